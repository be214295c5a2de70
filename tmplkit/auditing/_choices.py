"""The audit's choices, named once in a module that imports nothing: what `--fail-on`,
`--prefix-stability`, `audit --format` and `table --format` take. The command line builds its
options from these without loading the audit (its analyses, Jinja)."""

from __future__ import annotations

__all__ = ["AUDIT_FORMAT_NAMES", "EXPECTED_KINDS", "FAIL_ON", "PREFIX_STABILITY", "TABLE_FORMATS", "is_expected_failures"]

# What ends an audit non-zero (`--fail-on`, the configuration's `fail-on`), each mode stricter than
# the one before: "fail" (failing templates), "unchecked" (also a passing template with a check
# asked for that did not run: a time limit, no tokenizer for it) or "warning" (warnings as well).
FAIL_ON = ("fail", "unchecked", "warning")
# The prefix-stability check (`--prefix-stability`): not run, run and reported, or run with unstable
# templates failing the audit (the CI gate).
PREFIX_STABILITY = ("off", "report", "fail")
# The audit report's formats, in the order --help lists them: the keys of `AUDIT_FORMATS`
# (tmplkit.auditing._formats, which holds them to this list).
AUDIT_FORMAT_NAMES = ("text", "json", "markdown", "junit", "github", "summary")
# The delimiter table's formats (`tmplkit table --format`).
TABLE_FORMATS = ("markdown", "csv", "json")
# What an expected-failures entry may expect of a template: that it fails, or that its resumed agent
# session is unstable.
EXPECTED_KINDS = ("fail", "unstable")


def is_expected_failures(data: object) -> bool:
    """Whether `data` is an expected-failures mapping: template name -> reason (the template fails),
    or template name -> {kind: reason} with kinds from EXPECTED_KINDS ("unstable": its prefix is).

    >>> is_expected_failures({"a": "why", "b": {"unstable": "drops reasoning"}}), is_expected_failures({"a": {}})
    (True, False)
    """
    def entry(v: object) -> bool:
        return isinstance(v, str) or (isinstance(v, dict) and bool(v) and all(
            k in EXPECTED_KINDS and isinstance(r, str) for k, r in v.items()))

    return isinstance(data, dict) and all(isinstance(k, str) and entry(v) for k, v in data.items())
