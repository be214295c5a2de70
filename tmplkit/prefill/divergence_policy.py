"""The divergence-aware batch policy: checkpoints where the template's next render will diverge.

`gated` saves checkpoints at user starts (llama.cpp PR 25420) and near the prompt's end. A
resumed agent session is recomputed from where the template rewrites what the server holds, and
templates that drop the reasoning of earlier turns (Qwen3, Qwen3.5, GLM: the reasoning of the
assistant turns after the last user message is printed only until the next user message comes)
rewrite it at the first assistant turn after the last user message. This policy is `gated` plus a
checkpoint there: at the assistant start that follows the last user start, when the prompt holds
one (its generation prompt, when the prompt ends with the user message), so that the next user
request recomputes only from there.

Given `positions`, it uses those instead (e.g. the divergences `tmplkit turns` found for the
session's renders).

    >>> from tmplkit.prefill.policies import get_policy
    >>> get_policy("divergence-aware").name
    'divergence-aware'
"""

from __future__ import annotations

import bisect

from .policies import BreakContext, Gated

__all__ = ["DivergenceAware"]


class DivergenceAware(Gated):
    """`gated`, and a checkpoint (so a batch break) where the next render is predicted to diverge."""

    name = "divergence-aware"
    description = "gated, plus a checkpoint where the template's next render will diverge"

    def __init__(self, positions=None):
        self.positions = None if positions is None else frozenset(int(p) for p in positions)

    def predicted(self, spans) -> frozenset:
        """The positions of predicted divergences in a prompt with these spans."""
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
        return sorted(set(super().candidates(spans, n_tokens)) | self.predicted(spans))

    def break_before(self, pos: int, ctx: BreakContext) -> str | None:
        if pos in self.predicted(ctx.spans):
            return "next divergence"
        if ctx.spans is not None and ctx.spans.is_user_start(pos):
            return super().break_before(pos, ctx)
        return None

    def checkpoint_before(self, pos: int, spans=None) -> bool:
        """Whether a checkpoint is saved before the batch starting at `pos` (besides gated's own)."""
        return pos in self.predicted(spans)
