"""One contract for every command: a template renders under the audit's limits wherever it renders
(hostile templates run in a subprocess with a wall-clock bound: a hang fails the test, never the
suite), the gate never passes a check that did not run, bad input is one line, outputs are checked
before the work."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tmplkit as _tmplkit
from tmplkit.auditing import audit, prefix_stability_of, verdict_of
from tmplkit.errors import InputError, RenderLimitError, TmplkitError
from tmplkit.sources import load, load_one

ROOT = Path(__file__).resolve().parent.parent
CODE = Path(_tmplkit.__file__).resolve().parent.parent  # the tmplkit under test, for the subprocesses too
NOT_CHECKED = "not checked"
HOSTILE = ROOT / "fixtures" / "hostile"
CHATML = ROOT / "fixtures" / "templates" / "chatml.jinja"
BOUND = 40.0  # wall-clock seconds a command may take on a hostile template before it counts as a hang


def tmplkit(*args: str, timeout: float = BOUND, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python -m tmplkit ARGS` in a subprocess, killed past `timeout` (the test then fails as a hang)."""
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    try:
        return subprocess.run([sys.executable, "-m", "tmplkit", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, input=stdin, cwd=CODE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tmplkit {' '.join(args)} ran past {timeout} s (a hang)")


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and err.startswith("tmplkit: error: "), err[-2000:]
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def conversation(tmp_path) -> Path:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]))
    return path


# --- (3) every command that renders a template renders it under the audit's limits ---------------


def test_turns_timeout_stops_a_render_that_never_checks_the_clock():
    # one `wordwrap` call over 4M words runs for minutes with no check inside; --timeout 3 is kept
    proc = tmplkit("turns", str(HOSTILE / "filter_wordwrap_slow.jinja"), "--timeout", "3", "--no-switches")
    one_line_error(proc, "took longer than 4 s", "the worker was stopped")  # 3 s and a grace of 1


def test_turns_on_several_templates_at_once_keeps_each_ones_limits_and_report():
    # Two workers at once (-j 2): the hostile template is stopped at its own limit and is its own
    # error; the other's report is written whole, as one at a time would write it.
    stable = str(ROOT / "fixtures" / "turns" / "stable.jinja")
    args = (str(HOSTILE / "filter_wordwrap_slow.jinja"), stable, "--timeout", "3", "--no-switches", "--format", "json")
    proc = tmplkit("turns", *args, "-j", "2")
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in err and err.count("\n") == 0, err[-2000:]
    assert err.startswith("tmplkit: error: filter_wordwrap_slow: cannot render the session: ") and "took longer than 4 s" in err
    alone = tmplkit("turns", *args, "-j", "1")
    assert json.loads(proc.stdout) == json.loads(alone.stdout) and alone.stderr.strip() == err
    assert [r["template"] for r in json.loads(proc.stdout)["reports"]] == ["filter_wordwrap_slow", "stable"]


def test_turns_reports_a_memory_bomb_as_an_error():
    proc = tmplkit("turns", str(HOSTILE / "bomb_held_values.jinja"), "--timeout", "20", "--no-switches")
    one_line_error(proc, "memory")


def test_mask_stops_a_hostile_render_at_the_audit_time_limit(conversation, tiny_hf_folder):
    proc = tmplkit("mask", str(HOSTILE / "filter_wordwrap_slow.jinja"), "--session", str(conversation),
                   "--tokenizer", str(tiny_hf_folder), "--format", "json")
    # (the worker is stopped at 10 s; where the one call ends sooner, the render's own 2 s limit tells it)
    one_line_error(proc, "took longer than")


def test_spans_reports_a_memory_bomb_as_an_error(conversation, tiny_hf_folder):
    proc = tmplkit("spans", str(HOSTILE / "bomb_held_values.jinja"), "--session", str(conversation),
                   "--tokenizer", str(tiny_hf_folder))
    one_line_error(proc, "memory")


# (every command that renders a template in a worker: its limits are --timeout and --memory)
_WORKER_COMMANDS = {
    "mask": ["mask", str(CHATML), "--session", "{conv}", "--tokenizer", "{tok}"],
    "spans": ["spans", str(CHATML), "--session", "{conv}", "--tokenizer", "{tok}"],
    "request": ["request", str(CHATML), "--session", "{conv}", "--tokenizer", "{tok}"],
    "annotate": ["annotate", str(CHATML), "-o", "{out}"],
    "server log": ["server", "log", "{log}", "--template", str(CHATML), "--session", "{conv}", "--tokenizer", "{tok}"],
}


