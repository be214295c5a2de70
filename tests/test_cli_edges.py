"""What a CI user runs into: a cache folder that cannot be used, Ctrl-C early in an audit, the
audit from a script on standard input, a stray file in a folder, templates that cannot render,
`-` wherever a file is read, the options every command shares, and the wording of messages."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tmplkit._interrupt import Terminated, unwind_on_sigterm
from tmplkit.cli import build_parser, main
from tmplkit.cli._common import progress_printer
from tmplkit.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
TURNS = ROOT / "fixtures" / "turns"
CHATML = str(FIXTURES / "chatml.jinja")
RAISES = str(FIXTURES / "always-raises.jinja")  # raises on every chat: renders nothing
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # a child process imports this checkout


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--no-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *words: str) -> bool:
    return err.startswith("tmplkit: error: ") and err.count("\n") == 1 and all(w in err for w in words)


def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))


# ---- the cache folder -----------------------------------------------------------------------------

def test_a_cache_that_is_a_file_is_one_line(capsys, monkeypatch, tmp_path):
    pytest.importorskip("llama_cpp")
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path / "cache"))
    session = tmp_path / "s.json"
    session.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    # The real model is assembled into the cache on first use: the cache must be a folder.
    code, out, err = run(capsys, "prefill", "gemma", "--session", str(session), "--settings", "none")
    assert code == 2 and out == ""
    assert one_line_error(err, "cannot create the cache folder", "set TMPLKIT_CACHE to a writable folder")


def test_an_os_error_anywhere_is_one_line_with_exit_2(capsys, monkeypatch):
    # What no command foresaw (a read-only folder, a full disk) still ends in one line, not a traceback.
    import tmplkit.schemas

    def refuse(name):
        raise PermissionError(13, "Permission denied", "/cache/compiled")

    monkeypatch.setattr(tmplkit.schemas, "schema_path", refuse)
    code, _, err = run(capsys, "schema", "audit")
    assert code == 2 and one_line_error(err, "/cache/compiled: Permission denied", "TMPLKIT_CACHE")


# ---- Ctrl-C and scripts on standard input ------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3])
def test_ctrl_c_early_in_an_audit_is_one_line_and_130(delay):
    # The whole process group gets the SIGINT, as from a terminal: the workers and the forkserver,
    # still starting, must not print tracebacks of their own.
    code = ("import sys, tmplkit.cli\nprint('ready', flush=True)\n"
            f"sys.exit(tmplkit.cli.main(['--no-config', 'audit', '-j', '2', {str(FIXTURES)!r}]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, start_new_session=True)
    assert proc.stdout.readline() == "ready\n"
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert (proc.returncode, err) == (130, "tmplkit: interrupted\n") or proc.returncode == 1  # 1: it finished first


@pytest.mark.parametrize(("error", "printed"), [("EOFError", False), ("ValueError", True)])
def test_the_workers_forkserver_drops_the_eoferror_of_a_worker_whose_command_is_gone(error, printed):
    # A worker forked as the command is interrupted finds it gone before reading its start-up data;
    # multiprocessing then printed that EOFError's traceback after "tmplkit: interrupted" (the Ctrl-C
    # test at 0.3 s failed so once). In the forkserver (`python -c`, multiprocessing.forkserver
    # loaded) the preloaded module drops that error alone; anywhere else it changes nothing.
    code = ("import sys, multiprocessing.forkserver, tmplkit.auditing._forkserver_quiet as q\n"
            "assert sys.excepthook is q._quiet_when_parent_gone\n"
            f"raise {error}('parent gone')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert run.returncode == 1 and ("Traceback" in run.stderr) == printed, run.stderr
    elsewhere = subprocess.run([sys.executable, "-c", "import sys, tmplkit.auditing._forkserver_quiet as q; "
                                "assert sys.excepthook is not q._quiet_when_parent_gone", "x"],
                               capture_output=True, text=True, env=ENV, timeout=60)
    assert elsewhere.returncode == 0, elsewhere.stderr


@pytest.mark.parametrize("kind", [KeyboardInterrupt, Terminated])
def test_a_ctrl_c_that_lands_where_python_cannot_raise_it_still_ends_the_command(capsys, monkeypatch, kind):
    # A Ctrl-C (or SIGTERM) that lands in a callback Python calls from its own machinery (importlib's
    # module-lock weakref callback, while a command imports its layers: once in a while in the test
    # above) was printed as "Exception ignored in ... Traceback ... KeyboardInterrupt" and lost; the
    # command went on and did its work. It is raised again in the main thread: one line, exit 130.
    import weakref

    import tmplkit.schemas

    class Lock:
        pass

    def callback(_ref):
        raise kind

    def work(name):
        lock = Lock()
        ref = weakref.ref(lock, callback)
        del lock  # the callback runs here, and raises where nothing can catch it
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # (the interrupt comes back at a step of the main thread)
            ref()
        raise AssertionError("the command went on after the interrupt")

    monkeypatch.setattr(tmplkit.schemas, "schema_path", work)
    with unwind_on_sigterm():  # (SIGTERM raises Terminated, as in the commands that unwind)
        code, _, err = run(capsys, "schema", "audit")
    assert (code, err) == (130, "tmplkit: interrupted\n")


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="CPython 3.11's note of an unhandled Ctrl-C")
def test_a_ctrl_c_the_command_handled_exits_130_though_cpython_noted_it_unhandled(tmp_path):
    # CPython notes a Ctrl-C that interrupts code run through its C API (which some imports do) as
    # unhandled, and the note stayed when the command caught it: after its one line, `python -m
    # tmplkit` killed itself with SIGINT (status -2) about once in ten runs interrupted mid-work.
    (tmp_path / "interrupted_command.py").write_text(
        "import ctypes, sys, tmplkit.schemas\n"
        "from tmplkit.cli import main\n"
        "def interrupted(name):  # (as CPython notes it, then raises it)\n"
        "    ctypes.c_int.in_dll(ctypes.pythonapi, '_Py_UnhandledKeyboardInterrupt').value = 1\n"
        "    raise KeyboardInterrupt\n"
        "tmplkit.schemas.schema_path = interrupted\n"
        "sys.exit(main(['schema', 'audit']))\n")
    env = {**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    # (Ctrl-C's default action, as at a terminal: CPython's exit by the signal then kills the process)
    proc = subprocess.run([sys.executable, "-m", "interrupted_command"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (proc.returncode, proc.stderr) == (130, "tmplkit: interrupted\n")


def test_the_audit_from_a_script_on_standard_input(tmp_path):
    # multiprocessing's workers would run the main file '<stdin>' again, and fail on it each.
    script = ("import tmplkit\n"
              f"report = tmplkit.audit(tmplkit.load_many([{CHATML!r}, {str(FIXTURES / 'llama3.jinja')!r}]), jobs=2)\n"
              "print(report.ok, [a.status for a in report.results])\n")
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, env=ENV, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == "True ['pass', 'pass']\n"


# ---- a folder with a file that is not a template ---------------------------------------------------

@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / "templates"
    d.mkdir()
    (d / "chatml.jinja").write_text(Path(CHATML).read_text())
    (d / "empty.jinja").write_text("")
    (d / "binary.jinja").write_bytes(b"\x00\xff\xfe\x00 not text")
    (d / "syntax.jinja").write_text("{% for %}")
    return d


@pytest.mark.parametrize("jobs", [["--in-process"], ["-j", "1"]])
def test_an_empty_or_binary_file_is_that_files_result(capsys, folder, jobs):
    code, out, err = run(capsys, "audit", *jobs, "--format", "json", str(folder))
    assert code == 1
    rows = {r["name"]: r for r in json.loads(out)["results"]}
    assert {n: r["status"] for n, r in rows.items()} == {"binary": "error", "chatml": "pass", "empty": "error", "syntax": "error"}
    assert "not valid UTF-8" in rows["binary"]["errors"][0] and "empty file" in rows["empty"]["errors"][0]
    assert err == "4 templates: 3 error, 1 pass -> FAILED\n"


def test_a_file_that_cannot_be_read_asked_for_by_name_is_the_error(capsys, folder):
    code, out, err = run(capsys, "show", str(folder), "--name", "empty")
    assert code == 2 and out == "" and one_line_error(err, "empty.jinja: empty file")


# ---- templates that cannot render: one line on stderr, exit 2 -------------------------------------

def test_a_template_that_breaks_on_the_users_conversation_says_what_to_do(capsys, tmp_path):
    # (mask said only Python's words: "template 'chatml' failed (line 9): TypeError: can only
    # concatenate str (not "list") to str", a system message's content given as text parts, as
    # transformers gives them, to a template that adds it to a string)
    chat = tmp_path / "c.json"
    chat.write_text('[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", '
                    '"content": "hi"}, {"role": "assistant", "content": "hello"}]')
    code, out, err = run(capsys, "mask", CHATML, "--session", str(chat), "--tokenizer", "vocab:qwen35")
    assert code == 2 and out == "" and one_line_error(
        err, "tmplkit: error: the template fails on this conversation (give one it renders: each content as the "
             "template reads it, a string or a list of text parts", "template 'chatml' failed (line", "TypeError"), err


def test_show_a_template_that_cannot_render(capsys):
    code, out, err = run(capsys, "show", RAISES)
    assert code == 2 and out == ""
    assert one_line_error(err, "always-raises: cannot render the probe conversation", "documents=")


def test_a_templates_refusal_of_the_users_conversation_says_what_to_do(capsys, tmp_path):
    # (it said what the template said and stopped: "... raised (line 79): No user query found in messages.")
    template = tmp_path / "needs-user.jinja"
    template.write_text("{%- if not (messages | selectattr('role', 'equalto', 'user') | list) %}"
                        "{{ raise_exception('No user query found in messages.') }}{% endif %}" + Path(CHATML).read_text())
    chat = tmp_path / "c.json"
    chat.write_text('[{"role": "system", "content": "s"}, {"role": "assistant", "content": "hi"}]')
    for command in ("spans", "mask", "request"):
        code, out, err = run(capsys, command, str(template), "--session", str(chat), "--tokenizer", "vocab:qwen35")
        assert code == 2 and out == "" and one_line_error(
            err, "tmplkit: error: the template's own check refuses this conversation (give one it takes): template "
                 "'needs-user' raised (line 1): No user query found in messages."), err
    # turns says so too, in its own line (it was the template's words alone), one worker or several
    template = tmp_path / "no-tools.jinja"
    template.write_text("{%- if messages | selectattr('role', 'equalto', 'tool') | list %}"
                        "{{ raise_exception('Tool messages are not supported.') }}{% endif %}" + Path(CHATML).read_text())
    chat.write_text('[{"role": "user", "content": "ls"}, {"role": "assistant", "tool_calls": [{"id": "c1", "type": '
                    '"function", "function": {"name": "ls", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c1", '
                    '"content": "a.txt"}, {"role": "assistant", "content": "One file."}]')
    for jobs in ("1", "2"):
        code, out, err = run(capsys, "turns", str(template), str(template), "--session", str(chat), "-j", jobs)
        assert code == 2 and out == "" and err.count(
            "tmplkit: error: no-tools: cannot render the session: the template's own check refuses this conversation "
            "(give one it takes): template 'no-tools' raised (line 1): Tool messages are not supported.") == 2, err
    # (without --session the session is the generated one, no conversation of the user's to change)
    code, out, err = run(capsys, "turns", str(template))
    assert code == 2 and one_line_error(err, "no-tools: cannot render the session: the template's own check refuses the "
                                        "generated agent session (give --session FILE with a conversation it takes): "
                                        "template 'no-tools' raised (line 1): Tool messages are not supported.")
    code, out, err = run(capsys, "show", RAISES)  # (its own probe, no conversation of the user's: no such advice)
    assert "give one it takes" not in err


def test_turns_on_a_template_that_cannot_render(capsys):
    code, out, err = run(capsys, "turns", RAISES)
    assert code == 2 and out == "" and one_line_error(err, "always-raises: cannot render the session")
    # The others are still reported; the JSON keeps the error in its row, for a program.
    code, out, err = run(capsys, "turns", str(TURNS / "stable.jinja"), RAISES)
    assert code == 2 and out.startswith("stable: stable over") and "always-raises" not in out
    assert one_line_error(err, "always-raises")


def test_a_turns_report_written_to_a_file_names_the_template_that_failed(tmp_path, capsys):
    # (the file held the others' report alone: it read as whole, the failure on the terminal only)
    report = tmp_path / "turns.txt"
    code, out, err = run(capsys, "turns", str(TURNS / "stable.jinja"), RAISES, "-o", str(report))
    text = report.read_text()
    assert code == 2 and out == "" and one_line_error(err, "always-raises: cannot render the session")
    assert text.startswith("stable: stable over") and "always-raises: cannot render the session: " in text
    # every template failed: nothing studied, the file as it was
    report.write_text("keep")
    code, out, err = run(capsys, "turns", RAISES, RAISES, "-o", str(report))
    assert code == 2 and report.read_text() == "keep"
    for form in ("json", "markdown", "csv"):  # (each replaced the file with rows of errors alone)
        code, out, err = run(capsys, "turns", "--format", form, RAISES, "-o", str(report))
        assert code == 2 and report.read_text() == "keep" and one_line_error(err, "always-raises")
    code, out, _ = run(capsys, "turns", "--format", "json", RAISES)
    (row,) = json.loads(out)["reports"]
    assert code == 2 and row["error"] and row["stable"] is None  # not studied: no verdict (it said false)
    code, out, _ = run(capsys, "turns", "--format", "markdown", RAISES)
    assert "| always-raises | not studied |" in out


# ---- '-' wherever a file is read ---------------------------------------------------------------------

def test_turns_session_from_standard_input(capsys, monkeypatch):
    session = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "user", "content": "again"}]
    _stdin(monkeypatch, json.dumps(session))
    code, out, err = run(capsys, "turns", "--format", "json", "--no-switches", "--session", "-", str(TURNS / "stable.jinja"))
    assert code == 0, err
    assert json.loads(out)["reports"][0]["n_requests"] == 2


def test_expected_failures_from_standard_input(capsys, monkeypatch, tmp_path):
    failing = tmp_path / "nodelims.jinja"
    failing.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    _stdin(monkeypatch, json.dumps({"nodelims": "no delimiters, kept for a test"}))
    code, out, _ = run(capsys, "audit", "--in-process", "--expected-failures", "-", str(failing))
    assert code == 0 and "(expected) nodelims" in out
    _stdin(monkeypatch, "[1, 2]")
    code, _, err = run(capsys, "audit", "--in-process", "--expected-failures", "-", str(failing))
    assert code == 2 and one_line_error(err, "<stdin>", "JSON object")


# ---- the options every command shares ---------------------------------------------------------------

def _subcommands():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, p in sub.choices.items():
        nested = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            yield from ((f"{name} {n}", q) for n, q in nested[0].choices.items())
        else:
            yield name, p


def _option(parser, flag: str):
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_every_format_shows_its_choices_and_default():
    seen = 0
    for name, p in _subcommands():
        fmt = _option(p, "--format")
        if fmt is None:
            continue
        seen += 1
        old = p.get_default("_format_aliases") or {}  # old names, still accepted, not shown
        assert all(c in fmt.help for c in fmt.choices if c not in old), name
        assert f"(default: {fmt.default})" in fmt.help or (fmt.default is None and "(default: " in fmt.help), name
        assert _option(p, "-o") is not None, f"{name} has --format but no -o"
    assert seen >= 9


def test_every_command_that_reads_templates_has_name_and_output():
    for name, p in _subcommands():
        reads = any(a.dest in ("source", "sources", "template") for a in p._actions)
        if reads:
            assert _option(p, "--name") is not None, name
            assert _option(p, "-o") is not None and _option(p, "--output") is not None, name


def test_prefill_and_replay_take_format_and_o_and_report():
    parser = build_parser()
    for cmd in ("prefill", "replay"):
        args = parser.parse_args([cmd, "gemma", "--session", "s.json", "--format", "json", "-o", "out.json",
                                  "--report", "json:also.json"])
        assert (args.format, args.output, args.report, args.session) == ("json", "out.json", ["json:also.json"], "s.json")


def test_show_writes_to_o(capsys, tmp_path):
    out = tmp_path / "show.txt"
    code, printed, _ = run(capsys, "show", CHATML, "-o", str(out))
    assert code == 0 and printed == "" and out.read_text().startswith("# chatml: ")


def test_name_picks_templates_of_many_sources(capsys):
    code, out, _ = run(capsys, "table", "--format", "csv", "--jobs", "1", "--name", "llama3", str(FIXTURES))
    assert code == 0 and [row["name"] for row in csv.DictReader(io.StringIO(out))] == ["llama3"]
    code, _, err = run(capsys, "table", "--name", "nope", CHATML)
    assert code == 2 and one_line_error(err, "no template named 'nope'", "chatml")


def test_table_says_why_a_listed_failure_that_passes_fails_it(capsys, tmp_path):
    listed = tmp_path / "expected.json"
    listed.write_text(json.dumps({"chatml": "thought to fail"}))
    code, out, err = run(capsys, "table", "--jobs", "1", CHATML, "--expected-failures", str(listed))
    assert code == 1 and "| chatml | pass |" in out
    assert "note: chatml is listed as an expected failure but passes; remove it from the list" in err, err


# ---- wording -------------------------------------------------------------------------------------------

def test_one_template_is_singular(capsys):
    code, out, _ = run(capsys, "audit", "--in-process", CHATML)
    assert code == 0 and out.splitlines()[-1] == "1 template: 1 pass -> ok"


def test_turns_markdown_without_a_tokenizer_says_the_character(capsys):
    code, out, _ = run(capsys, "turns", "--format", "markdown", str(TURNS / "date.jinja"))
    row = out.splitlines()[2]
    assert code == 0 and "request 1, character " in row and "token  |" not in row and "token |" not in row


def test_progress_without_cursor_escapes_on_a_dumb_terminal(capsys, monkeypatch):
    class A:
        name = "chatml"

    monkeypatch.setenv("TERM", "dumb")
    report = progress_printer(True)
    report(1, 2, A())
    report(2, 2, A())
    assert capsys.readouterr().err == "[1/2] chatml\n[2/2] chatml\n"
    monkeypatch.setenv("TERM", "xterm")
    progress_printer(True)(1, 2, A())
    assert capsys.readouterr().err == "\r\x1b[2K[1/2] chatml"


def test_messages_name_the_flags(capsys):
    code, _, err = run(capsys, "session", "generate", "--tokens", "100")
    assert code == 2 and one_line_error(err, "--tokens must be at least 200")
    from tmplkit.cli._common import prefill_settings

    args = build_parser().parse_args(["prefill", "gemma", "s.json", "-b", "0"])
    with pytest.raises(Exception, match=r"^-b/--batch-size must be at least 1, got 0$"):
        prefill_settings(args)


def test_prefill_refuses_a_huge_repeat_and_checkpoints_shaped_and_off(capsys, tmp_path):
    # (both ran: a billion runs until killed; -ctxcp ignored under --checkpoints off, exit 0)
    from tmplkit.cli._common import prefill_settings

    session = tmp_path / "s.json"
    session.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    pytest.importorskip("llama_cpp")  # (prefill asks for the llama extra first)
    code, _, err = run(capsys, "prefill", "tiny:qwen35", "--session", str(session), "--repeat", "1000000000")
    assert code == 2 and one_line_error(err, "--repeat must be at most 1000, got 1000000000")
    parse = build_parser().parse_args
    for given, said in ((["-ctxcp", "5"], "-ctxcp shapes"), (["-ctxcp", "5", "-cms", "9"], "-ctxcp and -cms shape")):
        with pytest.raises(Exception, match=f"^{said} the checkpoints, and --checkpoints off takes none"):
            prefill_settings(parse(["prefill", "gemma", "--session", "s.json", "--checkpoints", "off", *given]))
    # given with checkpoints on, or left out: what was given, else the defaults
    on = prefill_settings(parse(["prefill", "gemma", "--session", "s.json", "--checkpoints", "on", "-cms", "9"]))
    off = prefill_settings(parse(["prefill", "gemma", "--session", "s.json", "--checkpoints", "off"]))
    assert (on.max_checkpoints, on.checkpoint_min_step) == (32, 9) and off.checkpoints is False
    assert (off.max_checkpoints, off.checkpoint_min_step) == (32, 8192)
    replay = prefill_settings(parse(["replay", "gemma", "--session", "s.json", "-ctxcp", "4"]))
    assert replay.max_checkpoints == 4


def test_ctx_checkpoints_zero_means_none_as_llama_server_reads_it_and_both_take_32_bits():
    # (-ctxcp 0 was "must be at least 1", with no word of what to do: llama-server takes it for no
    # checkpoints; -ctxcp 99999999999 and -cms 2147483648, which its int parsing refuses, ran)
    from tmplkit.cli._common import prefill_settings

    parse = build_parser().parse_args
    none = prefill_settings(parse(["prefill", "gemma", "--session", "s.json", "-ctxcp", "0"]))
    assert none.checkpoints is False and none == prefill_settings(parse(["prefill", "gemma", "--session", "s.json",
                                                                         "--checkpoints", "off"]))
    assert prefill_settings(parse(["prefill", "gemma", "--session", "s.json", "-ctxcp", "0", "--checkpoints", "off"])) == none
    for argv, said in ((["prefill", "-ctxcp", "0", "--checkpoints", "on"], "-ctxcp 0 takes no checkpoints and --checkpoints on"),
                       (["replay", "-ctxcp", "0"], "-ctxcp/--ctx-checkpoints 0 takes no checkpoints (llama-server's meaning)"),
                       (["replay", "-ctxcp", "99999999999"], "-ctxcp/--ctx-checkpoints must be at most 2147483647"),
                       (["prefill", "-cms", "2147483648"], "-cms/--checkpoint-min-step must be at most 2147483647"),
                       # (it said "must be at least 1" where 0 is taken, and "--checkpoints off" that was never typed)
                       (["prefill", "-ctxcp", "-1"], "-ctxcp/--ctx-checkpoints must be at least 0 (0: no checkpoints), got -1"),
                       (["prefill", "-ctxcp", "0", "-cms", "64"], "-cms shapes the checkpoints, and -ctxcp 0 takes none; "
                                                                  "leave it out or drop -ctxcp 0"),
                       # (it said "drop --checkpoints off", which left -ctxcp 0 taking none)
                       (["prefill", "-ctxcp", "0", "--checkpoints", "off", "-cms", "64"],
                        "-cms shapes the checkpoints, and -ctxcp 0 and --checkpoints off take none; leave it out or "
                        "drop -ctxcp 0 and --checkpoints off")):
        with pytest.raises(InputError, match=re.escape(said)):
            prefill_settings(parse([argv[0], "gemma", "--session", "s.json", *argv[1:]]))


def test_no_llama_server_points_at_what_an_installed_package_can_do(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPLKIT_LLAMA_SERVER", str(tmp_path / "none"))
    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path / "cache"))
    code, _, err = run(capsys, "engine-parity", CHATML)
    assert code == 2 and one_line_error(err, "--server PATH", "TMPLKIT_LLAMA_SERVER", "make llama-server")
    assert "scripts/" not in err


# ---- what a message says: JSON's words, what to do, one cause -----------------------------------

@pytest.mark.parametrize("name, content, argv, words", [
    ("n.json", '{"chat_template": null}', ("audit", "n.json"), ("got null",)),
    ("e.gguf", "", ("audit", "e.gguf"), ("0 bytes, too short for the GGUF magic",)),
    ("r.json", '[{"content": "x"}]', ("spans", CHATML, "--session", "r.json", "--tokenizer", "vocab:qwen35"),
     ("has no 'role'; give each message its 'role'",)),
    ("g.bin", "\x00garbage", ("spans", CHATML, "--session", "r.json", "--tokenizer", "g.bin"),
     ("neither a GGUF file nor a tokenizer.json; give a .gguf",)),
    ("syn.jinja", "{% if %}", ("annotate", "syn.jinja", "-o", "out.jinja"), ("does not compile", "tmplkit audit")),
])
def test_a_message_says_what_was_wrong_in_the_users_words_and_what_to_do(capsys, tmp_path, name, content, argv, words):
    (tmp_path / name).write_text(content, encoding="utf-8")
    (tmp_path / "r.json").write_text(content if name == "r.json" else '[{"role": "user", "content": "hi"}]', encoding="utf-8")
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err
    assert "NoneType" not in err and "cannot map" not in err


@pytest.mark.parametrize("argv, reads_dash", [(("server", "log", "{path}"), True),
                                              (("prefill", "{path}", "--session", "s.json"), False),  # (a model)
                                              (("turns", CHATML, "--session", "{path}"), True)])
def test_a_folder_or_a_pipe_given_for_a_file_is_said_for_what_it_is(capsys, tmp_path, argv, reads_dash):
    (tmp_path / "s.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    for name, says in (("folder", "is a folder"), ("pipe", "not a regular file (a pipe or device)")):
        code, out, err = run(capsys, *[a.format(path=name) for a in argv])
        assert code == 2 and err.count("\n") == 1 and says in err and "not found" not in err, err
        if name == "pipe":  # (`--session <(jq ...)`: where - is standard input, the line says so)
            assert err.rstrip().endswith("or pipe it to - (standard input)") == reads_dash, err


def test_a_template_given_as_a_pipe_says_to_pipe_it_to_dash(capsys, tmp_path):
    # `tmplkit audit <(curl ...)`: a pipe is not waited on; `-` reads the template from standard input
    os.mkfifo(tmp_path / "pipe")
    code, out, err = run(capsys, "audit", str(tmp_path / "pipe"))
    assert code == 2 and err.count("\n") == 1 and "not a regular file" in err, err
    assert err.rstrip().endswith("give a chat template as a file, or pipe it to - (standard input)"), err


# ---- a closed standard stream, a configuration that is a pipe, a folder's broken entries ------------------------

def _cli(args, cwd, **kwargs):
    return subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", *args], cwd=cwd, env=ENV, text=True,
                          capture_output=kwargs.pop("capture_output", True), timeout=120, **kwargs)


def test_sigterm_in_an_audit_is_one_line_and_130_and_leaves_nothing(tmp_path):
    # (SIGTERM ended it at once, silently, 143, multiprocessing's forkserver folder left in $TMPDIR)
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tmplkit", "--no-config", "audit", str(ROOT / "fixtures" / "hostile"),
                             "-o", str(tmp_path / "out.json")], cwd=tmp_path, env={**ENV, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # (its workers started, templates rendering: the folder's slowest take seconds)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (130, "tmplkit: interrupted\n")
    assert list(temp.iterdir()) == [] and not (tmp_path / "out.json").exists()


def test_a_closed_stdin_or_stderr_is_one_line_or_silence_with_the_right_exit_code(tmp_path):
    closed = _cli(["audit", "-"], tmp_path, stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0))
    assert closed.returncode == 2 and "standard input is closed" in closed.stderr and "Traceback" not in closed.stderr
    out = tmp_path / "out.txt"
    with open(out, "w") as f:  # stderr closed: the audit still runs, writes and passes
        quiet = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", "lock", CHATML, "--lock", "l.json"],
                               cwd=tmp_path, env=ENV, stdout=f, preexec_fn=lambda: os.close(2), timeout=120)
    assert quiet.returncode == 0 and (tmp_path / "l.json").is_file()


@pytest.mark.parametrize("argv", [["audit", "-"], ["server", "log", "-"], ["spans", CHATML, "--session", "-", "--tokenizer",
                                                                        "vocab:qwen35"]])
def test_a_dash_on_a_terminal_is_one_line_not_a_silent_wait(tmp_path, argv):
    # (each waited, printing nothing, for what would be typed: a hang to whoever forgot the pipe)
    import pty

    main_fd, typed = pty.openpty()
    try:
        done = _cli(argv, tmp_path, stdin=typed)
    finally:
        os.close(main_fd)
        os.close(typed)
    assert done.returncode == 2 and one_line_error(done.stderr, "standard input is a terminal", "pipe it in")


def test_a_configuration_that_is_a_pipe_or_nested_too_deep_is_one_line(tmp_path, capsys):
    os.mkfifo(tmp_path / "c.toml")
    assert main(["--config", str(tmp_path / "c.toml"), "audit", CHATML]) == 2  # (it hung, reading the pipe)
    assert "not a regular file" in capsys.readouterr().err
    (tmp_path / "deep.toml").write_text("x = " + "[" * 600 + "]" * 600 + "\n")
    assert main(["--config", str(tmp_path / "deep.toml"), "audit", CHATML]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nested too deep" in err


def test_a_folders_broken_link_and_pipe_are_error_rows_not_left_out(tmp_path, capsys):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a.jinja").write_text(Path(CHATML).read_text())
    (folder / "b.jinja").symlink_to(folder / "missing.jinja")
    os.mkfifo(folder / "c.jinja")
    code, out, _ = run(capsys, "audit", str(folder))
    assert code == 1 and "3 templates: 2 error, 1 pass" in out


def test_a_template_that_raises_a_message_of_two_lines_is_still_one_line(tmp_path, capsys):
    (tmp_path / "ml.jinja").write_text("{{ raise_exception('first line\\nsecond line') }}")
    (tmp_path / "c.json").write_text('[{"role": "user", "content": "hi"}]')
    code, _, err = run(capsys, "spans", str(tmp_path / "ml.jinja"), "--session", str(tmp_path / "c.json"),
                       "--tokenizer", "vocab:qwen35")
    assert code == 2 and err.count("\n") == 1 and "first line\\nsecond line" in err


def test_spans_of_delimiters_not_proven_are_written_and_fail(tmp_path, capsys):
    # (it exited 0 with empty spans: a pipeline took them for an answer)
    (tmp_path / "plain.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    (tmp_path / "c.json").write_text('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]')
    out = tmp_path / "spans.json"
    code, _, err = run(capsys, "spans", str(tmp_path / "plain.jinja"), "--session", str(tmp_path / "c.json"),
                       "--tokenizer", "vocab:qwen35", "-o", str(out))
    assert code == 1 and json.loads(out.read_text())["delimiters"]["passed"] is False
    assert err.count("\n") == 1 and "not proven" in err and "no delimiters" in err, err
    code, _, _ = run(capsys, "spans", CHATML, "--session", str(tmp_path / "c.json"), "--tokenizer", "vocab:qwen35")
    assert code == 0


def test_spans_and_requests_where_the_conversation_is_read_otherwise_than_the_probes_fail(tmp_path, capsys):
    # (a tool result without tool_call_id, written as a user turn by a template its probes proved on
    # tool turns: spans exited 0 with a user span per tool result, and `request` gave llama-server
    # delimiters that end a batch at each of them)
    template = str(ROOT / "fixtures" / "templates" / "tool-without-id-as-user.jinja")
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    chat = [{"role": "user", "content": "List the files."}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "a.txt b.txt"}, {"role": "assistant", "content": "Two files."}]
    (tmp_path / "c.json").write_text(json.dumps(chat))
    out = tmp_path / "spans.json"
    code, _, err = run(capsys, "spans", template, "--session", str(tmp_path / "c.json"), "--tokenizer", "vocab:qwen35",
                       "-o", str(out))
    written = json.loads(out.read_text())
    assert code == 1 and written["misplaced"] == ["message 2 (tool) lies in a user span (character 104)"]
    assert written["user_starts"] == [0, 24] and written["delimiters"]["passed"] is True
    assert err.count("\n") == 1 and err.startswith("tmplkit: spans: on this conversation message 2 (tool) lies in a user span")
    assert "cannot be trusted" in err  # (as spans of unproven delimiters: written, and exit 1)
    code, out_text, err = run(capsys, "request", template, "--session", str(tmp_path / "c.json"), "--tokenizer", "vocab:qwen35")
    assert code == 2 and out_text == "" and one_line_error(err, "message 2 (tool) lies in a user span", "llama-server")
    chat[2]["tool_call_id"] = "c1"  # (as the probes send it: read right)
    (tmp_path / "c.json").write_text(json.dumps(chat))
    code, _, err = run(capsys, "spans", template, "--session", str(tmp_path / "c.json"), "--tokenizer", "vocab:qwen35",
                       "-o", str(out))
    assert code == 0 and json.loads(out.read_text())["misplaced"] == [], err


def test_spans_whose_ids_read_the_conversation_otherwise_than_its_text_are_written_and_fail(tmp_path, capsys):
    """Token delimiters proven on the probe render meet contexts the probe lacks: here a BOS string
    the vocabulary spells as text merges into the first `[INST]` (`>[`), and `]` ending the user's
    content into `[/INST]` (`][/` in qwen2). spans exited 0 with the first user message in no span;
    the token split is now held against the text split of the very render."""
    (tmp_path / "inst.jinja").write_text("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}"
                                         "{{ '[INST]' + m.content + '[/INST]' }}{% elif m.role == 'assistant' %}"
                                         "{{ m.content + eos_token }}{% endif %}{% endfor %}")
    chat = [{"role": "user", "content": "Sort [3, 1, 2]"}, {"role": "assistant", "content": "[1, 2, 3]"},
            {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Welcome"}]
    (tmp_path / "c.json").write_text(json.dumps(chat))
    out = tmp_path / "spans.json"
    code, _, err = run(capsys, "spans", str(tmp_path / "inst.jinja"), "--session", str(tmp_path / "c.json"),
                       "--tokenizer", "vocab:qwen2", "-o", str(out))
    written = json.loads(out.read_text())
    assert code == 1 and written["delimiters"]["passed"] is True and written["misplaced"] == []
    assert written["disagreements"][0] == "the token split misses the user start at character 3", written
    assert err.count("\n") == 1 and "on this conversation the token split misses the user start at character 3" in err
    assert "cannot be trusted" in err
    # a conversation its ids read as its text: no disagreement, exit 0
    code, _, err = run(capsys, "spans", CHATML, "--session", str(tmp_path / "c.json"), "--tokenizer", "vocab:qwen35",
                       "-o", str(out))
    assert code == 0 and json.loads(out.read_text())["disagreements"] == [], err


@pytest.mark.parametrize("name,status", [("system-as-user", "impossible"), ("missing-call-marker", "fail")])
def test_spans_and_requests_of_a_template_that_failed_its_analysis_fail(tmp_path, capsys, name, status):
    # (spans exited 0, and `request` gave llama-server a failed template's delimiters: their ids
    # split the render as its text, which was never proved)
    template = str(ROOT / "fixtures" / "templates" / f"{name}.jinja")
    (tmp_path / "c.json").write_text('[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]')
    out = tmp_path / "spans.json"
    code, _, err = run(capsys, "spans", template, "--session", str(tmp_path / "c.json"), "--tokenizer", "vocab:qwen35", "-o", str(out))
    assert code == 1 and json.loads(out.read_text())["delimiters"]["passed"] is False
    assert err.count("\n") == 1 and f"not proven by the analysis (the analysis did not pass ({status}: " in err, err
    code, _, err = run(capsys, "request", template, "--delimiters-only", "--tokenizer", "vocab:qwen35")
    assert code == 2 and err.count("\n") == 1 and f"no delimiters to give llama-server: its analysis is {status}" in err, err


@pytest.mark.parametrize("argv", [["mask", CHATML, "--session", str(ROOT / "fixtures" / "masks" / "chat.json"),
                                   "--tokenizer", "vocab:qwen35"], ["lock", CHATML, "--lock", "l.json"],
                                  ["diff", CHATML, CHATML], ["audit", CHATML]])
def test_a_memory_past_any_machine_is_one_line_before_the_work(capsys, argv):
    # (a worker's address-space limit overflowed: a traceback, and lock and diff went on to exit 0)
    code, _, err = run(capsys, *argv, "--memory", "99999999999999999999")
    assert code == 2 and one_line_error(err, "--memory is MiB a worker may allocate, at most 1073741824")
    assert not os.path.exists("l.json")


def test_a_configuration_that_is_no_table_or_is_not_there_is_one_line(capsys, tmp_path):
    (tmp_path / "pyproject.toml").write_text("tool = 5\n")
    code = main(["table", CHATML])
    assert code == 2 and one_line_error(capsys.readouterr().err, "'tool' is int, not a table")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert main(["--config", "other/pyproject.toml", "table", CHATML]) == 2
    assert one_line_error(capsys.readouterr().err, "no [tool.tmplkit] table")
    (tmp_path / "tmplkit.toml").write_text("[limits]\nmemory = 99999999999999\n")
    assert main(["--config", "tmplkit.toml", "table", CHATML]) == 2
    assert one_line_error(capsys.readouterr().err, "limits.memory")


@pytest.mark.parametrize("argv, words", [(["-q", "-v", "table", CHATML], "-q (--quiet) and -v (--verbose)"),
                                         (["-q", "table", "-v", CHATML], "-q (--quiet) and -v (--verbose)"),
                                         (["table", "-qv", CHATML], "-q (--quiet) and -v (--verbose)"),
                                         (["--config", "x.toml", "table", "--no-config", CHATML], "--config FILE and --no-config"),
                                         (["audit", CHATML, "--report", "json:-"], "--report FORMAT:-: standard output is -o's"),
                                         (["lock", CHATML, "-o", "-"], "--lock -: a lock is a file")])
def test_options_that_contradict_or_name_standard_output_twice_are_one_line(capsys, argv, words):
    assert main(argv) == 2
    assert one_line_error(capsys.readouterr().err, words)
    assert not os.path.exists("-")


def test_a_template_message_of_megabytes_is_one_short_line(capsys, tmp_path):
    (tmp_path / "big.jinja").write_text("{{ raise_exception('x' * 9000000 + ' the end') }}")
    for argv in (["turns", "big.jinja"], ["spans", "big.jinja", "--session", str(ROOT / "fixtures" / "masks" / "chat.json"),
                                           "--tokenizer", "vocab:qwen35"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.count("\n") == 1 and len(err) < 2200 and "characters left out" in err, argv[0]
        assert err.rstrip().endswith("the end")


def test_a_tokenizer_file_not_found_is_said_so_and_options_are_named_as_typed(capsys):
    chat = str(ROOT / "fixtures" / "masks" / "chat.json")
    # (a missing tk/x.json was taken for a Hub repository to download; "" for the current folder)
    for spec, words in (("tk/nope.json", "tokenizer file not found: tk/nope.json"), ("", "--tokenizer '': the value is empty")):
        code, _, err = run(capsys, "spans", CHATML, "--session", chat, "--tokenizer", spec)
        assert code == 2 and one_line_error(err, words) and "hf download" not in err
    code, _, err = run(capsys, "request", CHATML, "--session", chat, "--tokenizer", "vocab:qwen35", "--n-predict", "-5")
    assert code == 2 and one_line_error(err, "--n-predict must be -1")


def test_arguments_are_named_as_the_help_shows_them(capsys, tmp_path):
    (tmp_path / "a.jinja").write_text(Path(CHATML).read_text())
    log = str(ROOT / "fixtures" / "server-logs" / "0.3.36-session-lv4.log")
    # a positional by its metavar (it was --old, --log), an option as typed
    for argv, words in ((["diff", "a.jinja", CHATML, "-o", "a.jinja"], "(A a.jinja)"),
                        (["server", "log", log, "-o", log], f"(LOG {log})"),
                        (["audit", "a.jinja", "-o", "a.jinja"], "(SOURCE a.jinja)")):
        assert main(argv) == 2
        assert one_line_error(capsys.readouterr().err, "it is also what the command reads", words)
    # arguments left over: the subcommand's --help, not the top one's
    with pytest.raises(SystemExit) as info:
        main(["server", "log", log, "extra"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "see tmplkit server log --help" in err and "extra" in err


@pytest.mark.parametrize("argv, words", [
    (["engine-parity", CHATML, "--server", ""], "--server '': the value is empty"),  # (ran the pinned server)
    (["turns", CHATML, "--memory-model="], "--memory-model '': the value is empty"),
    (["lock", CHATML, "-o", ""], "-o '': the path is empty; give a file path"),  # (as every -o says it)
    (["audit", CHATML, "--lock", "-"], "--lock -: a lock is a file the audit reads"),
    (["turns", CHATML, "--memory-model", "4096"], "--memory-model 4096: unknown memory model"),
    (["session", "generate", "--style", "nope"], "argument --style: invalid choice"),
    (["corpus", "fetch", "nope"], "argument NAME: invalid choice"),
    # a positional given '' read as the current folder (`tmplkit audit "$DIR"`, DIR unset, audited it)
    (["audit", ""], "SOURCE '': the argument is empty"),
    (["audit", CHATML, ""], "SOURCE '': the argument is empty"),
    (["diff", CHATML, ""], "B '': the argument is empty"),
    (["server", "log", ""], "LOG '': the argument is empty")])
def test_an_option_given_nothing_or_nonsense_is_named_as_typed(capsys, argv, words):
    try:
        code = main(argv)
    except SystemExit as exc:  # (argparse's own refusals)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err


def test_sources_given_after_an_option_join_the_others(capsys):
    # (argparse left them over: "unrecognized arguments")
    llama3 = str(FIXTURES / "llama3.jinja")
    code, out, _ = run(capsys, "table", CHATML, "--format", "csv", "--jobs", "1", llama3)
    assert code == 0 and [line.split(",")[0] for line in out.splitlines() if line[:6] in ("chatml", "llama3")] == ["chatml", "llama3"]
    with pytest.raises(SystemExit) as info:  # (argparse's own refusal)
        main(["--no-config", "table", CHATML, "--jobs", "1", llama3, "--bogus"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "unrecognized arguments" in err and "--bogus" in err
    assert "see tmplkit table --help" in err


@pytest.mark.parametrize("session, said", [
    ('[{"role": "user", "content": "hi", "reasoning_content": 7}]', "'reasoning_content' is int, which llama-server refuses"),
    ('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": '
     '[{"function": {"name": "f", "arguments": "{}"}}]}]', "tool_calls[0] has no 'type', which llama-server refuses"),
])
def test_audit_refuses_a_session_the_server_would_not_read_before_the_work(tmp_path, capsys, session, said):
    # (it was each template's ERROR row and exit 1, as if the templates had failed; `turns` and
    # `spans` refuse the same file in one line)
    (tmp_path / "s.json").write_text(session)
    code, out, err = run(capsys, "audit", CHATML, "--prefix-stability", "report", "--session", str(tmp_path / "s.json"))
    assert code == 2 and out == "" and one_line_error(err, "s.json: message ", said), err


def test_a_templates_escape_sequences_reach_no_terminal(tmp_path, capsys):
    # (its raise_exception text went raw into the report and the error line: ESC recolours, clears
    # or retitles the reader's terminal)
    template = tmp_path / "esc.jinja"
    template.write_text("{{ raise_exception('bad \\x1b[2J\\x1b]0;title\\x07 and \\x01') }}", encoding="utf-8")
    code, out, _ = run(capsys, "audit", str(template), "--in-process")
    assert code == 1 and "bad \\x1b[2J\\x1b]0;title\\x07 and \\x01" in out and "\x1b" not in out and "\x01" not in out
    code, _, err = run(capsys, "turns", str(template), "-j", "1")
    assert code == 2 and one_line_error(err, "bad \\x1b[2J") and "\x1b" not in err and "\x07" not in err
    # a delimiter that holds them: every report that shows delimiters or renders
    template.write_text("{% for m in messages %}{{ '<|' ~ m.role ~ '|>\\x1b]0;title\\x07' }}{{ m.content }}<|end|>"
                        "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}", encoding="utf-8")
    for argv in (["audit", "-v"], ["table"], ["show"], ["show", "--color", "always"], ["diff", CHATML]):
        code, out, err = run(capsys, *argv[:1], *(argv[1:] if argv[0] != "diff" else ()), str(template),
                             *(argv[1:] if argv[0] == "diff" else ()))
        assert "\\x1b]0;title\\x07" in out + err and "\x07" not in out + err, (argv, code, out, err)
    chat = str(FIXTURES.parent / "masks" / "chat.json")
    code, out, err = run(capsys, "mask", str(template), "--session", chat, "--tokenizer", "vocab:qwen35", "--format", "text")
    assert "\\x1b]0;title\\x07" in out and "\x07" not in out + err, (code, out, err)


@pytest.mark.parametrize("fmt", ["text", "summary", "junit", "markdown", "github"])
def test_a_template_file_name_with_a_line_break_stays_on_its_line(tmp_path, capsys, fmt):
    # (a file named "a\n::error::INJECTED.jinja" printed a line of its own in the report, which
    # GitHub Actions runs as a workflow command; names from a configuration or a GGUF are refused)
    folder = tmp_path / "nl"
    folder.mkdir()
    (folder / "a\n::error::INJECTED.jinja").write_text((ROOT / "fixtures" / "templates" / "alternating-over-tools.jinja")
                                                      .read_text(encoding="utf-8"), encoding="utf-8")
    code, out, err = run(capsys, "audit", "--in-process", "--format", fmt, str(folder))
    assert code == 0, err
    assert not any(line.startswith("::error::") for line in out.splitlines())
    if fmt != "summary":  # (which names failing templates only)
        assert "a\\n::error::INJECTED" in out
