"""Corpus audit: analyze many templates and report them as text, JSON, markdown or JUnit XML.

The audit is a thin layer: it runs `analyze` on each template (in worker processes when asked)
and formats the results. The JSON is one object: `schema_version` (JSON_SCHEMA_VERSION), the
`summary` and the `results`, each exactly `Analysis.to_dict()` (plus `token_round_trip` when a
tokenizer was given, and `prefix_stability`, a `PrefixStability.to_dict()`, when that check ran;
the summary then also has `prefix_stability`, `unstable`, `expected_unstable` and
`unexpected_stable`).

What ends an audit non-zero is `fail_on`: "fail" (a failing template, or a listed expected failure
that passes) or "warning" (also a template with a warning); and, with `prefix_stability="fail"`,
a template whose resumed agent session is not a prefix of what the server holds (unless listed as
{"name": {"unstable": "reason"}} in the expected failures, which then must stay unstable).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape as xml_escape

from ._version import __version__
from .analysis import Analysis
from .config import FAIL_ON, PREFIX_STABILITY
from .sources import ChatTemplate

# Statuses that make an audit fail (exit 1). 'unsupported' is reported but is not a failure:
# the template cannot render a basic chat, which is a fact about it, not a regression.
FAILING = frozenset({"fail", "error", "timeout", "memory", "unsafe"})
# The audit JSON's layout; raised when a field is removed or changes meaning (adding one does not).
JSON_SCHEMA_VERSION = 1
NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class PrefixStability:
    """Whether each request of a resumed agent session extends what the server holds (tmplkit.turns).

    `verdict`: "stable", "unstable", or "not applicable" (the analysis did not pass, the template
    cannot render the session, or the session has a single request; `detail` says why). When unstable: the first divergence's
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

    @property
    def label(self) -> str:
        return f"unstable ({self.cause})" if self.verdict == "unstable" else self.verdict

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "cause": self.cause, "request": self.request, "position": self.position,
                "n_requests": self.n_requests, "detail": self.detail, "seconds": round(self.seconds, 6)}


