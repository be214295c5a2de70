"""Whether llama.cpp would abort the process on a GGUF's vocabulary: read from its metadata before
llama.cpp opens the file, as a tokenizer (`tokenizers`) and as a model (`llama_model`)."""

from __future__ import annotations

from pathlib import Path

from ..sources.gguf_meta import GGUFError, Keys, read_metadata

__all__ = ["damage", "damaged_vocabulary", "vocab_metadata"]


def damaged_vocabulary(path: Path) -> str | None:
    """Why llama.cpp would abort the process on the vocabulary of the GGUF at `path` (one line), or
    None: it would not, or the file is no GGUF it reads (llama.cpp's own load says so then)."""
    try:
        model, tokens = vocab_metadata(path)
    except GGUFError:
        return None
    return damage(path, model, tokens)


def vocab_metadata(path: Path) -> tuple[str | None, list[bytes] | None]:
    """(`tokenizer.ggml.model`, the token texts) of a GGUF; GGUFError for a file it cannot read."""
    key = "tokenizer.ggml.tokens"
    md = read_metadata(path, lambda k: k in (Keys.Tokenizer.MODEL, key),
                       pick={key: lambda out: set(range(len(out[key]))) if hasattr(out.get(key), "pick") else set()})
    raw = md.get(Keys.Tokenizer.MODEL)
    tokens = md.get(key)
    return (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None,
            list(tokens.values()) if isinstance(tokens, dict) else None)


def damage(path: Path, model: str | None, tokens: list[bytes] | None) -> str | None:
    """`damaged_vocabulary` of what `vocab_metadata` read."""
    problem = _vocab_problem(model, tokens) if model and tokens is not None else None
    if problem is None:
        return None
    return (f"{path}: a damaged vocabulary ({problem}), which llama.cpp would abort the process on; re-convert or "
            "re-download the file")


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
