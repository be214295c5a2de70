"""The tiny byte model: the tiny random-weight gemma3 model (sliding window, so llama-server takes
checkpoints) with a vocabulary of single bytes, on which every delimiter, tokenized on its own,
matches wherever its text occurs. `tmplkit server delimiters` probes on it by default."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ..environment import cache_root
from ..sources.corpus import cache_folder
from ..tokens.gguf_vocab import bytes_to_unicode
from .tinymodel import TinyConfig, build_tiny_model

__all__ = ["byte_model_path"]


# The byte vocabulary: GPT-2's byte-to-character map (each byte one token, in token-id order), an
# end-of-text control token, and one merge that no text can use (two NUL bytes), since llama.cpp's
# BPE needs a merges list.
_BYTE_VOCAB_FORMAT = 1


def byte_model_path() -> Path:
    """The tiny random-weight gemma3 model (sliding window, so llama-server takes checkpoints) with
    a vocabulary of single bytes; built once into the cache (`cache_root()/models/`)."""
    config = TinyConfig()
    key = hashlib.sha256(f"{_BYTE_VOCAB_FORMAT}|{sorted(vars(config).items())}".encode()).hexdigest()[:12]
    out = cache_root() / "models" / f"tiny-gemma3-bytes-{key}.gguf"
    if out.is_file() and out.stat().st_size > 0:
        return out
    cache_folder("models")
    fd, vocab = tempfile.mkstemp(dir=out.parent, prefix=".vocab-bytes-", suffix=".gguf")
    os.close(fd)
    try:
        _write_byte_vocab(Path(vocab))
        build_tiny_model(vocab, out, config=config)
    finally:
        os.unlink(vocab)
    return out


def _write_byte_vocab(path: Path) -> None:
    import gguf

    chars = bytes_to_unicode()
    tokens = [chars[b] for b in range(256)] + ["<|endoftext|>", chars[0] * 2]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL, gguf.TokenType.NORMAL])
    w.add_token_merges([f"{chars[0]} {chars[0]}"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
