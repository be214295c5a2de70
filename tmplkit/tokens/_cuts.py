"""Where a long text can be cut so that tokenizing its pieces one by one gives the ids of the whole.

llama.cpp splits a text at its special tokens before it tokenizes the pieces between them
(llama-vocab.cpp, `tokenizer_st_partition`), but it walks its list of pieces from the start for
every special token it finds, so one call takes time quadratic in the special tokens of the text:
a 32,000-message chat (1.5 MB, 130,000 special tokens) takes 10 s, a 100,000-message one minutes.
Cut where llama.cpp would split anyway, each piece is a call of its own and the whole is linear.

A cut before special token S at byte p gives the same pieces as the whole text when llama.cpp
is sure to take that S as a token: no occurrence of a special token at least as long as S
(matched before S, longest first) overlaps it; and S strips no whitespace before it (LSTRIP would
take the text's end off the piece before). tests/test_tokenizers.py holds the pieces against a
model of the partition for any special texts, and their ids against the whole text's on every
vocabulary of the corpus.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CHUNK", "SpecialTexts", "cuts"]

CHUNK = 1 << 16  # bytes a piece holds at least: llama.cpp's call per piece stays short, and calls few
_MAX_SPECIALS = 20_000  # more and the pattern costs more than it saves: such a vocabulary is tokenized whole


@dataclass(frozen=True)
class SpecialTexts:
    """A vocabulary's special tokens as llama.cpp's partition matches them: their texts, longest
    first, and a pattern of those that may start a cut (no LSTRIP)."""

    texts: tuple[bytes, ...]
    starts: re.Pattern[bytes] | None

    @classmethod
    def of(cls, texts: Sequence[bytes], lstrip: Sequence[bool]) -> SpecialTexts | None:
        """None where no cut can be made safely (no special token, an empty one, or too many)."""
        if not texts or len(texts) > _MAX_SPECIALS or not all(texts):
            return None
        ordered = tuple(sorted(set(texts), key=len, reverse=True))
        stripped = {t for t, s in zip(texts, lstrip) if s}
        starts = [re.escape(t) for t in ordered if t not in stripped]
        return cls(ordered, re.compile(b"|".join(starts)) if starts else None)

    @property
    def longest(self) -> int:
        return len(self.texts[0])


def cuts(data: bytes, specials: SpecialTexts, chunk: int = CHUNK) -> list[int]:
    """Byte offsets, ascending, where `data` can be cut (see the module doc), about `chunk` apart."""
    out: list[int] = []
    pattern, at = specials.starts, chunk
    if pattern is None:
        return out
    while at < len(data):
        m = pattern.search(data, at)
        while m is not None and not _clean(data, m.start(), m.group(), specials):
            m = pattern.search(data, m.start() + 1)
        if m is None:
            break
        out.append(m.start())
        at = m.start() + chunk
    return out


def _clean(data: bytes, p: int, s: bytes, specials: SpecialTexts) -> bool:
    """Whether llama.cpp takes the occurrence of `s` at `p` as a token: no other occurrence of a
    special token at least as long overlaps it (those are taken first). A shorter one across `p` is
    then taken in neither the whole text nor the pieces."""
    lo = max(0, p - specials.longest + 1)
    end = p + len(s)
    window = data[lo:end + specials.longest - 1]
    for t in specials.texts:
        if len(t) < len(s):
            break  # (longest first)
        j = window.find(t)
        while j >= 0:
            a = lo + j
            if a < end and a + len(t) > p and not (a == p and t == s):
                return False
            j = window.find(t, j + 1)
    return True
