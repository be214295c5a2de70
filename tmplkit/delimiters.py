"""Roles and role start delimiters: the vocabulary every pipeline stage shares."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