def _check_modes(fail_on: str, prefix_stability: str) -> None:
    from .errors import InputError

    if fail_on not in FAIL_ON:
        raise InputError(f"fail_on must be one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    if prefix_stability not in PREFIX_STABILITY:
        raise InputError(f"prefix_stability must be one of {', '.join(PREFIX_STABILITY)}, got {prefix_stability!r}")


@dataclass(frozen=True)
class AuditReport:
    results: tuple[Analysis, ...]
    # Templates listed as expected failures, as given by the user: name -> reason (its analysis
    # fails), or name -> {"fail": reason, "unstable": reason} (see `expected`).
    expected_failures: dict = field(default_factory=dict)
    # With a tokenizer: one TokenRoundTrip (or None: no tokenizer for it / analysis did not pass)
    # per result, in the same order.
    token_checks: tuple = ()
    # "fail": failing templates fail the audit; "warning": templates with warnings too.
    fail_on: str = "fail"
    # With the prefix-stability check: one PrefixStability per result, in the same order.
    prefix_checks: tuple = ()
    # "off" (not checked), "report" (a column only) or "fail" (unstable templates fail the audit).
    prefix_stability: str = "off"

    def __post_init__(self):
        _check_modes(self.fail_on, self.prefix_stability)

    def token_check(self, i: int):
        return self.token_checks[i] if i < len(self.token_checks) else None

    def prefix_check(self, i: int) -> PrefixStability | None:
        return self.prefix_checks[i] if i < len(self.prefix_checks) else None

    def expected(self, name: str, kind: str = "fail") -> str | None:
        """The reason `name` is listed as expected to `kind` ("fail" or "unstable"), or None."""
        entry = self.expected_failures.get(name)
        if isinstance(entry, str):  # the original format: {name: reason} is an expected failure
            return entry if kind == "fail" else None
        return entry.get(kind) if isinstance(entry, dict) else None

    def unstable(self, i: int) -> bool:
        """An unstable prefix, when the prefix-stability gate is on (prefix_stability="fail")."""
        check = self.prefix_check(i)
        return self.prefix_stability == "fail" and check is not None and check.verdict == "unstable"

    def counts_against(self, i: int) -> bool:
        """Result i fails the audit: it fails (or is unstable under the gate) and is not listed so."""
        name = self.results[i].name
        return ((self.failed(i) and self.expected(name) is None)
                or (self.unstable(i) and self.expected(name, "unstable") is None))

    def excused(self, i: int) -> bool:
        """Result i fails or is unstable under the gate, and the expected failures list it so."""
        return (self.failed(i) or self.unstable(i)) and not self.counts_against(i)

    def failed(self, i: int) -> bool:
        a = self.results[i]
        tc = self.token_check(i)
        return a.status in FAILING or (tc is not None and not tc.passed) or self.warned(i)

    def warned(self, i: int) -> bool:
        """A passing template with warnings, when warnings fail the audit (fail_on="warning")."""
        a = self.results[i]
        return self.fail_on == "warning" and a.status == "pass" and bool(a.warnings)

    def result_dict(self, i: int) -> dict:
        """`Analysis.to_dict()`, plus `token_round_trip` when a tokenizer was given."""
        d = self.results[i].to_dict()
        if self.token_checks:
            tc = self.token_check(i)
            d["token_round_trip"] = tc.to_dict() if tc is not None else None
        if self.prefix_checks:
            d["prefix_stability"] = self.prefix_checks[i].to_dict()
        return d

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.results:
            out[a.status] = out.get(a.status, 0) + 1
        return out

    @property
    def failures(self) -> list[Analysis]:
        """Failing results (analysis or token round trip) that are not listed as expected failures."""
        return [a for i, a in enumerate(self.results) if self.counts_against(i)]

    @property
    def unexpected_passes(self) -> list[Analysis]:
        """Listed as expected failures, yet passing: the list must be updated."""
        return [a for i, a in enumerate(self.results)
                if a.status == "pass" and not self.failed(i) and self.expected(a.name) is not None]

    @property
    def unexpected_stable(self) -> list[Analysis]:
        """Under the gate, listed as unstable, yet passing with a prefix that is not unstable (now
        stable, or not applicable): the list must be updated."""
        if self.prefix_stability != "fail":
            return []
        return [a for a, c in zip(self.results, self.prefix_checks)
                if a.status == "pass" and self.expected(a.name, "unstable") is not None and c.verdict != "unstable"]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unexpected_passes and not self.unexpected_stable

    def summary(self) -> dict:
        """The audit's outcome: counts by status and the names behind the verdict."""
        names = [a.name for a in self.results]
        out = {
            "templates": len(self.results),
            "counts": self.counts,
            "warnings": sum(len(a.warnings) for a in self.results),
            "failures": [a.name for a in self.failures],
            "expected_failures": [n for i, n in enumerate(names) if self.failed(i) and self.expected(n) is not None],
            "unexpected_passes": [a.name for a in self.unexpected_passes],
            "fail_on": self.fail_on,
        }
        if self.prefix_checks:  # only when checked, so that an audit without it keeps its summary
            out.update({
                "prefix_stability": self.prefix_stability,
                "unstable": [n for n, c in zip(names, self.prefix_checks) if c.verdict == "unstable"],
                "expected_unstable": [n for i, n in enumerate(names)
                                      if self.unstable(i) and self.expected(n, "unstable") is not None],
                "unexpected_stable": [a.name for a in self.unexpected_stable],
            })
        out["ok"] = self.ok
        return out

    def to_dict(self) -> dict:
        """The audit JSON: {schema_version, tmplkit_version, summary, results}."""
        return {"schema_version": JSON_SCHEMA_VERSION, "tmplkit_version": __version__, "summary": self.summary(),
                "results": [self.result_dict(i) for i in range(len(self.results))]}


def audit(
    templates: Sequence[ChatTemplate],
    *,
    jobs: int | None = 1,
    timeout: float | None = None,
    memory_mb: int | None = None,
    expected_failures: dict | None = None,
    tokenizer: str | None = None,
    tokenizers: Mapping[str, str] | None = None,
    fail_on: str = "fail",
    prefix_stability: str = "off",
    session=None,
    progress: Callable[[int, int, Analysis], None] | None = None,
) -> AuditReport:
    """Analyze every template and collect the results in input order.

    `jobs=1` with no limits analyzes in this process; otherwise each template runs in a worker
    process with a wall-clock and memory limit (see tmplkit.isolate), `jobs` at a time.
    `tokenizer` (a path/spec for `load_tokenizer`, or "auto") adds the token-level round trip;
    `tokenizers` pairs template names with tokenizers, ahead of `tokenizer`. `fail_on`: see
    AuditReport. `prefix_stability` "report" or "fail" adds the prefix-stability check of each
    passing template over `session` (a `Session`; default `default_turns_session()`), run in the
    same worker as its analysis and under the same limits; "fail" makes an unstable one fail.

    >>> from tmplkit.sources import load
    >>> audit(load("fixtures/templates/chatml.jinja")).ok
    True
    """
    _check_modes(fail_on, prefix_stability)  # before any work
    target = None
    if prefix_stability != "off":
        session = session if session is not None else default_turns_session()
        _check_session(session)
        target = functools.partial(analyze_with_prefix_stability, session=session)
    if jobs == 1 and timeout is None and memory_mb is None:
        from .analysis import analyze
        from .isolate import add_scan_warnings

        results = []
        for i, t in enumerate(templates):
            a = add_scan_warnings((target or analyze)(t), t.text)
            results.append(a)
            if progress:
                progress(i + 1, len(templates), a)
    else:
        from .isolate import analyze_isolated

        kwargs: dict = {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if memory_mb is not None:
            kwargs["memory_mb"] = memory_mb
        results = analyze_isolated(list(templates), jobs=jobs, progress=progress, target=target, **kwargs)
    prefix: tuple[PrefixStability, ...] = ()
    if target is not None:
        results, prefix = _split_prefix_checks(results)
    checks = token_checks(results, tokenizer, tokenizers) if tokenizer or tokenizers else ()
    return AuditReport(tuple(results), dict(expected_failures or {}), checks, fail_on, prefix, prefix_stability)


# ---- prefix stability ----------------------------------------------------------------------------

def default_turns_session():
    """The session the prefix-stability check renders unless given one: a generated agent session
    (seed 0) of three user requests with reasoning, parallel tool calls and long tool outputs."""
    from .session import generate_session

    return generate_session(20000, seed=0, style="agent", requests=3)


def _check_session(session) -> None:
    """Refuse a session without a request here, before the workers would make it every template's error."""
    from .errors import InputError
    from .turns import request_points

    if not request_points(list(session.messages)):
        raise InputError(f"{getattr(session, 'source', '') or 'the session'}: no request in the session (the model "
                         "speaks after a user message or tool results); add a user message")


def prefix_stability_of(template: ChatTemplate, session=None) -> PrefixStability:
    """Whether `session` (default `default_turns_session()`), resumed request by request on
    `template`, always extends what the server holds; see tmplkit.turns.study_turns.

    >>> from tmplkit.sources import load_one
    >>> prefix_stability_of(load_one("fixtures/turns/drops-reasoning.jinja")).label
    'unstable (reasoning dropped)'
    """
    import time

    from .turns import study_turns

    start = time.perf_counter()
    report = study_turns(template, session if session is not None else default_turns_session(), switches=False)
    took = time.perf_counter() - start
    if report.error:
        return PrefixStability(NOT_APPLICABLE, n_requests=report.n_requests, detail=_bounded(report.error), seconds=took)
    if report.n_requests < 2:  # nothing is resumed, so "stable" would say nothing
        return PrefixStability(NOT_APPLICABLE, n_requests=report.n_requests, seconds=took,
                               detail="the session has one request: nothing is resumed")
    first = report.first
    if first is None:
        return PrefixStability("stable", n_requests=report.n_requests, seconds=took)
    return PrefixStability("unstable", first.cause, first.request, first.position, report.n_requests,
                           _bounded(first.detail), took)


def _bounded(text: str, limit: int = 500) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class _WithPrefixStability(Analysis):
    """An Analysis that carries its prefix-stability verdict out of the worker process (a worker's
    target must return an Analysis); `_split_prefix_checks` takes the two apart again."""

    prefix_stability: PrefixStability | None = None


def analyze_with_prefix_stability(template: ChatTemplate, session=None) -> Analysis:
    """A worker target (tmplkit.isolate): the analysis, then, if it passed, the prefix-stability
    check, in the same sandboxed process and under the same limits, since both render the template."""
    from .analysis import analyze

    a = analyze(template)
    check = prefix_stability_of(template, session) if a.status == "pass" else None
    return _WithPrefixStability(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Analysis)},
                                prefix_stability=check)


