"""Corpus audit: analyze many templates and report them as text, JSON, markdown or JUnit XML.

The audit is a thin layer: it runs `analyze` on each template (in worker processes when asked)
and formats the results (text, JSON, markdown, JUnit XML, GitHub annotations). The JSON is one object: `schema_version` (JSON_SCHEMA_VERSION), the
`summary` and the `results`, each exactly `Analysis.to_dict()` (plus `token_round_trip` when a
tokenizer was given, and `prefix_stability`, a `PrefixStability.to_dict()`, when that check ran;
the summary then also has `prefix_stability`, `unstable`, `expected_unstable` and
`unexpected_stable`).

What ends an audit non-zero is `fail_on`: "fail" (a failing template, or a listed expected failure
that passes), "unchecked" (also a template with a check asked for that did not run: the
prefix-stability check cut by its time limit, a token round trip without a tokenizer) or
"warning" (also a template with a warning); and, with `prefix_stability="fail"`,
a template whose resumed agent session is not a prefix of what the server holds (unless listed as
{"name": {"unstable": "reason"}} in the expected failures, which then must stay unstable).

The package, in the order an audit runs: `_driver` (`audit()`: the analyses, in workers over
`tmplkit.auditing.isolate`, the token round trip), `_prefix` (the prefix-stability check, run in the same
worker), `_gate` (`AuditReport`: what fails the audit, `FAILING`, the verdict of each template) and
`_formats` (text, JSON, markdown, JUnit, the delimiter table, `show`), `_summary` (the audit on one
screen: what was and was not checked), `_choices` (the options' choices, light to import).

The names load on first use (`__getattr__`, as the package root does): the command line reads
`_choices` to build its options without loading the analyses.
"""

import importlib
from typing import TYPE_CHECKING

# Where each name lives: module (relative to this package) -> names.
_LAZY: dict[str, tuple[str, ...]] = {
    "._choices": ("AUDIT_FORMAT_NAMES", "EXPECTED_KINDS", "FAIL_ON", "PREFIX_STABILITY", "TABLE_FORMATS", "is_expected_failures"),
    "._driver": ("audit", "token_checks", "token_skips", "tokenizer_for"),
    "._formats": ("AUDIT_FORMATS", "TABLE_COLUMNS", "TABLE_SCHEMA_VERSION", "format_github", "format_json", "format_junit",
                  "format_markdown", "format_show", "format_table", "format_text", "junit_error", "show", "summary_line",
                  "table_rows", "unrendered_reason"),
    "._gate": ("FAILING", "JSON_SCHEMA_VERSION", "REPORT_FAILURES", "AuditReport", "is_failure", "verdict_of"),
    "._prefix": ("NOT_APPLICABLE", "NOT_CHECKED", "PrefixStability", "analyze_with_prefix_stability", "default_turns_session",
                 "prefix_stability_of"),
    "._summary": ("format_summary",),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "AUDIT_FORMATS", "AUDIT_FORMAT_NAMES", "AuditReport", "EXPECTED_KINDS", "FAILING", "FAIL_ON", "JSON_SCHEMA_VERSION",
    "NOT_APPLICABLE", "NOT_CHECKED", "PREFIX_STABILITY", "PrefixStability", "REPORT_FAILURES", "TABLE_COLUMNS",
    "TABLE_FORMATS", "TABLE_SCHEMA_VERSION", "analyze_with_prefix_stability", "audit", "default_turns_session",
    "format_github", "format_json", "format_junit", "format_markdown", "format_show", "format_summary",
    "format_table", "format_text", "is_expected_failures", "is_failure", "junit_error", "prefix_stability_of", "show",
    "summary_line",
    "table_rows", "token_checks", "token_skips", "tokenizer_for", "unrendered_reason", "verdict_of",
]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tmplkit.auditing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers see: the same names, imported eagerly
    from ._choices import AUDIT_FORMAT_NAMES, EXPECTED_KINDS, FAIL_ON, PREFIX_STABILITY, TABLE_FORMATS, is_expected_failures
    from ._driver import audit, token_checks, token_skips, tokenizer_for
    from ._formats import (
        AUDIT_FORMATS,
        TABLE_COLUMNS,
        TABLE_SCHEMA_VERSION,
        format_github,
        format_json,
        format_junit,
        format_markdown,
        format_show,
        format_table,
        format_text,
        junit_error,
        show,
        summary_line,
        table_rows,
        unrendered_reason,
    )
    from ._gate import FAILING, JSON_SCHEMA_VERSION, REPORT_FAILURES, AuditReport, is_failure, verdict_of
    from ._prefix import (
        NOT_APPLICABLE,
        NOT_CHECKED,
        PrefixStability,
        analyze_with_prefix_stability,
        default_turns_session,
        prefix_stability_of,
    )
    from ._summary import format_summary
