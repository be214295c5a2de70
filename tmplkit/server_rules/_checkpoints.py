"""Context checkpoints and the rules llama-server keeps them by.

A checkpoint is the part of a sequence's memory that cannot be rolled back (the sliding-window
cache, or a recurrent state), saved with `llama_state_seq_get_data_ext(...,
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)` right before a batch is decoded: it holds the state after
`n_tokens` prompt tokens, covering positions [pos_min, pos_max].

The store keeps at most `max_count`; adding to a full store first drops, oldest first and only
until the store is below the cap, checkpoints of earlier runs that lie within `min_step` of the one
kept before them, then the oldest; a checkpoint at the same
n_tokens as the new one is replaced. Resuming picks the newest checkpoint that ends at or before
the first position to recompute and reaches far enough back for the attention window.

When one is taken is decided here too, once, for the runner and the `gated` policy alike
(`checkpoint_due`, `near_end`, `near_end_breaks`): llama-server's rules in
tools/server/server-context.cpp (0.3.36, "do_checkpoint").
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Checkpoint", "CheckpointStore", "checkpoint_due", "near_end", "near_end_breaks"]

# llama-server ends a batch this many tokens before the prompt's end (4 + n_ubatch, and 4), so
# that checkpoints exist there (llama.cpp PR 20288); a resume then recomputes at most a ubatch.
_NEAR_END_OFFSET = 4


def checkpoint_due(pos: int, *, last_user: int, newest: int | None, min_step: int) -> str | None:
    """The rule that takes a checkpoint at user start `pos`, or None (llama-server's order).

    `newest`: n_tokens of the newest checkpoint (None: none yet). A checkpoint is due at the last
    user message, when there is none yet, and more than `min_step` tokens past the newest.
    """
    if pos == last_user:
        return "last user message"
    if newest is None:
        return "no checkpoint yet"
    if pos > newest + min_step:
        return "min step"
    return None


def near_end(n_prompt: int, batch_end: int, n_ubatch: int) -> bool:
    """Whether a batch ending at `batch_end` lies near the prompt's end, where a checkpoint is
    always taken before it is decoded (the last batch always does)."""
    return n_prompt < batch_end + n_ubatch


def near_end_breaks(n_prompt: int, n_batch: int, n_ubatch: int) -> list[int]:
    """The positions where a batch ends so that near-end checkpoints exist, ascending."""
    offsets = (_NEAR_END_OFFSET + n_ubatch, _NEAR_END_OFFSET)
    return sorted({n_prompt - min(n_batch, off) for off in offsets} - {0})


@dataclass(eq=False)
class Checkpoint:
    n_tokens: int
    pos_min: int
    pos_max: int
    data: bytes = field(repr=False)
    run_id: int = 0

    @property
    def size(self) -> int:
        return len(self.data)


class CheckpointStore:
    """The checkpoints of one sequence, oldest first."""

    def __init__(self, max_count: int = 32, min_step: int = 8192):
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        self.max_count = max_count
        self.min_step = min_step
        self.items: list[Checkpoint] = []

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def last(self) -> Checkpoint | None:
        return self.items[-1] if self.items else None

    def clear(self) -> None:
        self.items.clear()

    @property
    def nbytes(self) -> int:
        return sum(c.size for c in self.items)

    def add(self, ckpt: Checkpoint) -> list[Checkpoint]:
        """Add `ckpt`, evicting as llama-server does; returns the evicted checkpoints."""
        evicted: list[Checkpoint] = []
        kept: list[Checkpoint] = []
        last = -1
        # server-context.cpp:2296-2310: the loop's condition is checked before every step, so it
        # stops evicting as soon as the store is below the cap again (one eviction, usually)
        for i, c in enumerate(self.items):
            if len(self.items) - len(evicted) + 1 < self.max_count:
                kept.extend(self.items[i:])
                break
            if c.run_id != ckpt.run_id and last >= 0 and c.n_tokens <= last + self.min_step:
                evicted.append(c)
                continue
            last = c.n_tokens
            kept.append(c)
        self.items = kept
        while len(self.items) >= self.max_count:
            evicted.append(self.items.pop(0))
        same = [c for c in self.items if c.n_tokens == ckpt.n_tokens]
        if same:
            evicted.extend(same)
            self.items = [c for c in self.items if c.n_tokens != ckpt.n_tokens]
        self.items.append(ckpt)
        return evicted

    def find_restorable(self, pos_next: int, pos_min_thold: int) -> Checkpoint | None:
        """The newest checkpoint usable to recompute from `pos_next` (llama-server's rule)."""
        for c in reversed(self.items):
            if c.pos_max > pos_next:
                continue
            if c.pos_min < pos_min_thold or c.pos_min == 0:
                return c
        return None

    def drop_after(self, pos_next: int) -> list[Checkpoint]:
        """Drop checkpoints that cover positions past `pos_next` (they no longer match the memory)."""
        gone = [c for c in self.items if c.pos_max > pos_next]
        self.items = [c for c in self.items if c.pos_max <= pos_next]
        return gone
