"""Audit report formats and the CI-gate semantics, on hand-made analyses."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

from tmplkit import Analysis, Delimiter, InputError, RoundTrip

# `tmplkit.audit` is also the audit function exported by the package; take the module itself.
from tmplkit import auditing as audit_mod
from tmplkit.cli.config import load_expected_failures

PASS = Analysis(
    name="qwen|like", source="x.jinja", status="pass",
    user_start="<|im_start|>user\n", assistant_start="<|im_start|>assistant\n",
    tool_response_start="<|im_start|>user\n<tool_response>\n", tool_placement="inside_user",
    delimiters=(Delimiter("tool", "<|im_start|>user\n<tool_response>\n"), Delimiter("user", "<|im_start|>user\n")),
    round_trip=RoundTrip(True, ("user", "tool"), ("user", "tool")),
)
FAIL = Analysis(name="broken", source="y.jinja", status="fail", errors=("tool response split as user",),
                round_trip=RoundTrip(False, ("user", "tool"), ("user", "user"), ("span 1 is user, expected tool",)))
UNSUP = Analysis(name="odd", source="z.jinja", status="unsupported", errors=("template raised: no system role",))


def test_gate_semantics_and_expected_failures():
    report = audit_mod.AuditReport((PASS, FAIL, UNSUP))
    # A template no chat can use ('unsupported') fails the gate too, with its reason.
    assert not report.ok and [a.name for a in report.failures] == ["broken", "odd"]
    assert report.counts == {"pass": 1, "fail": 1, "unsupported": 1}
    listed = audit_mod.AuditReport((PASS, FAIL, UNSUP), {"broken": "known upstream bug", "odd": "a guard model"})
    assert listed.ok
    assert not audit_mod.AuditReport((PASS, FAIL, UNSUP), {"broken": "known upstream bug"}).ok
    stale = audit_mod.AuditReport((PASS,), {"qwen|like": "was broken once"})
    assert not stale.ok and [a.name for a in stale.unexpected_passes] == ["qwen|like"]
    assert "remove it from the list" in audit_mod.format_text(stale)


def test_text_format_one_line_per_template_and_summary():
    text = audit_mod.format_text(audit_mod.AuditReport((PASS, FAIL, UNSUP)))
    lines = text.splitlines()
    assert lines[0].startswith("PASS") and "tool=<|im_start|>user\\n<tool_response>\\n" in lines[0]
    assert lines[1].startswith("FAIL") and "tool response split as user" in lines[1]
    assert lines[2].startswith("UNSUPPORTED") and "no system role" in lines[2]
    assert lines[3] == "3 templates: 1 fail, 1 pass, 1 unsupported -> FAILED"


def test_json_is_exactly_to_dict():
    data = json.loads(audit_mod.format_json(audit_mod.AuditReport((PASS, FAIL))))["results"]
    assert data == [PASS.to_dict(), FAIL.to_dict()]
    for key in ("name", "source", "status", "user_start", "assistant_start", "system_start",
                "tool_response_start", "delimiters", "tool_placement", "errors"):
        assert key in data[0]
    assert data[0]["delimiters"][0] == {"role": "tool", "text": "<|im_start|>user\n<tool_response>\n"}


def test_junit_is_valid_xml_with_failures_and_skips():
    root = ET.fromstring(audit_mod.format_junit(audit_mod.AuditReport((PASS, FAIL, UNSUP))))
    # An unsupported template is a failure of its own type (no chat can use it), not a skip.
    assert root.get("tests") == "3" and root.get("failures") == "2" and root.get("skipped") == "0"
    cases = root.findall("testcase")
    assert cases[0].get("name") == "qwen|like" and not list(cases[0])
    assert cases[1].find("failure").get("type") == "fail"
    assert cases[2].find("failure").get("type") == "unsupported" and "no system role" in cases[2].find("failure").get("message")


def test_a_check_asked_for_that_did_not_run_is_skipped_in_junit_and_a_warning_on_github():
    # Text, markdown, JSON and the summary said "not run"; JUnit gave a bare passing case and GitHub
    # no annotation, so a CI's view showed the token round trip as passed.
    why = "no tokenizer for it: --tokenizer auto knows none"
    report = audit_mod.AuditReport((PASS, FAIL), token_checks=(None, None), token_skipped=(why, ""))
    root = ET.fromstring(audit_mod.format_junit(report))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    case = root.findall("testcase")[-1]
    assert case.get("name") == "qwen|like: token round trip"
    assert case.find("skipped").get("message") == f"token round trip not run: {why}"
    github = audit_mod.format_github(report).splitlines()
    assert f"::warning file=x.jinja,title=tmplkit%3A qwen|like not checked::qwen|like: token round trip not run: {why}" in github
    # where that fails the audit (--fail-on unchecked), the template's own case is the failure
    strict = audit_mod.AuditReport((PASS,), token_checks=(None,), token_skipped=(why,), fail_on="unchecked")
    root = ET.fromstring(audit_mod.format_junit(strict))
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("1", "1", "0")


def test_table_csv_keeps_exact_strings_markdown_escapes():
    rows = list(csv.DictReader(io.StringIO(audit_mod.format_table([PASS], "csv"))))
    assert rows[0]["tool_response_start"] == "<|im_start|>user\n<tool_response>\n"
    md = audit_mod.format_table([PASS], "markdown").splitlines()
    assert len(md) == 3 and "`<\\|im_start\\|>user\\n<tool_response>\\n`" in md[2]
    assert json.loads(audit_mod.format_table([PASS], "json"))["rows"][0]["user_start"] == "<|im_start|>user\n"


def test_expected_failures_file(tmp_path):
    good = tmp_path / "ok.json"
    good.write_text('{"a": "why"}')
    assert load_expected_failures(good) == {"a": "why"}
    bad = tmp_path / "bad.json"
    bad.write_text('["a"]')
    with pytest.raises(InputError, match="template name -> reason"):
        load_expected_failures(bad)


@pytest.mark.parametrize("where", ["missing/dir/report.txt", "."])
def test_unwritable_output_is_one_line_error(tmp_path, capsys, where):
    from pathlib import Path

    from tmplkit.cli import main

    template = Path(__file__).resolve().parent.parent / "fixtures" / "templates" / "chatml.jinja"
    out = tmp_path / where
    assert main(["audit", "--in-process", "-o", str(out), str(template)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tmplkit: error: ") and "cannot write the" in err  # (refused before the analysis)
    assert "Traceback" not in err
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_failed_token_round_trip_fails_in_every_format():
    # A template whose text round trip passes but whose token round trip fails must fail the
    # audit, and every format must say so (the CI gate reads JUnit).
    from types import SimpleNamespace

    bad_tokens = SimpleNamespace(passed=False, tokenizer="vocab:qwen35", n_tokens=9,
                                 problems=("token spans have roles ['user'], expected ['tool']",),
                                 to_dict=lambda: {"passed": False})
    report = audit_mod.AuditReport((PASS,), token_checks=(bad_tokens,))
    assert not report.ok
    assert audit_mod.format_text(report).startswith("FAIL")
    assert "| fail |" in audit_mod.format_markdown(report)
    root = ET.fromstring(audit_mod.format_junit(report))
    assert root.get("failures") == "1"
    assert "token round trip" in root.find("testcase/failure").get("message")


def test_the_table_csv_has_one_column_per_field_and_markdown_keeps_a_name_in_its_cell():
    import dataclasses

    header = audit_mod.format_table([PASS], "csv").splitlines()[0].split(",")
    assert len(header) == len(set(header)) and header[-1] == "reason"  # (reason was a column twice)
    odd = dataclasses.replace(PASS, name="a|b\nc")
    for md in (audit_mod.format_table([odd], "markdown"), audit_mod.format_markdown(audit_mod.AuditReport((odd,)))):
        row = next(line for line in md.splitlines() if "a\\|b" in line)
        assert row.startswith("| a\\|b\\nc |")