def _split_prefix_checks(results: Sequence[Analysis]) -> tuple[list[Analysis], tuple[PrefixStability, ...]]:
    """Plain Analyses and, for each, its PrefixStability ("not applicable" where the analysis did not
    pass or the worker ended without a result: a timeout, a crash)."""
    plain, checks = [], []
    for a in results:
        check = getattr(a, "prefix_stability", None)
        plain.append(Analysis(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Analysis)}))
        checks.append(check if check is not None else
                      PrefixStability(NOT_APPLICABLE, detail=f"the analysis ended with status '{a.status}'"))
    return plain, tuple(checks)


def tokenizer_for(name: str, source: str, tokenizer: str | None, tokenizers: Mapping[str, str] | None = None) -> str | None:
    """The tokenizer spec the token round trip uses for the template `name` read from `source`.

    The pairing `tokenizers` (template name -> spec) first; then `tokenizer`: "auto" is the GGUF
    the template came from, else the corpus vocab paired with its name
    (token_audit.VOCAB_FOR_TEMPLATE), else None; any other value is one tokenizer for all.

    >>> tokenizer_for("x", "x.jinja", "auto", {"x": "vocab:qwen35"}), tokenizer_for("y", "m.gguf", "auto")
    ('vocab:qwen35', 'm.gguf')
    """
    if tokenizers and name in tokenizers:
        return tokenizers[name]
    if tokenizer != "auto":
        return tokenizer
    if source.lower().endswith(".gguf"):
        return source
    from .token_audit import vocab_for_template

    vocab = vocab_for_template(name)
    return f"vocab:{vocab}" if vocab else None


