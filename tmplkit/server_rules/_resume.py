"""How much of what a slot holds a new prompt reuses: llama-server's prompt-cache rule
(tools/server/server-context.cpp, 0.3.36), as a pure plan that the runner (on a real model's
memory) and the simulation (on a `MemoryModel`) both follow.

The common prefix of the held tokens and the prompt is kept when the memory can roll back to its
end. Where it cannot (a sliding window that has moved on, a recurrent state), the newest
checkpoint usable there is restored and everything after it is recomputed; with none usable, the
whole prompt is. At least one token is always decoded, so its logits exist.

    >>> plan_resume([1, 2, 3, 4], [1, 2, 3, 9], pos_min=0, n_swa=0, store=None)
    ResumePlan(n_common=3, n_past=3, pos_next=3, restore=None, reset=False)
    >>> plan_resume([1, 2, 3, 4], [1, 2, 3, 4], pos_min=0, n_swa=0, store=None).n_past  # all of it held
    3
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..markup import lcp as common_prefix  # token lists and strings alike
from ._checkpoints import Checkpoint, CheckpointStore

__all__ = ["ResumePlan", "plan_resume"]


@dataclass(frozen=True)
class ResumePlan:
    """`n_common`: the common prefix of the held tokens and the prompt; `n_past`: the tokens kept
    (from memory, or from `restore`, the checkpoint to restore), decoding starts there; `pos_next`:
    checkpoints that cover positions past it no longer match the memory and are dropped; `reset`:
    the memory could not go back to the divergence and no checkpoint was usable, so the whole prompt
    is processed again (the server's "forcing full prompt re-processing", server-context.cpp:3360-3365)."""

    n_common: int
    n_past: int
    pos_next: int
    restore: Checkpoint | None = None
    reset: bool = False


def plan_resume(held: Sequence[int], tokens: Sequence[int], *, pos_min: int, n_swa: int,
                store: CheckpointStore | None, n_common: int | None = None) -> ResumePlan:
    """The plan for prompt `tokens` after `held`: `pos_min` is the oldest position the memory still
    holds, `n_swa` the attention window (0: none), `store` the checkpoints (None: none are kept);
    `n_common`: their common prefix where the caller knows it (a simulation of several settings;
    `held` is then read for its length only)."""
    n_common = common_prefix(held, tokens) if n_common is None else n_common
    n_past = pos_next = n_common
    restore = None
    reset = False
    pos_min_thold = max(0, pos_next - n_swa - (0 if n_past < len(tokens) else 1))
    if 0 < n_past <= len(held) and pos_min >= pos_min_thold:
        restore = store.find_restorable(pos_next, pos_min_thold) if store is not None else None
        if restore is not None:
            pos_next = min(pos_next, max(restore.pos_min + 1, restore.pos_max))
            n_past = min(pos_next, restore.n_tokens)
        else:
            pos_next = n_past = 0
            reset = True
    if n_past == len(tokens) and n_past > 0:
        n_past -= 1  # at least one token is decoded, so its logits exist
    return ResumePlan(n_common, n_past, pos_next, restore, reset)
