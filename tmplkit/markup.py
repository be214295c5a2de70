"""The markup vocabulary every layer shares: markup units, where a cut may fall, common prefixes
and suffixes.

A markup unit is a special token or tag (`<|im_start|>`, `<｜User｜>`, `<start_of_turn>`, `[INST]`);
a cut that lands inside one is moved to its edge. Nothing here renders or knows a template: every
function takes strings (`lcp` also token lists) and returns a string or a length.

    >>> lcp("<|im_start|>user", "<|im_start|>assistant"), unit_prefix("ab<|im_start|>", 5)
    (12, 2)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["BOUNDARY", "MARKUP_END", "TAG", "UNIT", "back_to_boundary", "distinctive", "from_first_unit", "lcp", "lcs",
           "unit_prefix", "unit_start", "unit_suffix"]

# Markup units: special tokens and tags such as <|im_start|>, <｜User｜>, <start_of_turn>, [INST];
# TAG, those in angle brackets alone (a bracketed word may be text: a pythonic call `[f(x=1)]`).
TAG = re.compile(r"<\|[^<>|\s]*\|>|<｜[^<>｜]*｜>|〈\|[^〈〉]*\|〉|<[^<>\s]+>")
UNIT = re.compile(TAG.pattern + r"|\[[^\[\]\s]+\]")
# Markup (units and bare role words such as `system`) ending a text: `<|im_system|>system<|im_middle|>`.
MARKUP_END = re.compile(r"(?:" + UNIT.pattern + r"|[A-Za-z_]+(?=<|\[|〈)|\s)+$")
# A closer that is only partly rendered is cut after one of these.
BOUNDARY = frozenset(">]}\n \t")


def lcp(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two strings or token lists: the block where they
    first differ found walking forward, then a binary search on slices inside it (fast on long
    renders and sessions)."""
    hi = min(len(a), len(b))
    if isinstance(a, (str, bytes)) and type(a) is type(b):
        lo = _same_text_blocks(a, b, hi)  # type: ignore[arg-type]
        if lo == hi:
            return hi
        top = min(hi, lo + _TEXT_BLOCK)
    else:
        if a[:hi] == b[:hi]:
            return hi
        # Token lists: a slice is a copy, so each block is compared once, element by element.
        lo = 0
        while lo + _BLOCK < hi and a[lo:lo + _BLOCK] == b[lo:lo + _BLOCK]:
            lo += _BLOCK
        top = min(hi, lo + _BLOCK)
    base, a, b, lo, hi = lo, a[lo:top], b[lo:top], 0, top - lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return base + lo


def _same_text_blocks(a: str | bytes, b: str | bytes, hi: int) -> int:
    """`hi` where the first `hi` characters of two texts agree, else where the `_TEXT_BLOCK` they
    first differ in starts. A slice of a text is a copy, but `startswith` at an offset compares in
    place: the shorter whole (no copy), then blocks of b against a where they lie, each copied once
    (the binary search on whole slices copied the text six times: 2.5x slower on a 294k-token
    session's held texts against its requests)."""
    if a.startswith(b) if len(b) <= len(a) else b.startswith(a):  # type: ignore[arg-type]
        return hi
    lo = 0
    while lo + _TEXT_BLOCK < hi and a.startswith(b[lo:lo + _TEXT_BLOCK], lo):  # type: ignore[arg-type]
        lo += _TEXT_BLOCK
    return lo


_BLOCK = 2048
_TEXT_BLOCK = 65536


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


def unit_start(s: str, k: int) -> int:
    """`k`, moved back to the start of the markup unit (`UNIT`) it falls inside, else `k`: where two
    texts part inside a unit (`</s>` and `<|user|>` share their `<`), the start of the unit. Unlike
    `unit_prefix` it moves only into a whole unit, never back over a `<` in plain text."""
    return next((u.start() for u in UNIT.finditer(s, max(0, k - 64)) if u.start() < k < u.end()), k)


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
