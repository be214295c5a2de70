"""`tmplkit turns`, `tmplkit session generate`, and the model shortcuts."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.prefill.models import resolve_model

FIX = Path(__file__).parent.parent / "fixtures" / "turns"


@pytest.fixture(scope="module")
def session_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("s") / "session.json"
    assert main(["session", "generate", "--tokens", "3000", "--requests", "2", "--seed", "0", "-o", str(path)]) == 0
    return path


def test_session_generate_writes_an_agent_session(session_file):
    data = json.loads(session_file.read_text())
    roles = [m["role"] for m in data["messages"]]
    assert roles.count("user") == 2 and data["tools"]
    assert all(m.get("reasoning_content") for m in data["messages"] if m["role"] == "assistant")


def test_session_generate_refuses_a_bad_style(capsys):
    assert main(["session", "generate", "--style", "chatty"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown session style 'chatty'" in err


def test_turns_text_and_csv(session_file, capsys):
    args = ["turns", str(FIX / "stable.jinja"), str(FIX / "drops-reasoning.jinja"), "--session", str(session_file)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "stable: stable over" in out and "drops-reasoning: NOT stable" in out
    assert "reasoning dropped" in out and "stable with: preserve_thinking=True" in out
    assert main(args + ["--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["template"], r["stable"], r["cause"]) for r in rows] == [
        ("stable", "True", ""), ("drops-reasoning", "False", "reasoning dropped")]


def test_turns_json_with_a_tokenizer(session_file, capsys, qwen35):
    assert main(["turns", str(FIX / "date.jinja"), "--session", str(session_file), "--tokenizer", "vocab:qwen35",
                 "--format", "json", "--no-switches"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["reports"]
    assert report["first_divergence"]["cause"] == "date or time" and report["first_divergence"]["token_position"] > 0
    totals = report["cost"]["after_first"]
    assert totals["full attention"] <= min(totals["llama-server"], totals["tmplkit"], totals["divergence-aware"])


@pytest.mark.parametrize("args, message", [
    (["--session", "missing.json"], "session file not found"),
    (["--memory", "swa:x"], "unknown memory model"),
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
