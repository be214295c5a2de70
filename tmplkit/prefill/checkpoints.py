"""Context checkpoints and the rules llama-server keeps them by.

A checkpoint is the part of a sequence's memory that cannot be rolled back (the sliding-window
cache, or a recurrent state), saved with `llama_state_seq_get_data_ext(...,
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)` right before a batch is decoded: it holds the state after
`n_tokens` prompt tokens, covering positions [pos_min, pos_max].

The store keeps at most `max_count`; adding to a full store first drops checkpoints of earlier
runs that lie within `min_step` of the one before them, then the oldest; a checkpoint at the same
n_tokens as the new one is replaced. Resuming picks the newest checkpoint that ends at or before
the first position to recompute and reaches far enough back for the attention window.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
        if len(self.items) + 1 >= self.max_count:
            kept: list[Checkpoint] = []
            last = -1
            for c in self.items:
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
