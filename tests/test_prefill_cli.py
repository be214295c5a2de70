"""`tmplkit prefill`: the command and its library twin, on the tiny qwen35-vocab model."""

from __future__ import annotations

import json
import os

import pytest

from tmplkit.cli import main
from tmplkit.errors import SourceError
from tmplkit.sources import corpus

pytestmark = [pytest.mark.model, pytest.mark.corpus]
llama_cpp = pytest.importorskip("llama_cpp")

from tmplkit.prefill import POLICIES, PrefillSettings, compare_policies, generate_session, save_session, tiny_model_path  # noqa: E402

# TMPLKIT_TEST_GPU_LAYERS: layers offloaded to a GPU (scripts/gpu_check.sh sets 99); 0 here
FAST = ["-c", "8192", "-b", "1024", "-ub", "256", "-t", "2", "-cms", "1024", "-ngl", os.environ.get("TMPLKIT_TEST_GPU_LAYERS", "0")]


@pytest.fixture(scope="module")
def model():
    return str(tiny_model_path("qwen35"))


@pytest.fixture(scope="module")
def session_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("s") / "session.json"
    save_session(generate_session(4000, seed=21, style="tool-role"), path)
    return str(path)


def test_prefill_compares_policies_and_writes_json_and_plot(model, session_file, tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["prefill", model, "--session", session_file, "--repeat", "2", "--report", f"json:{out_json}", "--plot", str(out_png),
               *FAST])
    out = capsys.readouterr().out
    assert rc == 0
    # every registered policy (the registry is the CLI's list)
    assert "| | " + " | ".join(f"`{name}`" for name in POLICIES) + " |" in out.replace("|  |", "| |")
    assert "| vs `none` | 1.000 |" in out
    data = json.loads(out_json.read_text())
    assert [r["policy"] for r in data["results"]] == list(POLICIES)
    assert all(r["repeats"] == 2 for r in data["results"])
    gated = next(r for r in data["results"] if r["policy"] == "gated")["report"]
    assert gated["n_prompt"] == data["n_prompt"] and gated["checkpoints"]
    assert any(d["role"] == "tool" for d in data["delimiters"])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_library_twin_gives_the_same_structure(model, session_file):
    settings = PrefillSettings(n_ctx=8192, n_batch=1024, n_ubatch=256, n_threads=2, checkpoint_min_step=1024,
                               n_gpu_layers=int(FAST[-1]))
    comp = compare_policies(model, session_file, policies="gated", settings=settings)
    assert [r.policy for r in comp.results] == ["gated"]
    assert comp.result("gated").first.n_prompt == comp.n_prompt
    assert comp.to_markdown().count("`gated`") == 1


def _fails(args, capsys, tmp_path, match):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    # (an option the case gives replaces FAST's: one option given two values is refused)
    fast = [w for k in range(0, len(FAST), 2) if FAST[k] not in args[3:] for w in FAST[k:k + 2]]
    rc = main([*args[:2], "--session", *args[2:3], *fast, *args[3:], "--report", f"json:{out_json}", "--plot", str(out_png)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("tmplkit: error: ") and err.count("\n") == 1 and match in err, err
    assert not out_json.exists() and not out_png.exists()
    assert list(tmp_path.iterdir()) == []


def test_bad_session(model, tmp_path, capsys):
    bad = tmp_path.parent / "bad-session.json"
    bad.write_text('{"messages": [{"role": "robot", "content": "hi"}]}')
    _fails(["prefill", model, str(bad)], capsys, tmp_path, "role is 'robot'")
    bad.write_text("{not json")
    _fails(["prefill", model, str(bad)], capsys, tmp_path, "bad-session.json")


def test_bad_model(session_file, tmp_path, capsys):
    bad = tmp_path.parent / "bad-model.gguf"
    bad.write_bytes(b"\x00" * 100)
    _fails(["prefill", str(bad), session_file], capsys, tmp_path, "llama.cpp cannot load")


def test_a_vocabulary_only_model_is_named_so(session_file, tmp_path, capsys):
    # (it was blamed on "a download cut short, or a newer format")
    vocab = corpus.vocab_path("qwen35")
    _fails(["prefill", str(vocab), session_file], capsys, tmp_path, "a vocabulary-only GGUF (no weights)")


def test_model_without_template_needs_one(session_file, tmp_path, capsys):
    try:
        gemma = corpus.gemma_model_path()
    except SourceError as exc:  # a GPU machine may lack the model package (scripts/gpu_check.sh)
        pytest.skip(str(exc))
    _fails(["prefill", str(gemma), session_file], capsys, tmp_path, "carries no chat template")


def test_prompt_longer_than_context(model, session_file, tmp_path, capsys):
    _fails(["prefill", model, session_file, "-c", "512"], capsys, tmp_path, "more than the context size n_ctx=512")


def test_failing_decode_writes_nothing(model, session_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, batch: 1)
    _fails(["prefill", model, session_file], capsys, tmp_path, "no memory slot")


def test_unwritable_output_is_refused_before_the_run(model, session_file, tmp_path, capsys, monkeypatch):
    import tmplkit.prefill

    def no_run(*a, **k):
        raise AssertionError("the run started before the output path was checked")

    monkeypatch.setattr(tmplkit.prefill, "compare_policies", no_run)
    for flag, value in (("--report", f"json:{tmp_path / 'missing' / 'r.json'}"), ("--plot", str(tmp_path / "missing" / "r.png"))):
        rc = main(["prefill", model, "--session", session_file, *FAST, flag, value])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("tmplkit: error: ") and err.count("\n") == 1 and "missing" in err, err
    assert list(tmp_path.iterdir()) == []
