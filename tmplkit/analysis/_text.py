"""Text helpers of the analysis: tool-call ids made canonical, a role's delimiter agreed across
contexts, a delimiter cut to what every render contains. The markup vocabulary they build on
(`UNIT`, `lcp`, `lcs`, ...) is the ground floor's `tmplkit.markup`, re-exported here for the
analysis's modules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from ..markup import (  # re-exported: the analysis reads them from here
    BOUNDARY,
    MARKUP_END,
    UNIT,
    back_to_boundary,
    distinctive,
    from_first_unit,
    lcp,
    lcs,
    unit_prefix,
    unit_suffix,
)
from .probes import CALL_ID_FORMAT

__all__ = [
    "BOUNDARY", "MARKUP_END", "UNIT", "Note", "agree", "back_to_boundary", "canon", "distinctive",
    "from_first_unit", "keep_contained", "lcp", "lcs", "template_message", "unit_prefix", "unit_suffix",
]

_CALL_ID = re.compile(CALL_ID_FORMAT.replace("{:02d}", r"\d\d"))
_CANON_ID = CALL_ID_FORMAT.format(0)


class Note(NamedTuple):
    """A warning, with the key that makes it said once (a delimiter's name, or the text itself)."""

    key: str
    text: str


def canon(text: str) -> str:
    """Every tool-call id replaced by one of the same length, so texts that differ only by id compare equal."""
    return _CALL_ID.sub(_CANON_ID, text)


def template_message(exc: BaseException | None) -> str:
    """The template's own words for a render failure, else the error's message."""
    if exc is None:
        return "unknown error"
    return getattr(exc, "template_message", None) or str(exc)


def agree(candidates: Iterable[str], what: str) -> tuple[str, Note | None]:
    """A role's delimiter from its candidates in every context it was seen in.

    Where a role follows the same previous role in several places, the delimiter is what all of
    them share: their common prefix (text that varies at the end, like a call index, is no marker),
    else their common suffix (a block the template puts before some turns only, like Mistral's tool
    list before the last user message, or a closer rendered only before a next turn, is left out).
    Where they share nothing, the first is kept and a Note says so.
    """
    candidates = list(dict.fromkeys(c for c in candidates if c))
    if len(candidates) <= 1:
        return (candidates[0] if candidates else ""), None
    first = candidates[0]
    k = unit_prefix(first, min(lcp(first, c) for c in candidates[1:]))
    if first[:k].strip():
        return first[:k], None
    j = unit_suffix(first, len(first) - min(lcs(first, c) for c in candidates[1:]))
    if first[j:].strip():
        return first[j:], None
    return first, Note(what, f"{what} differs between contexts ({first!r}, {candidates[1]!r}); kept the first")


def keep_contained(start: str, segs: Iterable[str]) -> str:
    """`start` cut to what other renders of the same place still contain.

    A thinking switch (enable_thinking, thinking, ...) is set per request, so the round trip is also
    rendered with each of its values, and a delimiter is cut to what all of them contain at that
    place (DeepSeek V4: `<｜Assistant｜>`, which opens `</think>` or `<think>`). The closers there
    may differ (GLM 4.6 appends `/nothink` to user messages), so each such text only shortens the
    delimiter to its longest prefix (at a markup boundary) that it contains.
    """
    for seg in segs:
        if start in seg:
            continue
        lo, hi = 0, len(start)
        while lo < hi:  # start[:k] in seg holds for every k up to some point
            mid = (lo + hi + 1) // 2
            if start[:mid] in seg:
                lo = mid
            else:
                hi = mid - 1
        k = unit_prefix(start, lo)
        if start[:k].strip():
            start = start[:k]
    return start
