"""A tiny random-weight GGUF model around a real vocabulary, for fast prefill experiments.

The model has the `gemma3` architecture (sliding-window attention, so it cannot roll its memory
back and llama.cpp needs context checkpoints for it, like the real Gemma 3), two layers and a
width of 64, and the tokenizer of a vocab-only GGUF from the pinned llama.cpp corpus. Its weights
are random, so its output is noise, but every prompt token is a real token of that vocabulary:
tool responses and user messages are the same token spans a real model of that family sees.

    >>> path = tiny_model_path("qwen35")          # doctest: +SKIP
    >>> path.name                                  # doctest: +SKIP
    'tiny-gemma3-qwen35-Qwen3.5-4B-1f0c....gguf'

Built once and cached under `cache_root()/models/`; the file name carries a hash of everything
that goes into it, and it is written to a temporary file that is renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import SourceError
from ..sources import corpus
from ..sources.gguf_meta import Keys

# Bump when the layout of the generated file changes, so cached files are rebuilt.
_FORMAT = 1

# The corpus template a vocabulary's tiny model carries by default. The qwen35 vocab GGUF has a
# plain ChatML template that renders tool results as their own turns; the family's real template
# (Qwen3.5-4B, from the same corpus) puts them inside user turns, which is the case we study.
DEFAULT_TEMPLATES = {"qwen35": "Qwen3.5-4B"}


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the tiny model. `sliding_window_pattern` 2 makes layer 0 sliding-window, layer 1 full.

    Eight query heads share two KV heads (4:1, as in the Qwen3 family's 32:8; head_dim 8 keeps the
    width at 64). The head count matters to batch-break costs: llama.cpp's CPU flash attention
    cuts a ubatch's (token, head) rows into 4 chunks per thread and walks the whole KV cache once
    per tile of up to 64 rows of a chunk, so a batch's attention is rounded up to
    4 * n_threads * 64 / n_head tokens. With 2 heads that is 256 tokens on 2 threads (8 times a
    16-head model's 32), and every early end of a batch paid for up to 256 tokens of attention
    over the whole context: a 2-head stand-in overstates what a break costs a real model.
    """

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 8
    n_ff: int = 128
    n_swa: int = 512
    sliding_window_pattern: int = 2
    context_length: int = 131072
    seed: int = 0


def tiny_model_path(vocab: str = "qwen35", template: str | None = "default", config: TinyConfig | None = None) -> Path:
    """Path of the cached tiny model for corpus vocab `vocab`, building it on first use.

    `template`: a corpus template name (e.g. "Qwen3.5-4B"), "default" for DEFAULT_TEMPLATES' choice
    (else the vocab file's own template), or None for the vocab file's own template.
    """
    config = config or TinyConfig()
    return cached_tiny_model("gemma3", vocab, template, config, str(_FORMAT), build_tiny_model)


def cached_tiny_model(kind: str, vocab: str, template: str | None, config, fmt: str, build) -> Path:
    """The cached tiny model file of `kind` (`tiny-KIND-VOCAB-TEMPLATE-KEY.gguf`), built by
    `build(vocab_file, out, chat_template=..., config=config)` on first use; the key covers the
    format, the config, the vocabulary file and the template text. Shared by every tiny model."""
    vocab_file = corpus.vocab_path(vocab)
    if template == "default":
        template = DEFAULT_TEMPLATES.get(vocab)
    template_text = None
    if template is not None:
        tpath = corpus.templates_dir() / f"{template}.jinja"
        if not tpath.is_file():
            raise SourceError(f"no corpus template '{template}' in {tpath.parent}")
        template_text = tpath.read_text(encoding="utf-8")
    key = hashlib.sha256()
    key.update(f"{fmt}|{vocab}|{template}|{sorted(asdict(config).items())}".encode())
    key.update(_sha256(vocab_file).encode())
    key.update((template_text or "").encode())
    name = f"tiny-{kind}-{vocab}-{template or 'own'}-{key.hexdigest()[:12]}.gguf"
    out = corpus.cache_root() / "models" / name
    if out.is_file() and out.stat().st_size > 0:
        return out
    corpus.cache_folder("models")
    build(vocab_file, out, chat_template=template_text, config=config)
    return out