def token_checks(results: Sequence[Analysis], tokenizer: str | None, tokenizers: Mapping[str, str] | None = None) -> tuple:
    """The token-level round trip of every passing analysis with a tokenizer (see `tokenizer_for`);
    None for the others."""
    from .token_audit import token_round_trip
    from .tokenizers import load_tokenizer

    opened: dict[str, object] = {}

    def get(spec: str):
        if spec not in opened:
            opened[spec] = load_tokenizer(spec)
        return opened[spec]

    out = []
    for a in results:
        spec = tokenizer_for(a.name, a.source, tokenizer, tokenizers)
        out.append(token_round_trip(a, get(spec)) if spec and a.status == "pass" else None)
    return tuple(out)


# ---- formats ---------------------------------------------------------------------------------

def show(text: str | None) -> str:
    """A delimiter as one readable line: newlines and tabs escaped, None as '-'."""
    if text is None:
        return "-"
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _why(a: Analysis) -> str:
    if a.status == "pass":
        return ""
    reasons = list(a.errors) or (list(a.round_trip.problems) if a.round_trip else [])
    return reasons[0] if reasons else a.status


def _verdict(report: AuditReport, i: int) -> tuple[str, str, tuple[str, ...]]:
    """(status, why, all problems) of result i, with a failed token round trip counted as 'fail',
    an unstable prefix under the gate as 'unstable' and, with fail_on="warning", a pass with
    warnings as 'warning', so that every format agrees with the audit's exit code."""
    a = report.results[i]
    tc = report.token_check(i)
    if a.status == "pass" and tc is not None and not tc.passed:
        problems = tuple(f"token round trip ({tc.tokenizer}): {p}" for p in tc.problems) or ("token round trip failed",)
        return "fail", problems[0], problems
    if a.status == "pass" and report.unstable(i):
        check = report.prefix_checks[i]
        why = f"prefix unstable at request {check.request}: {check.cause}"
        return "unstable", why, (why + (f" ({check.detail})" if check.detail else ""),)
    if report.warned(i):
        return "warning", f"warning: {a.warnings[0]}", tuple(a.warnings)
    return a.status, _why(a), a.errors + (a.round_trip.problems if a.round_trip else ())


def _is_failure(status: str) -> bool:
    return status in FAILING or status in ("warning", "unstable")


# ANSI SGR codes of the text report's marks (used with color=True only).
_MARK_COLORS = {"pass": "32", "unsupported": "33", "warning": "33"}
_FAIL_COLOR = "31"


