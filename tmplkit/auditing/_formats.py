"""The audit's report formats (text, JSON, markdown, JUnit XML), the delimiter table, and a
conversation with its spans marked for a person to read. Every format shows the gate's verdict.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from xml.sax.saxutils import escape as _sax_escape

from .._version import __version__
from ..analysis import Analysis
from ..delimiters import split_text
from ..errors import escape_controls, one_line
from ._choices import AUDIT_FORMAT_NAMES
from ._gate import AuditReport, first_reason, is_failure, verdict_of
from ._prefix import NOT_APPLICABLE
from ._summary import format_summary

__all__ = ["AUDIT_FORMATS", "TABLE_COLUMNS", "TABLE_SCHEMA_VERSION", "format_json", "format_junit", "format_markdown", "format_show",
           "format_table", "format_text", "format_github", "junit_error", "show", "summary_line", "table_rows", "unrendered_reason"]


# Characters XML 1.0 cannot hold at all, even escaped (a template's raise_exception can carry them).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def xml_escape(text: str, entities: dict | None = None) -> str:
    """`text` for an XML attribute or element: escaped, and what XML cannot hold written as `\\xNN`
    (a JUnit report stays XML whatever a template's name or message holds)."""
    text = _NOT_XML.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", text)
    return _sax_escape(text, entities or {})


def show(text: str | None) -> str:
    """A delimiter as one readable line: newlines and tabs escaped, and the control characters a
    terminal would act on (a template's text is untrusted), None as '-'."""
    if text is None:
        return "-"
    return escape_controls(text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))


# ANSI SGR codes of the text report's marks (used with color=True only).
_MARK_COLORS = {"pass": "32", "warning": "33"}
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
    notes = report.list_notes()
    if verbosity < 0 and report.ok:
        return ""
    lines.append(summary_line(report, color=color))
    return "\n".join(lines + notes) + "\n"


def _text_rows(report: AuditReport, i: int, width: int, color: bool, verbosity: int) -> list[str]:
    a = report.results[i]
    tc = report.token_check(i)
    status, why, problems = verdict_of(report, i)
    mark = status.upper()
    if report.excused(i):
        mark += " (expected)"
    marks = _mark_width(report)  # as wide as the widest mark ('UNSUPPORTED (expected)')
    mark = _paint(f"{mark:<{marks}}", _MARK_COLORS.get(status, _FAIL_COLOR), color)
    detail = f"user={show(a.user_start)} assistant={show(a.assistant_start)} tool={show(a.tool_response_start)}"
    check = report.prefix_check(i)
    # The prefix-stability column, as wide as its longest label (absent when not checked).
    column = f"{check.label:<{max(len(c.label) for c in report.prefix_checks)}}  " if check is not None else ""
    pad = f"{'':<{marks}} {'':<{width}}  {'':<{len(column)}}"
    if status not in ("warning", "unstable", "unchecked"):
        why = first_reason(a)  # a failed token round trip has its own row below
    rows = [f"{mark} {a.name:<{width}}  {column}{why if why else detail}"]
    if tc is not None:
        verdict = "passed" if tc.passed else "FAILED: " + "; ".join(tc.problems[:2])
        rows.append(f"{pad}tokens ({tc.tokenizer}, {tc.n_tokens} ids): {verdict}")
    if status != "warning":  # a 'warning' row already names its warnings as problems
        rows += [f"{pad}warning: {w}" for w in a.warnings]
    if status != "unchecked":  # a check that did not run is said on every pass it leaves unproved
        rows += [f"{pad}not checked: {r}" for r in report.unchecked(i)]
    if check is not None and check.verdict == NOT_APPLICABLE and check.detail and verbosity <= 0:
        rows.append(f"{pad}prefix stability not applicable: {check.detail}")  # (why, where it is no verdict)
    if verbosity > 0:
        rows += [f"{pad}problem: {p}" for p in problems[1:]]
        if check is not None and (check.detail or check.verdict == "unstable"):
            where = f"request {check.request}, character {check.position}: " if check.verdict == "unstable" else ""
            rows.append(f"{pad}prefix stability: {where}{check.detail or check.cause}")
        if check is not None:
            rows.append(f"{pad}prefix stability checked in {check.seconds:.3f} s")
        rows += [f"{pad}{d.role}: {show(d.text)}" for d in a.delimiters]
        rows.append(f"{pad}{a.seconds:.3f} s")
    # (a template's words in any row: its control characters shown, not run; the mark's colour is this report's)
    return [f"{mark} {escape_controls(rows[0][len(mark) + 1:])}"] + [escape_controls(r) for r in rows[1:]]


