"""The gate: what fails an audit, in one place.

`FAILING` (the analysis statuses that fail it) and `REPORT_FAILURES` (the report's own verdicts
that do: a warning under fail_on="warning", an unstable prefix under prefix_stability="fail");
`AuditReport`, which applies them with the expected failures; and `verdict_of(report, i)`, the one
status, reason and problems every report format shows, so that each agrees with the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._version import __version__
from ..analysis import LIMIT_STATUSES, Analysis
from ..errors import InputError
from ._choices import FAIL_ON, PREFIX_STABILITY
from ._prefix import NOT_CHECKED, PrefixStability

__all__ = ["FAILING", "JSON_SCHEMA_VERSION", "REPORT_FAILURES", "AuditReport", "is_failure", "verdict_of"]

# Statuses that make an audit fail (exit 1): every status but 'pass'. 'impossible' is a template
# refused with the proof that no delimiter can exist; 'unsupported' one that renders no chat at all
# (it raises on every one, or renders the same text whatever the messages): no chat can use it, so
# a gate fails on it too, with the reason.
FAILING = frozenset({"fail", "impossible", "unsupported", "error", "timeout", "memory", "unsafe"})
# Statuses an expected-failures entry never excuses: a run's limit (the template was not checked)
# and a sandbox escape the template tried (no known failure of its design keeps a gate green on that).
NEVER_EXCUSED = LIMIT_STATUSES
# The audit JSON's layout; raised when a field is removed or changes meaning (adding one does not).
JSON_SCHEMA_VERSION = 1
# The verdicts a report gives besides the analysis statuses, each a failure of the audit: a pass
# with warnings under fail_on="warning", an unstable prefix under prefix_stability="fail", a check
# asked for that did not run under fail_on="unchecked" (or "warning").
REPORT_FAILURES = ("warning", "unstable", "unchecked")
# How strict each fail_on mode is: each fails what the ones before it fail.
_STRICTNESS = {mode: rank for rank, mode in enumerate(FAIL_ON)}


def check_modes(fail_on: str, prefix_stability: str) -> None:
    """One-line InputErrors for a `fail_on` or `prefix_stability` mode that does not exist."""
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
    # With a tokenizer: per result, why its token round trip did not run although asked for ("":
    # it ran, or the analysis did not pass); see `unchecked`.
    token_skipped: tuple = ()
    # The behaviour checks that failed (a lock's, an upstream's), each (kind, name, source, message)
    # with kind "LOCK" or "DRIFT" (`tmplkit.cli._lock.run_checks`): the audit fails with them, and
    # every format says so.
    checks: tuple = ()

    def __post_init__(self):
        check_modes(self.fail_on, self.prefix_stability)

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
        # (nor a check a limit left undone that fails it: a listed template that now passes still fails on that)
        never = self.results[i].status in NEVER_EXCUSED or self.unchecked_fails(i)
        return ((self.failed(i) and (self.expected(name) is None or never))
                or (self.unstable(i) and self.expected(name, "unstable") is None))

    def excused(self, i: int) -> bool:
        """Result i fails or is unstable under the gate, and the expected failures list it so."""
        return (self.failed(i) or self.unstable(i)) and not self.counts_against(i)

    def failed(self, i: int) -> bool:
        a = self.results[i]
        tc = self.token_check(i)
        return a.status in FAILING or (tc is not None and not tc.passed) or self.warned(i) or self.unchecked_fails(i)

    def unchecked(self, i: int) -> tuple[str, ...]:
        """The checks asked for that did not run on passing result i, each with why: never a pass of theirs."""
        return tuple(f"{check} {why}" for check, why in self.unchecked_checks(i))

    def unchecked_checks(self, i: int) -> tuple[tuple[str, str], ...]:
        """`unchecked` as (check, why) pairs: ("token round trip", "not run: no tokenizer ...")."""
        if self.results[i].status != "pass":
            return ()
        out = []
        skipped = self.token_skipped[i] if i < len(self.token_skipped) else ""
        if skipped:
            out.append(("token round trip", f"not run: {skipped}"))
        check = self.prefix_check(i)
        if self.prefix_stability != "off" and check is not None and check.verdict == NOT_CHECKED:
            out.append(("prefix stability", f"not checked: {check.detail}"))
        return tuple(out)

    def unchecked_fails(self, i: int) -> bool:
        """A check that did not run, when that fails the audit (fail_on "unchecked" or stricter)."""
        return _STRICTNESS[self.fail_on] >= _STRICTNESS["unchecked"] and bool(self.unchecked(i))

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
        if self.token_checks or self.prefix_checks:
            d["not_checked"] = list(self.unchecked(i))
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
        return [a for a, c in zip(self.results, self.prefix_checks)  # (one not checked proves nothing either way)
                if a.status == "pass" and self.expected(a.name, "unstable") is not None
                and c.verdict not in ("unstable", NOT_CHECKED)]

    def list_notes(self) -> list[str]:
        """A line for each entry of the expected-failures list the run contradicts (a listed failure
        that passes, a listed unstable template that is not): each fails the audit, and says why."""
        notes = [f"note: {a.name} is listed as an expected failure but passes; remove it from the list"
                 for a in self.unexpected_passes]
        verdicts = {a.name: c.verdict for a, c in zip(self.results, self.prefix_checks)}
        return notes + [f"note: {a.name} is listed as unstable but is {verdicts[a.name]}; remove it from the list"
                        for a in self.unexpected_stable]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unexpected_passes and not self.unexpected_stable and not self.checks

    def summary(self) -> dict:
        """The audit's outcome: counts by status and the names behind the verdict."""
        names = [a.name for a in self.results]
        out = {
            "templates": len(self.results),
            "counts": self.counts,
            "warnings": sum(len(a.warnings) for a in self.results),
            "failures": [a.name for a in self.failures],
            "expected_failures": [n for i, n in enumerate(names) if self.failed(i) and self.excused(i)],
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
        if self.token_checks or self.prefix_checks:  # what was asked for and did not run, by name and count
            out["not_checked"] = [n for i, n in enumerate(names) if self.unchecked(i)]
        if self.token_checks:
            out["token_round_trip"] = self.token_counts()
        if self.checks:  # (only when one failed, so that an audit without them keeps its summary)
            out["checks"] = [{"kind": kind, "name": name, "message": message} for kind, name, _, message in self.checks]
        out["ok"] = self.ok
        return out

    def token_counts(self) -> dict[str, int]:
        """Passing templates' token round trips: passed, failed, and asked for but not run."""
        checks = [self.token_check(i) for i, a in enumerate(self.results) if a.status == "pass"]
        skipped = sum(1 for i, a in enumerate(self.results) if a.status == "pass" and i < len(self.token_skipped)
                      and self.token_skipped[i])
        return {"passed": sum(1 for c in checks if c is not None and c.passed),
                "failed": sum(1 for c in checks if c is not None and not c.passed), "not_run": skipped}

    def to_dict(self) -> dict:
        """The audit JSON: {schema_version, tmplkit_version, summary, results}."""
        return {"schema_version": JSON_SCHEMA_VERSION, "tmplkit_version": __version__, "summary": self.summary(),
                "results": [self.result_dict(i) for i in range(len(self.results))]}


def first_reason(a: Analysis) -> str:
    """Why an analysis did not pass, in its first words ('' when it passed)."""
    if a.status == "pass":
        return ""
    reasons = list(a.errors) or (list(a.round_trip.problems) if a.round_trip else [])
    return reasons[0] if reasons else a.status


def verdict_of(report: AuditReport, i: int) -> tuple[str, str, tuple[str, ...]]:
    """(status, why, all problems) of result i, with a failed token round trip counted as 'fail',
    an unstable prefix under the gate as 'unstable', a check that did not run as 'unchecked' (with
    fail_on "unchecked" or "warning"; otherwise a 'pass' whose why says it did not run) and, with
    fail_on="warning", a pass with warnings as 'warning', so that every format agrees with the
    audit's exit code."""
    a = report.results[i]
    tc = report.token_check(i)
    if a.status == "pass" and tc is not None and not tc.passed:
        problems = tuple(f"token round trip ({tc.tokenizer}): {p}" for p in tc.problems) or ("token round trip failed",)
        return "fail", problems[0], problems
    if a.status == "pass" and report.unstable(i):
        check = report.prefix_checks[i]
        why = f"prefix unstable at request {check.request}: {check.cause}"
        return "unstable", why, (why + (f" ({check.detail})" if check.detail else ""),)
    if report.unchecked_fails(i):
        unchecked = report.unchecked(i)
        return "unchecked", unchecked[0], unchecked
    if report.warned(i):
        return "warning", f"warning: {a.warnings[0]}", tuple(a.warnings)
    if unchecked := report.unchecked(i):  # a pass, yet not of the checks that did not run: it says so
        return a.status, unchecked[0], unchecked
    return a.status, first_reason(a), a.errors + (a.round_trip.problems if a.round_trip else ())


def is_failure(status: str) -> bool:
    """Whether a verdict's status (see `verdict_of`) is one that fails the audit."""
    return status in FAILING or status in REPORT_FAILURES
