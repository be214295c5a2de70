"""Tokenizer adapters, and role delimiters as token ids of one tokenizer, checked in context.

Two adapters share one small protocol (`Tokenizer`):

- `LlamaCppTokenizer`: a GGUF opened vocab-only through llama-cpp-python (special tokens parsed,
  no BOS unless asked), the tokenizer llama-server itself uses;
- `HFTokenizer`: a Hugging Face `tokenizer.json` through the `tokenizers` package.

`load_tokenizer(spec)` picks one from a path, a `vocab:NAME` corpus vocab or an `hf:ORG/NAME` repo
in the local Hugging Face cache.

`token_delimiters(analysis, tokenizer)` turns an Analysis's text delimiters into token sequences.
Tokenizing a delimiter on its own (what llama-server does) is wrong whenever the tokenizer merges
its first or last characters with what surrounds it: in the qwen35 vocab `>\\n` is one token, so
`<|im_start|>user\\n<tool_response>` ends inside a token once the template's newline follows. The
sequences are therefore read off the tokenized probe render, at every place each delimiter occurs.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from .delimiters import Delimiter, sort_delimiters
from .errors import TokenizerError

Offsets = list[tuple[int, int]]


@runtime_checkable
class Tokenizer(Protocol):
    """What the span detector needs from a tokenizer.

    `tokenize_with_offsets(text)` returns the ids and, for each token, the [start, end) character
    offsets of `text` it covers. Tokens that split a multi-byte character both cover that
    character; a token that stands for no text of its own (an inserted space prefix) has
    start == end.
    """

    name: str

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; `add_bos` None = as the tokenizer was opened (`load_tokenizer(add_bos=)`)."""
        ...

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], Offsets]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    def piece(self, token_id: int) -> str: ...


# ---------------------------------------------------------------------------------------------
# Byte offsets -> character offsets


def _char_offsets(text: str, data: bytes, byte_offsets: Sequence[tuple[int, int]]) -> Offsets:
    """Map [start, end) byte offsets in `data` (text as UTF-8) to character offsets in `text`."""
    if len(data) == len(text):  # pure ASCII: bytes are characters
        return [(int(s), int(e)) for s, e in byte_offsets]
    raw = np.frombuffer(data, dtype=np.uint8)
    is_start = (raw & 0xC0) != 0x80
    # char_of[b] = index of the character that byte b belongs to; char_of[len] = len(text)
    char_of = np.empty(len(raw) + 1, dtype=np.int64)
    char_of[:-1] = np.cumsum(is_start) - 1
    char_of[-1] = len(text)
    out: Offsets = []
    for s, e in byte_offsets:
        cs = int(char_of[s])
        out.append((cs, int(char_of[e - 1]) + 1 if e > s else cs))
    return out


def _align_pieces(data: bytes, pieces: Sequence[bytes]) -> list[tuple[int, int]]:
    """Byte offsets of each piece in `data`.

    Pieces usually concatenate to `data` exactly. They do not where the tokenizer inserted a space
    (SentencePiece's space prefix after a special token) or dropped whitespace (special tokens
    with lstrip/rstrip); both are tolerated: an inserted leading space covers nothing, dropped
    whitespace belongs to no token.
    """
    joined = b"".join(pieces)
    if joined == data:
        ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
        starts = ends - np.array([len(p) for p in pieces], dtype=np.int64)
        return list(zip(starts.tolist(), ends.tolist()))
    out: list[tuple[int, int]] = []
    cur = 0
    n = len(data)
    for p in pieces:
        if data.startswith(p, cur):
            out.append((cur, cur + len(p)))
            cur += len(p)
            continue
        if p.startswith(b" ") and data.startswith(p[1:], cur):  # inserted space prefix
            out.append((cur, cur + len(p) - 1))
            cur += len(p) - 1
            continue
        # whitespace dropped by the tokenizer before this piece
        skip = cur
        while skip < n and data[skip:skip + 1] in (b" ", b"\n", b"\t", b"\r"):
            skip += 1
            if data.startswith(p, skip):
                break
        if skip < n and data.startswith(p, skip):
            out.append((skip, skip + len(p)))
            cur = skip + len(p)
            continue
        if p.startswith(b" ") and data.startswith(p[1:], skip):
            out.append((skip, skip + len(p) - 1))
            cur = skip + len(p) - 1
            continue
        # a piece that is not in the text (unknown token, normalisation): look a little ahead
        at = data.find(p, cur, cur + len(p) + 16) if p else -1
        if at != -1:
            out.append((at, at + len(p)))
            cur = at + len(p)
        else:
            out.append((cur, cur))
    return out


