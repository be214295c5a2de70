"""Batch policies: where a prompt batch ends early, before a message start.

A policy answers one question while a batch is being filled: after adding the token before
position `pos`, end the batch here? It returns the name of the rule that ends it, or None.
Everything else is shared by all policies and follows llama-server: batches are at most n_batch
tokens; when the model needs checkpoints, a batch also ends 4 + n_ubatch and 4 tokens before the
prompt's end (the near-end rule) and a checkpoint is taken at the start of a batch that starts a
user message (subject to the minimum step) or lies near the end. With a model that can roll its
memory back, no checkpoint is needed and no policy breaks a batch.

The policies llama.cpp has run (`every-user-start`: 73618f2, `gated`: PR 25420, `gated-llama-server`:
the gate exactly as the server runs it) and tmplkit's own; the registry of named ones is
`_registry.POLICIES`, and `_schedule.BatchSchedule` applies one to a prompt (the rule of its
checkpoints is `_checkpoints.checkpoint_due`, which `gated` asks too).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._checkpoints import checkpoint_due

if TYPE_CHECKING:
    from ..tokens.spans import Spans

__all__ = ["BatchPolicy", "BreakContext", "EveryUserStart", "FixedBreaks", "Gated", "NoBreaks", "ServerGated",
           "last_user_start", "user_starts"]


@dataclass(frozen=True, kw_only=True)
class BreakContext:
    """What a policy may look at: the spans, the last user start, and the checkpoints.

    `last_checkpoint` is the n_tokens of the newest checkpoint taken so far (None when there is
    none yet). `pending_checkpoint` is the checkpoint the batch being filled starts with: it is
    saved right before that batch is decoded, so it is not taken yet while the batch is filled
    (llama-server's gate looks only at `last_checkpoint`).
    """

    spans: Spans | None
    last_user: int
    last_checkpoint: int | None
    min_step: int
    pending_checkpoint: int | None = None
    # the smallest checkpoint worth ending a batch for (the runner passes n_ubatch)
    min_tokens: int = 0
    # the batch being filled: where it starts and where it ends at the latest (full, or the
    # near-end rule), and llama.cpp's ubatch size; 0 when unknown
    batch_begin: int = 0
    batch_end: int = 0
    n_ubatch: int = 0


class BatchPolicy:
    """Base policy: never ends a batch early.

    `candidates(spans, n)`: the positions where `break_before` is asked (by default the user
    starts); `break_before(pos, ctx)`: the name of the rule that ends the batch before `pos`, or
    None; `reason`: how a batch it ends is labelled in reports.
    """

    name = "base"
    description = ""
    reason = "user start"
    # Whether the runner reads spans at all (also for checkpoints at user starts).
    uses_spans = True

    def candidates(self, spans, n_tokens: int):
        return user_starts(spans)

    def break_before(self, pos: int, ctx: BreakContext) -> str | None:
        return None

    def checkpoint_before(self, pos: int, spans=None) -> bool:
        """Whether to save a checkpoint before a batch starting at `pos` that the shared rules
        would not save one before (no policy here does; see _divergence_aware)."""
        return False

    def keeps_checkpoint(self, pos: int, spans=None) -> bool:
        """Whether to save the checkpoint the shared rules would save before a batch starting at `pos`."""
        return True

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


class NoBreaks(BatchPolicy):
    """No message breaks, spans ignored: llama-server without message delimiters."""

    name = "none"
    description = "full batches; only the near-end breaks"
    uses_spans = False


class EveryUserStart(BatchPolicy):
    """End a batch before every user-message start (llama.cpp 73618f2, the issue-25213 regression)."""

    name = "every-user-start"
    description = "a break before every user start (llama.cpp 73618f2)"

    def break_before(self, pos: int, ctx: BreakContext) -> str | None:
        if ctx.spans is not None and ctx.spans.is_user_start(pos):
            return "every user start"
        return None


class Gated(BatchPolicy):
    """End a batch at a user start only where a checkpoint will be taken (llama.cpp PR 25420).

    Rules, in order: the last user message; no checkpoint yet; more than `min_step` tokens past
    the newest checkpoint. The newest checkpoint includes the one the batch being filled starts
    with: llama-server's gate does not see that one, so after each checkpoint it cuts the batch
    once more at the next user start, where no checkpoint is then taken (`ServerGated`).
    No break for a checkpoint of fewer than `min_tokens` tokens (n_ubatch): resuming from it
    would save less prefill than the extra batch costs. llama-server breaks there too, so a
    prompt whose first user message follows the BOS token gets a BOS-only batch.

    Where the rules leave a choice ("no checkpoint yet", "min step": any user start of the batch
    past the gate will do), the batch ends at the one that leaves its last ubatch fullest, and
    not at all when the last user message comes later in the same batch. llama.cpp splits a batch
    into ubatches of n_ubatch from its start, and a partly filled ubatch late in a long prompt
    costs nearly as much as a full one (its attention is most of the work and is rounded up to
    whole tiles), so a break that ends a ubatch 14 or 253 tokens in wastes most of one.
    """

    name = "gated"
    description = "a break at a user start only where a checkpoint is due (llama.cpp PR 25420)"

    def newest(self, ctx: BreakContext) -> int | None:
        return ctx.pending_checkpoint if ctx.pending_checkpoint is not None else ctx.last_checkpoint

    def min_tokens(self, ctx: BreakContext) -> int:
        return ctx.min_tokens

    def due(self, pos: int, ctx: BreakContext) -> str | None:
        """The rule that lets a checkpoint (and so a break) come before user start `pos`."""
        if pos < self.min_tokens(ctx):
            return None
        return checkpoint_due(pos, last_user=ctx.last_user, newest=self.newest(ctx), min_step=ctx.min_step)

    def break_before(self, pos: int, ctx: BreakContext) -> str | None:
        if ctx.spans is None or not ctx.spans.is_user_start(pos):
            return None
        rule = self.due(pos, ctx)
        if rule is None or rule == "last user message" or not self.packs(ctx):
            return rule
        # a choice: the user starts of this batch that are as good, and the one ending the
        # last ubatch fullest (the fewest tokens short of a whole ubatch; the first on a tie)
        starts = ctx.spans.starts("user")
        later = starts[bisect.bisect_right(starts, pos):bisect.bisect_left(starts, ctx.batch_end)]
        if ctx.last_user in later:
            return None  # the batch ends at the last user message anyway, with its checkpoint
        short = lambda p: -(p - ctx.batch_begin) % ctx.n_ubatch  # noqa: E731
        best = min([pos] + [p for p in later if self.due(p, ctx)], key=short)
        return rule if best == pos else None

    def packs(self, ctx: BreakContext) -> bool:
        return ctx.n_ubatch > 0 and ctx.batch_end > ctx.batch_begin


class ServerGated(Gated):
    """PR 25420 exactly as llama-server 0.3.36 runs it: the gate sees only checkpoints already taken."""

    name = "gated-llama-server"
    description = "gated as llama-server runs it, with its breaks where no checkpoint follows"

    def newest(self, ctx: BreakContext) -> int | None:
        return ctx.last_checkpoint

    def min_tokens(self, ctx: BreakContext) -> int:
        return 0

    def packs(self, ctx: BreakContext) -> bool:
        return False


class FixedBreaks(BatchPolicy):
    """End batches before the given positions (and nowhere else early): for experiments and tests."""

    name = "fixed"
    description = "breaks at given positions"
    reason = "fixed"

    def __init__(self, positions):
        self.positions = frozenset(int(p) for p in positions)

    def candidates(self, spans, n_tokens: int):
        return self.positions

    def break_before(self, pos: int, ctx: BreakContext) -> str | None:
        return "fixed" if pos in self.positions else None


def user_starts(spans) -> list[int]:
    """Positions of the user spans of a span value (tmplkit Spans or any iterable of (role, pos, len))."""
    if spans is None:
        return []
    if hasattr(spans, "starts"):
        return [int(p) for p in spans.starts("user")]
    return [int(s[1]) for s in spans if s[0] == "user"]


def last_user_start(spans) -> int:
    """The position of the last user message in `spans`, -1 when there is none (or no spans)."""
    if spans is None:
        return -1
    pos = spans.last_user_start()
    return -1 if pos is None else int(pos)
