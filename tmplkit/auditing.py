"""Corpus audit: analyze many templates and report them as text, JSON, markdown or JUnit XML.

The audit is a thin layer: it runs `analyze` on each template (in worker processes when asked)
and formats the results. The JSON is one object: `schema_version` (JSON_SCHEMA_VERSION), the
`summary` and the `results`, each exactly `Analysis.to_dict()` (plus `token_round_trip` when a
tokenizer was given).

What ends an audit non-zero is `fail_on`: "fail" (a failing template, or a listed expected failure
that passes) or "warning" (also a template with a warning).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape as xml_escape

from .analysis import Analysis
from .config import FAIL_ON
from .sources import ChatTemplate

# Statuses that make an audit fail (exit 1). 'unsupported' is reported but is not a failure:
# the template cannot render a basic chat, which is a fact about it, not a regression.
FAILING = frozenset({"fail", "error", "timeout", "memory", "unsafe"})
# The audit JSON's layout; raised when a field is removed or changes meaning (adding one does not).
JSON_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class AuditReport:
    results: tuple[Analysis, ...]
    # Templates listed as expected failures (name -> reason), as given by the user.
    expected_failures: dict = field(default_factory=dict)
    # With a tokenizer: one TokenRoundTrip (or None: no tokenizer for it / analysis did not pass)
    # per result, in the same order.
    token_checks: tuple = ()
    # "fail": failing templates fail the audit; "warning": templates with warnings too.
    fail_on: str = "fail"

    def __post_init__(self):
        if self.fail_on not in FAIL_ON:
            from .errors import InputError

            raise InputError(f"fail_on must be one of {', '.join(FAIL_ON)}, got {self.fail_on!r}")

    def token_check(self, i: int):
        return self.token_checks[i] if i < len(self.token_checks) else None

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
        return [a for i, a in enumerate(self.results) if self.failed(i) and a.name not in self.expected_failures]

    @property
    def unexpected_passes(self) -> list[Analysis]:
        """Listed as expected failures, yet passing: the list must be updated."""
        return [a for i, a in enumerate(self.results)
                if a.status == "pass" and not self.failed(i) and a.name in self.expected_failures]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unexpected_passes

    def summary(self) -> dict:
        """The audit's outcome: counts by status and the names behind the verdict."""
        failing = [a.name for i, a in enumerate(self.results) if self.failed(i)]
        return {
            "templates": len(self.results),
            "counts": self.counts,
            "warnings": sum(len(a.warnings) for a in self.results),
            "failures": [a.name for a in self.failures],
            "expected_failures": [n for n in failing if n in self.expected_failures],
            "unexpected_passes": [a.name for a in self.unexpected_passes],
            "fail_on": self.fail_on,
            "ok": self.ok,
        }

    def to_dict(self) -> dict:
        """The audit JSON: {schema_version, tmplkit_version, summary, results}."""
        from . import __version__

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
    progress: Callable[[int, int, Analysis], None] | None = None,
) -> AuditReport:
    """Analyze every template and collect the results in input order.

    `jobs=1` with no limits analyzes in this process; otherwise each template runs in a worker
    process with a wall-clock and memory limit (see tmplkit.isolate), `jobs` at a time.
    `tokenizer` (a path/spec for `load_tokenizer`, or "auto") adds the token-level round trip;
    `tokenizers` pairs template names with tokenizers, ahead of `tokenizer`. `fail_on`: see
    AuditReport.

    >>> from tmplkit.sources import load
    >>> audit(load("fixtures/templates/chatml.jinja")).ok
    True
    """
    if jobs == 1 and timeout is None and memory_mb is None:
        from .analysis import analyze
        from .isolate import add_scan_warnings

        results = []
        for i, t in enumerate(templates):
            a = add_scan_warnings(analyze(t), t.text)
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
        results = analyze_isolated(list(templates), jobs=jobs, progress=progress, **kwargs)
    checks = token_checks(results, tokenizer, tokenizers) if tokenizer or tokenizers else ()
    return AuditReport(tuple(results), dict(expected_failures or {}), checks, fail_on)


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
    from .tokenize import load_tokenizer

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


def load_expected_failures(path) -> dict:
    """A JSON object {template name: reason}."""
    from .errors import InputError
    from .jsonio import read_json

    data = read_json(path, what="an expected-failures file (a JSON object of template name -> reason)")
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise InputError(f"{path}: the expected-failures file must be a JSON object of template name -> reason")
    return data


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
    """(status, why, all problems) of result i, with a failed token round trip counted as 'fail'
    and, with fail_on="warning", a pass with warnings as 'warning', so that every format agrees
    with the audit's exit code."""
    a = report.results[i]
    tc = report.token_check(i)
    if a.status == "pass" and tc is not None and not tc.passed:
        problems = tuple(f"token round trip ({tc.tokenizer}): {p}" for p in tc.problems) or ("token round trip failed",)
        return "fail", problems[0], problems
    if report.warned(i):
        return "warning", f"warning: {a.warnings[0]}", tuple(a.warnings)
    return a.status, _why(a), a.errors + (a.round_trip.problems if a.round_trip else ())


