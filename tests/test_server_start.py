"""`engine-parity` and `server delimiters` when llama-server itself is the trouble, without a real
server: a binary that exits at once, one that never answers, a model it cannot load, a server that
refuses the template at start or answers its request with an error, one that dies mid-request,
and a SIGTERM while a server runs. Only the template's own refusal is a row ("refused", exit 0);
a server or model that cannot serve is one line and exit 2 (nothing was checked), every message
that names a log names one that is still there, and nothing is left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tmplkit as _tmplkit
from tmplkit.cli import main
from tmplkit.errors import ModelError
from tmplkit.server.process import LlamaServer, TemplateRefused, check_server_model, start_with_template

ROOT = Path(__file__).resolve().parent.parent
CODE = Path(_tmplkit.__file__).resolve().parent.parent  # the tmplkit under test, for the subprocesses too
TEMPLATE = ROOT / "fixtures" / "turns" / "stable.jinja"
COMMANDS = (("engine-parity",), ("server", "delimiters"))
TRUE = shutil.which("true") or "/bin/true"  # a binary that exits at once, with code 0 and no word

# A stand-in for llama-server: answers /health, and what else FAKE_MODE says (the environment
# reaches it: LlamaServer starts it with this process's).
FAKE_SERVER = textwrap.dedent("""\
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    argv = sys.argv[1:]
    mode = os.environ.get("FAKE_MODE", "")
    marks = os.environ.get("FAKE_MARKS")
    if marks:
        with open(os.path.join(marks, "pid"), "w") as f:
            f.write(str(os.getpid()))
    if mode == "refuse-template" and "--chat-template-file" in argv:
        print("0.00.003.506 E common_chat_verify_template: failed to apply template: Unknown (built-in) filter 'x'")
        print("error: the supplied chat template is not supported")
        sys.exit(1)
    if mode == "bad-model":
        print("0.00.014.520 E llama_model_load: error loading model: the model is corrupted or incomplete")
        print("0.00.017.289 E srv  llama_server: exiting due to model loading error")
        sys.exit(1)


    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer(200, {"status": "ok"})

        def do_POST(self):
            if marks:
                open(os.path.join(marks, "posted"), "w").close()
            if mode == "crash":
                os._exit(3)
            if mode == "hang":
                time.sleep(1000)
            if mode.startswith("answer:"):  # an answer that is no llama-server's
                self._answer(200, json.loads(mode[len("answer:"):]))
                return
            self._answer(500, {"error": {"message": "this template does not render here"}})

        def log_message(self, *args):
            pass


    port = int(argv[argv.index("--port") + 1])
    print("fake llama-server listening", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
""")


@pytest.fixture
def model(tmp_path) -> Path:
    """A small GGUF with one tensor (a model, not a vocabulary only) and a chat template."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "hello"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_string("tokenizer.chat_template", TEMPLATE.read_text())
    w.add_tensor("weight", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """`fake(mode)`: the path of an executable stand-in for llama-server in that mode."""
    def make(mode: str = "") -> Path:
        path = tmp_path / f"fake-server-{mode or 'plain'}"
        path.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
        path.chmod(0o755)
        monkeypatch.setenv("FAKE_MODE", mode)
        return path

    return make


def _run(capsys, command, *args) -> tuple[int, str, str]:
    if command[0] == "server":
        pytest.importorskip("llama_cpp")  # (the command needs the llama extra)
    code = main(["--no-config", *command, str(TEMPLATE), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str, *needles: str) -> str:
    assert code == 2, err
    assert err.startswith("tmplkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def _logs_named_exist(err: str) -> None:
    """Every log a message points at is still there."""
    for part in err.split("its log: ")[1:]:
        assert Path(part.split(";")[0].strip()).is_file(), err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_server_that_exits_at_once_is_an_error_not_a_refused_template(command, model, capsys):
    start = time.monotonic()
    code, out, err = _run(capsys, command, "--server", TRUE, "--model", str(model))
    _one_line(code, err, "exited with code 0 at start", "no template was checked", "--server", "--model")
    assert "refused" not in err and out == "" and time.monotonic() - start < 60
    assert "/tmplkit-" not in err  # no log in a temporary folder that is gone by now
    assert "--log-dir" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_the_server_cannot_load_is_an_error(command, model, fake, capsys):
    code, out, err = _run(capsys, command, "--server", str(fake("bad-model")), "--model", str(model))
    _one_line(code, err, "error loading model: the model is corrupted", "no template was checked")
    assert out == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_the_model_is_checked_the_same_way_before_any_template(command, tmp_path, write_gguf, capsys):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(os.urandom(2048).replace(b"GGUF", b"xxxx"))
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", str(garbage))
    _one_line(code, err, "not a GGUF file")
    vocab_only = write_gguf()  # a vocabulary, no weights: llama-server cannot load it
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", str(vocab_only))
    _one_line(code, err, "no weights", "llama-server cannot load it")
    with pytest.raises(Exception, match="no weights"):
        check_server_model(vocab_only)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_server_that_never_answers_ends_after_the_start_timeout(command, model, tmp_path, capsys):
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "hang.sh"
    script.write_text(f"#!/bin/sh\necho $$ > {marks}/pid\nsleep 1000\n")
    script.chmod(0o755)
    start = time.monotonic()
    code, out, err = _run(capsys, command, "--server", str(script), "--model", str(model), "--start-timeout", "1")
    _one_line(code, err, "not ready within 1 s", "--start-timeout")
    assert out == "" and time.monotonic() - start < 60
    assert not _group_alive(int((marks / "pid").read_text()))  # the script and its `sleep`: all stopped


@pytest.mark.parametrize("command", COMMANDS)
def test_both_commands_take_the_same_model_shortcuts(command, capsys):
    # (engine-parity took a GGUF path only: one vocabulary of options)
    pytest.importorskip("llama_cpp")
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", "tiny:nope")
    _one_line(code, err, "no vocab 'nope'", "qwen35")
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", "tiny:qwen35")
    _one_line(code, err, "exited with code 0 at start", "tiny-gemma3-qwen35")  # resolved, and started with it


@pytest.mark.parametrize("command", COMMANDS)
def test_the_start_timeout_must_be_positive(command, model, capsys):
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", str(model), "--start-timeout", "0")
    _one_line(code, err, "--start-timeout must be", "positive")


def test_a_template_the_server_refuses_at_start_is_a_row(model, fake, tmp_path, capsys):
    binary = fake("refuse-template")
    code, out, err = _run(capsys, ("engine-parity",), "--server", str(binary), "--model", str(model),
                          "--format", "json")
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    assert row["status"] == "refused" and "Unknown (built-in) filter" in row["error"]
    with pytest.raises(TemplateRefused, match="refuses the template at start"):
        start_with_template(binary, model, (), TEMPLATE, log=tmp_path / "s.log", startup_s=30)


def test_a_server_delimiters_refusal_at_start_is_a_row(model, fake, capsys):
    code, out, err = _run(capsys, ("server", "delimiters"), "--server", str(fake("refuse-template")),
                          "--model", str(model), "--format", "json")
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["verdicts"] == ["refused by llama-server"] and "Unknown (built-in) filter" in row["server"]["error"]


def test_an_error_answer_to_the_templates_request_is_a_row(model, fake, capsys):
    code, out, err = _run(capsys, ("engine-parity",), "--server", str(fake("http-error")), "--model", str(model),
                          "--format", "json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["status"] for r in rows] == ["refused", "refused"]
    assert "HTTP 500" in rows[0]["error"] and "this template does not render here" in rows[0]["error"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_server_that_dies_mid_request_is_an_error(command, model, fake, capsys):
    code, out, err = _run(capsys, command, "--server", str(fake("crash")), "--model", str(model))
    _one_line(code, err, "exited with code 3 before it answered", "nothing was checked")
    assert out == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_a_server_that_never_answers_a_request_ends_after_the_request_timeout(command, model, fake, tmp_path,
                                                                            monkeypatch, capsys):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("FAKE_MARKS", str(marks))
    start = time.monotonic()
    code, out, err = _run(capsys, command, "--server", str(fake("hang")), "--model", str(model), "--request-timeout", "1")
    _one_line(code, err, "did not answer", "within 1 s", "nothing was checked", "--request-timeout")
    assert out == "" and (marks / "posted").exists()  # (it was asked, and kept silent)
    assert time.monotonic() - start < 60  # (the default waits 120 s or 300 s)
    assert not _group_alive(int((marks / "pid").read_text()))


@pytest.mark.parametrize("command", COMMANDS)
def test_the_request_timeout_must_be_positive(command, model, capsys):
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", str(model), "--request-timeout", "-1")
    _one_line(code, err, "--request-timeout must be", "positive")


@pytest.mark.parametrize("command", COMMANDS)
def test_the_timeouts_must_fit_a_socket_and_a_bare_server_name_is_the_file_here(command, model, tmp_path, monkeypatch,
                                                                                 capsys):
    # (--request-timeout 1e10 ended in a traceback, OverflowError from the socket's timeout, exit 1;
    # `--server quick.sh`, a file in the current folder, was looked up on PATH: "No such file")
    for flag in ("--request-timeout", "--start-timeout"):
        code, _, err = _run(capsys, command, "--server", TRUE, "--model", str(model), flag, "1e10")
        _one_line(code, err, f"{flag} must be at most 604800 seconds")
    (tmp_path / "quick.sh").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "quick.sh").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, command, "--server", "quick.sh", "--model", str(model))
    _one_line(code, err, "exited with code 0 at start")  # (started: not "cannot run llama-server")


def test_the_request_timeouts_default_to_the_librarys():
    import inspect

    from tmplkit.cli._serve import DELIMITERS_REQUEST_S, PARITY_REQUEST_S
    from tmplkit.server.delimiters import server_delimiters
    from tmplkit.server.parity import engine_parity

    assert inspect.signature(engine_parity).parameters["request_s"].default == PARITY_REQUEST_S
    assert inspect.signature(server_delimiters).parameters["request_s"].default == DELIMITERS_REQUEST_S


@pytest.mark.parametrize("command", COMMANDS)
def test_a_log_named_in_a_message_is_still_there(command, model, tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    code, _, err = _run(capsys, command, "--server", TRUE, "--model", str(model), "--log-dir", str(logs))
    _one_line(code, err, f"its log: {logs}")
    _logs_named_exist(err)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where, words", [("a-file", "it is not a folder"), ("missing/logs", "no such folder")])
def test_a_log_dir_that_cannot_hold_the_logs_is_refused_before_any_work(command, model, tmp_path, capsys, where, words):
    # (it was an OSError when the first server started, with a hint about the cache folder)
    (tmp_path / "a-file").write_text("not a folder")
    code, out, err = _run(capsys, command, "--server", TRUE, "--model", str(model), "--log-dir", str(tmp_path / where))
    _one_line(code, err, f"--log-dir {tmp_path / where}: {words}", "give an existing folder")
    assert out == "" and "TMPLKIT_CACHE" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_named_as_a_log_in_the_log_dir_is_refused_before_any_work(command, model, tmp_path, capsys):
    # (`--log-dir . -o llama-server-c.log` kept the report alone: llama-server's log was lost, exit 0)
    logs = tmp_path / "logs"
    logs.mkdir()
    out_file = logs / "llama-server-chatml.log"
    code, out, err = _run(capsys, command, "--server", TRUE, "--model", str(model), "--log-dir", str(logs),
                          "-o", str(out_file))
    _one_line(code, err, f"{out_file}: --log-dir {logs} keeps llama-server's logs under such names", "another name")
    assert out == "" and not out_file.exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_named_as_a_log_in_the_log_dir_is_refused_before_any_work(command, model, tmp_path, capsys):
    # (the server's log replaced the 25 MB model before the server read it)
    logs = tmp_path / "logs"
    logs.mkdir()
    kept = logs / "llama-server-chatml.log"
    shutil.copy(model, kept)
    before = kept.read_bytes()
    code, out, err = _run(capsys, command, "--server", TRUE, "--model", str(kept), "--log-dir", str(logs))
    _one_line(code, err, f"{kept}: --log-dir {logs} keeps llama-server's logs under such names", "this file the command reads")
    assert out == "" and kept.read_bytes() == before


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_link_at_a_logs_name_is_replaced_not_written_through(command, model, tmp_path, capsys, link):
    # (`--log-dir ld` with ld/llama-server-q.log a link to the template q.jinja: the server's log
    # replaced the template, exit 0)
    logs = tmp_path / "logs"
    logs.mkdir()
    precious = tmp_path / "precious.jinja"
    precious.write_text("{{ messages }}", encoding="utf-8")
    at = logs / f"llama-server-{TEMPLATE.stem}.log"
    at.symlink_to(precious) if link == "symbolic" else os.link(precious, at)
    _run(capsys, command, "--server", TRUE, "--model", str(model), "--log-dir", str(logs))
    assert precious.read_text(encoding="utf-8") == "{{ messages }}"
    assert not at.is_symlink() and at.stat().st_nlink == 1  # (the log a file of its own)


def test_the_library_says_where_a_kept_log_is_and_quotes_a_removed_one(model, tmp_path):
    with pytest.raises(ModelError) as e:
        LlamaServer(TRUE, model, log=tmp_path / "kept.log", startup_s=10)
    assert f"its log: {tmp_path / 'kept.log'}" in str(e.value)
    with pytest.raises(ModelError) as e:
        LlamaServer(TRUE, model, log=tmp_path / "gone.log", startup_s=10, keep_log=False)
    assert "gone.log" not in str(e.value) and "--log-dir" in str(e.value)


@pytest.mark.parametrize("command", COMMANDS)
def test_sigterm_stops_the_server_and_removes_the_temporary_folder(command, model, fake, tmp_path, monkeypatch):
    if command[0] == "server":
        pytest.importorskip("llama_cpp")
    marks = tmp_path / "marks"
    marks.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    binary = fake("hang")
    env = {**os.environ, "PYTHONPATH": str(CODE), "TMPDIR": str(tmp), "FAKE_MARKS": str(marks)}
    proc = subprocess.Popen([sys.executable, "-m", "tmplkit", "--no-config", *command, str(TEMPLATE), "--server",
                             str(binary), "--model", str(model)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=CODE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (marks / "posted").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (marks / "posted").exists(), proc.communicate(timeout=30)
        assert [p.name for p in tmp.iterdir() if p.name.startswith("tmplkit-")]  # the work's folder, while it works
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        time.sleep(0.2)
        server_left = _group_alive(int((marks / "pid").read_text()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if (marks / "pid").exists() and _group_alive(int((marks / "pid").read_text())):  # (a failing run's server)
            os.killpg(int((marks / "pid").read_text()), signal.SIGKILL)
    assert proc.returncode == 130 and err.strip() == "tmplkit: interrupted", (proc.returncode, err)
    assert [p.name for p in tmp.iterdir() if p.name.startswith("tmplkit-")] == []
    assert not server_left  # the server is stopped


def _group_alive(pgid: int) -> bool:
    """A process of group `pgid` still runs (a zombie waiting for its reaper counts as gone)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    if not Path("/proc/self/stat").is_file():
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # (state, ppid, pgrp, ...)
            return True
    return False


def test_a_server_that_floods_its_log_is_read_by_its_ends(tmp_path):
    """Why a server would not start is read from its log's beginning and end: one that floods it
    (a `yes` loop as --server) held 23 GB in memory before its start timeout was looked at."""
    import tracemalloc

    from tmplkit.server.process import server_log_error

    log = tmp_path / "flood.log"
    with log.open("w") as f:
        f.write("0.00.003.506 E common_chat_verify_template: failed to apply template: Unknown filter 'x'\n")
        for _ in range(40):
            f.write("srv  load_model: loading\n" * 40_000)  # ~40 MB
        f.write("the last line")
    tracemalloc.start()
    try:
        reason = server_log_error(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reason is not None and "Unknown filter 'x'" in reason
    assert peak < 24 * 2**20, f"{peak / 2**20:.0f} MiB read for a 40 MB log"


@pytest.mark.parametrize("answer", ['{"foo": 1}', '{"prompt": 5}', '[1]'])
def test_an_answer_that_is_no_llama_servers_is_one_line(answer, model, fake, capsys):
    # (a KeyError or TypeError traceback)
    code, _, err = _run(capsys, ("engine-parity",), "--server", str(fake("answer:" + answer)), "--model", str(model))
    _one_line(code, err, "llama-server's answer to /apply-template", "is ")


def test_two_templates_of_one_name_keep_two_logs(tmp_path):
    # (engine-parity over two folders' `chat` templates: the second server's log replaced the first's)
    from tmplkit.server.process import log_path

    first, second, other = log_path(tmp_path, "chat"), log_path(tmp_path, "chat"), log_path(tmp_path, "c h")
    assert first.name == "llama-server-chat.log" and second.name == "llama-server-chat-2.log"
    assert log_path(tmp_path, "c_h").name == "llama-server-c_h-2.log" and other.name == "llama-server-c_h.log"