# ---------------------------------------------------------------------------------------------
# GGUF: a minimal header scan, enough to say why a file has no vocabulary

_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _gguf_tokenizer_model(path: Path, *, full: bool = False) -> str | None:
    """The value of `tokenizer.ggml.model` in a GGUF header, or None when the key is absent.

    Raises TokenizerError when the file is not a readable GGUF. Reads keys only up to that one,
    or, with `full`, every key (to tell a truncated file).
    """
    try:
        with path.open("rb") as f:
            head = f.read(24)
            if len(head) < 24 or head[:4] != b"GGUF":
                raise TokenizerError(f"{path} is not a GGUF file (no GGUF magic); give a .gguf model or vocab, or a tokenizer.json")
            version = struct.unpack_from("<I", head, 4)[0]
            if version < 2:
                raise TokenizerError(f"{path} is a GGUF v{version} file, too old to read; convert it with a current llama.cpp")
            n_kv = struct.unpack_from("<Q", head, 16)[0]

            def read(n: int) -> bytes:
                b = f.read(n)
                if len(b) != n:
                    raise EOFError
                return b

            def read_str() -> bytes:
                (length,) = struct.unpack("<Q", read(8))
                return read(length)

            def skip_value(vtype: int) -> None:
                if vtype in _GGUF_SCALAR:
                    f.seek(_GGUF_SCALAR[vtype], os.SEEK_CUR)
                elif vtype == _GGUF_STRING:
                    (length,) = struct.unpack("<Q", read(8))
                    f.seek(length, os.SEEK_CUR)
                elif vtype == _GGUF_ARRAY:
                    etype, count = struct.unpack("<IQ", read(12))
                    if etype in _GGUF_SCALAR:
                        f.seek(_GGUF_SCALAR[etype] * count, os.SEEK_CUR)
                    else:
                        for _ in range(count):
                            skip_value(etype)
                else:
                    raise ValueError(f"unknown GGUF value type {vtype}")

            found = None
            for _ in range(n_kv):
                key = read_str()
                (vtype,) = struct.unpack("<I", read(4))
                if key == b"tokenizer.ggml.model" and vtype == _GGUF_STRING:
                    found = read_str().decode("utf-8", "replace")
                    if not full:
                        return found
                else:
                    skip_value(vtype)
            if full and f.tell() > path.stat().st_size:
                raise EOFError
            return found
    except (EOFError, ValueError, struct.error) as exc:
        raise TokenizerError(f"{path} is a truncated or corrupted GGUF file ({exc or 'unexpected end of file'}); download it again") from None
    except OSError as exc:
        raise TokenizerError(f"cannot read {path}: {exc.strerror or exc}") from None
    return None


@contextlib.contextmanager
def _quiet_llama():
    """Keep llama.cpp's load messages off stderr (they go through llama-cpp-python's logger)."""
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


