"""The audit on one screen (`--format summary`): what was checked and what was not, in counts,
the failures that count against it by name, and the verdict. For a first run over a corpus,
where one line per template is a hundred lines; the whole report goes to a file beside it
(`--report text:FILE`).
"""

from __future__ import annotations

from ._gate import AuditReport, verdict_of
from ._prefix import NOT_CHECKED

__all__ = ["format_summary"]

# At most this many failing templates are named; the rest are counted.
_NAMED = 10


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def format_summary(report: AuditReport) -> str:
    """What was and was not checked, per check, in counts; the failures not listed as expected,
    by name; the verdict."""
    n = len(report.results)
    warned = sum(1 for a in report.results if a.status == "pass" and a.warnings)
    rows = [("analysis and text round trip", f"{n} checked: {_counts(report.counts)}"
             + (f" ({warned} passing with warnings)" if warned else ""))]
    rows += _token_rows(report)
    rows += _prefix_rows(report)
    excused = [a.name for i, a in enumerate(report.results) if report.excused(i)]
    failing = [i for i in range(n) if report.counts_against(i)]
    rows.append(("listed as expected failures", f"{len(excused)}" + (" (each with its reason in --format text)" if excused else "")))
    rows.append(("failing, not expected", str(len(failing))))
    width = max(len(k) for k, _ in rows)
    lines = [f"tmplkit audit: {_plural(n, 'template')}"] + [f"  {k:<{width}}  {v}" for k, v in rows]
    for i in failing[:_NAMED]:
        status, why, _ = verdict_of(report, i)
        lines.append(f"    {status.upper()} {report.results[i].name}: {why[:100]}")
    if len(failing) > _NAMED:
        lines.append(f"    ... {len(failing) - _NAMED} more (--format text, or the full report)")
    lines += [f"  {note}" for note in report.list_notes()]
    lines.append("-> ok" if report.ok else "-> FAILED")
    return "\n".join(lines) + "\n"


def _token_rows(report: AuditReport) -> list[tuple[str, str]]:
    """The token round trip: how many ran (passed, failed), and why the others did not."""
    if not report.token_checks:
        return [("token round trip", "not checked (no --tokenizer)")]
    ran = [tc for tc in report.token_checks if tc is not None]
    failed = sum(1 for tc in ran if not tc.passed)
    not_passing = sum(1 for a, tc in zip(report.results, report.token_checks) if tc is None and a.status != "pass")
    no_tokenizer = len(report.results) - len(ran) - not_passing
    rows = [("token round trip", f"{len(ran)} checked: {len(ran) - failed} passed, {failed} failed")]
    if no_tokenizer:
        rows.append(("  not checked: no tokenizer", f"{no_tokenizer} (not from a GGUF and no vocabulary paired with its "
                                                    "name, or one needing an extra not installed)"))
    if not_passing:
        rows.append(("  not checked: analysis failed", str(not_passing)))
    return rows


def _prefix_rows(report: AuditReport) -> list[tuple[str, str]]:
    if not report.prefix_checks:
        return [("prefix stability", "not checked (--prefix-stability report to check it)")]
    verdicts: dict[str, int] = {}
    for c in report.prefix_checks:
        verdicts[c.verdict] = verdicts.get(c.verdict, 0) + 1
    # Those a limit stopped were not checked: counted apart, not as checked (nothing was proved).
    stopped = verdicts.pop(NOT_CHECKED, 0)
    rows = [("prefix stability", f"{len(report.prefix_checks) - stopped} checked" + (f": {_counts(verdicts)}" if verdicts else ""))]
    if stopped:
        rows.append(("  not checked: stopped by a limit", f"{stopped} (a longer --timeout or more --memory checks it)"))
    return rows
