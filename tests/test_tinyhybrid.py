"""The tiny random-weight hybrid (llama.cpp's qwen35: gated delta net + full attention) around a
corpus vocabulary, and the memory kind a model's GGUF gives the turns study."""

from __future__ import annotations

import json
import os

import pytest

from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.prefill.tinyhybrid import HybridConfig, build_tiny_hybrid, tiny_hybrid_path
from tmplkit.sources import corpus
from tmplkit.turns.model_memory import ModelMemory, describe_memory, model_memory

pytestmark = pytest.mark.corpus


def test_build_writes_a_qwen35_hybrid_with_the_vocab(tmp_path):
    import gguf

    out = tmp_path / "hybrid.gguf"
    # a small vocabulary keeps the test quick; tiny_hybrid_path("qwen35") is the one used
    build_tiny_hybrid(corpus.vocab_path("llama-spm"), out, chat_template="{{ messages }}")
    r = gguf.GGUFReader(str(out))
    assert r.fields["general.architecture"].contents() == "qwen35"
    assert r.fields["qwen35.block_count"].contents() == 4
    assert r.fields["qwen35.full_attention_interval"].contents() == 4
    assert r.fields["qwen35.ssm.inner_size"].contents() == 64  # state_size 16 x time_step_rank 4
    assert r.fields["qwen35.rope.dimension_sections"].contents() == [2, 1, 1, 0]
    assert r.fields["tokenizer.chat_template"].contents() == "{{ messages }}"
    names = {t.name for t in r.tensors}
    # layers 0-2 recurrent (gated delta net), layer 3 full attention: the family's pattern
    assert {"blk.0.attn_qkv.weight", "blk.0.ssm_a", "blk.2.ssm_conv1d.weight", "blk.3.attn_q.weight"} <= names
    assert "blk.3.ssm_a" not in names and "blk.0.attn_q.weight" not in names
    assert [p.name for p in tmp_path.iterdir()] == ["hybrid.gguf"]  # no temporary file left
    assert model_memory(out) == ModelMemory("qwen35", "hybrid")


def test_a_bad_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match="rope_sections"):
        build_tiny_hybrid(corpus.vocab_path("llama-spm"), tmp_path / "x.gguf", config=HybridConfig(head_dim=16))


def test_memory_of_each_model_kind(tmp_path):
    from tmplkit.prefill.models import resolve_model

    hybrid = resolve_model("tiny:qwen35-hybrid")
    assert hybrid == tiny_hybrid_path("qwen35") and "Qwen3.5-4B" in hybrid.name
    assert describe_memory(model_memory(hybrid)) == "hybrid (recurrent + full attention, qwen35)"
    assert model_memory(hybrid).memory().kind == "recurrent"
    swa = model_memory(resolve_model("tiny:qwen35"))
    assert swa == ModelMemory("gemma3", "swa", 512) and swa.memory(512).swa_cells == 1024
    vocab_only = model_memory(corpus.vocab_path("llama-spm"))  # an architecture without a window
    assert vocab_only.kind == "full" and vocab_only.memory().kind == "full"
    with pytest.raises(InputError, match="tiny:qwen35-hybrid"):
        resolve_model("tiny:-hybrid")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4)
    with pytest.raises(InputError):
        model_memory(bad)


def test_turns_takes_the_memory_from_the_model(tmp_path, capsys):
    from tmplkit.session import generate_session, save_session

    path = tmp_path / "s.json"
    save_session(generate_session(1500, seed=3, style="agent", requests=2), path)  # (a short one: the study is all)
    template = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    assert main(["turns", template, "--session", str(path), "--tokenizer", "vocab:qwen35", "--model",
                 "tiny:qwen35-hybrid", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "memory of tiny:qwen35-hybrid: hybrid (recurrent + full attention, qwen35)" in captured.err
    kinds = {s["memory"]["kind"] for r in json.loads(captured.out)["reports"] for s in r["cost"]["settings"]}
    assert kinds == {"full", "recurrent"}  # the full-attention bound, and the model's memory
    assert main(["turns", template, "--memory", "recurrent", "--model", "tiny:qwen35-hybrid"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.model
def test_hybrid_loads_reports_hybrid_and_replay_equals_prediction():
    """llama-cpp-python loads it as a hybrid whose memory cannot roll back; a replay of a short agent
    session restores checkpoints of the recurrent state and measures what the turns study predicts."""
    pytest.importorskip("llama_cpp")
    import numpy as np

    from tmplkit.prefill import PrefillRunner
    from tmplkit.prefill.compare import resolve_template
    from tmplkit.replay import REPLAYABLE, replay_session
    from tmplkit.session import generate_session
    from tmplkit.sources import load_one

    ngl = int(os.environ.get("TMPLKIT_TEST_GPU_LAYERS", "0"))  # scripts/gpu_check.sh offloads every layer
    with PrefillRunner(tiny_hybrid_path("qwen35"), n_ctx=8192, n_threads=1, poll=None, n_gpu_layers=ngl) as r:
        assert r.info.is_hybrid and not r.info.is_recurrent and r.info.n_swa == 0
        assert not r.info.can_roll_back and r.checkpointing
        assert r.tokenize("<|im_start|>user") == [151644, 872]
        toks = np.random.default_rng(0).integers(0, r.info.n_vocab, 2000).tolist()
        rep = r.run(toks, None, "none")
        assert rep.n_processed == 2000 and np.isfinite(r.logits()).all()
        # a checkpoint is the recurrent state alone: one position, whatever the length before it
        assert [(c.n_tokens, c.pos_min, c.pos_max) for c in rep.checkpoints] == [(1484, 1483, 1483), (1996, 1995, 1995)]
        assert rep.checkpoints[0].bytes == rep.checkpoints[1].bytes
        assert r.info.seq_rm in ("full", "rs")  # a recurrent state cannot be cut at a position
        session = generate_session(1500, seed=3, style="agent", requests=2)
        template = load_one(corpus.templates_dir() / "Qwen3.5-4B.jinja")
        # every policy, the 73618f2 regression's rule and none included
        replay = replay_session(r, session, resolve_template(template, r), settings=REPLAYABLE)
    assert replay.memory["kind"] == "recurrent" and set(replay.requests) == set(REPLAYABLE)
    assert replay.matches, replay.mismatches()
    assert any(x.restored is not None for x in replay.requests["tmplkit"])


def test_turns_template_kwargs(tmp_path, capsys, corpus_template):
    """--template-kwargs reaches every render: a Qwen3.6 template of the Hub dev half that drops the
    reasoning of earlier turns (as llama-server renders with --no-reasoning-preserve) keeps it with
    preserve_thinking, and its prefix is then stable."""
    from tmplkit.session import generate_session, save_session

    template = corpus_template("lordx64-Qwen3.6-35B-A3B-Claude-4.7-Opus-Reasoning-Distilled")
    path = tmp_path / "s.json"
    save_session(generate_session(1500, seed=3, style="agent", requests=2), path)
    base = ["turns", str(template.source), "--session", str(path), "--no-switches", "--format", "json"]
    assert main(base + ["--template-kwargs", '{"preserve_reasoning": false}']) == 0
    assert json.loads(capsys.readouterr().out)["reports"][0]["stable"] is False
    assert main(base + ["--template-kwargs", '{"preserve_reasoning": false, "preserve_thinking": true}']) == 0
    assert json.loads(capsys.readouterr().out)["reports"][0]["stable"] is True
    for bad, message in (("[1]", "give a JSON object"), ("{", "not valid JSON")):
        assert main(base + ["--template-kwargs", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
