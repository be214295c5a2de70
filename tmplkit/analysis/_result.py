"""What an analysis returns (Analysis, RoundTrip), and the one way a failed analysis is built."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..delimiters import Delimiter
from ..errors import RenderError, RenderLimitError, TmplkitError, escape_controls

__all__ = ["STATUSES", "TOOL_PLACEMENTS", "Analysis", "RoundTrip", "failed_analysis", "failure_reason", "one_line", "status_of"]

# Reported strings are bounded: a hostile template can raise an exception with a 10 MB message.
MAX_MESSAGE = 2000

# Where a template puts tool responses.
TOOL_PLACEMENTS = ("own_role", "inside_user", "inside_assistant", "dropped", "rejected", "unknown")
# Analysis.status values: 'impossible' is a template refused with the proof that no delimiter can
# exist (two roles render alike); 'unsupported' one that renders no chat at all. The last three come
# from the isolation limits.
STATUSES = ("pass", "fail", "impossible", "unsupported", "error", "timeout", "memory", "unsafe")
# ... those last three: a sandbox limit stopped the analysis (no verdict on the template's design).
LIMIT_STATUSES = frozenset({"timeout", "memory", "unsafe"})
# A render limit's kind -> the status of an analysis it stopped. An output bomb stopped by the
# size limit is a resource exhaustion, as in the workers.
_LIMIT_STATUS = {"timeout": "timeout", "memory": "memory", "size": "memory", "unsafe": "unsafe"}


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
    # What the split showed that misreads no role (reasoning markup quoted inside another turn);
    # the Analysis reports it among its warnings.
    notes: tuple[str, ...] = field(default=(), repr=False, compare=False)
    # Whether a reasoning delimiter matched inside a turn other than an assistant's (among `notes`).
    stray_reasoning: bool = field(default=False, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "expected_roles": list(self.expected_roles),
            "actual_roles": list(self.actual_roles),
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Analysis:
    """What `analyze()` derived for one template, and its round-trip verdict.

    Role starts (`user_start`, ...) are the markup that says whose turn it is; reasoning markup
    inside an assistant turn has fields of its own (`reasoning_start`, `reasoning_end`), and so does
    what a per-request consumer needs to know about reasoning: `earlier_reasoning` and
    `generation_reasoning`. `delimiters` holds every delimiter with its role (`system`, `user`,
    `assistant`, `tool`, and `reasoning` / `reasoning_end`, which start no message), longest first.
    """

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
    # Reasoning markup inside an assistant turn (`<think>`, `</think>\n\n`); not part of assistant_start.
    reasoning_start: str | None = None
    reasoning_end: str | None = None
    # Whether assistant turns before the last user message keep their reasoning: 'kept', 'dropped',
    # or None where no reasoning renders.
    earlier_reasoning: str | None = None
    # What the generation prompt does with reasoning, per thinking-switch setting ('default': none
    # set, else 'name=value'): 'open' (it opens the reasoning: forced open), 'closed' (it closes it:
    # forced closed) or 'model' (left to the model).
    generation_reasoning: dict = field(default_factory=dict)
    capabilities: dict = field(default_factory=dict)
    delimiters: tuple[Delimiter, ...] = ()
    round_trip: RoundTrip | None = None
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def why_not(self) -> str:
        """The first reason it gives for its verdict (its first error, else its round trip's first
        problem), on one line and at most 300 characters; "" where it gives none.

        >>> Analysis(name="t", source="-", status="fail", errors=("a\\nb",)).why_not
        'a b'
        """
        reasons = tuple(self.errors) or (tuple(self.round_trip.problems) if self.round_trip else ())
        return " ".join(str(reasons[0]).split())[:300] if reasons else ""

    def to_dict(self) -> dict:
        """Every field as JSON (what `tmplkit audit --format json` prints): the role starts, the
        generation prompt, `tool_placement`, `reasoning_start`/`reasoning_end` (None where the
        template has no reasoning markup), `earlier_reasoning` ('kept', 'dropped' or None: whether
        answers before the last user message keep their reasoning), `generation_reasoning`
        ({setting: 'open' | 'closed' | 'model'}, per thinking-switch setting, 'default' for none),
        `capabilities`, `delimiters`, the round trip's verdict, errors, warnings and seconds."""
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
            "reasoning_start": self.reasoning_start,
            "reasoning_end": self.reasoning_end,
            "earlier_reasoning": self.earlier_reasoning,
            "generation_reasoning": dict(self.generation_reasoning),
            "capabilities": dict(self.capabilities),
            "delimiters": [d.to_dict() for d in self.delimiters],
            "round_trip": self.round_trip.to_dict() if self.round_trip else None,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 6),
        }


def one_line(text, limit: int = MAX_MESSAGE) -> str:
    """`text` on one line (a template's own message may hold newlines), at most `limit` characters.

    >>> one_line("bad\\nline two")
    'bad line two'
    """
    text = escape_controls(" ".join(str(text).split()))  # (a template's words: an escape sequence is shown, not run)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return text


def _chain(exc: BaseException | None):
    """`exc` and the exceptions it was raised from or during, once each."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def status_of(exc: BaseException) -> str:
    """The Analysis status for an analysis stopped by `exc` (or by anything it was raised from).

    A render limit maps to its status; a MemoryError is 'memory', a sandbox SecurityError 'unsafe';
    a template that refused the input on purpose (raise_exception) is 'unsupported'; anything else
    is 'error'.

    >>> status_of(RenderLimitError("too big", kind="size"))
    'memory'
    """
    from jinja2.exceptions import SecurityError

    if isinstance(exc, RenderError) and not isinstance(exc, RenderLimitError):
        # The template's own failure, whatever it was raised from (a mutating call such as
        # list.append is refused by the sandbox, as transformers refuses it: an error, not unsafe).
        return "unsupported" if exc.template_raised else "error"
    for e in _chain(exc):
        if isinstance(e, RenderLimitError):
            return _LIMIT_STATUS.get(e.kind, "error")
        if isinstance(e, MemoryError):
            return "memory"
        if isinstance(e, SecurityError):
            return "unsafe"
    return "error"


def failure_reason(template, exc: BaseException) -> str:
    """What to report for an analysis of `template` that raised `exc`."""
    if isinstance(exc, TmplkitError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return f"template '{template.name}' ran out of memory (MemoryError)"
    if isinstance(exc, RecursionError):
        return f"template '{template.name}' recursed too deeply"
    return f"template '{template.name}' failed: {type(exc).__name__}: {exc}"


def failed_analysis(template, status: str, errors, *, seconds: float = 0.0, warnings=(), capabilities=None) -> Analysis:
    """The Analysis of `template` that ended with `status` before any delimiter was derived."""
    return Analysis(name=template.name, source=template.source, status=status, errors=tuple(errors),
                    warnings=tuple(warnings), capabilities=dict(capabilities or {}), seconds=seconds)