def _add_weights(w, c: TinyConfig, n_vocab: int) -> None:
    """Random weights (seeded) for every tensor of a gemma3 model of shape `c`."""
    rng = np.random.default_rng(c.seed)

    def mat(rows: int, cols: int, dtype=np.float16) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (1.0 / np.sqrt(cols))).astype(dtype)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # numpy shapes are ggml shapes reversed: a {n_in, n_out} ggml matrix is (n_out, n_in) here.
    w.add_tensor("token_embd.weight", mat(n_vocab, c.n_embd))
    w.add_tensor("output_norm.weight", ones(c.n_embd))
    for i in range(c.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(c.n_embd))
        w.add_tensor(p + "attn_q.weight", mat(c.n_head * c.head_dim, c.n_embd, np.float32))
        w.add_tensor(p + "attn_k.weight", mat(c.n_head_kv * c.head_dim, c.n_embd, np.float32))
        w.add_tensor(p + "attn_v.weight", mat(c.n_head_kv * c.head_dim, c.n_embd, np.float32))
        w.add_tensor(p + "attn_output.weight", mat(c.n_embd, c.n_head * c.head_dim, np.float32))
        w.add_tensor(p + "attn_q_norm.weight", ones(c.head_dim))
        w.add_tensor(p + "attn_k_norm.weight", ones(c.head_dim))
        w.add_tensor(p + "post_attention_norm.weight", ones(c.n_embd))
        w.add_tensor(p + "ffn_norm.weight", ones(c.n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(c.n_ff, c.n_embd, np.float32))
        w.add_tensor(p + "ffn_up.weight", mat(c.n_ff, c.n_embd, np.float32))
        w.add_tensor(p + "ffn_down.weight", mat(c.n_embd, c.n_ff, np.float32))
        w.add_tensor(p + "post_ffw_norm.weight", ones(c.n_embd))


def build_tiny_model(vocab_file: str | os.PathLike, out: str | os.PathLike, chat_template: str | None = None,
                     config: TinyConfig | None = None) -> Path:
    """Write a tiny gemma3 GGUF with the tokenizer of `vocab_file` to `out` (atomically)."""
    config = config or TinyConfig()
    if config.n_head * config.head_dim != config.n_embd:
        raise ValueError("n_head * head_dim must equal n_embd")
    return write_tiny_gguf(vocab_file, out, "gemma3", f"tiny gemma3 with the {Path(vocab_file).stem} vocabulary (random weights)",
                           lambda w: _add_hparams(w, config), lambda w, n_vocab: _add_weights(w, config, n_vocab), chat_template)


def _add_hparams(w, c: TinyConfig) -> None:
    """The hyperparameter keys gemma3 reads."""
    add_shape(w, c, rope_freq_base=10000.0)
    w.add_sliding_window(c.n_swa)
    w.add_sliding_window_pattern(c.sliding_window_pattern)


def add_shape(w, c, *, rope_freq_base: float) -> None:
    """The keys every tiny model's architecture reads for its shape (llama-model.cpp's generic ones),
    in the order both write them (the files stay byte for byte as they were)."""
    w.add_context_length(c.context_length)
    w.add_embedding_length(c.n_embd)
    w.add_block_count(c.n_layer)
    w.add_feed_forward_length(c.n_ff)
    w.add_head_count(c.n_head)
    w.add_head_count_kv(c.n_head_kv)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(rope_freq_base)


def write_tiny_gguf(vocab_file: str | os.PathLike, out: str | os.PathLike, arch: str, name: str, add_hparams, add_weights,
                    chat_template: str | None = None) -> Path:
    """Write a GGUF of architecture `arch` to `out` (atomically): `add_hparams(writer)` and
    `add_weights(writer, n_vocab)` give the model, the tokenizer is `vocab_file`'s, the chat template
    `chat_template` where given (else the vocab file's own). Shared by every tiny model."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(vocab_file))
    except Exception as exc:
        raise SourceError(f"{vocab_file}: not a readable GGUF file ({exc})") from exc
    tk = Keys.Tokenizer
    tok_fields = {k: f for k, f in reader.fields.items() if k.startswith(tk.PREFIX)}
    if tk.LIST not in tok_fields:
        raise SourceError(f"{vocab_file}: has no {tk.LIST}; not a vocab GGUF")
    n_vocab = len(tok_fields[tk.LIST].data)

    out = Path(out)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=".tiny-", suffix=".gguf")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp_name, arch)
        w.add_name(name)
        add_hparams(w)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        for key, field in tok_fields.items():
            if key == tk.CHAT_TEMPLATE and chat_template is not None:
                continue
            _copy_field(w, key, field)
        if chat_template is not None:
            w.add_chat_template(chat_template)
        add_weights(w, n_vocab)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp_name, out)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise
    return out


def _copy_field(writer, key: str, field) -> None:
    import gguf

    types = list(field.types)
    value = field.contents()
    if types[0] == gguf.GGUFValueType.ARRAY:
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=types[1] if len(types) > 1 else None)
    else:
        writer.add_key_value(key, value, types[0])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
