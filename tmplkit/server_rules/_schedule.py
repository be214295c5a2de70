"""One prompt's batches: where each batch ends and which batch starts with a checkpoint, as
llama-server's prompt loop decides (tools/server/server-context.cpp, 0.3.36), for the runner and
the simulation alike.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ._checkpoints import checkpoint_due, near_end, near_end_breaks
from ._policies import BatchPolicy, BreakContext, last_user_start

__all__ = ["BatchSchedule", "PlannedBatch"]


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of a prefill: tokens [begin, end), why it ends there (`reason`, and `rule`: the
    policy rule that ended it early), and why a checkpoint is saved right before it is decoded
    (`checkpoint`: "user start", "last user message", "near end"; None: no checkpoint)."""

    begin: int
    end: int
    reason: str
    rule: str | None = None
    checkpoint: str | None = None

    @property
    def size(self) -> int:
        return self.end - self.begin


class BatchSchedule:
    """Where each batch of one prompt ends, and which batches start with a checkpoint.

    Batches hold at most `n_batch` tokens. When the model needs checkpoints (`checkpointing`), a
    batch also ends where the policy says, before a user start, or at a near-end position,
    whichever comes first (llama-server's order), and a checkpoint is saved before a batch that
    starts a user message where `checkpoint_due` says so, or that ends near the prompt's end.
    The runner asks for one batch at a time, passing the newest checkpoint it holds by then.

        >>> from tmplkit.server_rules import get_policy
        >>> sched = BatchSchedule(get_policy("none"), None, 5000, n_batch=2048, n_ubatch=512,
        ...                       min_step=8192, checkpointing=True)
        >>> [(b.begin, b.end, b.reason, b.checkpoint) for b in sched.plan(4096)]
        [(4096, 4484, 'near end', None), (4484, 4996, 'near end', 'near end'), (4996, 5000, 'end', 'near end')]
    """

    def __init__(self, policy: BatchPolicy, spans, n_prompt: int, *, n_batch: int, n_ubatch: int,
                 min_step: int, checkpointing: bool):
        self.policy = policy
        self.spans = spans if policy.uses_spans else None
        self.n_prompt = n_prompt
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.min_step = min_step
        self.checkpointing = checkpointing
        self.last_user = last_user_start(self.spans)
        self._near = near_end_breaks(n_prompt, n_batch, n_ubatch)
        self._candidates = sorted({int(p) for p in policy.candidates(self.spans, n_prompt) if 0 < int(p) < n_prompt})

    def next_batch(self, begin: int, newest: int | None) -> PlannedBatch:
        """The batch starting at `begin`; `newest`: n_tokens of the newest checkpoint held (or None)."""
        full = min(begin + self.n_batch, self.n_prompt)
        due = self._due(begin, newest)
        end, reason, rule = self._early_end(begin, full, newest, due) if self.checkpointing else (full, None, None)
        if end == self.n_prompt:
            reason, rule = "end", None
        elif end - begin == self.n_batch:
            reason, rule = "full", None  # the batch was full anyway; a rule cost nothing
        # without an early end the batch ends at `full`: the prompt's end or a full batch, both named above
        assert reason is not None
        return PlannedBatch(begin, end, reason, rule, self._checkpoint_why(begin, end, due))

    def plan(self, start: int = 0, newest: int | None = None) -> list[PlannedBatch]:
        """All batches from `start`, each checkpoint asked for counted as saved: for `run()`, which
        starts from an empty memory, exactly its decode calls and checkpoints, without a model."""
        out: list[PlannedBatch] = []
        while start < self.n_prompt:
            batch = self.next_batch(start, newest)
            if batch.checkpoint is not None:
                newest = batch.begin
            out.append(batch)
            start = batch.end
        return out

    def _due(self, begin: int, newest: int | None) -> bool:
        """Whether a checkpoint is due at the user start this batch begins with."""
        return (self.checkpointing and begin > 0 and self.spans is not None and self.spans.is_user_start(begin)
                and checkpoint_due(begin, last_user=self.last_user, newest=newest, min_step=self.min_step) is not None)

    def _checkpoint_why(self, begin: int, end: int, due: bool) -> str | None:
        if not self.checkpointing or begin == 0:
            return None
        if near_end(self.n_prompt, end, self.n_ubatch):
            why = "near end"
        elif due:
            why = "last user message" if begin == self.last_user else "user start"
        else:  # the policy may want one where the shared rules do not (and drop one where they do)
            return "next divergence" if self.policy.checkpoint_before(begin, self.spans) else None
        return why if self.policy.keeps_checkpoint(begin, self.spans) else None

    def _early_end(self, begin: int, full: int, newest: int | None, due: bool) -> tuple[int, str | None, str | None]:
        """(end, reason, rule): the first break before `full` that the policy (at its candidate
        positions) or the near-end rule asks for; `full` and no reason when none does."""
        cands, near, n = self._candidates, self._near, self.n_prompt
        i = bisect.bisect_right(cands, begin)
        j = bisect.bisect_right(near, begin)
        ctx = BreakContext(spans=self.spans, last_user=self.last_user, last_checkpoint=newest, min_step=self.min_step,
                           pending_checkpoint=begin if due else None, min_tokens=self.n_ubatch, batch_begin=begin,
                           batch_end=min(full, near[j]) if j < len(near) else full, n_ubatch=self.n_ubatch)
        while True:
            c = cands[i] if i < len(cands) else n
            e = near[j] if j < len(near) else n
            p = min(c, e)
            if p >= full:
                return full, None, None
            if c == p:
                rule = self.policy.break_before(p, ctx)
                if rule is not None:
                    return p, self.policy.reason, rule
                i += 1
            if e == p:
                return p, "near end", None
