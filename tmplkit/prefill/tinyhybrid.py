"""A tiny random-weight hybrid GGUF model (recurrent + full attention) around a real vocabulary.

The sliding-window stand-in (`tinymodel`, `tiny:qwen35`) cannot roll back its window; the models
users run now are hybrids, whose recurrent layers cannot roll back at all: the server resumes them
only from a checkpoint (a copy of the recurrent state) or from zero. This module writes one.

Architecture `qwen35` (Qwen3.5's dense architecture, llama.cpp `LLM_ARCH_QWEN35`), not
`qwen35moe` (the 25213 model's, Qwen3.6-35B-A3B): the two have the same memory (the same
gated-delta-net layers and the same recurrent/full-attention pattern; `llm_arch_is_hybrid` lists
both) and differ only in the feed-forward block (routed experts instead of one MLP). A resume, a
checkpoint, what a batch break costs in recomputed state: all are the memory's; experts would add
a router and expert tensors to the file and time per token, and prove nothing more about resuming.

Shape: four layers in the family's pattern, `full_attention_interval` 4 (layers 0-2 gated delta
net, layer 3 full attention, as Qwen3.5's 24/32/64 layers repeat it), width 64, the tokenizer of a
vocab-only GGUF of the pinned llama.cpp corpus (qwen35) and the corpus's Qwen3.5 template.

Tensor names, shapes and the hyperparameter keys follow the pinned source, llama.cpp as vendored
in llama-cpp-python 0.3.36:

- src/models/qwen35.cpp `load_arch_hparams` (lines 4-31): rms eps, `rope.dimension_sections`
  (required, 4 values), `ssm.conv_kernel`, `ssm.inner_size`, `ssm.state_size`,
  `ssm.time_step_rank`, `ssm.group_count`; recurrent layers from `attention.recurrent_layers`,
  else `full_attention_interval` (default 4): layer i is recurrent unless (i + 1) % interval == 0;
- src/models/qwen35.cpp `load_arch_tensors` (lines 33-124): per layer `attn_norm`,
  `post_attention_norm`; a full-attention layer `attn_q` {n_embd, head_dim * n_head * 2} (query
  and gate), `attn_k`, `attn_v`, `attn_output`, `attn_q_norm`, `attn_k_norm`; a recurrent layer
  `attn_qkv` {n_embd, 2 * key_dim + value_dim}, `attn_gate` {n_embd, value_dim}, `ssm_conv1d`
  {d_conv, conv_dim}, `ssm_dt.bias`, `ssm_a` {dt_rank}, `ssm_beta`, `ssm_alpha` {n_embd,
  n_v_heads}, `ssm_norm` {head_v_dim}, `ssm_out` {value_dim, n_embd}, with head_k_dim =
  head_v_dim = ssm_d_state, n_k_heads = ssm_n_group, n_v_heads = ssm_dt_rank; then `ffn_gate`,
  `ffn_up`, `ffn_down`; `output` absent means tied to `token_embd`;
- src/models/qwen35.cpp `build_layer_attn_linear` (line 335 on): head_v_dim = ssm_d_inner /
  ssm_dt_rank, so inner_size = state_size * time_step_rank;
- src/llama-arch.cpp lines 480-514 (the tensor name table: `blk.%d.attn_qkv`, `blk.%d.ssm_a`
  with no suffix, ...), lines 250, 305, 327 and 347-351 (the key names), line 1085 `llm_arch_is_hybrid`;
- src/llama-model.cpp lines 1321-1329 and 1393-1440 (the generic keys: context and embedding
  length, block count, feed-forward length, head counts, key/value length, rope dimension count).

    >>> path = tiny_hybrid_path("qwen35")          # doctest: +SKIP
    >>> path.name                                   # doctest: +SKIP
    'tiny-qwen35-hybrid-qwen35-Qwen3.5-4B-....gguf'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tinymodel import add_shape, cached_tiny_model, write_tiny_gguf

__all__ = ["ARCH", "HybridConfig", "build_tiny_hybrid", "tiny_hybrid_path"]

ARCH = "qwen35"

# Bump when the layout of the generated file changes, so cached files are rebuilt.
_FORMAT = 1


@dataclass(frozen=True)
class HybridConfig:
    """Shape of the tiny hybrid. Attention as the tiny gemma3 (8 query heads over 2 KV heads of 8,
    see `tinymodel.TinyConfig` for why the head count matters to batch-break costs); the gated
    delta net with 2 key heads and 4 value heads of 16 (Qwen3.5-4B: 16 and 32 of 128)."""

    n_layer: int = 4
    full_attention_interval: int = 4
    n_embd: int = 64
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 8
    rope_sections: tuple[int, int, int, int] = (2, 1, 1, 0)  # sums to head_dim / 2 (Qwen3.5: 11, 11, 10, 0 of 64 / 2)
    n_ff: int = 128
    ssm_d_conv: int = 4
    ssm_d_state: int = 16
    ssm_n_group: int = 2
    ssm_dt_rank: int = 4
    context_length: int = 131072
    seed: int = 0

    @property
    def ssm_d_inner(self) -> int:
        return self.ssm_d_state * self.ssm_dt_rank

    def is_recurrent(self, il: int) -> bool:
        """qwen35.cpp load_arch_hparams: recurrent unless (il + 1) % full_attention_interval == 0."""
        return (il + 1) % self.full_attention_interval != 0


def tiny_hybrid_path(vocab: str = "qwen35", template: str | None = "default", config: HybridConfig | None = None) -> Path:
    """Path of the cached tiny hybrid for corpus vocab `vocab`, building it on first use.

    `template`: a corpus template name, "default" for the family's (Qwen3.5-4B for qwen35, else
    the vocab file's own), or None for the vocab file's own template.
    """
    config = config or HybridConfig()
    # (the architecture stays in the key: files already cached keep their names)
    return cached_tiny_model(f"{ARCH}-hybrid", vocab, template, config, f"{_FORMAT}|{ARCH}", build_tiny_hybrid)


def _add_hparams(w, c: HybridConfig) -> None:
    """The hyperparameter keys qwen35 reads (see the module doc for the lines)."""
    import gguf

    u32 = gguf.GGUFValueType.UINT32
    add_shape(w, c, rope_freq_base=10000000.0)
    w.add_key_value(f"{ARCH}.rope.dimension_count", c.head_dim, u32)
    w.add_key_value(f"{ARCH}.rope.dimension_sections", list(c.rope_sections), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_key_value(f"{ARCH}.full_attention_interval", c.full_attention_interval, u32)
    for name, value in (("conv_kernel", c.ssm_d_conv), ("inner_size", c.ssm_d_inner), ("state_size", c.ssm_d_state),
                        ("time_step_rank", c.ssm_dt_rank), ("group_count", c.ssm_n_group)):
        w.add_key_value(f"{ARCH}.ssm.{name}", value, u32)


def _add_weights(w, c: HybridConfig, n_vocab: int) -> None:
    """Random weights (seeded) for every tensor of a qwen35 model of shape `c`. numpy shapes are
    ggml shapes reversed: a {n_in, n_out} ggml matrix is (n_out, n_in) here."""
    rng = np.random.default_rng(c.seed)

    def mat(rows: int, cols: int, dtype=np.float32) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (1.0 / np.sqrt(cols))).astype(dtype)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    key_dim, value_dim = c.ssm_d_state * c.ssm_n_group, c.ssm_d_state * c.ssm_dt_rank
    w.add_tensor("token_embd.weight", mat(n_vocab, c.n_embd, np.float16))
    w.add_tensor("output_norm.weight", ones(c.n_embd))
    for il in range(c.n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", ones(c.n_embd))
        w.add_tensor(p + "post_attention_norm.weight", ones(c.n_embd))
        if c.is_recurrent(il):
            w.add_tensor(p + "attn_qkv.weight", mat(2 * key_dim + value_dim, c.n_embd))
            w.add_tensor(p + "attn_gate.weight", mat(value_dim, c.n_embd))
            w.add_tensor(p + "ssm_conv1d.weight", mat(2 * key_dim + value_dim, c.ssm_d_conv))
            w.add_tensor(p + "ssm_dt.bias", np.zeros(c.ssm_dt_rank, dtype=np.float32))
            # -exp(A_log), A_log ~ U(0, 1): a decay per value head (the converter writes -exp(A_log))
            w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(0.0, 1.0, c.ssm_dt_rank)).astype(np.float32))
            w.add_tensor(p + "ssm_beta.weight", mat(c.ssm_dt_rank, c.n_embd))
            w.add_tensor(p + "ssm_alpha.weight", mat(c.ssm_dt_rank, c.n_embd))
            w.add_tensor(p + "ssm_norm.weight", ones(c.ssm_d_state))
            w.add_tensor(p + "ssm_out.weight", mat(c.n_embd, value_dim))
        else:
            w.add_tensor(p + "attn_q.weight", mat(2 * c.n_head * c.head_dim, c.n_embd))
            w.add_tensor(p + "attn_k.weight", mat(c.n_head_kv * c.head_dim, c.n_embd))
            w.add_tensor(p + "attn_v.weight", mat(c.n_head_kv * c.head_dim, c.n_embd))
            w.add_tensor(p + "attn_output.weight", mat(c.n_embd, c.n_head * c.head_dim))
            w.add_tensor(p + "attn_q_norm.weight", ones(c.head_dim))
            w.add_tensor(p + "attn_k_norm.weight", ones(c.head_dim))
        w.add_tensor(p + "ffn_gate.weight", mat(c.n_ff, c.n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(c.n_ff, c.n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(c.n_embd, c.n_ff))


def build_tiny_hybrid(vocab_file: str | os.PathLike, out: str | os.PathLike, chat_template: str | None = None,
                      config: HybridConfig | None = None) -> Path:
    """Write a tiny qwen35 hybrid GGUF with the tokenizer of `vocab_file` to `out` (atomically)."""
    c = config or HybridConfig()
    if sum(c.rope_sections) * 2 != c.head_dim:
        raise ValueError("rope_sections must sum to head_dim / 2")
    return write_tiny_gguf(vocab_file, out, ARCH, f"tiny {ARCH} hybrid with the {Path(vocab_file).stem} vocabulary (random weights)",
                           lambda w: _add_hparams(w, c), lambda w, n_vocab: _add_weights(w, c, n_vocab), chat_template)
