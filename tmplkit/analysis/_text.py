"""Pure text helpers of the analysis: common prefixes and suffixes, cuts at markup, agreement.

Nothing here renders or knows a template; every function takes strings and returns a string or a
length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ..probes import CALL_ID_FORMAT

__all__ = [
    "BOUNDARY", "MARKUP_END", "UNIT", "Note", "agree", "back_to_boundary", "canon", "distinctive",
    "from_first_unit", "keep_contained", "lcp", "lcs", "template_message", "unit_prefix", "unit_suffix",
]

# Markup units: special tokens and tags such as <|im_start|>, <｜User｜>, <start_of_turn>, [INST].
UNIT = re.compile(r"<\|[^<>|\s]*\|>|<｜[^<>｜]*｜>|〈\|[^〈〉]*\|〉|<[^<>\s]+>|\[[^\[\]\s]+\]")
# Markup (units and bare role words such as `system`) ending a text: `<|im_system|>system<|im_middle|>`.
MARKUP_END = re.compile(r"(?:" + UNIT.pattern + r"|[A-Za-z_]+(?=<|\[|〈)|\s)+$")
# A closer that is only partly rendered is cut after one of these.
BOUNDARY = frozenset(">]}\n \t")

_CALL_ID = re.compile(CALL_ID_FORMAT.replace("{:02d}", r"\d\d"))
_CANON_ID = CALL_ID_FORMAT.format(0)


class Note(NamedTuple):
    """A warning, with the key that makes it said once (a delimiter's name, or the text itself)."""

    key: str
    text: str


def lcp(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two strings or token lists (binary search on
    slices: fast on long renders and sessions)."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def lcs(a: str, b: str) -> int:
    """Length of the longest common suffix (binary search on slices, as `lcp`: a session's turn
    is compared with the whole history before it)."""
    hi = min(len(a), len(b))
    if a[len(a) - hi:] == b[len(b) - hi:]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def back_to_boundary(s: str, k: int, floor: int = 0) -> int:
    """`k`, moved back until s[:k] ends at a markup boundary (after `>`, `]`, `}` or whitespace)."""
    while k > floor and s[k - 1] not in BOUNDARY:
        k -= 1
    return k


def unit_prefix(s: str, k: int) -> int:
    """`k`, moved back so that s[:k] does not end inside a markup unit such as `<|im_start|>`."""
    if k >= len(s):
        return k
    opening = max(s.rfind("<", 0, k), s.rfind("[", 0, k))
    if opening >= 0 and s.find(">" if s[opening] == "<" else "]", opening, k) < 0:
        return opening
    return k


def unit_suffix(s: str, j: int) -> int:
    """`j`, moved forward so that s[j:] does not start inside a markup unit."""
    if j <= 0:
        return 0
    closings = [i for i in (s.find(">", j), s.find("]", j)) if i >= 0]
    if not closings:
        return j
    close = min(closings)
    if s.rfind("<" if s[close] == ">" else "[", j, close) < 0:
        return close + 1
    return j


def distinctive(d: str | None) -> bool:
    """Whether `d` can mark a turn: it holds a markup unit or a word, not just punctuation (`, `
    between list items does not)."""
    if not d:
        return False
    return bool(UNIT.search(d)) or sum(c.isalnum() for c in d) >= 2


def from_first_unit(text: str) -> str:
    m = UNIT.search(text)
    return text[m.start():] if m else ""


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
