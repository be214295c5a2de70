"""Reading llama-server logs as a user has them, on logs of our own builds (fixtures/server-logs/,
made by scripts/server_logs.py): 0.3.33 ends a batch at every message start it takes for a user
message (llama.cpp issue 25213), 0.3.36 only where it checkpoints. No server runs here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.server.log import FAR_BACK_TOKENS, LOG_SCHEMA_VERSION, read_server_log

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "server-logs"


def read(name: str):
    return read_server_log((LOGS / name).read_text(encoding="utf-8"), name)


def test_every_fixture_is_small_and_reads():
    files = sorted(LOGS.glob("*.log"))
    assert len(files) == 9
    for f in files:
        assert f.stat().st_size < 12_000, f  # trimmed to what the tests need
        assert read(f.name).tasks


def test_0_3_33_cold_resume_is_fragmented_at_trace_level():
    log = read("0.3.33-cold-lv4.log")
    assert (log.verbosity, log.n_batch, log.n_ubatch, log.checkpoints_max, log.checkpoint_min_step) == (4, 2048, 512, 32, 8192)
    (t,) = log.tasks
    assert t.level == "trace" and t.batches_complete
    assert (t.n_prompt, t.n_reused, t.n_processed) == (24416, 0, 24416)
    assert t.decode_calls == 40 and len(t.mid_breaks) == 32
    # the shape of the regression: breaks where no checkpoint is taken
    assert len(t.breaks_without_checkpoint) == 28
    assert t.checkpoints_created == (602, 8937, 17362, 23605) and t.checkpoints_restored == ()
    assert t.pattern == "fragmented"
    assert "25213" in t.findings()[0] and "28 of those breaks took no checkpoint" in t.findings()[0]
    # the batches cover the prompt, one after the other
    assert t.batch_starts[0] == 0 and sum(t.batch_sizes) == t.n_prompt


def test_0_3_36_cold_resume_breaks_only_where_it_checkpoints():
    (t,) = read("0.3.36-cold-lv4.log").tasks
    assert (t.n_prompt, t.n_processed) == (24416, 24416)
    assert t.decode_calls == 20 and t.pattern == "none" and not t.findings()
    # its checkpoints: the first user message, one per --checkpoint-min-step, and the two near the end
    assert t.checkpoints_created == (602, 8937, 17362, 23605, 23900, 24412)
    assert t.near_end == (23900, 24412) and set(t.near_end) <= set(t.early_ends)
    # every mid-prompt break it takes without a checkpoint comes right after one it took with one
    # (the batch after a checkpoint is filled before that checkpoint exists)
    assert len(t.breaks_without_checkpoint) == 3


def test_default_verbosity_shows_the_batches_after_3_s_and_says_what_it_cannot_see():
    old, new = read("0.3.33-cold-lv3.log"), read("0.3.36-cold-lv3.log")
    for log in (old, new):
        (t,) = log.tasks
        assert t.level == "info" and not t.batches_complete and t.decode_calls is None
        assert t.checkpoints_created is None and t.checkpoints_restored is None and t.full_reprocess is None
        # the prompt's length from the release line, its reuse from the timings
        assert (t.n_prompt, t.n_reused, t.n_processed) == (24416, 0, 24416)
        assert any("n_batch" in n for n in log.notes) and any("-lv 4" in n for n in log.notes)
    assert old.tasks[0].pattern == "fragmented" and new.tasks[0].pattern == "none"
    assert len(old.tasks[0].batch_sizes) > 2 * len(new.tasks[0].batch_sizes) > 0


def test_a_session_request_by_request_restores_the_checkpoint_of_the_user_message():
    new = {t.task: t for t in read("0.3.36-session-lv4.log").tasks}
    old = {t.task: t for t in read("0.3.33-session-lv4.log").tasks}
    # request 9: a new user message, and the template drops the past turns' reasoning: the prompt
    # shares 630 tokens with the slot; both restore the checkpoint at the first user message
    t = new[49]
    assert (t.n_prompt, t.n_reused, t.n_common) == (5572, 629, 631) and t.checkpoints_restored == (630,)
    assert t.went_back == 2 and t.pattern == "none"
    o = old[49]
    assert o.checkpoints_restored == (602,) and o.n_reused == 601
    assert o.pattern == "fragmented" and o.decode_calls == 14 > t.decode_calls == 6


def test_no_checkpoints_forces_a_full_reprocess_and_a_resume_from_too_far_back():
    log = read("0.3.36-no-checkpoints-lv4.log")
    assert any("checkpoints are off" in n for n in log.notes)
    tasks = {t.task: t for t in log.tasks}
    small, far = tasks[28], tasks[71]
    assert small.full_reprocess and small.went_back == 631 < FAR_BACK_TOKENS and small.pattern == "none"
    assert any("full prompt re-processing" in f for f in small.findings())
    assert far.full_reprocess and far.n_reused == 0 and far.n_common == 5569
    assert far.pattern == "resumed too far back"
    assert "started over from position 0, recomputing 5569" in far.findings()[0]


def test_the_json_is_to_dict_with_a_schema_version(capsys):
    code = main(["--no-config", "server", "log", str(LOGS / "0.3.33-cold-lv4.log"), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out == json.loads(json.dumps(read("0.3.33-cold-lv4.log").to_dict() | {"source": str(LOGS / "0.3.33-cold-lv4.log")}))
    assert out["schema_version"] == LOG_SCHEMA_VERSION and out["summary"]["patterns"] == {"fragmented": 1}
    task = out["tasks"][0]
    assert task["decode_calls"] == 40 and task["pattern"] == "fragmented" and task["findings"]


def test_the_text_report_names_the_pattern(capsys):
    assert main(["--no-config", "server", "log", str(LOGS / "0.3.36-no-checkpoints-lv4.log")]) == 0
    out = capsys.readouterr().out
    assert "pattern: resumed too far back" in out and "full re-processing forced" in out


def test_standard_input(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO((LOGS / "0.3.36-cold-lv3.log").read_text()))
    assert main(["--no-config", "server", "log", "-"]) == 0
    assert "<stdin>: 1 task;" in capsys.readouterr().out


@pytest.mark.parametrize("text, says", [
    ("", "the log is empty"),
    ("\x00" * 64 + "\r\n \n", "the log is empty"),  # (emptied with `: > server.log`, nothing written since)
    ("127.0.0.1 - - [02/Dec/2025] \"GET / HTTP/1.1\" 200 -\n", "not a llama-server log"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: no\n", "not a llama-server log"),
    ("\x00\x01\x02GGUF", "not a llama-server log"),  # (a NUL alone is no binary: a log emptied while written)
    # (its bytes make lines of one length, read as a log a terminal wrapped)
    (bytes(range(256)).decode("latin-1") * 50, "not a llama-server log"),
    ("0.00.000.870 I srv  llama_server: initializing ...\n0.00.913.772 I srv  llama_server: model loaded\n", "no task"),
])
def test_bad_or_foreign_logs_are_one_line_errors(text, says, tmp_path, capsys):
    with pytest.raises(InputError, match=says):
        read_server_log(text)
    path = tmp_path / "x.log"
    path.write_bytes(text.encode("latin-1"))
    assert main(["--no-config", "server", "log", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("tmplkit: error: ") and err.count("\n") == 1 and says in err


def test_a_missing_log_and_half_the_placing_options_are_usage_errors(tmp_path, capsys):
    assert main(["--no-config", "server", "log", str(tmp_path / "none.log")]) == 2
    assert "log file not found" in capsys.readouterr().err
    assert main(["--no-config", "server", "log", str(LOGS / "0.3.36-cold-lv3.log"), "--template", "x.jinja"]) == 2
    assert "together" in capsys.readouterr().err
    # what only the template rendering the session takes, without one: it did nothing, silently
    for extra, says in ((["--name", "x"], "--name is for"), (["--timeout", "5", "--memory", "100"], "--timeout and --memory are for")):
        assert main(["--no-config", "server", "log", str(LOGS / "0.3.36-cold-lv3.log"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "give --template, --session and --tokenizer with it" in err


@pytest.mark.corpus
def test_with_the_template_and_the_session_the_breaks_fall_on_tool_results(qwen35):
    from tmplkit.prefill import generate_session
    from tmplkit.server.log_breaks import locate_breaks
    from tmplkit.sources import corpus, load_one

    template = load_one(str(corpus.templates_dir() / "Qwen3.5-4B.jinja"))
    session = generate_session(30000, seed=0, style="agent")  # the session scripts/server_logs.py sent
    log = locate_breaks(read("0.3.33-cold-lv4.log"), template, session, qwen35)
    (loc,) = log.locations
    assert loc.tokens_match and loc.request == 31 and loc.n_messages == len(session.messages)
    assert loc.counts() == {"tool": 29, "user": 3}
    users = [p.pos for p in loc.places if p.what == "break" and p.role == "user"]
    assert users[0] == 602 and all(p.at_start for p in loc.places if p.pos in users)
    checkpoints = [p for p in loc.places if p.what == "checkpoint"]
    assert [p.role for p in checkpoints] == ["user", "tool", "user", "tool"]  # tool results get checkpoints too
    new = locate_breaks(read("0.3.36-cold-lv4.log"), template, session, qwen35).locations[0]
    assert sum(new.counts().values()) < 10



@pytest.mark.corpus
def test_a_log_of_another_session_is_refused_and_a_place_past_a_request_is_on_no_message(qwen35):
    from tmplkit.prefill import generate_session
    from tmplkit.server.log_breaks import _place, locate_breaks
    from tmplkit.sources import corpus, load_one

    template = load_one(str(corpus.templates_dir() / "Qwen3.5-4B.jinja"))
    short = generate_session(600, seed=0, style="agent")  # not the 30k session the log served
    with pytest.raises(InputError, match="are none of this session's requests") as e:
        locate_breaks(read("0.3.33-cold-lv4.log"), template, short, qwen35)
    assert "\n" not in str(e.value)
    offsets = [(i, i + 1) for i in range(10)]  # a request of 10 one-character tokens
    place = _place("break", 50, 0, offsets, [], [], [])
    assert place.past_end and place.message is None and "past the end" in place.describe()
    assert not _place("break", 10, 0, offsets, [], [], []).past_end  # the generation's start is the request's end

# ---- logs as users paste them: older formats, cut progress lines, a router -------------------------------

OLDER = [
    "slot launch_slot_: id  0 | task 0 | processing task\n"
    "slot update_slots: id  0 | task 0 | new prompt, n_ctx_slot = 8192, n_keep = 0, n_prompt_tokens = 3000\n"
    "slot update_slots: id  0 | task 0 | prompt processing progress, n_past = 2048, n_tokens = 2048, progress = 0.682667\n"
    "slot update_slots: id  0 | task 0 | prompt done, n_past = 3000, n_tokens = 952\n",
    "slot launch_slot_: id  0 | task 0 | processing task\n"
    "slot update_slots: id  0 | task 0 | kv cache rm [0, end), n_past=2048\n",
]


@pytest.mark.parametrize("text", OLDER)
def test_an_older_servers_log_is_refused_in_one_line(text, tmp_path, capsys):
    # (lines of our own writing, in the older format: before, they read as "? prompt tokens,
    # pattern none" and exit 0)
    with pytest.raises(InputError, match="a log format tmplkit does not read"):
        read_server_log(text)
    path = tmp_path / "old.log"
    path.write_text(text)
    assert main(["--no-config", "server", "log", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and ("n_past" in err or "n_prompt_tokens = 3000" in err)


def test_a_log_whose_tasks_hold_no_line_it_reads_is_refused():
    text = "slot launch_slot_: id  0 | task 0 | processing task\nslot update_slots: id  0 | task 0 | something else\n"
    with pytest.raises(InputError, match="1 task but none of the lines it reads"):
        read_server_log(text)


def cut_progress(text: str, keep: int) -> str:
    """`text` without the middle prompt-progress lines: the first and last keep/2 stay (as
    scripts/server_logs.py --cut-progress does)."""
    lines = text.splitlines()
    idx = [i for i, ln in enumerate(lines) if "prompt processing, n_tokens" in ln]
    drop = set(idx[keep // 2:len(idx) - (keep - keep // 2)])
    return "\n".join(ln for i, ln in enumerate(lines) if i not in drop) + "\n"


def test_progress_lines_cut_out_are_a_gap_not_a_batch():
    text = (LOGS / "0.3.33-cold-lv3.log").read_text(encoding="utf-8")
    (whole,) = read_server_log(text).tasks
    (cut,) = read_server_log(cut_progress(text, 16)).tasks
    assert not whole.gaps and len(cut.gaps) == 1
    (a, b), = cut.gaps
    assert b - a > cut.n_batch and cut.pattern == "fragmented"  # before: the gap counted as one batch, "none"
    assert "are not in the log" in cut.findings()[0]
    new = read_server_log(cut_progress((LOGS / "0.3.36-cold-lv3.log").read_text(encoding="utf-8"), 16)).tasks[0]
    assert new.pattern == "none"


def test_a_routers_log_keeps_its_servers_apart_and_reads_their_options():
    """Router mode, from 0.3.36 run as a router (scripts/server_logs.py --router, -b 2048 -ub 2048):
    the spawned server's lines prefixed with its port, its options on the router's load: lines."""
    log = read("0.3.36-router-lv3.log")
    (t,) = log.tasks
    assert t.instance is not None and t.instance > 0
    assert (log.n_batch, log.n_ubatch, t.n_batch, t.n_ubatch) == (2048, 2048, 2048, 2048)  # -b, -ub of the load: lines
    assert any("options the router spawned" in n for n in log.notes) and not any("does not show" in n for n in log.notes)
    assert (t.n_prompt, t.n_reused) == (24416, 0) and t.pattern == "none"


def test_two_spawned_servers_with_the_same_task_ids_are_two_tasks():
    text = (LOGS / "0.3.36-router-lv3.log").read_text(encoding="utf-8")
    port = read("0.3.36-router-lv3.log").tasks[0].instance
    other = text.replace(f"[{port:5d}] ", "[40001] ").replace(f"on port {port}", "on port 40001")
    log = read_server_log(text + other)
    assert [t.instance for t in log.tasks] == [port, 40001] and [t.task for t in log.tasks] == [0, 0]


def test_the_regressed_server_through_a_router_cut_by_its_reporter_is_fragmented(capsys):
    """0.3.33's default-verbosity log of a resumed 30k agent session, run through its router with
    -b 2048 -ub 2048, with its reporter's cut: 24 progress lines of 37 left."""
    log = read("0.3.33-router-lv3-cut.log")
    (t,) = log.tasks
    assert t.instance == 54021 and t.level == "info" and len(t.batch_sizes) == 24
    assert (log.n_batch, log.n_ubatch) == (2048, 2048)  # read off the router's load: lines
    assert t.gaps == ((7771, 19640),) and t.pattern == "fragmented"
    assert main(["--no-config", "server", "log", str(LOGS / "0.3.33-router-lv3-cut.log")]) == 0
    out = capsys.readouterr().out
    assert "task 0 (server on port 54021)" in out and "pattern: fragmented" in out and "cut out of the log" in out


