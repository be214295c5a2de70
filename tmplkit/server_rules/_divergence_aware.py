"""The divergence-aware batch policy: checkpoints where the template's next render will diverge.

`gated` saves checkpoints at user starts (llama.cpp PR 25420) and near the prompt's end, and
llama-server keeps at most 32, evicting old ones within `checkpoint_min_step` of each other. A
resumed agent session is recomputed from where the template rewrites what the server holds:
templates that drop the reasoning of earlier turns (Qwen3, Qwen3.5, GLM) rewrite it at the first
assistant turn after the last user message once the next user message comes; a template whose
generation prompt differs from its rendered turn rewrites the end of every request.

Given `positions` (where the next render is predicted to diverge, e.g. from the renders of the
requests that can follow: `tmplkit.turns.next_renders`), the policy saves checkpoints there and
one near the prompt's end (a safety net), and nowhere else, so the few that matter are not
evicted by ones that cannot be used. Without them (the registry's instance), it is `gated` plus a
checkpoint at the assistant start that follows the last user start, the position Qwen-style
templates rewrite.

The runner's schedule asks a policy for two things besides batch breaks, when it has them:
`checkpoint_before(pos, spans)` (save one before a batch starting at pos) and
`keeps_checkpoint(pos, spans)` (keep one the schedule's own rules would save).

    >>> from tmplkit.server_rules import get_policy
    >>> get_policy("divergence-aware").name
    'divergence-aware'
    >>> sorted(DivergenceAware.for_prompt([40, 1200], n_prompt=1000).positions)
    [41, 996]
    >>> sorted(DivergenceAware.for_prompt([40], n_prompt=1000).positions)
    [41, 996]
    >>> sorted(DivergenceAware.for_prompt([], n_prompt=1000).positions)
    [996]
"""

from __future__ import annotations

import bisect

from ._checkpoints import near_end_breaks
from ._policies import BreakContext, Gated

__all__ = ["DivergenceAware"]


class DivergenceAware(Gated):
    """Checkpoints where the next render is predicted to diverge (see the module doc)."""

    name = "divergence-aware"
    description = "checkpoints where the template's next render will diverge"
    reason = "next divergence"

    def __init__(self, positions=None):
        self.positions = None if positions is None else frozenset(int(p) for p in positions)

    @classmethod
    def for_prompt(cls, divergences, n_prompt: int) -> DivergenceAware:
        """The policy for a prompt of `n_prompt` tokens whose next renders diverge at token positions
        `divergences`. Restoring a checkpoint saved before position c recomputes from c - 1, so it
        goes one past the divergence; past the prompt's end (in the generated turn) the last
        near-end position is as close as a prompt can get."""
        last = (near_end_breaks(n_prompt, n_prompt, 0)[-1:] or [n_prompt - 1])[0]
        positions = {min(int(p) + 1, last) for p in divergences if int(p) + 1 > 0}
        # always one at the end too, as a safety net: a request nobody predicted, and llama-server's
        # rule that looks for a checkpoint while the memory still holds position 0 (a prompt shorter
        # than the attention window's cells), even when the next request extends what is held
        return cls(positions | {last})

    def predicted(self, spans) -> frozenset:
        if self.positions is not None:
            return self.positions
        if spans is None or not hasattr(spans, "starts"):
            return frozenset()
        last = spans.last_user_start()
        if last is None:
            return frozenset()
        after = spans.starts("assistant")
        i = bisect.bisect_right(after, last)
        return frozenset(after[i:i + 1])

    def candidates(self, spans, n_tokens: int):
        own = self.predicted(spans)
        return sorted(own if self.positions is not None else set(super().candidates(spans, n_tokens)) | own)

    def break_before(self, pos: int, ctx: BreakContext) -> str | None:
        if pos in self.predicted(ctx.spans):
            return "next divergence"
        if self.positions is None and ctx.spans is not None and ctx.spans.is_user_start(pos):
            return super().break_before(pos, ctx)
        return None

    def checkpoint_before(self, pos: int, spans=None) -> bool:
        return pos in self.predicted(spans)

    def keeps_checkpoint(self, pos: int, spans=None) -> bool:
        return self.positions is None or pos in self.positions