def _mark_width(report: AuditReport) -> int:
    """The status column's width: 16, or the widest mark of the report's rows."""
    return max([16] + [len(verdict_of(report, i)[0]) + len(" (expected)") for i in range(len(report.results)) if report.excused(i)])


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
    if report.token_checks:  # the token round trip: what it proved, and where it did not run
        tokens = report.token_counts()
        counts += f"; token round trip: {tokens['passed']} passed, {tokens['failed']} failed, {tokens['not_run']} not run"
    verdict = _paint("ok", "32", color) if report.ok else _paint("FAILED", _FAIL_COLOR, color)
    n = len(report.results)
    return f"{n} template{'' if n == 1 else 's'}: {counts} -> {verdict}"


def format_json(report: AuditReport) -> str:
    """The audit JSON (`AuditReport.to_dict()`)."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _md(text: str | None) -> str:
    return "`" + show(text).replace("|", "\\|").replace("`", "'") + "`" if text is not None else "-"


def _name_cell(name: str) -> str:
    """A template's name in a markdown table: a `|` or a line break in it would end the row."""
    return one_line(name.replace("|", "\\|"))


def format_markdown(report: AuditReport) -> str:
    checked = bool(report.prefix_checks)
    stability = " prefix stability |" if checked else ""
    lines = [f"| template | status |{stability} tool placement | why |", "|---|---|" + "---|" * (2 + checked)]
    for i, a in enumerate(report.results):
        status, why, _ = verdict_of(report, i)
        cell = f" {report.prefix_checks[i].label} |" if checked else ""
        lines.append(f"| {_name_cell(a.name)} | {status} |{cell} {a.tool_placement} | {why.replace('|', '/')} |")
    lines += ["", summary_line(report)]
    return "\n".join(lines) + "\n"


def format_junit(report: AuditReport) -> str:
    verdicts = [verdict_of(report, i) for i in range(len(report.results))]
    failures = sum(1 for v in verdicts if is_failure(v[0])) + len(report.checks)
    # A test case's time is its analysis and, when checked, its prefix-stability check.
    times = [a.seconds + getattr(report.prefix_check(i), "seconds", 0.0) for i, a in enumerate(report.results)]
    total = sum(times)
    skipped = _skipped_checks(report)
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name="tmplkit-audit" tests="{len(report.results) + len(report.checks) + len(skipped)}" '
        f'failures="{failures}" skipped="{len(skipped)}" time="{total:.3f}">',
    ]
    quote = {chr(34): "&quot;"}
    for i, (a, (status, why, problems)) in enumerate(zip(report.results, verdicts)):
        attrs = f'classname="tmplkit.auditing" name="{xml_escape(a.name, quote)}" time="{times[i]:.3f}"'
        check = report.prefix_check(i)
        # The prefix-stability column: a testcase property (JUnit's per-test key/value).
        inner = (f'<properties><property name="prefix_stability" value="{xml_escape(check.label, quote)}"/></properties>'
                 if check is not None else "")
        if status != "pass":
            body = xml_escape("\n".join(problems))
            inner += f'<failure type="{status}" message="{xml_escape(why, quote)}">{body}</failure>'
        out.append(f"  <testcase {attrs}>{inner}</testcase>" if inner else f"  <testcase {attrs}/>")
    for kind, name, _, message in report.checks:  # a lock's or an upstream's check that failed: a case of its own
        out.append(f'  <testcase classname="tmplkit.{kind.lower()}" name="{xml_escape(name, quote)}" time="0.000">'
                   f'<failure type="{kind.lower()}" message="{xml_escape(message, quote)}"/></testcase>')
    for name, what, why in skipped:  # a check asked for that did not run: skipped, never a silent pass
        out.append(f'  <testcase classname="tmplkit.auditing" name="{xml_escape(f"{name}: {what}", quote)}" '
                   f'time="0.000"><skipped message="{xml_escape(why, quote)}"/></testcase>')
    out.append("</testsuite>")
    return "\n".join(out) + "\n"


