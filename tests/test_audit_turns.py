"""The audit's prefix-stability check (--prefix-stability report|fail): the column in every format,
the JSON key, the CI gate and its expected failures, the configuration key, and the check running
in the template's sandboxed worker."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tmplkit import Analysis, InputError, load_one
from tmplkit import auditing as audit_mod
from tmplkit.cli import main
from tmplkit.cli.config import load_expected_failures

ROOT = Path(__file__).resolve().parent.parent
TURNS = ROOT / "fixtures" / "turns"
STABLE = str(TURNS / "stable.jinja")  # prints every turn's reasoning: a resumed session is a prefix
DROPS = str(TURNS / "drops-reasoning.jinja")  # Qwen3-style: reasoning only after the last user message
# The stable fixture, plus a loop that only a conversation longer than the analysis's probes reaches:
# the analysis passes, and only the session's renders hang.
LOOPS_ON_LONG = "{%- if messages|length > 16 -%}{%- for i in range(100000) -%}{%- for j in range(100000) -%}" \
                "{%- endfor -%}{%- endfor -%}{%- endif -%}"


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configuration file of the machine or the repository applies


@pytest.fixture(scope="module")
def checked() -> audit_mod.AuditReport:
    """Both fixtures audited in this process with the check reported (not gated)."""
    return audit_mod.audit([load_one(STABLE), load_one(DROPS)], prefix_stability="report")


def gated(report: audit_mod.AuditReport, expected: dict | None = None) -> audit_mod.AuditReport:
    """The same results under the gate, with `expected` as the expected failures."""
    return audit_mod.AuditReport(report.results, expected or {}, prefix_checks=report.prefix_checks,
                                 prefix_stability="fail")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- the verdicts --------------------------------------------------------------------------------

def test_a_stable_and_an_unstable_template(checked):
    stable, drops = checked.prefix_checks
    assert (stable.verdict, stable.label, stable.cause) == ("stable", "stable", "")
    assert stable.n_requests > 2 and stable.seconds > 0  # the check's own time is kept
    assert drops.verdict == "unstable" and drops.label == "unstable (reasoning dropped)"
    # the first request after a new user message no longer prints the earlier turn's reasoning
    assert drops.request >= 1 and drops.position > 0
    # the analysis results stay plain Analyses (the verdict is the report's, not a field of them)
    assert all(type(a) is Analysis for a in checked.results)
    # reported, not gated: the audit passes
    assert checked.ok and checked.summary()["unstable"] == ["drops-reasoning"]


def test_given_whatever_the_analysis_says(tmp_path):
    # Prefix stability needs renders, not delimiters: a template refused as impossible still gets
    # its verdict, as `tmplkit turns` gives it.
    path = tmp_path / "nodelims.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    report = audit_mod.audit([load_one(str(path))], prefix_stability="fail")
    (check,) = report.prefix_checks
    assert report.results[0].status == "impossible"  # contents alone: every role renders alike
    assert check.verdict == "stable" and check.n_requests > 1
    assert not report.unstable(0)  # the analysis failure is what fails it, once
    dropping = tmp_path / "nodelims-dropping.jinja"
    dropping.write_text("{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.content }}{% endif %}{% endfor %}")
    (check,) = audit_mod.audit([load_one(str(dropping))], prefix_stability="report").prefix_checks
    assert check.verdict == "unstable"


def test_not_checked_after_a_sandbox_limit(tmp_path):
    path = tmp_path / "slow.jinja"
    path.write_text((ROOT / "fixtures" / "hostile" / "loop_nested_range.jinja").read_text(encoding="utf-8"))
    report = audit_mod.audit([load_one(str(path))], prefix_stability="report", timeout=2)
    (check,) = report.prefix_checks
    assert report.results[0].status in ("timeout", "memory")
    assert check.verdict == "not checked" and report.results[0].status in check.detail


def test_not_checked_by_default():
    report = audit_mod.audit([load_one(DROPS)])
    assert report.prefix_checks == () and report.ok
    assert "prefix_stability" not in report.result_dict(0) and "unstable" not in report.summary()
    with pytest.raises(InputError, match="prefix_stability must be one of off, report, fail"):
        audit_mod.audit([load_one(DROPS)], prefix_stability="yes")


# ---- the column in each format -------------------------------------------------------------------

def test_text_column(checked):
    lines = audit_mod.format_text(checked).splitlines()
    assert lines[0].split()[:3] == ["PASS", "stable", "stable"]
    assert lines[1].split()[:5] == ["PASS", "drops-reasoning", "unstable", "(reasoning", "dropped)"]
    # one column: the delimiters start at the same place on both rows
    assert lines[0].index("user=") == lines[1].index("user=")
    assert lines[-1] == "2 templates: 2 pass; prefix: 1 stable, 1 unstable -> ok"
    verbose = audit_mod.format_text(checked, verbosity=1)
    assert f"prefix stability: request {checked.prefix_checks[1].request}, character" in verbose


def test_markdown_column(checked):
    lines = audit_mod.format_markdown(checked).splitlines()
    assert lines[0] == "| template | status | prefix stability | tool placement | why |"
    assert lines[1] == "|---|---|---|---|---|"
    assert lines[2].startswith("| stable | pass | stable |")
    assert lines[3].startswith("| drops-reasoning | pass | unstable (reasoning dropped) |")
    unchecked = audit_mod.AuditReport(checked.results)
    assert audit_mod.format_markdown(unchecked).splitlines()[0] == "| template | status | tool placement | why |"


def test_junit_property_and_failure(checked):
    def cases(report):
        return {c.get("name"): c for c in ET.fromstring(audit_mod.format_junit(report)).iter("testcase")}

    reported = cases(checked)
    props = {n: c.find("properties/property") for n, c in reported.items()}
    assert {n: (p.get("name"), p.get("value")) for n, p in props.items()} == {
        "stable": ("prefix_stability", "stable"), "drops-reasoning": ("prefix_stability", "unstable (reasoning dropped)")}
    assert reported["drops-reasoning"].find("failure") is None  # reported only
    failure = cases(gated(checked))["drops-reasoning"].find("failure")
    assert failure.get("type") == "unstable" and "reasoning dropped" in failure.get("message")
    assert ET.fromstring(audit_mod.format_junit(gated(checked))).get("failures") == "1"


def test_json_rows_are_the_analysis_plus_one_key(checked):
    data = json.loads(audit_mod.format_json(checked))
    assert data["schema_version"] == audit_mod.JSON_SCHEMA_VERSION
    for a, row in zip(checked.results, data["results"]):
        extra = ("prefix_stability", "not_checked")  # (not_checked: [] here, every check ran)
        assert {k: v for k, v in row.items() if k not in extra} == json.loads(json.dumps(a.to_dict()))
    assert data["results"][1]["prefix_stability"] == checked.prefix_checks[1].to_dict()
    assert data["results"][1]["prefix_stability"]["cause"] == "reasoning dropped"
    summary = data["summary"]
    assert (summary["prefix_stability"], summary["unstable"], summary["ok"]) == ("report", ["drops-reasoning"], True)


# ---- the gate and the expected failures ----------------------------------------------------------

def test_gate_fails_an_unstable_template(checked):
    report = gated(checked)
    assert not report.ok and [a.name for a in report.failures] == ["drops-reasoning"]
    assert audit_mod.format_text(report).splitlines()[1].startswith("UNSTABLE")
    assert report.summary()["failures"] == ["drops-reasoning"]


def test_listed_unstable_template_does_not_fail(checked):
    report = gated(checked, {"drops-reasoning": {"unstable": "drops earlier reasoning, as Qwen3 does"}})
    assert report.ok and report.failures == []
    assert report.summary()["expected_unstable"] == ["drops-reasoning"]
    assert "UNSTABLE (expected)" in audit_mod.format_text(report)
    # an old-style entry {name: reason} excuses a failing analysis, not an unstable prefix
    assert not gated(checked, {"drops-reasoning": "some reason"}).ok


def test_listed_template_that_became_stable_fails(checked):
    report = gated(checked, {"stable": {"unstable": "was unstable once"}, "drops-reasoning": {"unstable": "known"}})
    assert not report.ok and [a.name for a in report.unexpected_stable] == ["stable"]
    assert report.summary()["unexpected_stable"] == ["stable"]
    assert "note: stable is listed as unstable but is stable; remove it from the list" in audit_mod.format_text(report)
    # reported, not gated: the unstable entries are not checked
    assert audit_mod.AuditReport(checked.results, {"stable": {"unstable": "x"}}, prefix_checks=checked.prefix_checks,
                                 prefix_stability="report").ok


def test_expected_failures_file_old_and_new_entries(tmp_path):
    path = tmp_path / "expected.json"
    entries = {"old": "fails", "new": {"unstable": "drops reasoning"}, "both": {"fail": "a", "unstable": "b"}}
    path.write_text(json.dumps(entries))
    assert load_expected_failures(path) == entries
    for bad in ({"x": {"unstabel": "typo"}}, {"x": {}}, {"x": {"unstable": 1}}):
        path.write_text(json.dumps(bad))
        with pytest.raises(InputError, match="template name -> reason"):
            load_expected_failures(path)


def test_cli_gate_with_and_without_the_expected_failures(capsys, tmp_path):
    code, out, _ = run(capsys, "--no-config", "audit", "--in-process", "--prefix-stability", "report", STABLE, DROPS)
    assert code == 0 and "unstable (reasoning dropped)" in out
    code, out, _ = run(capsys, "--no-config", "audit", "--in-process", "--prefix-stability", "fail", STABLE, DROPS)
    assert code == 1 and out.splitlines()[-1].endswith("-> FAILED")
    listed = tmp_path / "expected.json"
    listed.write_text(json.dumps({"drops-reasoning": {"unstable": "Qwen3-style"}}))
    args = ["--no-config", "audit", "--in-process", "--prefix-stability", "fail", "--expected-failures", str(listed)]
    assert run(capsys, *args, STABLE, DROPS)[0] == 0
    listed.write_text(json.dumps({"drops-reasoning": {"unstable": "Qwen3-style"}, "stable": {"unstable": "stale"}}))
    assert run(capsys, *args, STABLE, DROPS)[0] == 1


def test_cli_session_file(capsys, tmp_path):
    # one earlier turn with reasoning, then a new user message: the drops-reasoning fixture diverges
    session = tmp_path / "session.json"
    session.write_text(json.dumps([
        {"role": "user", "content": "fix the parser"},
        {"role": "assistant", "reasoning_content": "the tokenizer is wrong", "content": "Done."},
        {"role": "user", "content": "now the tests"},
    ]))
    code, out, _ = run(capsys, "--no-config", "audit", "--in-process", "--prefix-stability", "report",
                       "--session", str(session), DROPS)
    assert code == 0 and "unstable (reasoning dropped)" in out
    session.write_text(json.dumps([{"role": "user", "content": "fix the parser"}]))
    code, out, _ = run(capsys, "--no-config", "audit", "--in-process", "--prefix-stability", "fail",
                       "--session", str(session), DROPS)
    assert code == 0 and "not applicable" in out  # one request: nothing is resumed, nothing to judge
    session.write_text(json.dumps([{"role": "system", "content": "you are a coding agent"}]))
    code, _, err = run(capsys, "--no-config", "audit", "--prefix-stability", "report", "--session", str(session), DROPS)
    assert code == 2 and "no request in the session" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "--no-config", "audit", "--in-process", "--session", str(session), DROPS)
    assert code == 2 and "add --prefix-stability report" in err and len(err.strip().splitlines()) == 1


# ---- the configuration key -----------------------------------------------------------------------

def test_configuration_key(capsys, tmp_path):
    (tmp_path / "tmplkit.toml").write_text(
        'prefix-stability = "fail"\n[expected-failures]\n"stable" = {unstable = "stale entry"}\n')
    assert run(capsys, "audit", "--in-process", STABLE)[0] == 1  # listed as unstable, yet stable
    assert run(capsys, "audit", "--in-process", "--prefix-stability", "report", STABLE)[0] == 0  # the flag wins
    (tmp_path / "tmplkit.toml").write_text('prefix-stability = "fail"\n[expected-failures]\n'
                                           '"drops-reasoning" = {unstable = "Qwen3-style"}\n')
    code, out, _ = run(capsys, "audit", "--in-process", DROPS)
    assert code == 0 and "UNSTABLE (expected)" in out
    (tmp_path / "tmplkit.toml").write_text('prefix-stability = "on"\n')
    code, _, err = run(capsys, "audit", "--in-process", DROPS)
    assert code == 2 and "'prefix-stability' must be one of off, report, fail, got 'on'" in err


# ---- in the worker -------------------------------------------------------------------------------

def test_the_check_runs_in_the_worker(checked):
    isolated = audit_mod.audit([load_one(STABLE), load_one(DROPS)], jobs=1, timeout=60, prefix_stability="report")
    assert isolated.prefix_checks == checked.prefix_checks
    assert [a.name for a in isolated.results] == ["stable", "drops-reasoning"]
    assert all(type(a) is Analysis for a in isolated.results)


def test_a_template_that_loops_only_on_the_session_is_stopped(tmp_path):
    path = tmp_path / "loops.jinja"
    path.write_text((TURNS / "stable.jinja").read_text() + LOOPS_ON_LONG)
    template = load_one(str(path))
    plain = audit_mod.audit([template], jobs=1, timeout=5)
    assert plain.results[0].status == "pass"  # the analysis alone never reaches the loop
    report = audit_mod.audit([template], jobs=1, timeout=2, prefix_stability="report")
    assert report.results[0].status == "timeout" and "longer than 2 s" in report.results[0].errors[0]
    assert report.prefix_checks[0].verdict == "not checked" and not report.ok


def test_a_long_session_is_studied_up_to_the_time_limit():
    """The check stops in time for the worker to answer: a session too long for --timeout gives the
    analysis and a verdict on the requests rendered by then, not a killed worker."""
    from tmplkit.session import Session

    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(6001)]
    report = audit_mod.audit([load_one(STABLE)], jobs=1, timeout=4, prefix_stability="report", session=Session(msgs))
    assert report.results[0].status == "pass"
    (check,) = report.prefix_checks
    assert check.verdict == "not checked" and "stopped at the time limit" in check.detail
    assert 1 < check.n_requests < 3001 and "no divergence up to there" in check.detail
    assert report.ok and report.unchecked(0)  # passes, yet says the check did not run
    assert not dataclasses.replace(report, fail_on="unchecked").ok
