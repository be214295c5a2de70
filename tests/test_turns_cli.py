"""`tmplkit turns`, `tmplkit session generate`, and the model shortcuts."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.prefill.models import resolve_model

FIX = Path(__file__).parent.parent / "fixtures" / "turns"


@pytest.fixture(scope="module")
def session_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("s") / "session.json"
    assert main(["session", "generate", "--requests", "2", "--seed", "0", "-o", str(path)]) == 0
    return path


def test_session_generate_writes_an_agent_session(session_file):
    data = json.loads(session_file.read_text())
    roles = [m["role"] for m in data["messages"]]
    assert roles.count("user") == 2 and data["tools"]
    assert all(m.get("reasoning_content") for m in data["messages"] if m["role"] == "assistant")


def test_session_generate_refuses_a_bad_style(capsys):
    with pytest.raises(SystemExit) as info:  # (argparse's choices: the line names --style)
        main(["session", "generate", "--style", "chatty"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "argument --style: invalid choice: 'chatty'" in err


def test_turns_text_and_csv(session_file, capsys):
    args = ["turns", str(FIX / "stable.jinja"), str(FIX / "drops-reasoning.jinja"), "--session", str(session_file)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "stable: stable over" in out and "drops-reasoning: NOT stable" in out
    assert "reasoning dropped" in out and "stable with: keep_reasoning=True" in out
    assert main(args + ["--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["template"], r["stable"], r["cause"]) for r in rows] == [
        ("stable", "True", ""), ("drops-reasoning", "False", "reasoning dropped")]


def test_quiet_turns_prints_only_the_templates_whose_prefix_is_not_kept(session_file, capsys):
    """-q is "only what went wrong" in every command; turns printed every template's report."""
    args = ["turns", str(FIX / "stable.jinja"), str(FIX / "drops-reasoning.jinja"), "--session", str(session_file), "-q"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "drops-reasoning: NOT stable" in out and "stable: stable over" not in out
    assert main(["turns", str(FIX / "stable.jinja"), "--session", str(session_file), "-q"]) == 0
    assert capsys.readouterr().out == ""
    assert main(args + ["--format", "csv"]) == 0  # (data is written whole)
    assert len(list(csv.DictReader(io.StringIO(capsys.readouterr().out)))) == 2
    out_file = session_file.parent / "quiet-turns.txt"  # (so is a file: -q is about the terminal)
    assert main(args + ["-o", str(out_file)]) == 0
    assert "stable: stable over" in out_file.read_text(encoding="utf-8")


def test_turns_json_with_a_tokenizer(session_file, capsys, qwen35):
    assert main(["turns", str(FIX / "date.jinja"), "--session", str(session_file), "--tokenizer", "vocab:qwen35",
                 "--format", "json", "--no-switches"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["reports"]
    assert report["first_divergence"]["cause"] == "date or time" and report["first_divergence"]["token_position"] > 0
    totals = report["cost"]["after_first"]
    assert totals["full attention"] <= min(totals["llama-server"], totals["tmplkit"], totals["divergence-aware"])


def test_turns_simulates_the_settings_asked_for(session_file, capsys, qwen35):
    assert main(["turns", str(FIX / "date.jinja"), "--session", str(session_file), "--tokenizer", "vocab:qwen35",
                 "--format", "json", "--no-switches", "--settings", "llama-server"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["reports"]
    assert set(report["cost"]["totals"]) == {"full attention", "llama-server"}


def test_turns_workers_by_default_are_the_cores_within_the_free_memory(monkeypatch):
    from tmplkit.cli import _turns

    monkeypatch.setattr(_turns.os, "cpu_count", lambda: 8)
    available = {"bytes": 3 * _turns.MEMORY_MB * 2**20}  # 3 workers' worth
    monkeypatch.setattr(_turns, "_available_memory", lambda: available["bytes"])
    assert _turns._default_jobs() == 3
    available["bytes"] = 10 * 4096
    assert _turns._default_jobs() == 1
    available["bytes"] = None  # (the system does not say)
    assert _turns._default_jobs() == 8


def test_available_memory_is_what_the_system_can_give_not_its_free_pages(tmp_path):
    from tmplkit.cli import _turns

    # (a meminfo of ours: the machine's own moves between two reads)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:          900000 kB\nMemAvailable:   17000000 kB\n"
                       "Buffers:          100000 kB\n", encoding="ascii")
    got = _turns._available_memory(str(meminfo))
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines()}
    assert got == fields["MemAvailable"] >= fields["MemFree"]
    if os.path.exists("/proc/meminfo"):  # the machine's own is read too
        assert (_turns._available_memory() or 0) > 0


def test_turns_with_the_servers_delimiter_lists(session_file, tmp_path, capsys, qwen35):
    saved = tmp_path / "server.json"
    row = {"template": "stable", "server": {"status": "ok", "route": "specialized", "handler": "LFM2"}}
    saved.write_text(json.dumps({"schema_version": 1, "results": [row]}))
    assert main(["turns", str(FIX / "stable.jinja"), "--session", str(session_file), "--tokenizer", "vocab:qwen35",
                 "--no-switches", "--server-delimiters", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "llama-server: resumes up to" in out and "re-processes the whole prompt" in out


@pytest.mark.parametrize("args, message", [
    (["--session", "missing.json"], "session file not found"),
    (["--memory-model", "swa:x"], "unknown memory model"),
    (["--memory-model", "swa:0"], "memory model 'swa:0': a window of 0 positions holds nothing"),
    (["--server-delimiters", "missing.json", "--tokenizer", "vocab:qwen35"], "missing.json: cannot read"),
    (["--settings", "tmplkit,fastest"], "unknown --settings fastest; give some of llama-server, tmplkit, divergence-aware"),
    # (it said "unknown --settings (none)")
    (["--settings", ","], "no --settings given (an empty list); give some of llama-server, tmplkit, divergence-aware"),
])
def test_turns_errors_are_one_line(args, message, capsys):
    assert main(["turns", str(FIX / "stable.jinja")] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bad_session_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}')
    assert main(["turns", str(FIX / "stable.jinja"), "--session", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "messages[1]" in err


def test_model_shortcuts(tmp_path):
    with pytest.raises(InputError, match="model file not found: .*shortcut"):
        resolve_model(tmp_path / "nope.gguf")
    with pytest.raises(InputError, match="tiny:qwen35"):
        resolve_model("tiny:")
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(f) == f


def test_replay_refuses_unknown_settings_before_loading(capsys, session_file):
    assert main(["replay", "tiny:qwen35", str(session_file), "--settings", "fastest"]) == 2
    assert "unknown --settings fastest" in capsys.readouterr().err


def test_replay_table_json_and_plot(tmp_path):
    from tmplkit.replay import ReplayedRequest, SessionReplay, plot_replay

    reqs = {name: tuple(ReplayedRequest(k, 100 * (k + 1), 100 * k, 100 if k else 100, None, 100, 0.01, 0.0, 5)
                        for k in range(3)) for name in ("llama-server", "tmplkit")}
    rep = SessionReplay("m.gguf", "t", {"kind": "swa"}, reqs, (100, 90, 95))
    assert rep.matches and rep.total("tmplkit") == 200
    md = rep.to_markdown()
    assert md.splitlines()[0].startswith("| request | prompt | llama-server") and "MISMATCH" not in md
    assert rep.to_dict()["full_attention_bound"] == 185
    pytest.importorskip("matplotlib")
    plot_replay(rep, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_a_time_limit_studies_the_requests_rendered_by_then(session_file):
    """Past --timeout the study stops between two requests: the ones rendered are studied, the
    switches are not tried, and the report says where it stopped."""
    from tmplkit.session import load_session
    from tmplkit.sources import load_one
    from tmplkit.turns import study_turns
    from tmplkit.turns.formats import format_turns

    session, template = load_session(session_file), load_one(FIX / "drops-reasoning.jinja")
    whole = study_turns(template, session)
    cut = study_turns(template, session, timeout=1e-9)
    assert whole.n_requests > 2 and not whole.stopped and whole.switches
    assert cut.n_requests == 1 and not cut.switches
    assert cut.stopped.startswith("stopped at the time limit") and f"after 1 of {whole.n_requests} requests" in cut.stopped
    assert cut.stopped in cut.notes and cut.to_dict()["stopped"] == cut.stopped
    assert whole.stable is False and cut.stable is None
    assert format_turns([cut]).startswith("drops-reasoning: no divergence in the first 1 request (stopped before the "
                                          "session's end: not known beyond)")  # (it said "in the first over 1 request")
    assert "80% of it for the requests" in cut.stopped  # (text only: little to study after them)


def test_the_requests_take_only_their_share_of_the_time_limit(monkeypatch):
    """What is studied after the requests (tokens, spans, the next renders predicted from) takes up
    to 3.5x their time: they stop at their share of the limit, so the study ends inside it with what
    it found (a 32,000-message chat with a tokenizer was stopped with nothing at 66 s of 60)."""
    from tmplkit.turns import budget as b
    from tmplkit.turns.summary import _share

    now = [100.0]
    monkeypatch.setattr(b.time, "monotonic", lambda: now[0])
    budget = b.Budget(timeout=60, share=_share(tokens=True, predict=True), started=now[0])
    now[0] += 11.9
    assert not budget.expired()
    now[0] += 0.1
    assert budget.expired() and _share(True, False) == 0.25 and _share(False, False) == 0.8
    assert list(budget.take(iter(range(5)), 5)) == [0] and "20% of it for the requests" in budget.stopped


def test_progress_is_reported_request_by_request(session_file):
    from tmplkit.session import load_session
    from tmplkit.sources import load_one
    from tmplkit.turns import study_turns

    seen = []
    n = study_turns(load_one(FIX / "stable.jinja"), load_session(session_file), progress=lambda *a: seen.append(a)).n_requests
    assert seen == [("requests", k, n) for k in range(1, n + 1)]


def test_turns_timeout_on_the_command_line(session_file, capsys):
    assert main(["turns", str(FIX / "drops-reasoning.jinja"), "--session", str(session_file), "--timeout", "1e-9",
                 "--format", "json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["reports"]
    assert report["n_requests"] == 1 and "after 1 of 22 requests" in report["stopped"]
    # one request studied says nothing of the other 21: no verdict (the whole study is NOT stable)
    assert report["stable"] is None
    assert main(["turns", str(FIX / "stable.jinja"), "--timeout", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeout must be a positive finite number" in err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("term, shown", [("xterm", True), ("dumb", False)])
def test_turns_progress_on_a_terminal_only(session_file, monkeypatch, capsys, term, shown):
    err = _Terminal()
    monkeypatch.setenv("TERM", term)
    monkeypatch.setattr("sys.stderr", err)
    assert main(["turns", str(FIX / "stable.jinja"), "--session", str(session_file)]) == 0
    assert ("stable: requests 22/22" in err.getvalue()) is shown
    assert ("\x1b[" in err.getvalue()) is shown
    assert "stable over" in capsys.readouterr().out  # the report itself is untouched


def test_an_infinite_timeout_is_refused_as_the_configuration_refuses_it(capsys):
    assert main(["turns", str(FIX / "stable.jinja"), "--timeout", "inf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeout must be a positive finite number, got inf" in err


def test_options_that_count_tokens_without_a_tokenizer_are_refused_not_ignored(capsys):
    assert main(["turns", str(FIX / "stable.jinja"), "--add-bos", "--server-delimiters", "d.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--add-bos, --server-delimiters only change what is counted in tokens; give --tokenizer too" in err
    # (--model was read, and its memory said, before the refusal: two lines)
    assert main(["turns", str(FIX / "stable.jinja"), "--model", "gemma"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tmplkit: error: --model only changes what is counted in tokens"), err


def test_a_memory_limit_in_turns_names_a_way_turns_has(capsys):
    # turns takes --memory MB as the other commands do (it was the memory model's old spelling, and
    # the limit was fixed: a long session with token ids ran out of it, the message blaming the template)
    hostile = Path(__file__).resolve().parent.parent / "fixtures" / "hostile" / "bomb_held_values.jinja"
    assert main(["--no-config", "turns", str(hostile)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "raise --memory" in err


def test_turns_memory_is_mib_and_the_old_memory_model_spelling_still_works(session_file, capsys):
    from tmplkit.cli import build_parser

    args = build_parser().parse_args(["turns", str(FIX / "stable.jinja"), "--memory", "4096"])
    assert args.memory_mb == 4096 and args.memory is None and capsys.readouterr().err == ""
    old = build_parser().parse_args(["turns", str(FIX / "stable.jinja"), "--memory", "swa:64"])
    assert old.memory == "swa:64" and old.memory_mb is None and "--memory-model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:  # (argparse's own refusal: one line, exit 2)
        main(["--no-config", "turns", str(FIX / "stable.jinja"), "--memory", "1.5"])
    assert bad.value.code == 2 and "'1.5' is not a whole number of MiB" in capsys.readouterr().err
    for typo in ("", "0x10", "nan", "inf", "big"):  # (nan was taken for the old memory model: its error named --memory-model)
        with pytest.raises(SystemExit) as bad:
            main(["--no-config", "turns", str(FIX / "stable.jinja"), "--memory", typo])
        err = capsys.readouterr().err
        assert bad.value.code == 2 and err.count("\n") == 1 and "is not a whole number of MiB" in err, err
    assert main(["--no-config", "turns", str(FIX / "stable.jinja"), "--memory", "0"]) == 2
    assert "--memory" in capsys.readouterr().err
    # the limit is the worker's: what the command gives the study's worker, and its limits
    from tmplkit.cli import _turns

    given = []
    work = _turns._contained_study
    for argv, want in (([], _turns.MEMORY_MB), (["--memory", "4096"], 4096)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_turns, "_contained_study", lambda t, s, timeout, mb, options: given.append(mb)
                       or work(t, s, timeout, mb, options))
            assert main(["--no-config", "turns", str(FIX / "stable.jinja"), "--session", str(session_file), "-j", "1",
                         *argv]) == 0
        assert given[-1] == want and _turns._worker_limits(None, want)[1]["memory_mb"] == want


def test_one_template_on_two_workers_makes_its_next_renders_ahead_with_the_same_report(session_file, capsys, monkeypatch):
    # `-j 2` and one template: the study's next renders are made in a forked child, beside it
    # (turns.ahead); the report is the one `-j 1` writes, which makes them in the study itself
    from tmplkit.cli import _turns

    asked = []
    work = _turns._contained_study
    monkeypatch.setattr(_turns, "_contained_study", lambda t, s, timeout, mb, options: asked.append(options["ahead"])
                        or work(t, s, timeout, mb, options))
    argv = ["turns", str(FIX / "strict-alternation.jinja"), "--session", str(session_file), "--tokenizer", "vocab:qwen35",
            "--format", "json", "--no-switches"]
    reports = []
    for jobs in ("1", "2"):
        assert main([*argv, "-j", jobs]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert asked == [False, True]
    assert reports[0] == reports[1] and reports[0]["reports"][0]["cost"]
