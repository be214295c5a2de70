"""The command line's conventions: exit codes, `python -m tmplkit`, `-` for standard input,
--quiet / --verbose, NO_COLOR and --color, --fail-on, the audit JSON's schema, and the one-line
refusal of a command whose optional extra is not installed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit import analyze, load_one
from tmplkit.auditing import JSON_SCHEMA_VERSION
from tmplkit.cli import EXIT_CODES, main
from tmplkit.cli._common import use_color
from tmplkit.sources import corpus

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
CHATML = str(FIXTURES / "chatml.jinja")
LLAMA3 = str(FIXTURES / "llama3.jinja")  # passes, with a warning (parallel tool calls rejected)
FAILING = "{% for m in messages %}{{ m.content }}{% endfor %}"  # no delimiter before a user message
ESC = "\x1b["
# A child process imports this checkout's package (not whichever checkout the environment installed).
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def failing(tmp_path) -> str:
    path = tmp_path / "nodelims.jinja"
    path.write_text(FAILING)
    return str(path)


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    # No configuration file of the machine or the repository applies (tests of it: test_config.py).
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--no-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- exit codes ---------------------------------------------------------------------------------

def test_a_template_no_chat_can_use_fails_the_gate_with_its_reason(capsys, tmp_path):
    # Unsupported (it renders the same text whatever the messages) is a failure, not a pass: exit 1,
    # its row says why, and the JUnit report has a failure of that type.
    same = str(FIXTURES / "same-text.jinja")
    code, out, _ = run(capsys, "audit", "--in-process", CHATML, same)
    assert code == 1 and "UNSUPPORTED" in out and "does not render the content of a user message" in out
    report = tmp_path / "report.xml"
    code, _, _ = run(capsys, "audit", "--in-process", same, "--format", "junit", "-o", str(report))
    assert code == 1 and 'type="unsupported"' in report.read_text(encoding="utf-8")

def test_exit_codes_are_documented_in_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for code, what in EXIT_CODES.items():
        assert f"{code:<4} {what}" in out


def test_exit_0_when_all_pass_1_when_one_fails_2_on_bad_input(capsys, failing, tmp_path):
    assert run(capsys, "audit", "--in-process", CHATML)[0] == 0
    code, out, _ = run(capsys, "audit", "--in-process", CHATML, failing)
    assert code == 1 and "FAIL" in out and "nodelims" in out
    code, out, err = run(capsys, "audit", "--in-process", str(tmp_path / "missing.jinja"))
    assert code == 2 and out == ""
    assert err.startswith("tmplkit: error: ") and err.count("\n") == 1


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["audit", "--fail-on", "sometimes", CHATML])
    assert e.value.code == 2
    assert "--fail-on" in capsys.readouterr().err


def test_python_dash_m_tmplkit(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", "audit", "--in-process", CHATML],
                        capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert ok.returncode == 0 and "1 template: 1 pass -> ok" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "tmplkit", "audit", str(tmp_path / "nope.jinja")],
                         capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


# ---- --fail-on ----------------------------------------------------------------------------------

def test_fail_on_warning_fails_a_template_with_warnings(capsys):
    code, out, _ = run(capsys, "audit", "--in-process", LLAMA3)
    assert code == 0 and "warning: parallel tool calls" in out
    code, out, _ = run(capsys, "audit", "--in-process", "--fail-on", "warning", LLAMA3, CHATML)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("WARNING") and "llama3" in lines[0] and "parallel tool calls" in lines[0]
    assert lines[-1] == "2 templates: 2 pass (1 with warnings) -> FAILED"


def test_fail_on_warning_is_excused_by_the_expected_failures(capsys, tmp_path):
    listed = tmp_path / "expected.json"
    listed.write_text(json.dumps({"llama3": "rejects parallel tool calls by design"}))
    code, _, _ = run(capsys, "audit", "--in-process", "--fail-on", "warning", "--expected-failures", str(listed), LLAMA3)
    assert code == 0


# ---- the audit JSON -----------------------------------------------------------------------------

def test_audit_json_is_one_object_with_schema_version_summary_and_rows(capsys, failing):
    code, out, err = run(capsys, "audit", "--in-process", "--format", "json", CHATML, failing)
    assert code == 1
    data = json.loads(out)
    assert list(data) == ["schema_version", "tmplkit_version", "summary", "results"]
    assert data["schema_version"] == JSON_SCHEMA_VERSION == 1
    assert data["summary"] == {
        "templates": 2, "counts": {"pass": 1, "impossible": 1}, "warnings": 0, "failures": ["nodelims"],
        "expected_failures": [], "unexpected_passes": [], "fail_on": "fail", "ok": False,
    }
    # each row is exactly Analysis.to_dict() (timing aside, which differs from run to run)
    expected = analyze(load_one(CHATML)).to_dict()
    row = data["results"][0]
    assert {k: v for k, v in row.items() if k != "seconds"} == {k: v for k, v in expected.items() if k != "seconds"}
    assert err.strip() == "2 templates: 1 impossible, 1 pass -> FAILED"  # the summary on stderr, stdout stays JSON


# ---- --quiet / --verbose ------------------------------------------------------------------------

def test_quiet_prints_nothing_when_all_pass_and_only_failures_otherwise(capsys, failing):
    assert run(capsys, "audit", "--in-process", "--quiet", CHATML, LLAMA3) == (0, "", "")
    code, out, _ = run(capsys, "-q", "audit", "--in-process", CHATML, failing)
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("IMPOSSIBLE") and "nodelims" in lines[0]
    assert "chatml" not in out and lines[1].endswith("-> FAILED")
    # no summary on stderr either
    assert run(capsys, "audit", "--in-process", "-q", "--format", "json", CHATML)[2] == ""


def test_verbose_prints_every_delimiter_and_the_time(capsys):
    _, normal, _ = run(capsys, "audit", "--in-process", CHATML)
    code, out, _ = run(capsys, "audit", "--in-process", CHATML, "--verbose")
    assert code == 0 and len(out.splitlines()) > len(normal.splitlines())
    a = analyze(load_one(CHATML))
    for d in a.delimiters:
        assert f"{d.role}: {d.text.replace(chr(10), chr(92) + 'n')}" in out
    assert " s\n" in out


def test_global_options_before_and_after_the_subcommand(capsys):
    assert run(capsys, "--quiet", "audit", "--in-process", CHATML) == (0, "", "")
    assert run(capsys, "audit", "--in-process", CHATML, "--quiet") == (0, "", "")


# ---- colour -------------------------------------------------------------------------------------

class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("color", "no_color", "tty", "expected"), [
    ("auto", None, True, True),
    ("auto", None, False, False),
    ("auto", "1", True, False),      # https://no-color.org
    ("auto", "", True, True),        # NO_COLOR set but empty does not count
    ("always", "1", False, True),    # the flag wins over the environment
    ("never", None, True, False),
])
def test_use_color(monkeypatch, color, no_color, tty, expected):
    import argparse

    monkeypatch.delenv("TERM", raising=False)
    if no_color is not None:
        monkeypatch.setenv("NO_COLOR", no_color)
    stream = _Tty() if tty else io.StringIO()
    assert use_color(argparse.Namespace(color=color), stream) is expected


def test_color_always_and_never_in_the_text_report(capsys, monkeypatch, failing):
    _, out, _ = run(capsys, "audit", "--in-process", "--color", "always", CHATML, failing)
    assert f"{ESC}32mPASS" in out and f"{ESC}31mFAIL" in out and f"{ESC}31mFAILED{ESC}0m" in out
    monkeypatch.setenv("NO_COLOR", "1")
    _, out, _ = run(capsys, "audit", "--in-process", "--color", "never", CHATML, failing)
    assert ESC not in out
    _, out, _ = run(capsys, "audit", "--in-process", CHATML, failing)  # auto, NO_COLOR, not a terminal
    assert ESC not in out


# ---- '-': standard input -----------------------------------------------------------------------

def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))


def test_template_from_stdin_jinja_and_tokenizer_config(capsys, monkeypatch):
    _stdin(monkeypatch, Path(CHATML).read_text())
    code, out, _ = run(capsys, "audit", "--in-process", "--format", "json", "-")
    row = json.loads(out)["results"][0]
    assert code == 0 and row["name"] == "stdin" and row["user_start"] == "<|im_start|>user\n"
    config = {"chat_template": Path(CHATML).read_text(), "bos_token": {"content": "<s>"}}
    _stdin(monkeypatch, json.dumps(config))
    code, out, _ = run(capsys, "audit", "--in-process", "--format", "json", "-")
    assert code == 0 and json.loads(out)["results"][0]["user_start"] == "<|im_start|>user\n"


def test_empty_stdin_is_a_one_line_error(capsys, monkeypatch):
    _stdin(monkeypatch, "  \n")
    code, _, err = run(capsys, "audit", "--in-process", "-")
    assert code == 2 and err == "tmplkit: error: <stdin>: empty file; give a chat template\n"


def test_a_json_list_on_stdin_is_refused_as_the_same_file_given_by_path_is(capsys, monkeypatch, tmp_path):
    # (read as template text, it was "UNSUPPORTED stdin ... does not render", exit 1; a template that
    # starts with `[`, `[INST]`, is still one)
    conversation = json.dumps([{"role": "user", "content": "hi"}])
    (tmp_path / "conv.json").write_text(conversation, encoding="utf-8")
    _, _, by_path = run(capsys, "audit", "--in-process", str(tmp_path / "conv.json"))
    _stdin(monkeypatch, conversation)
    code, _, err = run(capsys, "audit", "--in-process", "-")
    assert code == 2 and err == "tmplkit: error: <stdin>: expected a JSON object with 'chat_template', got a list\n"
    assert by_path.endswith(": expected a JSON object with 'chat_template', got a list\n")
    _stdin(monkeypatch, "[INST] {{ messages[0].content }} [/INST]")
    code, out, _ = run(capsys, "audit", "--in-process", "--format", "json", "-")
    assert json.loads(out)["results"][0]["name"] == "stdin"
    # nested past what Python's reader follows: no conversation, read as text (it raised RecursionError)
    _stdin(monkeypatch, "[" * 100000 + "]" * 100000)
    code, _, err = run(capsys, "audit", "--in-process", "-")
    assert code == 1 and "Traceback" not in err


def test_conversation_from_stdin(monkeypatch):
    from tmplkit import load_conversation

    _stdin(monkeypatch, json.dumps([{"role": "user", "content": "hi"}]))
    conv = load_conversation("-")
    assert conv.messages == ({"role": "user", "content": "hi"},) and conv.source == "<stdin>"
    _stdin(monkeypatch, "[{")
    with pytest.raises(Exception, match="<stdin>: not valid JSON"):
        load_conversation("-")


# ---- optional extras: one line before any work -------------------------------------------------

@pytest.fixture
def no_llama(monkeypatch):
    """llama-cpp-python as if not installed (None in sys.modules: importing it raises)."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)


