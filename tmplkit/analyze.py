"""Differential analysis: derive each role's start delimiter from probe renders, and prove it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .delimiters import Delimiter

# Where a template puts tool responses.
TOOL_PLACEMENTS = ("own_role", "inside_user", "inside_assistant", "dropped", "rejected", "unknown")
# Analysis.status values. The last three come from the isolation limits.
STATUSES = ("pass", "fail", "unsupported", "error", "timeout", "memory", "unsafe")


@dataclass(frozen=True)
class RoundTrip:
    """The verdict of rendering the mixed conversation and splitting it with the derived delimiters.

    `expected_roles` are the roles of the messages the template renders as turns of their own,
    in order; `actual_roles` the roles of the spans found. `messages`/`rendered` are kept for the
    token-level round trip and are not part of to_dict().
    """

    passed: bool
    expected_roles: tuple[str, ...]
    actual_roles: tuple[str, ...]
    problems: tuple[str, ...] = ()
    messages: tuple = field(default=(), repr=False, compare=False)
    render_kwargs: dict = field(default_factory=dict, repr=False, compare=False)
    rendered: str = field(default="", repr=False, compare=False)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "expected_roles": list(self.expected_roles),
            "actual_roles": list(self.actual_roles),
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Analysis:
    name: str
    source: str
    status: str
    user_start: str | None = None
    assistant_start: str | None = None
    system_start: str | None = None
    tool_response_start: str | None = None
    # Where consecutive tool responses share one turn: the delimiter that starts each further one.
    tool_response_next: str | None = None
    generation_prompt: str | None = None
    tool_placement: str = "unknown"
    capabilities: dict = field(default_factory=dict)
    delimiters: tuple[Delimiter, ...] = ()
    round_trip: RoundTrip | None = None
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "status": self.status,
            "user_start": self.user_start,
            "assistant_start": self.assistant_start,
            "system_start": self.system_start,
            "tool_response_start": self.tool_response_start,
            "tool_response_next": self.tool_response_next,
            "generation_prompt": self.generation_prompt,
            "tool_placement": self.tool_placement,
            "capabilities": dict(self.capabilities),
            "delimiters": [d.to_dict() for d in self.delimiters],
            "round_trip": self.round_trip.to_dict() if self.round_trip else None,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 6),
        }


def analyze(template) -> Analysis:  # filled in by the analysis work
    raise NotImplementedError
