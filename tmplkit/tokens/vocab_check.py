"""Whether llama.cpp would abort the process on a GGUF's vocabulary: read from its metadata before
llama.cpp opens the file, as a tokenizer (`tokenizers`) and as a model (`llama_model`)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..sources.gguf_meta import GGUFError, Keys, read_metadata

__all__ = ["checked_vocabulary", "damaged_vocabulary"]


def damaged_vocabulary(path: Path) -> str | None:
    """Why llama.cpp would abort the process on the vocabulary of the GGUF at `path` (one line), or
    None: it would not, or the file is no GGUF it reads (llama.cpp's own load says so then)."""
    try:
        return checked_vocabulary(path)[1]
    except GGUFError:
        return None


def checked_vocabulary(path: Path) -> tuple[str | None, str | None]:
    """(`tokenizer.ggml.model` of the GGUF at `path`, `damaged_vocabulary`'s answer); GGUFError for a
    file it cannot read. Read once per file as it stands (its every token is read: 0.1-0.3 s for a
    vocabulary of 150k-260k; a test suite and a runner load the same model again and again)."""
    try:
        st = os.stat(path)
        model, problem = _checked(Path(path).resolve(), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    except OSError:
        model, problem = _checked(Path(path), None)  # (read_metadata says what is wrong with it)
    if problem is None:
        return model, None
    return model, (f"{path}: a damaged vocabulary ({problem}), which llama.cpp would abort the process on; re-convert "
                   "or re-download the file")


@functools.lru_cache(maxsize=16)
def _checked(path: Path, stamp) -> tuple[str | None, str | None]:
    key = "tokenizer.ggml.tokens"
    md = read_metadata(path, lambda k: k in (Keys.Tokenizer.MODEL, key),
                       pick={key: lambda out: set(range(len(out[key]))) if hasattr(out.get(key), "pick") else set()})
    raw, tokens = md.get(Keys.Tokenizer.MODEL), md.get(key)
    model = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None
    return model, _vocab_problem(model, list(tokens.values())) if model and isinstance(tokens, dict) else None


def _vocab_problem(model: str, tokens: list[bytes]) -> str | None:
    """Why llama.cpp's vocabulary would stop the process (an assert, an uncaught `at`), or None: two
    tokens of one text (llama-vocab.cpp: `id_to_token.size() == token_to_id.size()`), or, for
    SentencePiece, a byte its fallback needs (`byte_to_token`: `<0xXX>` or the byte itself; every
    SentencePiece vocabulary of the corpus has all 256). BPE vocabularies leave out bytes no UTF-8
    text holds (0xC0, 0xC1) and llama.cpp does not fall back to bytes there: not checked."""
    seen: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        if seen.setdefault(t, i) != i:
            return f"token {i} repeats the text of token {seen[t]}, {t[:40]!r}"
    if model == "llama":
        missing = [b for b in range(256) if b"<0x%02X>" % b not in seen and bytes([b]) not in seen]
        if missing:
            return f"no token for byte 0x{missing[0]:02X}, which its SentencePiece tokenizer falls back to"
    return None