def test_two_runs_of_the_server_in_one_log_are_both_read():
    """An appended --log-file holds two runs whose task ids both start at 0: the first run's tasks
    were silently replaced by the second's."""
    a, b = (LOGS / "0.3.36-session-lv4.log").read_text(), (LOGS / "0.3.33-session-lv4.log").read_text()
    both = read_server_log(a + b, "two.log")
    assert [t.task for t in both.tasks] == [t.task for t in read_server_log(a).tasks] + [t.task for t in read_server_log(b).tasks]
    assert [t.to_dict() for t in both.tasks] == [t.to_dict() for t in read_server_log(a).tasks + read_server_log(b).tasks]
    assert any("2 runs of the server" in n for n in both.notes)


def test_a_log_as_windows_saves_it_a_cut_log_and_a_damaged_number(tmp_path, capsys):
    text = (LOGS / "0.3.36-session-lv4.log").read_text()
    want = read_server_log(text).to_dict()["tasks"]
    for i, data in enumerate((text.encode("utf-16"), text.encode("utf-16-le"), b"\xef\xbb\xbf" + text.encode())):
        (tmp_path / f"{i}.log").write_bytes(data)  # PowerShell's `>` writes UTF-16 (was "a binary file")
        assert main(["--no-config", "server", "log", str(tmp_path / f"{i}.log"), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["tasks"] == want
    cut = read_server_log(text[:3000], "cut.log")
    assert any("last line has no end" in n for n in cut.notes) and not any("no end" in n for n in read_server_log(text).notes)
    # cut inside a line it reads a task from (a batch, a checkpoint, the timings): that line left
    # out, said so (it was refused as a line "written by another version")
    at = text.index("prompt eval time =") + 30
    cut = read_server_log(text[:at], "cut.log")
    assert [t.task for t in cut.tasks] == [0] and any("last line has no end and cannot be read" in n for n in cut.notes)
    for end in range(text.index("prompt processing"), len(text), 97):  # (every kind of line cut somewhere)
        read_server_log(text[:end], "cut.log")
    with pytest.raises(InputError, match="not a llama-server log"):  # (what else is wrong is still said)
        read_server_log("hello\nworld", "other.log")
    damaged = text.replace("task.n_tokens = 634", "task.n_tokens = 99999999999999999999999999999")
    with pytest.raises(InputError, match=r"task 0 has a token count of 9{29}, more than llama.cpp can hold"):
        read_server_log(damaged, "d.log")


def test_a_log_emptied_while_written_a_compressed_log_and_one_too_big(tmp_path, capsys, monkeypatch):
    import gzip
    import io
    import sys

    text = (LOGS / "0.3.36-session-lv4.log").read_text()
    want = read_server_log(text).to_dict()["tasks"]
    # `: > server.log` while the server writes on: zero bytes up to where it was (was "a binary file")
    (tmp_path / "emptied.log").write_bytes(b"\x00" * 100_000 + text.encode())
    assert main(["--no-config", "server", "log", str(tmp_path / "emptied.log"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == want
    (tmp_path / "server.log.gz").write_bytes(gzip.compress(text.encode()))
    assert main(["--no-config", "server", "log", str(tmp_path / "server.log.gz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a compressed file" in err and "zcat" in err, err
    # (a file or a stream of any size was read whole: a model given by mistake, or `cat /dev/zero`)
    monkeypatch.setattr("tmplkit.server.log.LOG_MAX_BYTES", 1000)
    assert main(["--no-config", "server", "log", str(LOGS / "0.3.36-session-lv4.log")]) == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["--no-config", "server", "log", "-"]) == 2
    errs = capsys.readouterr().err.splitlines()
    assert len(errs) == 2 and all("more than 0 MiB, more than tmplkit reads as one log" in e and "tail -c" in e for e in errs)


@pytest.mark.parametrize("name,lines,pattern", [("0.3.33-cold-lv3", 35, "fragmented"), ("0.3.33-cold-lv4", 50, "fragmented"),
                                                ("0.3.36-cold-lv3", 14, "none")])
def test_a_log_cut_before_its_task_ends_reads_the_batches_it_shows(name, lines, pattern):
    # (a regressed server's log pasted in part read as pattern "none", 0 breaks at info level: the
    # task's end, from which positions and the last batch are read, was cut off)
    text = "".join((LOGS / f"{name}.log").read_text(encoding="utf-8").splitlines(keepends=True)[:lines])
    log = read_server_log(text, "cut.log")
    (task,) = log.tasks
    assert not task.ended and task.decode_calls is None and task.pattern == pattern, task.to_dict()
    assert any("the log ends before task 0 does" in n for n in log.notes)
    (whole,) = read_server_log((LOGS / f"{name}.log").read_text(encoding="utf-8")).tasks
    assert whole.ended and whole.pattern == pattern


def test_a_log_cut_inside_a_later_task_says_so_and_one_cut_as_it_began_is_said_to_be():
    text = (LOGS / "0.3.36-session-lv4.log").read_text(encoding="utf-8").splitlines(keepends=True)
    log = read_server_log("".join(text[:27]), "cut.log")
    assert [t.ended for t in log.tasks] == [True, False] and any("ends before task 49 does" in n for n in log.notes)
    with pytest.raises(InputError, match="a log cut right after its task began"):
        read_server_log("".join(text[:8]), "cut.log")


def _fold(text: str, width: int) -> str:
    """`text` as `fold -w WIDTH` (a terminal, a mail client) breaks its lines."""
    return "".join("\n".join(ln[i:i + width] for i in range(0, max(len(ln), 1), width)) + "\n" for ln in text.splitlines())


@pytest.mark.parametrize("width", [80, 120])
def test_a_log_wrapped_at_a_width_is_refused_not_misread(width):
    # (read with exit 0 as "no breaks" at 80 columns, "None tokens" at 120: the regression hidden)
    text = (LOGS / "0.3.33-cold-lv4.log").read_text(encoding="utf-8")
    with pytest.raises(InputError, match=f"w.log: the log's lines look broken at {width} characters .* give the log as "
                                         "llama-server wrote it"):
        read_server_log(_fold(text, width), "w.log")
    # lines of one length that the server wrote so (its progress lines) are no wrapping
    assert read_server_log(text).tasks[0].pattern == "fragmented"


def test_another_servers_wording_of_its_batches_is_refused_not_read_as_no_breaks():
    # (a newer server's words: read as 0 decode calls and no break, exit 0)
    text = (LOGS / "0.3.33-cold-lv4.log").read_text(encoding="utf-8")
    newer = re.sub(r"prompt processing, n_tokens = +(\d+), progress = ([\d.]+), t = .*",
                   r"prompt processing progress, n_tokens = \1, batch.n_tokens = 512, progress = \2",
                   text.replace("cached n_tokens = ", "n_tokens = "))
    with pytest.raises(InputError, match="task 0 processed 24416 tokens, but no line of the log says its prompt batches"):
        read_server_log(newer, "n.log")
    # a short task prints no batch line; nor, at the default verbosity, does a slow prompt of one
    # batch (its progress lines come only before a batch that starts 3 s in): no refusal
    assert read("0.3.36-session-lv4.log").tasks
    slow = re.sub(r"prompt eval time = +[\d.]+ ms / +\d+ tokens", "prompt eval time =    5080.34 ms /  2000 tokens",
                  "".join(ln for ln in (LOGS / "0.3.36-cold-lv3.log").read_text(encoding="utf-8").splitlines(True)
                          if "prompt processing, n_tokens" not in ln))
    (task,) = read_server_log(slow, "slow.log").tasks
    assert task.n_processed == 2000 and not task.mid_breaks


@pytest.mark.parametrize("log, old, new", [
    ("0.3.33-cold-lv4.log", "memory_seq_rm [", "mem_seq_rm ["),  # (its progress lines kept: 0 decode calls, "none")
    ("0.3.33-cold-lv3.log", "prompt processing, n_tokens =", "prompt processing, n_tok ="),  # (0 breaks seen, "none")
])
def test_a_counted_line_in_other_words_is_refused_not_read_as_fewer_batches(log, old, new):
    text = (LOGS / log).read_text(encoding="utf-8")
    assert read_server_log(text, log).tasks[0].pattern == "fragmented"
    with pytest.raises(InputError, match=r"task 0 has a line tmplkit cannot read \('.*" + re.escape(new)) as e:
        read_server_log(text.replace(old, new), log)
    assert "another version), or damaged" in str(e.value) and "\n" not in str(e.value)


def test_a_routers_log_with_a_collectors_prefix_and_tabs_reads_as_the_log_itself():
    # (docker's timestamp before the port: the port and the router's options were lost, the breaks
    # miscounted; tabs where the server wrote spaces: "no task in it")
    want = read("0.3.33-router-lv3-cut.log").to_dict()
    text = (LOGS / "0.3.33-router-lv3-cut.log").read_text(encoding="utf-8")
    prefixed = "".join(f"2025-06-01T12:00:00.000000000Z {ln}" for ln in text.splitlines(keepends=True))
    assert read_server_log(prefixed, want["source"]).to_dict() == want
    # a bracketed number further into a line is no router's port
    plain = (LOGS / "0.3.36-cold-lv4.log").read_text(encoding="utf-8")
    marked = plain.replace("load_model: context checkpoints enabled", "load_model: [ 12] context checkpoints enabled")
    assert marked != plain and read_server_log(marked).to_dict() == read_server_log(plain).to_dict()
    tabbed = (LOGS / "0.3.36-cold-lv4.log").read_text(encoding="utf-8").replace("  ", "\t")
    assert read_server_log(tabbed).summary() == read("0.3.36-cold-lv4.log").summary()


def test_a_log_cut_before_its_end_sums_to_unknown_not_zero(capsys, tmp_path):
    # (the task said "? processed" and the summary "0 tokens processed", the JSON 0 decode calls)
    text = "".join((LOGS / "0.3.33-cold-lv4.log").read_text(encoding="utf-8").splitlines(keepends=True)[:60])
    s = read_server_log(text, "c.log").summary()
    assert s["tokens_processed"] is None and s["decode_calls"] is None and s["tokens_reused"] == 0
    (tmp_path / "c.log").write_text(text, encoding="utf-8")
    assert main(["--no-config", "server", "log", str(tmp_path / "c.log")]) == 0
    assert "; ? tokens processed, 0 reused," in capsys.readouterr().out