def _skipped_checks(report: AuditReport) -> list[tuple[str, str, str]]:
    """(template, check, why) for each check asked for that did not run on a template the audit
    passes (where that fails the audit, `--fail-on unchecked`, the template's case says so)."""
    out = []
    for i, a in enumerate(report.results):
        if not report.counts_against(i):
            out += [(a.name, check, f"{check} {why}") for check, why in report.unchecked_checks(i)]
    return out


def junit_error(message: str) -> str:
    """The JUnit report of an audit that could not run (bad input: exit 2): one test case in
    error, with the one-line message, so that a CI reading the report says why instead of
    finding no file."""
    quote = {chr(34): "&quot;"}
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<testsuite name="tmplkit-audit" tests="1" failures="0" errors="1" skipped="0" time="0.000">',
        f'  <testcase classname="tmplkit.auditing" name="tmplkit audit" time="0.000"><error type="input" '
        f'message="{xml_escape(message, quote)}">{xml_escape(message)}</error></testcase>',
        "</testsuite>",
    ]) + "\n"


# ---- GitHub Actions annotations ------------------------------------------------------------------

def _gh(text: str, prop: bool = False) -> str:
    """Escaped for a workflow command (actions/toolkit's escapeData / escapeProperty)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def _gh_file(source: str) -> str | None:
    """The file an annotation goes on: the template's file, relative to the working folder (the
    repository's root in a workflow); None for sources that are no file of it (hf:, corpus:, -)."""
    import os

    if not source or source == "-" or source.startswith(("hf:", "corpus:", "<")):
        return None
    path = os.path.abspath(source)
    here = os.getcwd()
    if os.path.commonpath([path, here]) != here:
        return None  # outside the repository (a cache, another checkout): the log still names it
    return os.path.relpath(path, here)


def _annotation(kind: str, source: str, title: str, message: str) -> str:
    file = _gh_file(source)
    props = ([f"file={_gh(file, True)}"] if file else []) + [f"title={_gh(title, True)}"]
    return f"::{kind} {','.join(props)}::{_gh(message)}"


def format_github(report: AuditReport) -> str:
    """GitHub Actions workflow commands, one a line, then the summary: `::error` on the file of each
    template that fails the audit (its verdict and why), `::warning` for each warning of a template
    that passes and each check asked for that did not run on it, `::notice` for a listed failure
    that now passes. The job log shows each line and
    the pull request shows them on the template files."""
    lines = []
    for i, a in enumerate(report.results):
        status, why, _ = verdict_of(report, i)
        if report.counts_against(i):
            lines.append(_annotation("error", a.source, f"tmplkit: {a.name} {status}", f"{a.name}: {why or status}"))
        elif not report.failed(i):
            lines += [_annotation("warning", a.source, f"tmplkit: {a.name} warning", f"{a.name}: {w}") for w in a.warnings]
            lines += [_annotation("warning", a.source, f"tmplkit: {a.name} not checked", f"{a.name}: {why}")
                      for why in report.unchecked(i)]
    for a in [*report.unexpected_passes, *report.unexpected_stable]:
        lines.append(_annotation("notice", a.source, f"tmplkit: {a.name} listed", f"{a.name} is listed in the expected "
                                 "failures but does not fail that way; remove it from the list"))
    return "\n".join(lines + [summary_line(report)]) + "\n"


AUDIT_FORMATS: dict[str, Callable[[AuditReport], str]] = {
    "text": format_text,
    "json": format_json,
    "markdown": format_markdown,
    "junit": format_junit,
    "github": format_github,
    "summary": format_summary,
}
if tuple(AUDIT_FORMATS) != AUDIT_FORMAT_NAMES:  # the command line lists the names without loading this module
    raise AssertionError(f"AUDIT_FORMATS {tuple(AUDIT_FORMATS)} is not _choices.AUDIT_FORMAT_NAMES")


# ---- the delimiter table ------------------------------------------------------------------------

# The table JSON's layout (tmplkit/schemas/table.schema.json); raised as the audit's is. 2: a row that
# did not pass has null delimiters (1 listed them, unproven) and a `reason`.
TABLE_SCHEMA_VERSION = 2
TABLE_COLUMNS = ("name", "status", "reason", "user_start", "assistant_start", "system_start",
                 "tool_response_start", "tool_response_next", "generation_prompt", "tool_placement",
                 "reasoning_start", "reasoning_end", "generation_reasoning")