def _is_failure(status: str) -> bool:
    return status in FAILING or status == "warning"


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
    for i, a in enumerate(report.results):
        if verbosity < 0 and not (report.failed(i) and a.name not in report.expected_failures):
            continue
        lines.extend(_text_rows(report, i, width, color, verbosity))
    notes = [f"note: {a.name} is listed as an expected failure but passes; remove it from the list"
             for a in report.unexpected_passes]
    if verbosity < 0 and report.ok:
        return ""
    lines.append(summary_line(report, color=color))
    return "\n".join(lines + notes) + "\n"


def _text_rows(report: AuditReport, i: int, width: int, color: bool, verbosity: int) -> list[str]:
    a = report.results[i]
    tc = report.token_check(i)
    status, why, problems = _verdict(report, i)
    mark = status.upper()
    if a.name in report.expected_failures and report.failed(i):
        mark += " (expected)"
    mark = _paint(f"{mark:<16}", _MARK_COLORS.get(status, _FAIL_COLOR), color)
    detail = f"user={show(a.user_start)} assistant={show(a.assistant_start)} tool={show(a.tool_response_start)}"
    pad = f"{'':<16} {'':<{width}}  "
    if status != "warning":
        why = _why(a)  # a failed token round trip has its own row below
    rows = [f"{mark} {a.name:<{width}}  {why if why else detail}"]
    if tc is not None:
        verdict = "passed" if tc.passed else "FAILED: " + "; ".join(tc.problems[:2])
        rows.append(f"{pad}tokens ({tc.tokenizer}, {tc.n_tokens} ids): {verdict}")
    if status != "warning":  # a 'warning' row already names its warnings as problems
        rows += [f"{pad}warning: {w}" for w in a.warnings]
    if verbosity > 0:
        rows += [f"{pad}problem: {p}" for p in problems[1:]]
        rows += [f"{pad}{d.role}: {show(d.text)}" for d in a.delimiters]
        rows.append(f"{pad}{a.seconds:.3f} s")
    return rows


def summary_line(report: AuditReport, *, color: bool = False) -> str:
    """'N templates: counts -> ok|FAILED', the counts by analysis status."""
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items()))
    warned = sum(1 for i in range(len(report.results)) if report.warned(i))
    if warned:
        counts += f" ({warned} with warnings)"
    verdict = _paint("ok", "32", color) if report.ok else _paint("FAILED", _FAIL_COLOR, color)
    return f"{len(report.results)} templates: {counts} -> {verdict}"


def format_json(report: AuditReport) -> str:
    """The audit JSON (`AuditReport.to_dict()`)."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _md(text: str | None) -> str:
    return "`" + show(text).replace("|", "\\|").replace("`", "'") + "`" if text is not None else "-"


def format_markdown(report: AuditReport) -> str:
    lines = ["| template | status | tool placement | why |", "|---|---|---|---|"]
    for i, a in enumerate(report.results):
        status, why, _ = _verdict(report, i)
        lines.append(f"| {a.name} | {status} | {a.tool_placement} | {why.replace('|', '/')} |")
    lines += ["", summary_line(report)]
    return "\n".join(lines) + "\n"


def format_junit(report: AuditReport) -> str:
    verdicts = [_verdict(report, i) for i in range(len(report.results))]
    failures = sum(1 for v in verdicts if _is_failure(v[0]))
    skipped = sum(1 for v in verdicts if v[0] == "unsupported")
    total = sum(a.seconds for a in report.results)
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name="tmplkit-audit" tests="{len(report.results)}" failures="{failures}" '
        f'skipped="{skipped}" time="{total:.3f}">',
    ]
    quote = {chr(34): "&quot;"}
    for a, (status, why, problems) in zip(report.results, verdicts):
        attrs = f'classname="tmplkit.auditing" name="{xml_escape(a.name, quote)}" time="{a.seconds:.3f}"'
        if status == "pass":
            out.append(f"  <testcase {attrs}/>")
        elif status == "unsupported":
            out.append(f'  <testcase {attrs}><skipped message="{xml_escape(why, quote)}"/></testcase>')
        else:
            body = xml_escape("\n".join(problems))
            out.append(f'  <testcase {attrs}><failure type="{status}" message="{xml_escape(why, quote)}">{body}</failure></testcase>')
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
