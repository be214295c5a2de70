"""The prefix-stability check: whether each request of a resumed agent session extends what the
server holds (tmplkit.turns), run in the template's worker after its analysis, under the same limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..analysis import LIMIT_STATUSES, Analysis, analyze, failed_analysis
from ..errors import InputError
from ..sources.templates import ChatTemplate

__all__ = ["NOT_APPLICABLE", "NOT_CHECKED", "PrefixStability", "analyze_with_prefix_stability", "default_turns_session", "prefix_stability_of"]

NOT_APPLICABLE = "not applicable"
# The check did not run to the end (its time limit, or the template's worker gave no result): it
# proves nothing, and the gate never counts it as passed (`--fail-on unchecked` fails it).
NOT_CHECKED = "not checked"


@dataclass(frozen=True)
class PrefixStability:
    """Whether each request of a resumed agent session extends what the server holds (tmplkit.turns).

    `verdict`: "stable", "unstable", "not applicable" (the template cannot render the default
    session, or the session has a single request; `detail` says why) or "not checked" (the time
    limit came before a divergence, the worker gave no result, or the template cannot render the
    session the user gave: nothing was proved; `detail` says where or why). When unstable: the first divergence's
    `cause` (one of tmplkit.turns.CAUSES), the `request` it happens at and its character `position`.
    `seconds`: the time the check took (not compared: it differs from run to run).

    >>> PrefixStability("unstable", "reasoning dropped", 1, 5120, 3).label
    'unstable (reasoning dropped)'
    """

    verdict: str
    cause: str = ""
    request: int | None = None
    position: int | None = None
    n_requests: int = 0
    detail: str = ""
    seconds: float = field(default=0.0, compare=False)
    limit: str = ""  # the render limit that stopped the check (`RenderLimitError.KINDS`; "": none)

    @property
    def label(self) -> str:
        return f"unstable ({self.cause})" if self.verdict == "unstable" else self.verdict

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "cause": self.cause, "request": self.request, "position": self.position,
                "n_requests": self.n_requests, "detail": self.detail, "seconds": round(self.seconds, 6)}


def default_turns_session():
    """The session the prefix-stability check renders unless given one: a generated agent session
    (seed 0) of three user requests with reasoning, parallel tool calls and long tool outputs."""
    from ..session import generate_session  # only with --prefix-stability: keeps the session layer out of the workers' preload

    return generate_session(20000, seed=0, style="agent", requests=3)


def check_session(session) -> None:
    """Refuse a session without a request, or one llama-server would refuse to read (a message's key
    it reads as a string, a tool call's shape: `session.given_messages`), here, before the workers
    would make it every template's error."""
    from ..session import given_messages, given_tools
    from ..turns import request_points  # numpy: only with --prefix-stability (keeps import tmplkit.auditing numpy-free)

    source = getattr(session, "source", "") or "the session"
    if not request_points(list(session.messages)):
        raise InputError(f"{source}: no request in the session (the model speaks after a user message or tool "
                         "results); add a user message")
    try:  # (as the check reads it: the server setting, `study_turns`' default)
        given_messages(session.messages, "server")
        given_tools(session.tools, "server")
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def prefix_stability_of(template: ChatTemplate, session=None, timeout: float | None = None) -> PrefixStability:
    """Whether `session` (default `default_turns_session()`), resumed request by request on
    `template`, always extends what the server holds; see tmplkit.turns.study_turns. Past
    `timeout` seconds, the requests rendered by then decide: a divergence among them is the
    verdict, none is "not checked" with where it stopped.

    >>> from tmplkit.sources import load_one
    >>> prefix_stability_of(load_one("fixtures/turns/drops-reasoning.jinja")).label
    'unstable (reasoning dropped)'
    """
    import time

    from ..turns import study_turns  # numpy: only with --prefix-stability

    start = time.perf_counter()
    report = study_turns(template, session if session is not None else default_turns_session(), switches=False,
                         timeout=timeout)
    took = time.perf_counter() - start
    if report.error:
        # A render limit stopped the study: not checked. A template that refuses the session: the
        # default one does not apply to it (the tools it calls, parallel calls); the user's own was
        # not checked, and a gate must not pass it (a server would refuse those requests too).
        limited = bool(report.limit)  # (a time, memory or size limit, or a sandbox escape)
        own = session is not None and session != default_turns_session()  # (the default, made anew where it was passed)
        verdict = NOT_CHECKED if limited or own else NOT_APPLICABLE
        why = report.error if limited else f"the template cannot render the session: {report.error}"
        return PrefixStability(verdict, n_requests=report.n_requests, detail=_bounded(why), seconds=took,
                               limit=report.limit)
    first = report.first
    if first is None and report.stopped:  # (before the count: a time limit after one request is not a one-request session)
        return PrefixStability(NOT_CHECKED, n_requests=report.n_requests, seconds=took,
                               detail=f"{report.stopped}: no divergence up to there, none proved after")
    if report.n_requests < 2:  # nothing is resumed, so "stable" would say nothing
        return PrefixStability(NOT_APPLICABLE, n_requests=report.n_requests, seconds=took,
                               detail="the session has one request: nothing is resumed")
    if first is None:
        return PrefixStability("stable", n_requests=report.n_requests, seconds=took)
    return PrefixStability("unstable", first.cause, first.request, first.position, report.n_requests,
                           _bounded(first.detail), took)


def _bounded(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def analyze_with_prefix_stability(template: ChatTemplate, session=None,
                                  timeout: float | None = None) -> tuple[Analysis, PrefixStability | None]:
    """A worker target (tmplkit.auditing.isolate): the analysis, then the prefix-stability check, in the same
    sandboxed process and under the same limits, since both render the template; the two come back
    as a pair (None: not checked). Prefix stability needs renders, not delimiters: it is checked
    whatever the analysis found, except after a sandbox limit (the template would hit it again).
    With the worker's `timeout`, the check stops in time for the pair to come back (what the
    analysis left of it, less a margin), rather than be killed with both lost."""
    import time

    start = time.monotonic()
    a = analyze(template)
    if a.status in LIMIT_STATUSES:  # (the template hit a sandbox limit: it would again)
        return a, None
    left = None if timeout is None else max(0.05, 0.8 * (timeout - (time.monotonic() - start)) - 0.5)
    check = prefix_stability_of(template, session, timeout=left)
    if check.limit == "unsafe":  # (an escape its probes did not reach: unsafe, whatever the gate's options,
        # as where the probes reach it: no check after a sandbox limit, and no behaviour to lock)
        return failed_analysis(template, "unsafe", (f"rendering the agent session: {check.detail}",), seconds=a.seconds), None
    return a, check


def split_prefix_checks(results: Sequence) -> tuple[list[Analysis], tuple[PrefixStability, ...]]:
    """The Analyses and, for each, its PrefixStability ("not checked" where the check did not run:
    a sandbox limit in the analysis, or a worker that ended without a result), from the pairs (or, where the
    worker gave none, the failed Analysis alone) the target's workers returned."""
    plain, checks = [], []
    for r in results:
        a, check = r if isinstance(r, tuple) else (r, None)
        plain.append(a)
        checks.append(check if check is not None else
                      PrefixStability(NOT_CHECKED, detail=f"the analysis ended with status '{a.status}'"))
    return plain, tuple(checks)
