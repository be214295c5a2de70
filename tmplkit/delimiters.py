"""Roles, role start delimiters and text spans: the vocabulary every pipeline stage shares.

`split_text` splits a rendered string into role spans as llama-server splits a prompt (a span runs
from its delimiter to the next; text before the first belongs to none), the longest delimiter first.
It lives here, below the analysis, so that the analysis needs neither token ids nor numpy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

# Message roles. Role order is also the tie-break order when delimiters have the same length.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# Spans inside an assistant turn: its reasoning (from `<think>`) and what follows the reasoning's
# end (from `</think>`). Delimiters of these roles start no message: a reasoning span is never a
# user start, and splitting treats it as part of the assistant turn before it.
REASONING_ROLES: tuple[str, ...] = ("reasoning", "reasoning_end")
# Every role a delimiter or span may have, in tie-break order.
SPAN_ROLES: tuple[str, ...] = ROLES + REASONING_ROLES
_ROLE_RANK = {role: i for i, role in enumerate(SPAN_ROLES)}


@dataclass(frozen=True)
class Delimiter:
    """A string that starts a message of `role` in a rendered conversation."""

    role: str
    text: str

    def to_dict(self) -> dict:
        return {"role": self.role, "text": self.text}


def with_article(role: str) -> str:
    """`role` with its article, as messages name a role: 'a user', 'an assistant'."""
    return f"an {role}" if role[:1] in "aeio" else f"a {role}"


def sort_delimiters(delimiters: Iterable[Delimiter]) -> tuple[Delimiter, ...]:
    """Longest first; ties by role order (system, user, assistant, tool, reasoning, reasoning_end), then by text.

    Duplicates (same role and text) are dropped. Splitting always tries the longest first,
    so `<|im_start|>user\\n<tool_response>` wins over `<|im_start|>user`.

    >>> [d.text for d in sort_delimiters([Delimiter("user", "<u>"), Delimiter("tool", "<u><t>")])]
    ['<u><t>', '<u>']
    """
    unique = {(d.role, d.text): d for d in delimiters if d.text}
    return tuple(
        sorted(unique.values(), key=lambda d: (-len(d.text), _ROLE_RANK.get(d.role, len(SPAN_ROLES)), d.text))
    )


@dataclass(frozen=True)
class TextSpan:
    """A message span in rendered text: [start, end) character offsets; `start` is where its delimiter begins."""

    role: str
    start: int
    end: int

    def to_dict(self) -> dict:
        return {"role": self.role, "start": self.start, "end": self.end}


def split_text(text: str, delimiters: Iterable[Delimiter]) -> list[TextSpan]:
    """Split `text` into spans, each running from one delimiter match to the next.

    At each position the longest matching delimiter wins; text before the first match belongs
    to no span (llama-server's semantics).

    >>> split_text("<s>U:hi A:yo", [Delimiter("user", "U:"), Delimiter("assistant", "A:")])
    [TextSpan(role='user', start=3, end=8), TextSpan(role='assistant', start=8, end=12)]
    """
    starts = text_matches(text, delimiters)
    n = len(text)
    return [
        TextSpan(d.role, at, starts[i + 1][0] if i + 1 < len(starts) else n)
        for i, (at, d) in enumerate(starts)
    ]


def text_matches(text: str, delimiters: Iterable[Delimiter]) -> list[tuple[int, Delimiter]]:
    """Where each span of `split_text` starts, and the delimiter that matched there.

    >>> text_matches("U:hi A:yo", [Delimiter("user", "U:"), Delimiter("assistant", "A:")])
    [(0, Delimiter(role='user', text='U:')), (5, Delimiter(role='assistant', text='A:'))]
    """
    ordered = sort_delimiters(delimiters)
    if not ordered:
        return []
    # One scan: a regular expression's alternation tries its alternatives in order at each position,
    # so the earliest match wins and, there, the first in `ordered` (`_text_matches_plain` is the
    # plain loop it is held equal to by tests/test_speed_paths.py).
    pattern, first = _alternation(ordered)
    return [(m.start(), first[m.group(0)]) for m in pattern.finditer(text)]


@lru_cache(maxsize=256)
def _alternation(ordered: tuple[Delimiter, ...]) -> tuple[re.Pattern, dict[str, Delimiter]]:
    first: dict[str, Delimiter] = {}
    for d in ordered:
        first.setdefault(d.text, d)
    return re.compile("|".join(re.escape(d.text) for d in ordered)), first


def _text_matches_plain(text: str, delimiters: Iterable[Delimiter]) -> list[tuple[int, Delimiter]]:
    """`text_matches` as a loop of `str.find`s: the reference the one-scan version is tested against."""
    ordered = sort_delimiters(delimiters)
    starts: list[tuple[int, Delimiter]] = []
    pos = 0
    n = len(text)
    while pos < n:
        best = None
        best_at = n
        # Find the earliest match at or after pos; among matches there, the longest (first in order).
        for d in ordered:
            at = text.find(d.text, pos, best_at + len(d.text))
            if at != -1 and at < best_at:
                best, best_at = d, at
        if best is None:
            break
        starts.append((best_at, best))
        pos = best_at + len(best.text)
    return starts
