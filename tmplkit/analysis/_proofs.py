"""Where no delimiter can exist: the proof that two roles render alike.

A template that renders a tool result exactly as it renders a user message (SmolLM3), a system
message exactly as a user message, a tool result as a system message, or an answer as a user
message gives a prefill engine nothing to tell the two apart: whatever delimiters are chosen, one
of the two roles is misread. The proof is a render: the round-trip conversation with every message
of one role given the other role renders to the very same text. Such a template is refused as
impossible (status 'impossible'), with that render named, never passed.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import RenderError
from ._probing import Prober
from .probes import Probe

__all__ = ["PAIRS", "indistinguishable"]

# (role, the role it may render as), in the order tried.
PAIRS = (("tool", "user"), ("system", "user"), ("tool", "system"), ("assistant", "user"))


def _as(probe: Probe, role: str, other: str) -> Probe:
    """`probe` with every `role` message (an answer: without tool calls) made an `other` message of
    the same content."""
    messages = [{"role": other, "content": m.get("content")} if m.get("role") == role and not m.get("tool_calls") else m
                for m in probe.messages]
    return replace(probe, messages=messages)


def indistinguishable(prober: Prober, probe: Probe, text: str | None, what: str = "the round-trip conversation") -> str | None:
    """The proof that two roles of `probe` (`what`, in the proof's words) render alike (its render
    `text`), or None."""
    if text is None:
        return None
    for role, other in PAIRS:
        shown = [needles[0] in text for r, f, needles in zip(probe.roles, probe.tool_call_flags, probe.needles)
                 if r == role and not f and needles]
        if not shown or not all(shown):
            continue  # none of that role, or the template drops them: nothing is misread
        try:
            same = prober.render(_as(probe, role, other)) == text
        except RenderError:  # the template refuses that conversation: it tells the two apart
            continue
        if same:
            return (f"{role} messages render exactly like {other} messages: {what} renders to the "
                    f"same text with every {role} message given the role '{other}', so no delimiter can tell them apart")
    return None