def _paint(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color else text


def format_text(report: AuditReport, *, color: bool = False, verbosity: int = 0) -> str:
    """One line per template and the summary. `verbosity` -1 (quiet): only the templates that
    fail the audit, and nothing when it passes; 1 (verbose): every problem, every delimiter and
    each template's time. `color`: ANSI colours on the status marks and the verdict."""
    width = max([len(a.name) for a in report.results] + [8])
    lines = []
    for i in range(len(report.results)):
        if verbosity < 0 and not report.counts_against(i):
            continue
        lines.extend(_text_rows(report, i, width, color, verbosity))
    notes = [f"note: {a.name} is listed as an expected failure but passes; remove it from the list"
             for a in report.unexpected_passes]
    verdicts = {a.name: c.verdict for a, c in zip(report.results, report.prefix_checks)}
    notes += [f"note: {a.name} is listed as unstable but is {verdicts[a.name]}; remove it from the list"
              for a in report.unexpected_stable]
    if verbosity < 0 and report.ok:
        return ""
    lines.append(summary_line(report, color=color))
    return "\n".join(lines + notes) + "\n"


def _text_rows(report: AuditReport, i: int, width: int, color: bool, verbosity: int) -> list[str]:
    a = report.results[i]
    tc = report.token_check(i)
    status, why, problems = _verdict(report, i)
    mark = status.upper()
    if report.excused(i):
        mark += " (expected)"
    mark = _paint(f"{mark:<16}", _MARK_COLORS.get(status, _FAIL_COLOR), color)
    detail = f"user={show(a.user_start)} assistant={show(a.assistant_start)} tool={show(a.tool_response_start)}"
    check = report.prefix_check(i)
    # The prefix-stability column, as wide as its longest label (absent when not checked).
    column = f"{check.label:<{max(len(c.label) for c in report.prefix_checks)}}  " if check is not None else ""
    pad = f"{'':<16} {'':<{width}}  {'':<{len(column)}}"
    if status not in ("warning", "unstable"):
        why = _why(a)  # a failed token round trip has its own row below
    rows = [f"{mark} {a.name:<{width}}  {column}{why if why else detail}"]
    if tc is not None:
        verdict = "passed" if tc.passed else "FAILED: " + "; ".join(tc.problems[:2])
        rows.append(f"{pad}tokens ({tc.tokenizer}, {tc.n_tokens} ids): {verdict}")
    if status != "warning":  # a 'warning' row already names its warnings as problems
        rows += [f"{pad}warning: {w}" for w in a.warnings]
    if verbosity > 0:
        rows += [f"{pad}problem: {p}" for p in problems[1:]]
        if check is not None and (check.detail or check.verdict == "unstable"):
            where = f"request {check.request}, character {check.position}: " if check.verdict == "unstable" else ""
            rows.append(f"{pad}prefix stability: {where}{check.detail or check.cause}")
        if check is not None:
            rows.append(f"{pad}prefix stability checked in {check.seconds:.3f} s")
        rows += [f"{pad}{d.role}: {show(d.text)}" for d in a.delimiters]
        rows.append(f"{pad}{a.seconds:.3f} s")
    return rows


def summary_line(report: AuditReport, *, color: bool = False) -> str:
    """'N templates: counts -> ok|FAILED', the counts by analysis status (and by prefix-stability
    verdict, when checked)."""
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items()))
    warned = sum(1 for i in range(len(report.results)) if report.warned(i))
    if warned:
        counts += f" ({warned} with warnings)"
    if report.prefix_checks:
        verdicts: dict[str, int] = {}
        for c in report.prefix_checks:
            verdicts[c.verdict] = verdicts.get(c.verdict, 0) + 1
        counts += "; prefix: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
    verdict = _paint("ok", "32", color) if report.ok else _paint("FAILED", _FAIL_COLOR, color)
    return f"{len(report.results)} templates: {counts} -> {verdict}"


