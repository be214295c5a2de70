"""`tmplkit server log` on logs as users paste them: each variant of our own fixtures reads as the
log itself does, or is refused in one line; never a different verdict without a word."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.server.log import read_server_log

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "server-logs"


def text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def tasks_dict(log) -> list[dict]:
    return [t.to_dict() for t in log.tasks]


def test_a_default_verbosity_paste_without_its_release_line_keeps_its_batches():
    # (before: every batch dropped, 0 breaks, "none", no note: a paste of the timing lines alone)
    whole = read_server_log(text("0.3.33-cold-lv3.log")).tasks[0]
    lines = text("0.3.33-cold-lv3.log").splitlines(keepends=True)
    assert "stop processing" in lines[-1]
    log = read_server_log("".join(lines[:-1]))
    (t,) = log.tasks
    assert t.relative and t.n_prompt is None and t.n_reused is None and t.n_processed == whole.n_processed
    assert t.pattern == "fragmented" and len(t.mid_breaks) == len(whole.mid_breaks)
    assert [s - t.batch_starts[0] for s in t.batch_starts] == [s - whole.batch_starts[0] for s in whole.batch_starts]
    assert any("'stop processing' line is not in the log" in n and "count from the first token it processed" in n for n in log.notes)


@pytest.mark.parametrize("name", ["0.3.36-cold-lv3.log", "0.3.36-router-lv3.log", "0.3.33-router-lv3-cut.log"])
@pytest.mark.parametrize("cut", [("eval time",), ("eval time", "stop processing")])
def test_a_paste_without_the_prompts_length_still_tells_the_near_end_batches_from_breaks(cut, name):
    # (before: the fixed server's two near-end batch ends, n - 4 - n_ubatch and n - 4, counted as
    # breaks: 7 where the whole log has 5, where the paste has neither eval line; the router's
    # -ub 2048 puts a break between the two)
    whole = read_server_log(text(name)).tasks[0]
    paste = "".join(line for line in text(name).splitlines(keepends=True) if not any(c in line for c in cut))
    (t,) = read_server_log(paste).tasks
    assert t.relative and t.n_prompt is None and t.n_processed is None and len(whole.near_end) == 2
    first = t.batch_starts[0] - whole.batch_starts[0]  # (positions count from the first batch logged)
    assert [p + first for p in t.near_end] == list(whole.near_end) and t.implied_end + first == whole.n_prompt
    assert [p + first for p in t.mid_breaks] == list(whole.mid_breaks) and t.pattern == whole.pattern
    assert len(whole.mid_breaks) == {"0.3.36-cold-lv3.log": 5, "0.3.36-router-lv3.log": 5, "0.3.33-router-lv3-cut.log": 18}[name]


def test_a_paste_cut_in_the_middle_of_a_prompt_implies_no_end():
    lines = [line for line in text("0.3.36-cold-lv3.log").splitlines(keepends=True)
             if "progress = 0.9" not in line and "progress = 1.00" not in line and "eval time" not in line]
    (t,) = read_server_log("".join(lines)).tasks
    assert t.implied_end is None and t.near_end == ()


def test_batch_lines_cut_out_of_a_trace_log_are_a_gap_not_a_batch():
    # (before: a 17,704-token "batch" with n_batch 2048, 20 decode calls, "none")
    lines = text("0.3.33-cold-lv4.log").splitlines(keepends=True)
    (t,) = read_server_log("".join(lines[:19] + lines[60:])).tasks
    assert len(t.gaps) == 1 and t.gaps[0][1] - t.gaps[0][0] > t.n_batch
    assert t.decode_calls is None and t.pattern == "fragmented"
    assert "the batch lines of" in t.findings()[0]


@pytest.mark.parametrize("how", ["every line twice", "one batch line twice", "one batch line twice, no timestamps"])
def test_a_log_that_holds_a_line_twice_is_refused_not_read_as_breaks(how):
    # (before: 40 decode calls and 25 breaks, "fragmented", of a fixed server's 20 and 7; one line
    # twice was one batch and one break more)
    lines = text("0.3.36-cold-lv4.log").splitlines(keepends=True)
    if how == "every line twice":
        doubled = [ln for line in lines for ln in (line, line)]
    else:
        doubled = [ln for line in lines for ln in ((line, line) if "cached n_tokens = 4770," in line else (line,))]
        if "no timestamps" in how:
            doubled = [re.sub(r"^\d+\.\d\d\.\d\d\d\.\d\d\d [A-Z] ", "", ln) for ln in doubled]
    says = "is the line before it again, timestamp and all" if "no timestamps" not in how else \
        "a batch at 4770 right after one at 4770, which no server prints"
    with pytest.raises(InputError, match=says):
        read_server_log("".join(doubled))


def _line(slot: int, task: int, msg: str) -> str:
    return f"slot   operator(): id  {slot} | task {task} | {msg}\n"




def test_batches_two_slots_share_are_no_breaks():
    """Two tasks at once, in our own words of the server's: before, each shared batch's early end was
    a mid-prompt break (3 of them on a server that has none, 12 with four slots)."""
    lines = ["llama_context: n_batch               = 2048\n", "llama_context: n_ubatch              = 512\n",
             "common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)\n"]
    for slot, task in ((0, 0), (1, 1)):
        lines += [_line(slot, task, "processing task, is_child = 0"),
                  _line(slot, task, "new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = 8000")]
    # (each batch 2048 tokens: slot 0's line, then slot 1's; slot 1 goes on alone once slot 0 is done)
    batches = [[(0, 0)], [(0, 2048), (1, 0)], [(0, 3072), (1, 1024)], [(0, 4096), (1, 2048)], [(0, 5120), (1, 3072)],
               [(0, 6144), (1, 4096)], [(0, 7168), (1, 5120)], [(0, 7484), (1, 6852)], [(0, 7996), (1, 7340)]]
    for batch in batches:
        lines += [_line(slot, slot, f"cached n_tokens = {at}, memory_seq_rm [{at}, end)") for slot, at in batch]
    lines += [_line(0, 0, "prompt eval time =    1000.00 ms /  8000 tokens (    0.12 ms per token,  8000.00 tokens per second)"),
              _line(0, 0, "stop processing: n_tokens = 8001, truncated = 0")]
    lines += [_line(1, 1, f"cached n_tokens = {at}, memory_seq_rm [{at}, end)") for at in (7484, 7996)]
    lines += [_line(1, 1, "prompt eval time =    2000.00 ms /  8000 tokens (    0.25 ms per token,  4000.00 tokens per second)"),
              _line(1, 1, "stop processing: n_tokens = 8001, truncated = 0")]
    log = read_server_log("".join(lines))
    first, second = log.tasks
    # (slot 0's batches from 2048 on ran beside slot 1's prompt; slot 1's beside slot 0's prompt, then
    # beside the turn slot 0 generates, to 7484; its last one alone)
    assert first.shared_ends == (3072, 4096, 5120, 6144, 7168, 7484, 7996)
    assert second.shared_ends == (1024, 2048, 3072, 4096, 5120, 6852, 7340, 7484)
    assert first.mid_breaks == () and second.mid_breaks == () and {first.pattern, second.pattern} == {"none"}
    assert "ran while another slot's task did" in first.findings()[-1]
    # the same batches, one task after the other (nothing shared): each early end is a break
    alone = read_server_log("".join(ln for ln in lines if "task 1 |" not in ln))
    assert alone.tasks[0].mid_breaks == (3072, 4096, 5120, 6144, 7168) and not alone.tasks[0].shared_ends


def test_each_run_of_an_appended_log_is_read_with_its_own_batch_sizes():
    # (before: the last run's n_batch for every run)
    first = text("0.3.36-cold-lv4.log").replace("n_batch               = 2048", "n_batch               = 4096")
    log = read_server_log(first + text("0.3.36-cold-lv4.log"))
    assert [t.n_batch for t in log.tasks] == [4096, 2048] and log.n_batch == 4096
    assert tasks_dict(log)[1] == tasks_dict(read_server_log(text("0.3.36-cold-lv4.log")))[0]
    assert any("each with its run's batch sizes (they differ)" in n for n in log.notes)


def test_a_paste_that_begins_inside_a_task():
    whole = read_server_log(text("0.3.33-cold-lv4.log")).tasks[0].to_dict()
    lines = text("0.3.33-cold-lv4.log").splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if "new prompt" in ln)
    # from its 'new prompt' line the task is whole (before: "no task in it ... cut before the first one")
    log = read_server_log("".join(lines[at:]))
    got = log.tasks[0].to_dict()
    # (the start lines are gone: n_ubatch, and what the slot held before: not known)
    assert {k: v for k, v in got.items() if got[k] != whole[k]} == {"n_ubatch": None, "n_common": None, "went_back": None}
    assert any("begins at task 0's 'new prompt' line" in n for n in log.notes)
    with pytest.raises(InputError, match=r"the log begins inside task 0 \(line 1 is one of its batch"):
        read_server_log("".join(lines[at + 1:]))
    # a later task read, the one it begins inside named (before: dropped without a word)
    lines = text("0.3.36-no-checkpoints-lv4.log").splitlines(keepends=True)
    cut = "".join(lines[next(i for i, ln in enumerate(lines) if "task 28 | cached" in ln):])
    log = read_server_log(cut)
    assert [t.task for t in log.tasks] == [71] and any("the log begins inside task 28" in n for n in log.notes)


@pytest.mark.parametrize("paste", ["tabs", "squeezed", "grep --color", "no-break space"])
def test_a_pastes_spacing_and_escapes_read_as_the_log(paste):
    def pasted(s: str) -> str:
        if paste == "tabs":
            return s.replace("load:   ", "load:\t")
        if paste == "squeezed":
            return re.sub(" +", " ", s)
        if paste == "grep --color":
            return re.sub(r"(task \d+)", "\x1b[01;31m\x1b[K\\1\x1b[m\x1b[K", s)
        return s.replace("id  0", "id\u00a0 0")
    for name in ("0.3.36-router-lv3.log", "0.3.36-no-checkpoints-lv4.log", "0.3.33-cold-lv4.log"):
        clean, got = read_server_log(text(name)), read_server_log(pasted(text(name)))
        # (before: a router's options not read when spaced otherwise, n_ubatch 512 for 2048 and a break
        # more; a squeezed ' - checking sim' line lost, the shared tokens estimated; a no-break space or
        # an erase-line code: no task read)
        assert (got.n_batch, got.n_ubatch) == (clean.n_batch, clean.n_ubatch), name
        assert tasks_dict(got) == tasks_dict(clean), name


def test_a_line_split_by_another_write_and_a_log_that_ends_as_a_task_begins():
    lines = text("0.3.36-cold-lv4.log").splitlines(keepends=True)
    k = next(i for i, ln in enumerate(lines) if "cached n_tokens = 602," in ln)
    cut = lines[k].index("cached n_tok") + len("cached n_tok")
    split = lines[:k] + [lines[k][:cut] + "\n", lines[k][cut:]] + lines[k + 1:]
    with pytest.raises(InputError, match="a line tmplkit cannot read \\('cached n_tok'\\)"):  # (before: one batch fewer)
        read_server_log("".join(split))
    begun = "".join(lines) + lines[next(i for i, ln in enumerate(lines) if "processing task" in ln)].replace("task 0", "task 9")
    log = read_server_log(begun)
    assert log.tasks[-1].task == 9 and any("the log ends as task 9 begins: nothing of it is read" in n for n in log.notes)


def test_a_compressed_logs_hint_names_its_own_tool(tmp_path, capsys):
    (tmp_path / "server.log.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 16)
    assert main(["--no-config", "server", "log", str(tmp_path / "server.log.zst")]) == 2
    err = capsys.readouterr().err
    assert "a compressed file (zstd)" in err and "`zstdcat " in err and err.count("\n") == 1


@pytest.mark.corpus
def test_a_task_whose_positions_are_relative_is_placed_on_no_message(qwen35):
    # (before: its positions, counted from its first processed token, were placed on the longest
    # request as if from the prompt's start: messages the breaks never fell on)
    from tmplkit.prefill import generate_session
    from tmplkit.server.log_breaks import locate_breaks
    from tmplkit.sources import corpus, load_one

    template = load_one(str(corpus.templates_dir() / "Qwen3.5-4B.jinja"))
    session = generate_session(30000, seed=0, style="agent")
    lines = text("0.3.33-cold-lv3.log").splitlines(keepends=True)
    log = locate_breaks(read_server_log("".join(lines[:-1])), template, session, qwen35)
    assert log.tasks[0].relative and log.locations == ()
    assert locate_breaks(read_server_log("".join(lines)), template, session, qwen35).locations  # (whole: placed)


def _trace(slot: int, task: int, at: int) -> str:
    return _line(slot, task, f"cached n_tokens = {at}, memory_seq_rm [{at}, end)")


def _task_lines(slot: int, task: int, n: int, starts, generated: int = 2) -> list[str]:
    return ([_line(slot, task, "processing task, is_child = 0"),
             _line(slot, task, f"new prompt, n_ctx_slot = 32768, n_keep = 0, task.n_tokens = {n}")]
            + [_trace(slot, task, at) for at in starts]
            + [_line(slot, task, f"prompt eval time =    1000.00 ms /  {n} tokens (    0.25 ms per token,  4000.00 tokens per second)"),
               _line(slot, task, f"       eval time =      10.00 ms /     {generated} tokens (    5.00 ms per token,   200.00 tokens per second)"),
               _line(slot, task, f"stop processing: n_tokens = {n + generated - 1}, truncated = 0")])


HEAD = ["llama_context: n_batch               = 2048\n", "llama_context: n_ubatch              = 512\n",
        "common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)\n"]


def test_a_task_begun_on_a_lower_slot_shares_only_the_batches_after_it_and_tasks_in_turn_share_none():
    # slot 1 runs alone to 2600 (a break at a message), then a short prompt arrives on slot 0: the
    # server fills each batch from slot 0 first, so its first line comes before slot 1's next one
    # (before the slot order was read: the break at 2600 was taken for a shared batch's end)
    a = _task_lines(1, 0, 10000, [])
    lines = HEAD + a[:2] + [_trace(1, 0, 0), _trace(1, 0, 2048)] + _task_lines(0, 2, 1000, [0])[:3] + \
        [_trace(1, 0, 2600), _trace(1, 0, 3648)] + _task_lines(0, 2, 1000, [])[3:] + \
        [_trace(1, 0, at) for at in (5694, 7742, 9484, 9996)] + a[2:]
    first = read_server_log("".join(lines)).tasks[0]
    assert first.mid_breaks == (2600,) and first.shared_ends == (3648, 5694)
    # the same two prompts one after the other, on two slots: nothing shared, every break counted
    lines = HEAD + _task_lines(1, 0, 4000, [0, 1500, 3484, 3996]) + _task_lines(0, 1, 4000, [0, 1500, 3484, 3996])
    log = read_server_log("".join(lines))
    assert [t.shared_ends for t in log.tasks] == [(), ()] and [t.mid_breaks for t in log.tasks] == [(1500,), (1500,)]
    # two servers behind a router (each its own port) share no batch either
    ported = [f"[{port}] {ln}" for port, task in ((41001, 0), (41002, 0))
              for ln in HEAD + _task_lines(0, task, 4000, [0, 1500, 3484, 3996])]
    mixed = [ported[i] for pair in zip(range(0, len(ported) // 2), range(len(ported) // 2, len(ported))) for i in pair]
    log = read_server_log("".join(mixed))
    assert [t.instance for t in log.tasks] == [41001, 41002] and [t.mid_breaks for t in log.tasks] == [(1500,), (1500,)]


def test_at_the_default_verbosity_a_short_request_beside_a_long_one_still_shares_its_batches():
    # (a prompt under 3 s prints no progress line: it ran from its 'processing task' line; before,
    # the long prompt's batches beside it and its turn's tokens were read as breaks)
    def progress(slot, task, k, n):
        return _line(slot, task, f"prompt processing, n_tokens = {k}, progress = {k / n:.2f}, t =   3.50 s / 500.00 tokens per second")
    info = [ln for ln in HEAD if "verbosity" not in ln] + ["common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)\n"]
    long_ = [_line(1, 0, "processing task, is_child = 0")] + [progress(1, 0, k, 24000) for k in (12000, 14048, 16096, 18144)]
    short = [_line(0, 5, "processing task, is_child = 0"),
             _line(0, 5, "prompt eval time =     200.00 ms /   500 tokens (    0.40 ms per token,  2500.00 tokens per second)")]
    # (the batch at 20192 holds the short prompt first, then 1,548 of the long one's; the next, the
    # short one's first generated token, then the long one's up to its near-end checkpoint at 23484)
    lines = info + long_ + short + [progress(1, 0, k, 24000) for k in (20192, 21740)] + \
        [_line(0, 5, "       eval time =     400.00 ms /    40 tokens (   10.00 ms per token,   100.00 tokens per second)"),
         _line(0, 5, "stop processing: n_tokens = 539, truncated = 0")] + \
        [progress(1, 0, k, 24000) for k in (23484, 23996)] + \
        [_line(1, 0, "prompt eval time =   10000.00 ms / 24000 tokens (    0.42 ms per token,  2400.00 tokens per second)"),
         _line(1, 0, "       eval time =      10.00 ms /     2 tokens (    5.00 ms per token,   200.00 tokens per second)"),
         _line(1, 0, "stop processing: n_tokens = 24001, truncated = 0")]
    long_task = read_server_log("".join(lines)).tasks[0]
    assert long_task.shared_ends == (21740, 23484) and long_task.mid_breaks == ()
    alone = read_server_log("".join(ln for ln in lines if "task 5 |" not in ln)).tasks[0]
    assert alone.mid_breaks == (21740,)


def test_a_trace_paste_without_the_servers_start_and_a_larger_batch_is_no_gap():
    # -b 4096, pasted from the task's 'processing task' line: n_batch is not in the log (before: every
    # batch "lines cut out of the log", no decode calls)
    lines = _task_lines(0, 0, 19890, [0, 4096, 8192, 12288, 16384, 19374, 19886])
    log = read_server_log("".join(["common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)\n"] + lines))
    (t,) = log.tasks
    assert t.gaps == () and t.decode_calls == 7 and t.mid_breaks == ()
    assert any("batches of up to 4096 tokens, more than the n_batch taken" in n for n in log.notes)


def test_quiet_prints_only_the_tasks_that_show_a_pattern(tmp_path, capsys):
    """-q is "only what went wrong" in every command; `server log` printed the whole reading."""
    fixed, regressed = str(LOGS / "0.3.36-cold-lv3.log"), str(LOGS / "0.3.33-cold-lv3.log")
    assert main(["-q", "server", "log", fixed]) == 0
    assert capsys.readouterr().out == ""
    assert main(["-q", "server", "log", regressed]) == 0
    out = capsys.readouterr().out
    assert "pattern: fragmented" in out and "summary: fragmented: 1" in out
    assert main(["-q", "server", "log", fixed, "--format", "json"]) == 0  # (data, written whole)
    assert '"pattern": "none"' in capsys.readouterr().out
    assert main(["-q", "server", "log", fixed, "-o", str(tmp_path / "r.txt")]) == 0  # (a file too)
    assert "5 mid-prompt breaks" in (tmp_path / "r.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["0.3.36-session-lv4.log", "0.3.36-cold-lv4.log", "0.3.33-session-lv4.log",
                                  "0.3.33-cold-lv4.log"])
def test_a_trace_paste_without_its_tasks_first_and_last_lines_reads_the_prompts_length_off_its_sampler_line(name):
    # (before: no 'new prompt' line and no end lines left the prompt's length unknown, so the
    # near-end batch ends counted as breaks: the fixed server's 1-break task 0 read "fragmented")
    whole = read_server_log(text(name))
    cut = ("new prompt", "eval time", "stop processing")
    paste = read_server_log("".join(line for line in text(name).splitlines(keepends=True) if not any(c in line for c in cut)))
    for a, b in zip(whole.tasks, paste.tasks, strict=True):
        assert (b.n_prompt, b.mid_breaks, b.pattern, b.decode_calls) == (a.n_prompt, a.mid_breaks, a.pattern, a.decode_calls)
        assert b.prompt_tps is None and b.n_generated is None  # (what the cut lines said is not made up)


def test_a_trace_paste_without_its_batch_lines_is_refused_not_read_as_whole_batches():
    # (before: its progress lines stood in, and the regressed server's 32 breaks read "0 decode
    # calls; 0 mid-prompt breaks", none)
    paste = "".join(line for line in text("0.3.33-cold-lv4.log").splitlines(keepends=True) if "cached n_tokens" not in line)
    with pytest.raises(InputError, match="task 0 processed 24416 tokens, but no line of the log says its prompt batches.*cut out"):
        read_server_log(paste)


@pytest.mark.parametrize("how", ["cut out", "worded otherwise"])
def test_a_trace_paste_from_its_first_request_without_its_batch_lines_is_refused(how):
    # (a paste of the task lines only, without the server's start lines that say -lv 4: its
    # 'new prompt' line says the verbosity; it read "0 decode calls; 0 mid-prompt breaks", none)
    lines = [ln for ln in text("0.3.33-cold-lv4.log").splitlines(keepends=True) if "| task" in ln]
    paste = "".join(ln for ln in lines if "cached n_tokens" not in ln) if how == "cut out" else \
        "".join(ln.replace("cached n_tokens = ", "n_tokens = ") for ln in lines)
    with pytest.raises(InputError, match="task 0 processed 24416 tokens, but no line of the log says its prompt batches"):
        read_server_log(paste)
    assert read_server_log("".join(lines)).tasks[0].mid_breaks  # (the task lines whole read the breaks)


@pytest.mark.parametrize("name", ["0.3.36-cold-lv3.log", "0.3.36-router-lv3.log", "0.3.33-router-lv3-cut.log"])
def test_a_log_cut_inside_its_last_number_reads_without_that_line(name):
    # (a log cut inside its last `stop processing: n_tokens = 24417` read 2441 there: -21976 tokens
    # reused and negative batch positions, exit 0)
    whole = text(name)
    at = whole.rindex("stop processing: n_tokens = ") + len("stop processing: n_tokens = ")
    for digits in range(1, 5):
        log = read_server_log(whole[:at + digits], "cut.log")
        assert any("last line has no end and cannot be read" in n for n in log.notes)
        for t in log.tasks:
            assert (t.n_reused is None or t.n_reused >= 0) and all(b >= 0 for b in t.batch_starts)
        # ended there, the number is the log's and no server prints it
        with pytest.raises(InputError, match="which no server prints"):
            read_server_log(whole[:at + digits] + "\n", "cut.log")


def test_a_default_verbosity_paste_without_its_progress_lines_says_its_breaks_are_not_known():
    # (before: the regressed server's 24 breaks read "none" with nothing said)
    paste = "".join(line for line in text("0.3.33-cold-lv3.log").splitlines(keepends=True) if "prompt processing" not in line)
    log = read_server_log(paste)
    assert any("no 'prompt processing' line is in the log" in n and "breaks are not known" in n for n in log.notes)
    assert log.tasks[0].pattern == "not known" and log.summary()["patterns"] == {"not known": 1}  # (not "none": unchecked)
    assert not any("no 'prompt processing' line" in n for n in read_server_log(text("0.3.33-cold-lv3.log")).notes)