@pytest.mark.parametrize("command", sorted(_WORKER_COMMANDS))
@pytest.mark.parametrize("limit", [["--timeout", "0"], ["--timeout", "nan"], ["--memory", "-5"]])
def test_a_workers_limit_that_is_not_positive_is_one_line_before_any_work(command, limit, conversation, tiny_hf_folder, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("main: server is listening on http://127.0.0.1:8080\n")
    args = [a.format(conv=conversation, tok=tiny_hf_folder, out=tmp_path / "out.jinja", log=log) for a in _WORKER_COMMANDS[command]]
    one_line_error(tmplkit(*args, *limit), f"{limit[0]} must be a positive")
    assert not (tmp_path / "out.jinja").exists()


def test_a_mask_past_its_timeout_says_which_option_raises_it(conversation, tiny_hf_folder):
    # a long conversation is legitimately slow: the limit is the user's to raise, and the error says how
    proc = tmplkit("mask", str(HOSTILE / "filter_wordwrap_slow.jinja"), "--session", str(conversation),
                   "--tokenizer", str(tiny_hf_folder), "--timeout", "1.5")
    one_line_error(proc, "took longer than 1.5 s", "raise --timeout")


@pytest.mark.parametrize("command", ["spans", "mask", "request"])
def test_a_low_memory_bounds_the_work_not_the_libraries_imports(conversation, command):
    # (--memory 128 failed every tokenizer command: numpy's and llama.cpp's own mapping counted
    # against it, and the line blamed an install, "llama-cpp-python, which is not installed")
    ok = tmplkit(command, str(CHATML), "--session", str(conversation), "--tokenizer", "vocab:qwen35", "--memory", "128")
    assert ok.returncode == 0, ok.stderr
    low = tmplkit(command, str(CHATML), "--session", str(conversation), "--tokenizer", "vocab:qwen35", "--memory", "16")
    one_line_error(low, "raise --memory")


def test_spans_out_of_memory_says_which_option_raises_it(conversation, tiny_hf_folder):
    proc = tmplkit("spans", str(HOSTILE / "bomb_held_values.jinja"), "--session", str(conversation),
                   "--tokenizer", str(tiny_hf_folder), "--memory", "300")
    one_line_error(proc, "out of memory", "raise --memory")


def test_annotate_stops_a_hostile_render_at_its_time_limit(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "annotated.jinja"
    # annotate's own limit (60 s by default: transformers' import and every check conversation), 5 s here
    proc = tmplkit("annotate", str(HOSTILE / "filter_wordwrap_slow.jinja"), "-o", str(out), "--timeout", "5")
    one_line_error(proc, "took longer than 5 s", "raise --timeout")
    assert not out.exists()


def test_annotate_reports_a_memory_bomb_as_an_error(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "annotated.jinja"
    one_line_error(tmplkit("annotate", str(HOSTILE / "bomb_held_values.jinja"), "-o", str(out)))
    assert not out.exists()


def _on_session(tmp_path) -> tuple[Path, Path]:
    """A template that passes every probe and makes one long call with no check inside (a `wordwrap`
    over 8M words: seconds on any machine, a gigabyte; a session render may build 50M characters)
    only on a message of the session it is given; and that session."""
    template = tmp_path / "on-session.jinja"
    template.write_text("{% for m in messages %}{% if m.content == 'wrap it' %}{{ ('x ' * 8000000)|wordwrap(1) }}"
                        "{% endif %}{% endfor %}" + CHATML.read_text())
    chat = tmp_path / "wrap-it.json"
    chat.write_text(json.dumps([{"role": "user", "content": "wrap it"}, {"role": "assistant", "content": "done"}]))
    return template, chat


def _with_session_timeout(seconds: float, *args: str) -> subprocess.CompletedProcess:
    """The command with its session renders' worker limits (tmplkit.cli._limits: SESSION_TIMEOUT, 60 s;
    RENDER_TIMEOUT, the audit's 10 s) made `seconds`, in a subprocess bounded as `tmplkit()`'s."""
    code = (f"import sys, tmplkit.cli._limits as l; l.SESSION_TIMEOUT = l.RENDER_TIMEOUT = {seconds}; "
            "from tmplkit.cli import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    try:
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=BOUND,
                              env=env, cwd=CODE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tmplkit {' '.join(args)} ran past {BOUND} s (a hang)")


def _hostile_model_run(command: str, tmp_path: Path) -> list[str]:
    """`prefill`'s or `replay`'s arguments on tiny:qwen35 with the template hostile only on its
    session (`_on_session`)."""
    template, chat = _on_session(tmp_path)
    return [command, "tiny:qwen35", "--session", str(chat), "--template", str(template), "-c", "512",
            "--settings", "none" if command == "prefill" else "llama-server"]


@pytest.mark.model
@pytest.mark.parametrize("command", ["prefill", "replay"])
def test_a_template_hostile_only_on_the_session_is_refused_before_the_model_loads(tmp_path, command):
    # the probes pass (the pre-check's analysis); the session's own render ran in this process, with
    # no memory limit, until a session render's 60 s limit (past this test's bound): it now runs in a
    # worker first, under the audit's limits
    pytest.importorskip("llama_cpp")
    proc = _with_session_timeout(1.0, *_hostile_model_run(command, tmp_path))
    err = one_line_error(proc, "refused before the model loads")
    assert "took longer than 1 s" in err or "ran out of memory" in err, err


@pytest.mark.model
@pytest.mark.parametrize("command", ["prefill", "replay"])
def test_prefill_and_replay_take_the_worker_limits_their_messages_name(tmp_path, command):
    # (replay ran out of memory on a 10,000-message session, "the template may build a huge value",
    # and neither command had a --memory or --timeout to raise: one vocabulary of options)
    pytest.importorskip("llama_cpp")
    run = _hostile_model_run(command, tmp_path)
    proc = tmplkit(*run, "--timeout", "1")
    err = one_line_error(proc, "refused before the model loads")
    assert ("took longer than 1 s" in err and "raise --timeout" in err) or "raise --memory" in err, err
    proc = tmplkit(*run, "--memory", "0")
    one_line_error(proc, "--memory")


def test_server_log_places_the_log_with_the_template_in_a_worker(tmp_path, tiny_hf_folder):
    template, chat = _on_session(tmp_path)
    log = ROOT / "fixtures" / "server-logs" / "0.3.36-cold-lv3.log"
    proc = _with_session_timeout(1.0, "server", "log", str(log), "--template", str(template), "--session", str(chat),
                                 "--tokenizer", str(tiny_hf_folder))
    err = one_line_error(proc, "the worker was stopped")
    assert "took longer than 1 s" in err or "ran out of memory" in err, err


def test_mask_in_its_worker_gives_the_same_mask(conversation, tiny_hf_folder):
    proc = tmplkit("mask", str(CHATML), "--session", str(conversation), "--tokenizer", str(tiny_hf_folder),
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    from tmplkit.masks import assistant_mask
    from tmplkit.session import load_conversation
    from tmplkit.tokens.tokenizers import load_tokenizer

    here = assistant_mask(load_one(CHATML), load_tokenizer(tiny_hf_folder), load_conversation(str(conversation)))
    assert json.loads(proc.stdout) == json.loads(json.dumps(here.to_dict(), ensure_ascii=False))


def test_contained_work_raises_its_own_error_class_here(tmp_path):
    from tmplkit.auditing.contained import run_contained
    from tmplkit.session import load_conversation

    with pytest.raises(InputError) as e:
        run_contained(load_conversation, str(tmp_path / "missing.json"), what="loading")
    assert "missing.json" in str(e.value)


def test_contained_work_past_its_time_is_a_timeout():
    import time

    from tmplkit.auditing.contained import run_contained

    with pytest.raises(RenderLimitError) as e:
        run_contained(time.sleep, 30, what="sleeping", timeout=0.5)
    assert e.value.kind == "timeout" and "took longer than 0.5 s" in str(e.value)


def test_contained_work_that_aborts_under_a_memory_limit_is_said_to_be_memory_likely():
    import os

    from tmplkit.auditing.contained import run_contained

    # (a tokenizer's native allocator aborts the process where an allocation fails under the limit)
    with pytest.raises(TmplkitError) as e:
        run_contained(os.abort, what="tokenizing", memory_mb=700)
    assert "aborted (SIGABRT)" in str(e.value) and "out of memory (over 700 MiB)" in str(e.value)
    assert "\n" not in str(e.value)


# --- (2) the gate never passes what it did not check ----------------------------------------------


def test_prefix_stability_cut_by_its_time_limit_is_not_checked():
    check = prefix_stability_of(load_one(CHATML), timeout=1e-6)
    assert check.verdict == NOT_CHECKED and "time limit" in check.detail


def test_prefix_stability_stopped_by_a_render_limit_is_not_checked(monkeypatch):
    # a session's render that hits a render limit (a long session: each render under its 2 s) proves
    # nothing; a template that refuses the session is "not applicable" (stand-ins for the study: a
    # real render limit takes its seconds on every render the study tries)
    import tmplkit.turns as turns
    from tmplkit.turns import TurnsReport

    stopped = "rendering template 't' took longer than 2 s; the template may loop without end"
    monkeypatch.setattr(turns, "study_turns", lambda *a, **k: TurnsReport("t", 0, (), error=stopped, limit="timeout"))
    check = prefix_stability_of(load_one(CHATML))
    assert check.verdict == NOT_CHECKED and "took longer than" in check.detail
    refused = "template 't' raised: system messages are not supported"
    monkeypatch.setattr(turns, "study_turns", lambda *a, **k: TurnsReport("t", 0, (), error=refused))
    assert prefix_stability_of(load_one(CHATML)).verdict == "not applicable"


def test_prefix_stability_on_the_users_own_session_that_the_template_refuses_is_not_checked(tmp_path, capsys):
    # (it was "not applicable", which the gate passes even with --fail-on unchecked: the session the
    # user asked about was never checked; the default session refused stays "not applicable")
    from tmplkit.auditing import default_turns_session
    from tmplkit.cli import main
    from tmplkit.session import Session, save_session

    template = tmp_path / "late-raise.jinja"
    template.write_text("{%- if messages | length > 20 %}{{ raise_exception('context too long for this template') }}"
                        "{% endif %}" + Path(CHATML).read_text(), encoding="utf-8")
    session = default_turns_session()
    own = prefix_stability_of(load_one(str(template)), session=Session(session.messages + session.messages[1:], ()))
    assert own.verdict == NOT_CHECKED and own.detail.startswith("the template cannot render the session: ")
    assert prefix_stability_of(load_one(str(template))).verdict == "not applicable"
    assert prefix_stability_of(load_one(str(template)), session=default_turns_session()).verdict == "not applicable"
    path = tmp_path / "s.json"
    save_session(Session(session.messages + session.messages[1:], ()), path)
    argv = ["--no-config", "audit", str(template), "--prefix-stability", "fail", "--session", str(path), "--in-process"]
    assert main(argv) == 0 and "prefix: 1 not checked -> ok" in capsys.readouterr().out
    assert main([*argv, "--fail-on", "unchecked"]) == 1
    out = capsys.readouterr().out
    assert "UNCHECKED" in out and "context too long for this template" in out
    # the default session: not applicable, and the text says why (it was in the JSON only)
    assert main(["--no-config", "audit", str(template), "--prefix-stability", "fail", "--in-process", "--fail-on",
                 "unchecked"]) == 0
    out = capsys.readouterr().out
    assert "prefix stability not applicable: the template cannot render the session: template 'late-raise' raised" in out


def _report_with_unchecked_prefix(fail_on: str, expected=None):
    from tmplkit.auditing import AuditReport, PrefixStability

    results = tuple(audit(load(str(CHATML))).results)
    check = PrefixStability(NOT_CHECKED, n_requests=3, detail="stopped at the time limit (1 s) after 1 of 3 requests")
    return AuditReport(results, dict(expected or {}), (), fail_on, (check,), "fail")


def test_gate_never_says_pass_for_a_prefix_check_that_did_not_run():
    report = _report_with_unchecked_prefix("fail")
    status, why, _ = verdict_of(report, 0)
    assert status == "pass" and why.startswith("prefix stability not checked")
    assert report.summary()["not_checked"] == ["chatml"]
    from tmplkit.auditing import format_text

    assert "not checked: prefix stability not checked" in format_text(report)
    from tmplkit.auditing import format_summary

    summary = format_summary(report)  # a stopped check is counted apart, never as checked
    assert re.search(r"prefix stability +0 checked\n", summary), summary
    assert re.search(r"not checked: stopped by a limit +1 ", summary), summary


def test_fail_on_unchecked_fails_a_check_that_did_not_run():
    report = _report_with_unchecked_prefix("unchecked")
    assert not report.ok and verdict_of(report, 0)[0] == "unchecked"
    assert report.summary()["failures"] == ["chatml"]
    # (an expected-failures entry excused it: a listed template that now passes, its check cut by a limit)
    listed = _report_with_unchecked_prefix("unchecked", {"chatml": "failed once"})
    assert not listed.ok and not listed.excused(0) and listed.summary()["expected_failures"] == []


def test_a_template_paired_with_an_empty_tokenizer_is_not_checked_never_passed():
    # (the library's `tokenizers={"chatml": ""}` skipped the round trip and passed under
    # fail_on="unchecked"; None was said so: "" is no tokenizer either)
    for none in ("", None):
        report = audit([load_one(CHATML)], tokenizer="vocab:qwen35", tokenizers={"chatml": none}, fail_on="unchecked")
        assert not report.ok and report.unchecked(0)[0].startswith("token round trip not run"), none


def test_tokenizer_auto_without_a_tokenizer_says_so_in_the_verdict_and_counts(tmp_path, matches_schema):
    folder = tmp_path / "ours"
    folder.mkdir()
    (folder / "plain-ours.jinja").write_text(CHATML.read_text())  # a name no corpus vocabulary is paired with
    report = audit(load(str(folder)), tokenizer="auto")
    assert report.ok
    status, why, _ = verdict_of(report, 0)
    assert status == "pass" and why.startswith("token round trip not run")
    assert report.summary()["token_round_trip"] == {"passed": 0, "failed": 0, "not_run": 1}
    assert matches_schema("audit", report.to_dict())
    strict = audit(load(str(folder)), tokenizer="auto", fail_on="unchecked")
    assert not strict.ok


def test_a_sandbox_escape_only_the_agent_session_reaches_fails_the_template(tmp_path, capsys):
    # (the analysis's short probes passed; the escape on the session's long render was "not
    # applicable" on the default session, and the gate passed it: an escape fails whatever happens)
    from tmplkit.cli import main

    template = tmp_path / "late-unsafe.jinja"
    template.write_text("{%- if messages | length > 20 %}{{ ''.__class__.__mro__[1].__subclasses__() }}{% endif %}"
                        + Path(CHATML).read_text(), encoding="utf-8")
    assert main(["--no-config", "audit", str(template), "--in-process"]) == 0  # (without the check: its probes pass)
    capsys.readouterr()
    for fail_on in ([], ["--fail-on", "unchecked"]):
        assert main(["--no-config", "audit", str(template), "--prefix-stability", "report", "--in-process", *fail_on]) == 1
        out = capsys.readouterr().out
        assert "UNSAFE" in out and "rendering the agent session: " in out and "1 unsafe" in out, out
    # lock: no behaviour to record, whichever render reached the escape (nothing rendered: two
    # unsafe templates compared as "no change" on their empty renders), and diff compares nothing
    capsys.readouterr()
    assert main(["--no-config", "lock", str(template), "--in-process", "-o", str(tmp_path / "l.json")]) == 2
    err = capsys.readouterr().err
    assert "the behaviour of 'late-unsafe'" in err and "sandbox forbids" in err and err.count("\n") == 1, err
    assert not (tmp_path / "l.json").exists()
    other = tmp_path / "other-unsafe.jinja"
    other.write_text(template.read_text(encoding="utf-8").replace("<|im_start|>", "<|start|>"), encoding="utf-8")
    assert main(["--no-config", "diff", str(template), str(other), "-j", "1"]) == 2
    assert "nothing was compared" in capsys.readouterr().err


def test_cli_audit_counts_what_was_not_checked(tmp_path):
    folder = tmp_path / "ours"
    folder.mkdir()
    (folder / "plain-ours.jinja").write_text(CHATML.read_text())
    proc = tmplkit("audit", str(folder), "--tokenizer", "auto", "--in-process")
    assert proc.returncode == 0, proc.stderr
    assert "token round trip: 0 passed, 0 failed, 1 not run" in proc.stdout
    proc = tmplkit("audit", str(folder), "--tokenizer", "auto", "--in-process", "--fail-on", "unchecked")
    assert proc.returncode == 1 and "UNCHECKED" in proc.stdout


# --- (4) folders take every template suffix, and names that would collide keep theirs --------------


def test_folder_reads_j2_and_jinja2_and_keeps_suffixes_apart(tmp_path):
    for name in ("a.j2", "b.jinja2", "c.jinja", "x.j2", "x.jinja2"):
        (tmp_path / name).write_text(CHATML.read_text())
    names = sorted(t.name for t in load(str(tmp_path)))
    assert names == ["a", "b", "c", "x.j2", "x.jinja2"]


# --- (5) a GGUF no extra can read is not sent to compile llama.cpp ----------------------------------


@pytest.mark.parametrize("spec", ["missing.gguf", "truncated.gguf"])
def test_unreadable_gguf_needs_no_extra(tmp_path, spec, monkeypatch):
    import importlib.util

    from tmplkit.tokens.tokenizers import TokenizerSpec

    (tmp_path / "truncated.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert TokenizerSpec.parse(str(tmp_path / spec)).extra == ""


def test_unreadable_gguf_is_told_as_what_it_is(tmp_path, conversation):
    (tmp_path / "truncated.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    for spec, needle in [(str(tmp_path / "missing.gguf"), "not found"), (str(tmp_path / "truncated.gguf"), "truncated.gguf")]:
        proc = tmplkit("spans", str(CHATML), "--session", str(conversation), "--tokenizer", spec)
        err = one_line_error(proc, needle)
        assert "llama-cpp-python" not in err and "compile" not in err


# --- (8) an output path that cannot be written is refused before the work ---------------------------


@pytest.mark.parametrize("command", [
    ["audit", str(CHATML), "-o", "{missing}"],
    ["audit", str(CHATML), "--report", "json:{missing}"],
    ["turns", str(HOSTILE / "filter_wordwrap_slow.jinja"), "-o", "{missing}"],
    ["table", str(CHATML), "-o", "{missing}"],
])
def test_unwritable_output_is_refused_before_any_work(tmp_path, command):
    missing = str(tmp_path / "no" / "such" / "out.txt")
    proc = tmplkit(*[a.replace("{missing}", missing) for a in command], timeout=20)
    one_line_error(proc, "cannot write")
    assert proc.stdout == ""  # nothing analyzed, nothing printed



# --- (6) no traceback: a lone surrogate, a closed or full stdout, an early Ctrl-C, undecodable names ---


@pytest.mark.parametrize("command", [["mask"], ["spans"], ["turns-session"]])
def test_lone_surrogate_in_a_conversation_is_one_line(tmp_path, tiny_hf_folder, command):
    chat = tmp_path / "chat.json"
    chat.write_text('[{"role": "user", "content": "a\\ud800"}, {"role": "assistant", "content": "b"}]')
    if command == ["turns-session"]:
        args = ["turns", str(CHATML), "--session", str(chat), "--tokenizer", str(tiny_hf_folder)]
    else:
        args = [command[0], str(CHATML), "--session", str(chat), "--tokenizer", str(tiny_hf_folder)]
    one_line_error(tmplkit(*args), "\\ud800", "chat.json")


def test_a_lone_surrogate_given_to_the_library_is_one_line(tiny_hf_folder, qwen35):
    # A Python str can hold half a UTF-16 pair, which a JSON file's reader refuses: the library
    # refuses it too, as its own error, never UnicodeEncodeError from deep inside a tokenizer.
    conv = [{"role": "user", "content": "a\ud800"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(InputError, match=r"<conversation>: a string holds \\ud800"):
        _tmplkit.load_conversation(conv)
    template = load_one(str(CHATML))
    for tok in (_tmplkit.load_tokenizer(str(tiny_hf_folder)), qwen35):
        with pytest.raises(InputError, match=r"\\ud800"):
            _tmplkit.assistant_mask(template, tok, conv)
        with pytest.raises(TmplkitError, match=r"'\\ud800', half of a UTF-16 pair"):
            tok.tokenize("a\ud800")
        assert tok.tokenize("a\U0001f600b")  # a whole pair is a character


@pytest.mark.parametrize("redirect", ["closed", "full"])
def test_a_closed_or_full_stdout_is_one_line(redirect):
    if redirect == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    shell = f"exec {sys.executable} -m tmplkit audit {CHATML} " + (">&-" if redirect == "closed" else "> /dev/full")
    proc = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=BOUND, env=env, cwd=CODE)
    err = one_line_error(proc, "standard output")
    assert "TMPLKIT_CACHE" not in err and "Exception ignored" not in err


@pytest.mark.parametrize("template,code", [("always-raises", 1), ("chatml", 0)])
def test_a_reader_that_stops_reading_leaves_the_exit_code_as_it_is(template, code):
    # (`tmplkit audit ... | grep -q`, `| head -1`: a failing audit exited 0 when its reader had gone)
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    proc = subprocess.Popen([sys.executable, "-m", "tmplkit", "--no-config", "audit", str(ROOT / "fixtures" / "templates" / f"{template}.jinja")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=CODE)
    proc.stdout.close()  # the reader is gone before the first line: every write meets a closed pipe
    _, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == code and "Traceback" not in err and "Exception ignored" not in err, err


def test_ctrl_c_while_the_command_starts_is_exit_130():
    import time

    env = {**os.environ, "PYTHONPATH": str(CODE)}
    # a template that runs to its time limit (seconds): a Ctrl-C that a loaded machine delivers late still
    # lands in the command, never in the interpreter's shutdown after a quick audit (which ends by the signal)
    slow = HOSTILE / "filter_wordwrap_slow.jinja"
    proc = subprocess.Popen([sys.executable, "-m", "tmplkit", "audit", str(slow)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=CODE, text=True)
    # (wait until tmplkit's imports are under way: before its first line, a Ctrl-C is Python's own start-up's)
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline and proc.poll() is None and not _importing_tmplkit(proc.pid):
        pass  # (no sleep: the signal must land while the imports still run)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=BOUND)
    assert proc.returncode == 130 and err.strip() == "tmplkit: interrupted", (proc.returncode, err)


def test_ctrl_c_handler_is_tmplkits_first_import():
    # the window a Ctrl-C prints Python's traceback in ends when tmplkit._interrupt runs: it is the
    # first module the command imports (after the interpreter's own `site` and `runpy`) and imports
    # nothing the interpreter has not loaded already
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "tmplkit", "--version"], capture_output=True,
                          text=True, timeout=BOUND, env=env, cwd=CODE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = [line.split("|")[-1] for line in proc.stderr.splitlines() if line.startswith("import time:")]
    first = names[[n.strip() for n in names].index("runpy") + 1:][0]
    assert first.strip() == "tmplkit._interrupt" and first.startswith("   "), names[:80]  # nested under `tmplkit`


def test_ctrl_c_after_the_work_is_still_one_line(tmp_path):
    # once main() has returned, the interpreter's shutdown (atexit work) runs: a Ctrl-C there is
    # tmplkit's one line and exit 130 too, not a traceback from an atexit callback
    proc = _schema_then_sigint_handler(tmp_path)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "_interrupted", (proc.stdout[-500:], proc.stderr)


def test_an_ignored_ctrl_c_stays_ignored(tmp_path):
    # started with SIGINT ignored (nohup, `cmd &` in a script, a CI runner), tmplkit installs no handler
    # of its own: Ctrl-C must not stop a command its parent shielded from it
    proc = _schema_then_sigint_handler(tmp_path, lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "SIG_IGN", (proc.stdout[-500:], proc.stderr)


def _schema_then_sigint_handler(tmp_path, preexec=None):
    """`tmplkit schema` through a console script that prints, after main() returns, the SIGINT handler
    (`preexec`: run in the child before it starts, e.g. to ignore SIGINT as nohup does)."""
    script = tmp_path / "tmplkit"  # the console script's name, as pip writes it
    script.write_text(f"#!{sys.executable}\nimport signal, sys\nfrom tmplkit.cli import main\ncode = main()\n"
                      "h = signal.getsignal(signal.SIGINT)\nprint(getattr(h, 'name', None) or h.__name__)\n"
                      "sys.exit(code)\n")
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    return subprocess.run([str(script), "schema"], capture_output=True, text=True, timeout=BOUND, env=env, cwd=CODE,
                          preexec_fn=preexec)


def _importing_tmplkit(pid: int) -> bool:
    """Whether the process has loaded a compiled module only tmplkit's imports bring (numpy's, or
    markupsafe's for jinja2): tmplkit's first line, which installs its Ctrl-C handler, has run."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return "numpy" in maps or "markupsafe" in maps


def test_undecodable_file_names_keep_json_and_junit_valid(tmp_path):
    import xml.dom.minidom

    folder = tmp_path / "t"
    folder.mkdir()
    (folder / os.fsdecode(b"\xff.jinja")).write_text(CHATML.read_text())
    out = tmp_path / os.fsdecode(b"\xfe.json")
    proc = tmplkit("audit", str(folder), "--format", "json", "-o", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(out.read_bytes().decode("utf-8"))["results"][0]["name"] == "\udcff"
    junit = tmplkit("audit", str(folder), "--format", "junit")
    xml.dom.minidom.parseString(junit.stdout.encode("utf-8", "surrogateescape"))


# --- (7) the blame goes where the fault is ------------------------------------------------------------


def test_bad_tool_call_arguments_blame_the_message(tmp_path, tiny_hf_folder):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        {"role": "tool", "content": "ok"}]))
    template = tmp_path / "items.jinja"  # reads the arguments as an object, as Qwen3.5's template does
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
                        "{% for k, v in c.function.arguments|items %}{{ k }}={{ v }}{% endfor %}{% endfor %}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    proc = tmplkit("spans", str(template), "--session", str(chat), "--tokenizer", str(tiny_hf_folder))
    one_line_error(proc, "message [1]", "not valid JSON")


def test_offline_hub_error_does_not_blame_an_unset_variable(monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub
    from huggingface_hub import constants, errors

    from tmplkit.errors import SourceError
    from tmplkit.sources import load_hf

    def unreachable(*args, **kwargs):
        raise errors.LocalEntryNotFoundError("cannot reach the Hub")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(SourceError) as e:
        load_hf("org/name")
    assert "HF_HUB_OFFLINE" not in str(e.value) and "could not be reached" in str(e.value)


# --- (9) the table: its exit code, a reason column, no unproven delimiters ---------------------------


def test_table_fails_with_failing_rows_says_why_and_lists_no_unproven_delimiters(tmp_path):
    (tmp_path / "good.jinja").write_text(CHATML.read_text())
    (tmp_path / "bad.jinja").write_text((ROOT / "fixtures" / "templates" / "always-raises.jinja").read_text())
    proc = tmplkit("table", str(tmp_path), "--format", "json", "--jobs", "1")
    assert proc.returncode == 1, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["rows"]}
    assert rows["good"]["reason"] == "" and rows["good"]["user_start"]
    assert rows["bad"]["status"] != "pass" and rows["bad"]["reason"]
    assert rows["bad"]["user_start"] is None and rows["bad"]["assistant_start"] is None
    listed = tmp_path / "expected.json"
    listed.write_text(json.dumps({"bad": "raises on purpose"}))
    assert tmplkit("table", str(tmp_path), "--jobs", "1", "--expected-failures", str(listed)).returncode == 0


def test_an_expected_failure_never_excuses_a_limit_or_a_sandbox_escape(tmp_path):
    # (a template listed for its impossible verdict that timed out, or one that reached for a sandbox
    # escape, was "TIMEOUT (expected)" / "UNSAFE (expected)" and the gate passed: nothing was checked,
    # or the template now does what no known failure covers)
    (tmp_path / "sau.jinja").write_text((ROOT / "fixtures" / "templates" / "system-as-user.jinja").read_text())
    (tmp_path / "escape.jinja").write_text((HOSTILE / "escape_mro_method.jinja").read_text())
    # (a loop no machine ends within the limit: the listed template, changed so that it times out)
    (tmp_path / "hang.jinja").write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    listed = tmp_path / "expected.json"
    listed.write_text(json.dumps({"sau": "impossible by design", "escape": "impossible by design",
                                  "hang": "impossible by design"}))
    proc = tmplkit("--no-config", "audit", str(tmp_path / "sau.jinja"), "--expected-failures", str(listed))
    assert proc.returncode == 0 and "IMPOSSIBLE (expected)" in proc.stdout, proc.stdout + proc.stderr
    proc = tmplkit("--no-config", "audit", str(tmp_path / "hang.jinja"), "--expected-failures", str(listed), "--timeout", "1")
    assert proc.returncode == 1 and "TIMEOUT " in proc.stdout and "(expected)" not in proc.stdout, proc.stdout
    proc = tmplkit("--no-config", "audit", str(tmp_path / "escape.jinja"), "--expected-failures", str(listed))
    assert proc.returncode == 1 and "UNSAFE " in proc.stdout and "(expected)" not in proc.stdout, proc.stdout


# --- (10) an internal attribute through |attr is unsafe, as the attribute itself is ----------------------


@pytest.mark.parametrize("padding", [0, 2_100_000])
def test_attr_filter_to_an_internal_attribute_is_unsafe(padding):
    from tmplkit.analysis import analyze
    from tmplkit.sources import ChatTemplate

    text = " " * padding + "{% set x = ''|attr('__class__') %}" + CHATML.read_text()
    assert analyze(ChatTemplate(text, "t", "-")).status == "unsafe"


def test_the_librarys_session_functions_take_what_their_siblings_take_and_refuse_bad_shapes_in_one_line(tmp_path):
    # (study_turns and session_requests raised AttributeError on a list or a path that text_mask and
    # conversation_spans take; template variables or expected failures of another shape raised a
    # ValueError or a TypeError from inside)
    from tmplkit.turns import session_requests, study_turns

    template = load_one(CHATML)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "more"}, {"role": "assistant", "content": "ok"}]
    (tmp_path / "c.json").write_text(json.dumps(chat))
    assert study_turns(template, chat, switches=False).n_requests == 2
    assert len(session_requests(chat, template)) == len(session_requests(str(tmp_path / "c.json"), template)) == 2
    for kwargs in (["a"], 5, {1: 2}):
        with pytest.raises(InputError, match="template variables must be a mapping of name -> value"):
            session_requests(chat, template, kwargs=kwargs)
    for listed in (["chatml"], 5, {"chatml": 5}):
        with pytest.raises(InputError, match="expected_failures must map template names to a reason"):
            audit([template], expected_failures=listed)