def test_prefill_without_llama_refuses_in_one_line_before_any_work(capsys, no_llama, tmp_path):
    # the model and session do not exist: the refusal comes before anything is read
    code, out, err = run(capsys, "prefill", str(tmp_path / "model.gguf"), str(tmp_path / "session.json"))
    assert code == 2 and out == ""
    assert err == ("tmplkit: error: tmplkit prefill needs llama-cpp-python, which is not installed; "
                   "install the 'llama' extra: pip install 'tmplkit[llama]'\n")


def test_spans_with_a_gguf_tokenizer_without_llama_refuses_first(capsys, no_llama, tmp_path):
    # a corpus vocabulary only llama.cpp reads (SentencePiece)
    code, _, err = run(capsys, "spans", str(tmp_path / "missing.jinja"), "--tokenizer", "vocab:phi-3",
                       "--session", str(tmp_path / "missing.json"))
    assert code == 2 and err.count("\n") == 1 and "pip install 'tmplkit[llama]'" in err, err
    # a GGUF that is no file needs no extra: no install would read it, the input's own error is told
    code, _, err = run(capsys, "spans", str(tmp_path / "missing.jinja"), "--tokenizer", str(tmp_path / "model.gguf"),
                       "--session", str(tmp_path / "missing.json"))
    assert code == 2 and err.count("\n") == 1 and "llama" not in err, err


