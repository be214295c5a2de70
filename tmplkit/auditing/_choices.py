"""The audit's choices, named once in a module that imports nothing: what `--fail-on`,
`--prefix-stability`, `audit --format` and `table --format` take. The command line builds its
options from these without loading the audit (its analyses, Jinja)."""

from __future__ import annotations

__all__ = ["AUDIT_FORMAT_NAMES", "FAIL_ON", "PREFIX_STABILITY", "TABLE_FORMATS"]

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