def format_json(report: AuditReport) -> str:
    """The audit JSON (`AuditReport.to_dict()`)."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _md(text: str | None) -> str:
    return "`" + show(text).replace("|", "\\|").replace("`", "'") + "`" if text is not None else "-"


def format_markdown(report: AuditReport) -> str:
    checked = bool(report.prefix_checks)
    stability = " prefix stability |" if checked else ""
    lines = [f"| template | status |{stability} tool placement | why |", "|---|---|" + "---|" * (2 + checked)]
    for i, a in enumerate(report.results):
        status, why, _ = _verdict(report, i)
        cell = f" {report.prefix_checks[i].label} |" if checked else ""
        lines.append(f"| {a.name} | {status} |{cell} {a.tool_placement} | {why.replace('|', '/')} |")
    lines += ["", summary_line(report)]
    return "\n".join(lines) + "\n"


def format_junit(report: AuditReport) -> str:
    verdicts = [_verdict(report, i) for i in range(len(report.results))]
    failures = sum(1 for v in verdicts if _is_failure(v[0]))
    skipped = sum(1 for v in verdicts if v[0] == "unsupported")
    # A test case's time is its analysis and, when checked, its prefix-stability check.
    times = [a.seconds + getattr(report.prefix_check(i), "seconds", 0.0) for i, a in enumerate(report.results)]
    total = sum(times)
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name="tmplkit-audit" tests="{len(report.results)}" failures="{failures}" '
        f'skipped="{skipped}" time="{total:.3f}">',
    ]
    quote = {chr(34): "&quot;"}
    for i, (a, (status, why, problems)) in enumerate(zip(report.results, verdicts)):
        attrs = f'classname="tmplkit.auditing" name="{xml_escape(a.name, quote)}" time="{times[i]:.3f}"'
        check = report.prefix_check(i)
        # The prefix-stability column: a testcase property (JUnit's per-test key/value).
        inner = (f'<properties><property name="prefix_stability" value="{xml_escape(check.label, quote)}"/></properties>'
                 if check is not None else "")
        if status == "unsupported":
            inner += f'<skipped message="{xml_escape(why, quote)}"/>'
        elif status != "pass":
            body = xml_escape("\n".join(problems))
            inner += f'<failure type="{status}" message="{xml_escape(why, quote)}">{body}</failure>'
        out.append(f"  <testcase {attrs}>{inner}</testcase>" if inner else f"  <testcase {attrs}/>")
    out.append("</testsuite>")
    return "\n".join(out) + "\n"


AUDIT_FORMATS: dict[str, Callable[[AuditReport], str]] = {
    "text": format_text,
    "json": format_json,
    "markdown": format_markdown,
    "junit": format_junit,
}


# ---- the delimiter table ------------------------------------------------------------------------

TABLE_COLUMNS = ("name", "status", "user_start", "assistant_start", "system_start",
                 "tool_response_start", "tool_response_next", "generation_prompt", "tool_placement",
                 "reasoning_start", "reasoning_end", "generation_reasoning")


def table_rows(results: Iterable[Analysis]) -> list[dict]:
    return [{c: getattr(a, c) for c in TABLE_COLUMNS} for a in results]


def format_table(results: Iterable[Analysis], fmt: str = "markdown") -> str:
    """The delimiter table, one row per template. CSV and JSON keep exact strings; markdown escapes."""
    rows = table_rows(results)
    if fmt == "json":
        return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    for r in rows:  # one cell: how the generation prompt treats reasoning, per thinking-switch setting
        r["generation_reasoning"] = " ".join(f"{k}:{v}" for k, v in r["generation_reasoning"].items()) or None
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    head = ["template", "status", "user", "assistant", "system", "tool response", "next tool response",
            "generation prompt", "tool placement", "reasoning", "reasoning end", "generation reasoning"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([r["name"], r["status"]] + [_md(r[c]) for c in TABLE_COLUMNS[2:8]] + [r["tool_placement"]]
                 + [_md(r[c]) for c in TABLE_COLUMNS[9:]])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


TABLE_FORMATS = ("markdown", "csv", "json")


# ---- a conversation with its spans marked, for a person to read -----------------------------------

_COLORS = {"system": "35", "user": "32", "assistant": "34", "tool": "33"}


def format_show(analysis: Analysis, color: bool = False) -> str:
    """The round-trip conversation as the template renders it, each span introduced by a marker
    line naming its role; the delimiter is highlighted where the terminal allows."""
    from .spans import split_text

    rt = analysis.round_trip
    if rt is None or not rt.rendered:
        why = "; ".join(analysis.errors) or "nothing was rendered"
        return f"{analysis.name}: no rendered conversation to show ({why})\n"
    text = rt.rendered
    spans = split_text(text, analysis.delimiters)
    out = [f"# {analysis.name}: {len(spans)} spans, round trip {'passed' if rt.passed else 'FAILED'}"]
    if spans and spans[0].start > 0:
        out.append("--- (before the first delimiter: no span) ---")
        out.append(text[: spans[0].start])
    for i, sp in enumerate(spans):
        body = text[sp.start:sp.end]
        delim = next((d for d in analysis.delimiters if body.startswith(d.text) and d.role == sp.role), None)
        head = f"--- [{i}] {sp.role} @ {sp.start}..{sp.end} ---"
        if color:
            head = f"\x1b[1;{_COLORS.get(sp.role, '0')}m{head}\x1b[0m"
        out.append(head)
        if delim is not None and color:
            body = f"\x1b[7m{delim.text}\x1b[0m" + body[len(delim.text):]
        out.append(body)
    for p in rt.problems:
        out.append(f"problem: {p}")
    return "\n".join(out).rstrip("\n") + "\n"