# The columns a template's analysis proves: shown only where it passed (a failing template's
# delimiters were not proved, and a table must not list them as if they held).
_PROVED = TABLE_COLUMNS[3:9] + TABLE_COLUMNS[10:12]


def table_rows(results: Iterable[Analysis]) -> list[dict]:
    rows = []
    for a in results:
        row = {c: getattr(a, c) for c in TABLE_COLUMNS if c != "reason"}
        row["reason"] = first_reason(a)
        if a.status != "pass":
            row |= {c: None for c in _PROVED} | {"generation_reasoning": {}}
        rows.append({c: row[c] for c in TABLE_COLUMNS})
    return rows


def format_table(results: Iterable[Analysis], fmt: str = "markdown") -> str:
    """The delimiter table, one row per template. CSV and JSON keep exact strings; markdown escapes.
    The JSON is {schema_version, tmplkit_version, rows}."""
    rows = table_rows(results)
    if fmt == "json":
        table = {"schema_version": TABLE_SCHEMA_VERSION, "tmplkit_version": __version__, "rows": rows}
        return json.dumps(table, indent=2, ensure_ascii=False) + "\n"
    for r in rows:  # one cell: how the generation prompt treats reasoning, per thinking-switch setting
        r["generation_reasoning"] = " ".join(f"{k}:{v}" for k, v in r["generation_reasoning"].items()) or None
    if fmt == "csv":
        buf = io.StringIO()
        # (the reason last, once: it was also third, a header of two columns named alike)
        writer = csv.DictWriter(buf, fieldnames=(*(c for c in TABLE_COLUMNS if c != "reason"), "reason"), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    head = ["template", "status", "user", "assistant", "system", "tool response", "next tool response",
            "generation prompt", "tool placement", "reasoning", "reasoning end", "generation reasoning", "why not"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([_name_cell(r["name"]), r["status"]] + [_md(r[c]) for c in TABLE_COLUMNS[3:9]] + [r["tool_placement"]]
                 + [_md(r[c]) for c in TABLE_COLUMNS[10:]] + [_reason_cell(r["reason"])])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _reason_cell(reason: str, limit: int = 120) -> str:
    """A reason in one markdown cell: one line, its pipes escaped, cut at `limit` characters."""
    text = " ".join(reason.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---- a conversation with its spans marked, for a person to read -----------------------------------

_COLORS = {"system": "35", "user": "32", "assistant": "34", "tool": "33"}


def unrendered_reason(analysis: Analysis) -> str | None:
    """Why the analysis has no rendered round-trip conversation to show, or None when it has one."""
    rt = analysis.round_trip
    if rt is not None and rt.rendered:
        return None
    return "; ".join(analysis.errors) or "nothing was rendered"


def format_show(analysis: Analysis, color: bool = False) -> str:
    """The round-trip conversation as the template renders it, each span introduced by a marker
    line naming its role; the delimiter is highlighted where the terminal allows."""
    why = unrendered_reason(analysis)
    if why is not None:
        return f"{analysis.name}: no rendered conversation to show ({why})\n"
    rt = analysis.round_trip
    assert rt is not None
    text = rt.rendered
    spans = split_text(text, analysis.delimiters)
    out = [f"# {analysis.name}: {len(spans)} spans, round trip {'passed' if rt.passed else 'FAILED'}"]
    if spans and spans[0].start > 0:
        out.append("--- (before the first delimiter: no span) ---")
        out.append(escape_controls(text[: spans[0].start]))
    for i, sp in enumerate(spans):
        body = text[sp.start:sp.end]
        delim = next((d for d in analysis.delimiters if body.startswith(d.text) and d.role == sp.role), None)
        head = f"--- [{i}] {sp.role} @ {sp.start}..{sp.end} ---"
        if color:
            head = f"\x1b[1;{_COLORS.get(sp.role, '0')}m{head}\x1b[0m"
        out.append(head)
        # (the template's text with its control characters shown, not run; then this report's own colours)
        if delim is not None and color:
            body = f"\x1b[7m{escape_controls(delim.text)}\x1b[0m" + escape_controls(body[len(delim.text):])
        else:
            body = escape_controls(body)
        out.append(body)
    for p in rt.problems:
        out.append(f"problem: {p}")
    return "\n".join(out).rstrip("\n") + "\n"
