"""The tiny random-weight gemma3 GGUF built around a corpus vocabulary."""

from __future__ import annotations

import os

import pytest

from tmplkit.errors import SourceError, TokenizerError
from tmplkit.prefill.tinymodel import TinyConfig, build_tiny_model, tiny_model_path
from tmplkit.sources import corpus

pytestmark = pytest.mark.corpus


def test_build_writes_a_gemma3_gguf_with_the_vocab(tmp_path):
    import gguf

    out = tmp_path / "tiny.gguf"
    build_tiny_model(corpus.vocab_path("llama-spm"), out, chat_template="{{ messages }}", config=TinyConfig(n_swa=128))
    r = gguf.GGUFReader(str(out))
    vocab = gguf.GGUFReader(str(corpus.vocab_path("llama-spm")))
    assert r.fields["general.architecture"].contents() == "gemma3"
    assert r.fields["gemma3.attention.sliding_window"].contents() == 128
    assert r.fields["gemma3.block_count"].contents() == 2
    assert r.fields["tokenizer.ggml.tokens"].contents() == vocab.fields["tokenizer.ggml.tokens"].contents()
    assert r.fields["tokenizer.chat_template"].contents() == "{{ messages }}"
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "blk.1.ffn_down.weight", "blk.0.attn_q_norm.weight"} <= names
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]  # no temporary file left


def test_not_a_vocab_is_a_source_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(SourceError, match="not a readable GGUF"):
        build_tiny_model(bad, tmp_path / "out.gguf")
    with pytest.raises(SourceError, match="no corpus template 'Nope'"):
        tiny_model_path("qwen35", template="Nope")


def test_cached_path_is_reused():
    a = tiny_model_path("qwen35")
    mtime = a.stat().st_mtime_ns
    assert tiny_model_path("qwen35") == a and a.stat().st_mtime_ns == mtime
    assert "Qwen3.5-4B" in a.name


@pytest.mark.model
def test_tiny_model_loads_and_needs_checkpoints():
    pytest.importorskip("llama_cpp")
    import numpy as np

    from tmplkit.prefill import PrefillRunner

    ngl = int(os.environ.get("TMPLKIT_TEST_GPU_LAYERS", "0"))  # scripts/gpu_check.sh offloads every layer
    with PrefillRunner(tiny_model_path("qwen35"), n_ctx=4096, n_threads=2, n_gpu_layers=ngl) as r:
        assert r.info.n_swa == 512 and not r.info.can_roll_back and r.checkpointing
        assert "<tool_response>" in r.info.chat_template
        assert r.tokenize("<|im_start|>user") == [151644, 872]
        tok = r.tokenizer  # the loaded model's vocabulary, not a second load of the file
        assert tok is r.tokenizer and tok.n_vocab == r.info.n_vocab
        assert tok.detokenize(tok.tokenize("<|im_start|>user")) == "<|im_start|>user"
        toks = np.random.default_rng(0).integers(0, r.info.n_vocab, 3000).tolist()
        rep = r.run(toks, None, "none")
        assert rep.n_processed == 3000 and len(rep.checkpoints) == 2
        assert np.isfinite(r.logits()).all()
    with pytest.raises(TokenizerError, match="closed"):  # never a call into a freed model
        tok.tokenize("hi")