@pytest.mark.corpus
def test_audit_token_round_trip_without_llama(capsys, no_llama):
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    code, out, err = run(capsys, "audit", "--in-process", "--tokenizer", "vocab:phi-3", CHATML)
    assert code == 2 and out == "" and "the token round trip (--tokenizer) needs llama-cpp-python" in err
    # a BPE vocabulary is rebuilt without llama.cpp: the round trip runs
    code, out, err = run(capsys, "audit", "--in-process", "--tokenizer", "vocab:qwen35", CHATML)
    assert code == 0 and "tokens (vocab:qwen35" in out, err
    # auto: the templates decide; the fixtures' Qwen-style chatml is paired with no corpus vocab
    code, _, err = run(capsys, "audit", "--in-process", "--tokenizer", "auto", CHATML)
    assert code == 0, err


@pytest.mark.corpus
def test_audit_auto_without_llama_leaves_out_what_only_llama_reads(capsys, no_llama):
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    phi = str(corpus.templates_dir() / "microsoft-Phi-3.5-mini-instruct.jinja")
    qwen = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    code, out, err = run(capsys, "audit", "--in-process", "--tokenizer", "auto", phi, qwen)
    assert code == 0, err
    assert err.count("\n") == 1 and "no token round trip for 1 template (microsoft-Phi-3.5-mini-instruct)" in err
    assert "pip install" not in err and "'tmplkit[llama]'" in err
    assert "tokens (vocab:qwen35" in out and "tokens (vocab:phi-3" not in out


def test_core_commands_need_no_llama(capsys, no_llama):
    assert run(capsys, "audit", "--in-process", CHATML)[0] == 0
    assert run(capsys, "table", "--format", "csv", CHATML)[0] == 0


def test_core_install_imports_no_extra(tmp_path):
    # A fresh process in which the extras cannot be imported, as after `pip install .`: the
    # package, every subcommand's parser and the audit work.
    code = ("import sys\n"
            "for m in ('llama_cpp', 'tokenizers', 'transformers', 'matplotlib'): sys.modules[m] = None\n"
            "from tmplkit.cli import build_parser, main\n"
            "build_parser().format_help()\n"
            f"sys.exit(main(['--no-config', 'audit', '--in-process', {CHATML!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "1 template: 1 pass -> ok" in proc.stdout
