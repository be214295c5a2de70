"""Corpus audit: analyze many templates and report them as text, JSON, markdown or JUnit XML.

The audit is a thin layer: it runs `analyze` on each template (in worker processes when asked)
and formats the results. The JSON is exactly a list of `Analysis.to_dict()`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence
from xml.sax.saxutils import escape as xml_escape

from .analysis import Analysis
from .sources import ChatTemplate

# Statuses that make an audit fail (exit 1). 'unsupported' is reported but is not a failure:
# the template cannot render a basic chat, which is a fact about it, not a regression.
FAILING = frozenset({"fail", "error", "timeout", "memory", "unsafe"})


@dataclass(frozen=True)
class AuditReport:
    results: tuple[Analysis, ...]
    # Templates listed as expected failures (name -> reason), as given by the user.
    expected_failures: dict = field(default_factory=dict)
    # With a tokenizer: one TokenRoundTrip (or None: no tokenizer for it / analysis did not pass)
    # per result, in the same order.
    token_checks: tuple = ()

    def token_check(self, i: int):
        return self.token_checks[i] if i < len(self.token_checks) else None

    def failed(self, i: int) -> bool:
        a = self.results[i]
        tc = self.token_check(i)
        return a.status in FAILING or (tc is not None and not tc.passed)

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

    def to_dict(self) -> dict:
        return {"results": [self.result_dict(i) for i in range(len(self.results))], "counts": self.counts, "ok": self.ok}


def audit(
    templates: Sequence[ChatTemplate],
    *,
    jobs: int | None = 1,
    timeout: float | None = None,
    memory_mb: int | None = None,
    expected_failures: dict | None = None,
    tokenizer: str | None = None,
    progress: Callable[[int, int, Analysis], None] | None = None,
) -> AuditReport:
    """Analyze every template and collect the results in input order.

    `jobs=1` with no limits analyzes in this process; otherwise each template runs in a worker
    process with a wall-clock and memory limit (see tmplkit.isolate), `jobs` at a time.
    `tokenizer` (a path/spec for `load_tokenizer`, or "auto") adds the token-level round trip.

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

        kwargs = {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if memory_mb is not None:
            kwargs["memory_mb"] = memory_mb
        results = analyze_isolated(list(templates), jobs=jobs, progress=progress, **kwargs)
    checks = token_checks(results, tokenizer) if tokenizer else ()
    return AuditReport(tuple(results), dict(expected_failures or {}), checks)


def token_checks(results: Sequence[Analysis], tokenizer: str) -> tuple:
    """The token-level round trip of every passing analysis.

    `tokenizer="auto"` picks, per template, the GGUF the template came from, else the corpus
    vocab paired with the template's name (token_audit.VOCAB_FOR_TEMPLATE); templates with no
    tokenizer get None. Any other value is one tokenizer for all (see tokenize.load_tokenizer).
    """
    from .token_audit import token_round_trip, vocab_for_template
    from .tokenize import load_tokenizer

    opened: dict[str, object] = {}

    def get(spec: str):
        if spec not in opened:
            opened[spec] = load_tokenizer(spec)
        return opened[spec]

    out = []
    for a in results:
        spec: str | None = tokenizer
        if tokenizer == "auto":
            if a.source.lower().endswith(".gguf"):
                spec = a.source
            else:
                vocab = vocab_for_template(a.name)
                spec = f"vocab:{vocab}" if vocab else None
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
    so that every format agrees with the audit's exit code."""
    a = report.results[i]
    tc = report.token_check(i)
    if a.status == "pass" and tc is not None and not tc.passed:
        problems = tuple(f"token round trip ({tc.tokenizer}): {p}" for p in tc.problems) or ("token round trip failed",)
        return "fail", problems[0], problems
    return a.status, _why(a), a.errors + (a.round_trip.problems if a.round_trip else ())


def format_text(report: AuditReport) -> str:
    width = max([len(a.name) for a in report.results] + [8])
    lines = []
    for i, a in enumerate(report.results):
        tc = report.token_check(i)
        mark = _verdict(report, i)[0].upper()
        if a.name in report.expected_failures and report.failed(i):
            mark += " (expected)"
        detail = f"user={show(a.user_start)} assistant={show(a.assistant_start)} tool={show(a.tool_response_start)}"
        why = _why(a)
        lines.append(f"{mark:<16} {a.name:<{width}}  {why if why else detail}")
        pad = f"{'':<16} {'':<{width}}  "
        if tc is not None:
            verdict = "passed" if tc.passed else "FAILED: " + "; ".join(tc.problems[:2])
            lines.append(f"{pad}tokens ({tc.tokenizer}, {tc.n_tokens} ids): {verdict}")
        for w in a.warnings:
            lines.append(f"{pad}warning: {w}")
    lines.append(summary_line(report))
    for a in report.unexpected_passes:
        lines.append(f"note: {a.name} is listed as an expected failure but passes; remove it from the list")
    return "\n".join(lines) + "\n"


def summary_line(report: AuditReport) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items()))
    verdict = "ok" if report.ok else "FAILED"
    return f"{len(report.results)} templates: {counts} -> {verdict}"


def format_json(report: AuditReport) -> str:
    data = [report.result_dict(i) for i in range(len(report.results))]
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


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
    failures = sum(1 for v in verdicts if v[0] in FAILING)
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
                 "tool_response_start", "tool_response_next", "generation_prompt", "tool_placement")


def table_rows(results: Iterable[Analysis]) -> list[dict]:
    return [{c: getattr(a, c) for c in TABLE_COLUMNS} for a in results]


def format_table(results: Iterable[Analysis], fmt: str = "markdown") -> str:
    """The delimiter table, one row per template. CSV and JSON keep exact strings; markdown escapes."""
    rows = table_rows(results)
    if fmt == "json":
        return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    head = ["template", "status", "user", "assistant", "system", "tool response", "next tool response",
            "generation prompt", "tool placement"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], r["status"]] + [_md(r[c]) for c in TABLE_COLUMNS[2:8]] + [r["tool_placement"]]
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