class LlamaCppTokenizer:
    """A GGUF's vocabulary through llama.cpp, loaded vocab-only (no weights, no context).

    >>> tok = LlamaCppTokenizer(vocab_path("qwen35"))          # doctest: +SKIP
    >>> tok.tokenize("<|im_start|>user\\n")                     # doctest: +SKIP
    [151644, 872, 198]
    """

    def __init__(self, path: str | os.PathLike, *, add_bos: bool = False, name: str | None = None):
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file not found: {path}")
        model = _gguf_tokenizer_model(path)
        if model is None:
            raise TokenizerError(f"{path} has no vocabulary (no tokenizer.ggml.* keys); use the model's GGUF or a vocab GGUF")
        if model in ("none", "no_vocab"):
            raise TokenizerError(f"{path} has no vocabulary (tokenizer.ggml.model = '{model}'); use the model's GGUF or a vocab GGUF")
        try:
            import llama_cpp
        except ImportError:
            raise TokenizerError("reading a GGUF vocabulary needs llama-cpp-python; run `pip install 'tmplkit[llama]'`") from None
        self._lib = llama_cpp
        with _quiet_llama():
            llama_cpp.llama_backend_init()
            params = llama_cpp.llama_model_default_params()
            params.vocab_only = True
            self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            _gguf_tokenizer_model(path, full=True)  # says so when the file is truncated
            raise TokenizerError(f"llama.cpp could not load the vocabulary of {path} (tokenizer '{model}'); the file may be damaged or from a newer llama.cpp")
        self._use_vocab(self._model, path, add_bos, name)
        if self.n_vocab <= 0:
            self.close()
            raise TokenizerError(f"{path} has no vocabulary (0 tokens); use the model's GGUF or a vocab GGUF")

    def _use_vocab(self, model, path: Path, add_bos: bool, name: str | None) -> None:
        lib = self._lib
        self._vocab = lib.llama_model_get_vocab(model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.path = path
        self.name = name or path.name
        self.add_bos = add_bos
        self._pieces: dict[int, bytes] = {}
        self._buf = ctypes.create_string_buffer(256)

    @classmethod
    def of_model(cls, model, path: str | os.PathLike, *, add_bos: bool = False, name: str | None = None) -> "LlamaCppTokenizer":
        """The vocabulary of a llama.cpp model already loaded (a `llama_model` pointer, e.g. the
        prefill runner's), without loading the file again. The owner frees the model; it must
        close this tokenizer first (using a closed one raises TokenizerError)."""
        import llama_cpp

        self = cls.__new__(cls)
        self._lib = llama_cpp
        self._model = None  # not ours to free
        self._use_vocab(model, Path(path), add_bos, name)
        return self

    def __repr__(self) -> str:
        return f"LlamaCppTokenizer({str(self.path)!r})"

    def close(self) -> None:
        # no call may reach llama.cpp with the vocabulary of a freed model
        self._vocab = None
        model, self._model = getattr(self, "_model", None), None
        if model:
            self._lib.llama_model_free(model)

    def _open_vocab(self):
        if self._vocab is None:
            raise TokenizerError(f"the tokenizer of {self.name} is closed")
        return self._vocab

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def _encode(self, data: bytes, add_bos: bool) -> list[int]:
        lib = self._lib
        cap = len(data) + 8
        while True:
            out = (lib.llama_token * cap)()
            n = lib.llama_tokenize(self._open_vocab(), data, len(data), out, cap, add_bos, True)
            if n >= 0:
                return list(out[:n])
            if n == -2147483648:  # INT32_MIN: the result would not fit an int32
                raise TokenizerError("the text is too long to tokenize in one call")
            cap = -n

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, special tokens parsed; BOS only when asked (here or at load)."""
        return self._encode(text.encode("utf-8"), self.add_bos if add_bos is None else add_bos)

    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for (special tokens as their text)."""
        cached = self._pieces.get(token_id)
        if cached is not None:
            return cached
        lib = self._lib
        buf = self._buf
        n = lib.llama_token_to_piece(self._open_vocab(), token_id, buf, len(buf), 0, True)
        if n < 0:
            self._buf = buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
        piece = buf.raw[:n]
        self._pieces[token_id] = piece
        return piece

    def piece(self, token_id: int) -> str:
        return self.piece_bytes(token_id).decode("utf-8", "replace")

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], Offsets]:
        data = text.encode("utf-8")
        ids = self._encode(data, False)
        pieces = [self.piece_bytes(i) for i in ids]
        return ids, _char_offsets(text, data, _align_pieces(data, pieces))

    def detokenize(self, ids: Sequence[int]) -> str:
        lib = self._lib
        arr = (lib.llama_token * len(ids))(*ids)
        cap = sum(len(self.piece_bytes(i)) for i in ids) + 16
        buf = ctypes.create_string_buffer(cap)
        n = lib.llama_detokenize(self._open_vocab(), arr, len(ids), buf, cap, False, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_detokenize(self._vocab, arr, len(ids), buf, -n, False, True)
        return buf.raw[:n].decode("utf-8", "replace")


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` package."""

    def __init__(self, path: str | os.PathLike, *, add_bos: bool = False, name: str | None = None):
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"tokenizer file not found: {path}")
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:
            raise TokenizerError("reading a tokenizer.json needs the tokenizers package; run `pip install 'tmplkit[hf]'`") from None
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception on bad JSON
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TokenizerError(f"{path} is not a usable tokenizer.json ({first})") from None
        if self._tok.get_vocab_size(with_added_tokens=True) == 0:
            raise TokenizerError(f"{path} has no vocabulary; give the model's tokenizer.json")
        self.path = path
        self.name = name or (path.parent.name + "/" + path.name if path.parent.name else path.name)
        self.n_vocab = self._tok.get_vocab_size(with_added_tokens=True)
        self.add_bos = add_bos

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; with add_bos (default: as opened), the tokenizer's own post-processing (BOS etc.) too."""
        add = self.add_bos if add_bos is None else add_bos
        return list(self._tok.encode(text, add_special_tokens=add).ids)

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], Offsets]:
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [(int(s), int(e)) for s, e in enc.offsets]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)


def load_tokenizer(spec: str | os.PathLike, *, add_bos: bool = False) -> Tokenizer:
    """Open a tokenizer from a path or spec.

    - a `.gguf` file (a model or a vocab-only GGUF): llama.cpp, vocab only;
    - a `tokenizer.json` file, or a folder holding one: Hugging Face tokenizers;
    - `vocab:NAME`: a vocab-only GGUF of the pinned llama.cpp corpus, e.g. `vocab:qwen35`;
    - `hf:ORG/NAME`: the repo's tokenizer.json in the local Hugging Face cache (never downloads).

    >>> tok = load_tokenizer("vocab:qwen35")   # doctest: +SKIP
    """
    text = os.fspath(spec)
    if text.startswith("vocab:"):
        from . import corpus
        from .errors import SourceError

        try:
            return LlamaCppTokenizer(corpus.vocab_path(text[len("vocab:"):]), add_bos=add_bos, name=text)
        except SourceError as exc:
            raise TokenizerError(str(exc)) from None
    if text.startswith("hf:"):
        return _hf_from_cache(text[len("hf:"):], add_bos)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return HFTokenizer(path / "tokenizer.json", add_bos=add_bos)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return LlamaCppTokenizer(ggufs[0], add_bos=add_bos)
        raise TokenizerError(f"{path} holds no tokenizer.json (and not exactly one .gguf); give the file itself")
    if not path.exists():
        if text.count("/") == 1 and not text.startswith((".", "/", "~")):
            return _hf_from_cache(text, add_bos)
        raise TokenizerError(f"tokenizer file not found: {path}")
    if not path.is_file():
        raise TokenizerError(f"{path} is not a file")
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise TokenizerError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head[:4] == b"GGUF":
        return LlamaCppTokenizer(path, add_bos=add_bos)
    if path.suffix == ".json" or head.lstrip()[:1] == b"{":
        return HFTokenizer(path, add_bos=add_bos)
    if path.suffix == ".gguf":
        raise TokenizerError(f"{path} is not a GGUF file (no GGUF magic); it may be damaged or a Git LFS pointer")
    raise TokenizerError(f"{path} is neither a GGUF file nor a tokenizer.json")


def _hf_from_cache(repo_id: str, add_bos: bool = False) -> HFTokenizer:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise TokenizerError("reading the Hugging Face cache needs huggingface_hub; run `pip install huggingface_hub`") from None
    try:
        found = try_to_load_from_cache(repo_id, "tokenizer.json")
    except Exception as exc:  # invalid repo id
        raise TokenizerError(f"'{repo_id}' is not a Hugging Face repo id ({exc})") from None
    if not isinstance(found, str):
        raise TokenizerError(f"no tokenizer.json for '{repo_id}' in the local Hugging Face cache; download it first (e.g. `hf download {repo_id} tokenizer.json`) or give a path")
    return HFTokenizer(found, add_bos=add_bos, name=f"hf:{repo_id}")


# ---------------------------------------------------------------------------------------------
# Delimiters as token ids, derived in context


@dataclass(frozen=True)
class TokenDelimiter:
    """One role delimiter as token ids of one tokenizer.

    `ids` is what the span detector matches. `occurrences` counts where the delimiter starts a
    message in the probe render; `aligned` says its text began and ended on token boundaries at
    all of them; `stable` that the tokens covering it were the same ids at all of them.
    `standalone_ids` is the delimiter tokenized on its own (what llama-server uses); `adjusted`
    explains, when ids differ from the exact tokens of the text, what was changed and why.
    """

    role: str
    text: str
    ids: tuple[int, ...]
    occurrences: int
    aligned: bool
    stable: bool
    standalone_ids: tuple[int, ...]
    adjusted: str | None = None
    # The text the ids stand for (the delimiter as llama-server should be given it).
    token_text: str = ""
    # Further id sequences matched for this delimiter, where its edge tokens vary with context.
    alternatives: tuple[tuple[int, ...], ...] = ()
    alternative_texts: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "role": self.role,
            "text": self.text,
            "ids": list(self.ids),
            "token_text": self.token_text,
            "occurrences": self.occurrences,
            "aligned": self.aligned,
            "stable": self.stable,
            "standalone_ids": list(self.standalone_ids),
            "adjusted": self.adjusted,
            "alternatives": [list(a) for a in self.alternatives],
        }


@dataclass(frozen=True)
class TokenDelimiters:
    """Every delimiter of an Analysis as token ids, longest first, with the check's verdict.

    `passed` is true when splitting the tokenized probe render with these ids finds exactly the
    message starts that splitting its text finds, at the same places; `problems` says otherwise.
    `warnings` note what does not fail the check (a delimiter absent from the render, one whose
    text tokenizes differently on its own).
    """

    tokenizer: str
    template: str
    delimiters: tuple[TokenDelimiter, ...]
    passed: bool
    problems: tuple[str, ...] = ()
    n_tokens: int = 0
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "tokenizer": self.tokenizer,
            "template": self.template,
            "passed": self.passed,
            "n_tokens": self.n_tokens,
            "delimiters": [d.to_dict() for d in self.delimiters],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }

    def message_delimiters(self) -> list[dict]:
        """llama-server's `message_delimiters` form: `[{"role": ..., "delimiter": ...}]`.

        The delimiter strings are the text of the token-aligned sequences, so that llama-server,
        which tokenizes each on its own, gets the ids checked here.
        """
        return [{"role": d.role, "delimiter": text} for d in self.delimiters
                for text in (d.token_text,) + d.alternative_texts]

    def id_lists(self) -> list[dict]:
        """`[{"role": ..., "ids": [...]}]`, longest first."""
        return [{"role": d.role, "ids": list(q)} for d in self.delimiters for q in (d.ids,) + d.alternatives]

    def __iter__(self):
        return iter(self.delimiters)

    def __len__(self) -> int:
        return len(self.delimiters)


@dataclass
class _Occ:
    """Where one delimiter occurrence lies in the token list."""

    first: int  # first token overlapping the delimiter
    last: int  # last token overlapping it (inclusive)
    left_aligned: bool
    right_aligned: bool
    at: int = 0  # character offset where the delimiter starts

    def bounds(self, left_inner: bool, right_inner: bool) -> tuple[int, int]:
        lo = self.first + (1 if left_inner and not self.left_aligned else 0)
        hi = self.last + 1 - (1 if right_inner and not self.right_aligned else 0)
        return lo, hi


def _locate(starts: list[int], ends: list[int], a: int, b: int) -> _Occ | None:
    """Tokens overlapping characters [a, b), or None when no token does."""
    i = bisect.bisect_right(ends, a)  # first token with end > a
    while i < len(starts) and ends[i] == starts[i] and starts[i] <= a:  # zero-width tokens at a
        i += 1
    j = bisect.bisect_left(starts, b) - 1  # last token with start < b
    if i >= len(starts) or j < i:
        return None
    return _Occ(i, j, starts[i] >= a, ends[j] <= b, a)


# (left_inner, right_inner) in order of preference: cut back to the tokens wholly inside the
# delimiter first (they depend on the template only), extend to whole tokens after that.
_MODES = ((True, True), (True, False), (False, True), (False, False))


def _describe(occ: Sequence[_Occ], lo: int, hi: int, left_inner: bool, right_inner: bool,
              offsets: Offsets, text: str) -> str | None:
    """A note on how the chosen ids differ from the delimiter's text, or None when they match."""
    notes = []
    left = [x for x in occ if not x.left_aligned]
    right = [x for x in occ if not x.right_aligned]
    where = lambda xs: "" if len(xs) == len(occ) else f" at {len(xs)} of its {len(occ)} occurrences"  # noqa: E731
    if left:
        piece = text[offsets[left[0].first][0]:offsets[left[0].first][1]]
        if left_inner:
            notes.append(f"starts inside token {piece!r}{where(left)}; the match starts after it")
        else:
            notes.append(f"starts inside token {piece!r}{where(left)}; kept the whole token")
    if right:
        piece = text[offsets[right[0].last][0]:offsets[right[0].last][1]]
        if right_inner:
            kept = text[offsets[lo][0]:offsets[hi - 1][1]] if hi > lo else ""
            notes.append(f"ends inside token {piece!r}{where(right)}; dropped it, matching {kept!r}")
        else:
            notes.append(f"ends inside token {piece!r}{where(right)}; kept the whole token")
    return "; ".join(notes) if notes else None


def token_delimiters(analysis, tokenizer: Tokenizer) -> TokenDelimiters:
    """Derive each delimiter's token ids from the tokenized probe render of `analysis`.

    For each delimiter, the tokens covering it are read at every place it starts a message in
    `analysis.round_trip.rendered`. Where its text begins or ends inside a token, the ids are cut
    back to the tokens wholly inside it (or, where that leaves nothing or does not mark every
    place, extended to whole tokens); the choice is kept only if splitting the tokenized render
    finds exactly the starts the text split finds. What was changed is in each `adjusted`.

    >>> td = token_delimiters(analyze(load("Qwen3.5-4B.jinja")), load_tokenizer("vocab:qwen35"))  # doctest: +SKIP
    >>> [d.token_text for d in td][:1]                                                          # doctest: +SKIP
    ['<|im_start|>user\\n<tool_response']
    """
    from .spans import SpanDetector, text_matches

    delimiters = sort_delimiters(getattr(analysis, "delimiters", ()) or ())
    rt = getattr(analysis, "round_trip", None)
    rendered = getattr(rt, "rendered", "") or ""
    name = getattr(analysis, "name", "")
    tok_name = getattr(tokenizer, "name", type(tokenizer).__name__)
    if not delimiters:
        return TokenDelimiters(tok_name, name, (), False, ("the analysis has no delimiters",))
    problems: list[str] = []
    warnings: list[str] = []
    ids, offsets = tokenizer.tokenize_with_offsets(rendered) if rendered else ([], [])
    starts = [s for s, _ in offsets]
    ends = [e for _, e in offsets]
    # offsets are non-decreasing for the tokenizers we support; bisect relies on it
    if any(ends[k] > ends[k + 1] for k in range(len(ends) - 1)):
        ends = list(np.maximum.accumulate(ends)) if ends else ends
    matches = text_matches(rendered, delimiters) if rendered else []

    per: dict[Delimiter, list[_Occ]] = {d: [] for d in delimiters}
    order: list[tuple[Delimiter, int]] = []  # (delimiter, index into per[d]) in text order
    for pos, d in matches:
        o = _locate(starts, ends, pos, pos + len(d.text))
        if o is None:
            problems.append(f"{d.role} delimiter {d.text!r} at character {pos} is covered by no token")
            continue
        order.append((d, len(per[d])))
        per[d].append(o)

    # Candidate id sequences per delimiter, in order of preference:
    # (ids, match start per occurrence, note, alternative ids matched as well)
    candidates: dict[Delimiter, list[tuple[tuple[int, ...], list[int], str | None, tuple]]] = {}
    info: dict[Delimiter, tuple[bool, bool, tuple[int, ...]]] = {}
    for d in delimiters:
        occ = per[d]
        standalone = tuple(tokenizer.tokenize(d.text))
        if not occ:
            candidates[d] = [(standalone, [], "not found in the probe render; tokenized on its own, unchecked", ())]
            warnings.append(f"{d.role} delimiter {d.text!r} does not start a message in the probe render; its ids are unchecked")
            info[d] = (False, False, standalone)
            continue
        aligned = all(o.left_aligned and o.right_aligned for o in occ)
        covering = {tuple(ids[o.first:o.last + 1]) for o in occ}
        info[d] = (aligned, len(covering) == 1, standalone)
        exact: list = []
        trimmed: list = []
        variants: list = []
        seen: set[tuple[int, ...]] = set()
        for left_inner, right_inner in _MODES:
            bounds = [o.bounds(left_inner, right_inner) for o in occ]
            seqs = [tuple(ids[lo:hi]) for lo, hi in bounds]
            distinct = sorted(set(seqs), key=lambda q: (-seqs.count(q), seqs.index(q)))
            if 1 < len(distinct) <= 4 and all(distinct) and distinct[0] not in seen:
                # the tokens at its edge differ with what surrounds it: match each variant
                note = _describe(occ, bounds[0][0], bounds[0][1], left_inner, right_inner, offsets, rendered)
                extra = f"its tokens differ between its {len(occ)} occurrences; matching {len(distinct)} variants"
                variants.append((distinct[0], [lo for lo, _ in bounds], f"{note}; {extra}" if note else extra,
                                 tuple(distinct[1:])))
            seq = _common_prefix(seqs)  # all of it when every occurrence has the same tokens
            if not seq or seq in seen:
                continue
            seen.add(seq)
            lo0, hi0 = bounds[0]
            note = _describe(occ, lo0, lo0 + len(seq), left_inner, right_inner, offsets, rendered)
            if len(set(seqs)) > 1:
                extra = f"the tokens differ between its {len(occ)} occurrences; kept the common first {len(seq)}"
                note = f"{note}; {extra}" if note else extra
                trimmed.append((seq, [lo for lo, _ in bounds], note, ()))
            else:
                exact.append((seq, [lo for lo, _ in bounds], note, ()))
        cands = exact + _common_cores(d, occ, ids, starts, seen) + trimmed + variants
        cands = _robust_first(tokenizer, d, occ, cands, rendered, offsets, seen)
        if not cands:
            cands.append((standalone, [], "no token sequence is common to all its occurrences; tokenized on its own", ()))
            problems.append(f"{d.role} delimiter {d.text!r}: no token sequence is common to all {len(occ)} occurrences")
        candidates[d] = cands

    choice = {d: 0 for d in delimiters}

    def expected_and_found():
        chosen = [(d.role, q) for d in delimiters
                  for q in (candidates[d][choice[d]][0],) + candidates[d][choice[d]][3]]
        found = SpanDetector(chosen).split(ids) if ids else None
        exp = []
        for d, k in order:
            los = candidates[d][choice[d]][1]
            if k < len(los):
                exp.append((los[k], d.role))
        got = [(s.pos, s.role) for s in found] if found is not None else []
        return sorted(exp), got

    def cost() -> int:
        exp, got = expected_and_found()
        return len(set(exp).symmetric_difference(got)) + (len(exp) != len(got))

    # Start from each delimiter's preferred candidate; while the token split disagrees with the
    # text split, change one delimiter's candidate at a time where that lowers the disagreement.
    best = cost()
    for _ in range(4):
        if best == 0:
            break
        improved = False
        for d in delimiters:
            keep = choice[d]
            for k in range(len(candidates[d])):
                if k == keep:
                    continue
                choice[d] = k
                c = cost()
                if c < best:
                    best, keep, improved = c, k, True
            choice[d] = keep
        if not improved:
            break
    exp, got = expected_and_found()
    if exp != got:
        missing = sorted(set(exp) - set(got))
        extra = sorted(set(got) - set(exp))
        if missing:
            problems.append("token split misses message starts at " + _fmt_positions(missing, offsets))
        if extra:
            problems.append("token split finds extra message starts at " + _fmt_positions(extra, offsets))

    out = []
    for d in delimiters:
        seq, _, note, alts = candidates[d][choice[d]]
        aligned, stable, standalone = info[d]
        token_text = tokenizer.detokenize(list(seq))
        if note is None and token_text != d.text:
            note = f"its tokens stand for {token_text!r}: the tokenizer drops or normalises characters here"
        out.append(TokenDelimiter(
            role=d.role, text=d.text, ids=seq, occurrences=len(per[d]), aligned=aligned, stable=stable,
            standalone_ids=standalone, adjusted=note, token_text=token_text, alternatives=alts,
            alternative_texts=tuple(tokenizer.detokenize(list(a)) for a in alts),
        ))
    # Longest (in tokens) first, as the detector matches them.
    out.sort(key=lambda t: -len(t.ids))
    for t in out:
        if t.occurrences and tuple(tokenizer.tokenize(t.token_text)) != t.ids:
            warnings.append(f"{t.role} delimiter {t.token_text!r} tokenizes on its own to other ids than in context; give llama-server the ids")
    return TokenDelimiters(tok_name, name, tuple(out), not problems, tuple(problems), len(ids), tuple(warnings))


# What message content may begin with: a delimiter's last tokens must not merge with any of it.
_CONTINUATIONS = ("a", "A", " a", "1", ".", ",", "<", "{", "[", "\"", "'", "\n", "\n\n", " ", "  ", "\t", "é", "😀")


def _robust_len(tokenizer: Tokenizer, rendered: str, offsets: Offsets, seq: tuple[int, ...], lo: int,
                end: int) -> tuple[int, str | None]:
    """How many of `seq`'s leading ids survive whatever content follows the delimiter.

    Re-tokenizes the text from a few tokens before the match to the delimiter's `end`, followed
    by each of `_CONTINUATIONS`; returns the shortest surviving length and the continuation that
    cut it (None when nothing did).
    """
    start = offsets[lo][0]
    left_start = offsets[max(0, lo - 8)][0]
    head = rendered[left_start:end]
    k, culprit = len(seq), None
    for cont in _CONTINUATIONS:
        got, offs = tokenizer.tokenize_with_offsets(head + cont)
        at = bisect.bisect_left([s for s, _ in offs], start - left_start)
        if at >= len(got) or offs[at][0] != start - left_start:
            continue  # the match start itself moved: not something a continuation explains
        m = 0
        while m < k and at + m < len(got) and got[at + m] == seq[m]:
            m += 1
        if m < k:
            k, culprit = m, cont
    return k, culprit


def _robust_first(tokenizer: Tokenizer, d: Delimiter, occ: Sequence[_Occ], cands, rendered: str,
                  offsets: Offsets, seen: set[tuple[int, ...]]):
    """Put before each candidate its version without the last tokens that content can merge with.

    In the qwen35 vocab `<|im_start|>user\n<tool_response>\n` ends in `>\n`, which becomes `>\n\n`
    when the tool response itself starts with a newline: the delimiter would then miss.
    """
    if not occ:
        return cands
    end = occ[0].at + len(d.text)
    out = []
    for seq, los, note, alts in cands:
        if los and not alts and offsets[los[0] + len(seq) - 1][1] <= end:
            k, culprit = _robust_len(tokenizer, rendered, offsets, seq, los[0], end)
            if 0 < k < len(seq) and seq[:k] not in seen:
                seen.add(seq[:k])
                dropped = rendered[offsets[los[0] + k][0]:offsets[los[0] + len(seq) - 1][1]]
                extra = f"dropped {dropped!r} at the end: content starting with {culprit!r} merges with it"
                out.append((seq[:k], los, f"{note}; {extra}" if note else extra, ()))
        out.append((seq, los, note, alts))
    return out


def _common_cores(d: Delimiter, occ: Sequence[_Occ], ids: Sequence[int], starts: Sequence[int],
                  seen: set[tuple[int, ...]], keep: int = 3) -> list[tuple[tuple[int, ...], list[int], str | None]]:
    """Token sequences that start at the same character of the delimiter at every occurrence.

    Where a neighbour merges into the delimiter at some occurrences only (`><` after a textual
    end marker, `<` alone after a word), the tokens differ at its edges but share a core: match
    from a character offset that begins a token everywhere, as far as the ids agree.
    """
    if len(occ) < 2 or all(o.left_aligned and o.right_aligned for o in occ):
        return []
    n = len(d.text)
    offsets_per = []
    for o in occ:
        offsets_per.append({starts[t] - o.at for t in range(o.first, o.last + 1) if o.at <= starts[t] < o.at + n})
    common = set.intersection(*offsets_per)
    found = []
    for c in sorted(common):
        for right_inner in (True, False):
            seqs, los = [], []
            for o in occ:
                lo = bisect.bisect_left(starts, o.at + c, o.first, o.last + 1)
                hi = o.last + 1 - (1 if right_inner and not o.right_aligned else 0)
                seqs.append(tuple(ids[lo:hi]))
                los.append(lo)
            seq = _common_prefix(seqs)
            if seq:
                found.append((len(seq), c, not right_inner, seq, los))
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    out = []
    for _, c, _, seq, los in found:
        if seq in seen:
            continue
        seen.add(seq)
        note = (f"the tokens at its edges differ between its {len(occ)} occurrences (a neighbour merges into it at some); "
                f"matching {len(seq)} tokens from character {c}, {d.text[c:]!r}")
        out.append((seq, los, note, ()))
        if len(out) == keep:
            break
    return out


def _common_prefix(seqs: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    seqs = list(seqs)
    if not seqs:
        return ()
    first = seqs[0]
    n = min(len(s) for s in seqs)
    k = 0
    while k < n and all(s[k] == first[k] for s in seqs):
        k += 1
    return first[:k]


def _fmt_positions(items, offsets: Offsets, limit: int = 5) -> str:
    shown = [f"token {p} ({role}, char {offsets[p][0] if p < len(offsets) else '?'})" for p, role in items[:limit]]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(shown) + more
