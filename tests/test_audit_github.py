"""The audit's GitHub Actions output (`--format github`: annotations on the template files), its
further reports from the same run (`--report FORMAT:FILE`), and the JUnit report on bad input."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tmplkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
FAILING = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A repository's working folder with a passing, a warning and a failing template (a name with
    the characters a workflow command escapes)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "chat.jinja").write_text((FIXTURES / "chatml.jinja").read_text())
    (tmp_path / "t" / "llama3.jinja").write_text((FIXTURES / "llama3.jinja").read_text())
    (tmp_path / "t" / "50%,bad.jinja").write_text(FAILING)
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--no-config", "audit", "--in-process", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_github_format_annotates_each_file(capsys, repo):
    code, out, err = run(capsys, "--format", "github", "t")
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("::error file=t/50%25%2Cbad.jinja,title=tmplkit%3A 50%25%2Cbad impossible::50%25,bad: ")
    assert lines[1] == ("::warning file=t/llama3.jinja,title=tmplkit%3A llama3 warning::llama3: parallel tool calls are "
                        "rejected by the template: one tool call per message")
    assert lines[2] == "3 templates: 1 impossible, 2 pass -> FAILED" and len(lines) == 3


def test_github_format_on_a_source_outside_the_repository_names_no_file(capsys, repo):
    code, out, _ = run(capsys, "--format", "github", str(FIXTURES / "same-text.jinja"))
    assert code == 1 and out.startswith("::error title=tmplkit%3A same-text unsupported::same-text: ")


def test_a_listed_failure_that_passes_is_a_notice(capsys, repo):
    listed = repo / "expected.json"
    listed.write_text(json.dumps({"chat": "was broken", "50%,bad": "no delimiters"}))
    code, out, _ = run(capsys, "--format", "github", "--expected-failures", str(listed), "t/chat.jinja", "t/50%,bad.jinja")
    assert code == 1
    assert out.splitlines()[0].startswith("::notice file=t/chat.jinja,title=tmplkit%3A chat listed::chat is listed")
    assert "::error" not in out  # the listed failure is excused


def test_more_reports_from_the_same_run(capsys, repo):
    code, out, err = run(capsys, "--format", "github", "--report", "junit:r.xml", "--report", "markdown:s.md",
                         "--report", "json:r.json", "t")
    assert code == 1 and out.count("::error") == 1
    suite = ET.parse(repo / "r.xml").getroot()
    assert suite.get("tests") == "3" and suite.get("failures") == "1"
    assert (repo / "s.md").read_text().startswith("| template | status |")
    assert json.loads((repo / "r.json").read_text())["summary"]["failures"] == ["50%,bad"]
    code, _, err = run(capsys, "--report", "yaml:x.yml", "t")
    assert code == 2 and err.count("\n") == 1 and "FORMAT one of text, json, markdown, junit, github" in err


@pytest.mark.parametrize("how", [["--format", "junit", "-o", "r.xml"], ["--report", "junit:r.xml"]])
def test_junit_is_written_on_bad_input_too(capsys, repo, how):
    code, out, err = run(capsys, *how, "t/missing.jinja")
    assert code == 2 and out == "" and err.startswith("tmplkit: error: t/missing.jinja: no such file")
    suite = ET.parse(repo / "r.xml").getroot()
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("1", "1", "0")
    assert suite.find("testcase/error").get("message") == err.removeprefix("tmplkit: error: ").rstrip("\n")
