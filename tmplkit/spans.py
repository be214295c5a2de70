"""Splitting rendered text (and, later, token ids) into role spans by start delimiters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .delimiters import Delimiter, sort_delimiters


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
    ordered = sort_delimiters(delimiters)
    starts: list[tuple[int, str]] = []
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
        starts.append((best_at, best.role))
        pos = best_at + len(best.text)
    return [
        TextSpan(role, at, starts[i + 1][0] if i + 1 < len(starts) else n)
        for i, (at, role) in enumerate(starts)
    ]
