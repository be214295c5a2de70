"""Tokenizers: the adapters, and the one reader of tokenizer specs.

Three adapters share one small protocol (`Tokenizer`):

- `LlamaCppTokenizer`: a GGUF opened vocab-only through llama-cpp-python (special tokens parsed,
  no BOS unless asked), the tokenizer llama-server itself uses;
- `HFTokenizer`: a Hugging Face `tokenizer.json` through the `tokenizers` package;
- `GGUFBPETokenizer`: a GGUF's BPE vocabulary rebuilt in `tokenizers` (`gguf_vocab`), what a GGUF
  opens as when llama-cpp-python is not installed and the vocabulary is one it rebuilds.

A spec names a tokenizer: a path (a `.gguf`, a `tokenizer.json` or a folder holding one), a
`vocab:NAME` corpus vocab or an `hf:ORG/NAME` repo in the local Hugging Face cache.
`TokenizerSpec.parse(spec)` reads one, for the loader (`load_tokenizer`), the command line (which
extra a spec needs) and the configuration (which specs are paths, relative to its file) alike.

Delimiters as token ids of one of these tokenizers are derived in `delimiter_ids`, beside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ..errors import GGUFError, ModelError, SourceError, TokenizerError
from ..sources import corpus
from ..sources.gguf_meta import Keys
from ._cuts import CHUNK, SpecialTexts, cuts
from .gguf_vocab import byte_level_bytes, gguf_bpe_tokenizer, supports
from .llama_model import LlamaModel, import_llama_cpp
from .vocab_check import checked_vocabulary

__all__ = ["GGUFBPETokenizer", "HFTokenizer", "LlamaCppTokenizer", "Offsets", "TokenizerSpec", "Tokenizer", "fewest_tokens", "load_tokenizer",
           "locate_tokenizer", "utf8"]

_GIVE = "give a .gguf (vocab-only is enough), a tokenizer.json or its folder, vocab:NAME or hf:org/name"

Offsets = list[tuple[int, int]]


# ---------------------------------------------------------------------------------------------
# Specs: what names a tokenizer


@dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer spec, read: `kind` is "vocab" (`vocab:NAME`, a corpus vocab-only GGUF), "hf"
    (`hf:ORG/NAME`, a repo in the local Hugging Face cache) or "path" (anything else: a `.gguf`,
    a `tokenizer.json` or a folder holding one; a bare `ORG/NAME` that is no file is a repo too,
    as the loader finds out). `name` is what follows the prefix (the whole text for a path).

    >>> TokenizerSpec.parse("vocab:qwen35").kind, TokenizerSpec.parse("hf:Qwen/Qwen3-8B").name
    ('vocab', 'Qwen/Qwen3-8B')
    >>> TokenizerSpec.parse("models/m.gguf").is_path, TokenizerSpec.parse("tokenizer.json").extra
    (True, 'hf')
    """

    text: str
    kind: str
    name: str

    PREFIXES: ClassVar[tuple[tuple[str, str], ...]] = (("vocab:", "vocab"), ("hf:", "hf"))

    @classmethod
    def parse(cls, spec: str | os.PathLike) -> TokenizerSpec:
        text = os.fspath(spec)
        for prefix, kind in cls.PREFIXES:
            if text.startswith(prefix):
                return cls(text, kind, text[len(prefix):])
        return cls(text, "path", text)

    @property
    def is_path(self) -> bool:
        """Whether the spec names a file or folder (which a configuration resolves against its own folder)."""
        return self.kind == "path"

    @property
    def extra(self) -> str:
        """The optional extra the tokenizer opens with: "llama" for a GGUF or a corpus vocab (also a
        folder without a tokenizer.json: its one .gguf), "hf" for a tokenizer.json or a repo, and
        for a GGUF whose BPE vocabulary `gguf_vocab` rebuilds when llama-cpp-python is missing;
        "" (none) for a GGUF that no extra would read (missing, truncated, no vocabulary: the
        loader's error says what is wrong)."""
        if self.kind == "vocab" or (self.is_path and self.text.lower().endswith(".gguf")):
            return self._gguf_extra()
        if self.is_path and os.path.isdir(self.text) and not os.path.isfile(os.path.join(self.text, "tokenizer.json")):
            return "llama"
        return "hf"

    def _gguf_extra(self) -> str:
        # Without llama-cpp-python a BPE vocabulary that gguf_vocab rebuilds opens with tokenizers.
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is not None:
            return "llama"

        if self.kind == "vocab":
            if not corpus.is_fetched():
                return ""  # no extra would help: the loader says to fetch the corpus
            path = corpus.vocab_dir() / f"ggml-vocab-{self.name}.gguf"
        else:
            path = Path(self.text).expanduser()
        if path.is_file() and supports(path):
            return "hf"
        # A file that is missing, not a GGUF, truncated or without a vocabulary needs no extra:
        # the loader says what is wrong with it (sending the user to compile llama.cpp would not).
        return "llama" if _readable_vocab(path) else ""


def _readable_vocab(path: Path) -> bool:
    """Whether `path` is a whole GGUF with a vocabulary (what only llama.cpp may then read)."""
    try:
        return path.is_file() and _gguf_vocab_model(path) not in (None, "none", "no_vocab")
    except (TokenizerError, OSError):
        return False


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
    """Map [start, end) byte offsets in `data` (text as UTF-8) to character offsets in `text`
    (pairs of ints, as `_align_pieces` gives them)."""
    if len(data) == len(text):  # pure ASCII: bytes are characters
        return list(byte_offsets)
    if not byte_offsets:
        return []
    raw = np.frombuffer(data, dtype=np.uint8)
    is_start = (raw & 0xC0) != 0x80
    # char_of[b] = index of the character that byte b belongs to; char_of[len] = len(text)
    char_of = np.empty(len(raw) + 1, dtype=np.int64)
    char_of[:-1] = np.cumsum(is_start) - 1
    char_of[-1] = len(text)
    # (all tokens at once: a 90k-token session's last request, one by one, took a tenth of a second)
    pairs = np.asarray(byte_offsets, dtype=np.int64).reshape(-1, 2)
    starts = char_of[pairs[:, 0]]
    ends = np.where(pairs[:, 1] > pairs[:, 0], char_of[np.maximum(pairs[:, 1] - 1, 0)] + 1, starts)
    return list(zip(starts.tolist(), ends.tolist()))


def _align_pieces(data: bytes, pieces: Sequence[bytes]) -> list[tuple[int, int]]:
    """Byte offsets of each piece in `data`.

    Pieces usually concatenate to `data` exactly. They do not where the tokenizer inserted a space
    (SentencePiece's space prefix after a special token) or dropped whitespace (special tokens
    with lstrip/rstrip); both are tolerated: an inserted leading space covers nothing, dropped
    whitespace belongs to no token.
    """
    if b"".join(pieces) == data:
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        ends = np.cumsum(lengths)
        return list(zip((ends - lengths).tolist(), ends.tolist()))
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
# GGUF: which tokenizer the file declares, read through the one GGUF metadata reader


def _gguf_vocab_model(path: Path) -> str | None:
    """The value of `tokenizer.ggml.model` in a GGUF's metadata, or None when the key is absent.

    Reads the whole key/value header, so a truncated or corrupted file is told before llama.cpp
    opens it; raises TokenizerError then, and for a vocabulary llama.cpp would abort the process
    on (`vocab_check.checked_vocabulary`).
    """
    try:
        model, problem = checked_vocabulary(path)
    except GGUFError as exc:
        raise TokenizerError(str(exc)) from None
    if problem is not None:
        raise TokenizerError(problem)
    return model


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


def common_byte_prefix(a: bytes, b: bytes) -> int:
    """`lcp` of two byte strings in one vectorized pass (a slice of bytes is a copy, so the binary
    search copies a long render's bytes a score of times)."""
    n = min(len(a), len(b))
    differ = np.frombuffer(a, np.uint8, n) != np.frombuffer(b, np.uint8, n)
    first = int(differ.argmax()) if n else 0
    return first if n and differ[first] else n


# The ids of the tuples whose `_Spelled` a tokenizer keeps alive for no one else (`_keep`): every
# request of a 120k-token session, 8 bytes an id. A tuple its caller still holds costs only its
# table (a few hundred numbers) and is not counted.
_SPELLINGS_KEPT = 8_000_000


def _refs_to_first(entry: tuple) -> int:
    """The references to `entry[0]`, as this function counts them."""
    return sys.getrefcount(entry[0])


# what `_refs_to_first` counts for a tuple nothing but its entry holds (measured, not assumed: the
# count of the interpreter's own temporaries differs between Python versions)
_ONLY_IN_ENTRY = _refs_to_first((tuple(range(2)), None))
# The bytes of text between control tokens whose ids a tokenizer keeps (`_encode_pieces`): a long
# session's several times over; past it the pieces are forgotten and kept anew.
_PIECES_KEPT = 16_000_000


@dataclass(frozen=True)
class _Spelled:
    """The control tokens of a tokenized text: their indices among its ids and the bytes each
    starts and ends at, with the length of the bytes all its ids spell (what `tokenize_after`
    needs of a base, a few hundred numbers where the ids are tens of thousands)."""

    n_bytes: int
    index: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    ids: np.ndarray

    @classmethod
    def of(cls, arr, lengths, control) -> _Spelled:
        ends = np.cumsum(lengths)
        at = np.flatnonzero(control[arr])
        return cls(int(ends[-1]) if len(ends) else 0, at, ends[at] - lengths[at], ends[at], arr[at])

    def extended(self, cut: int, start: int, tail: _Spelled) -> _Spelled:
        """This text's first `cut` ids (spelling `start` bytes), then `tail`'s."""
        keep = self.index < cut
        return _Spelled(start + tail.n_bytes, np.concatenate((self.index[keep], cut + tail.index)),
                        np.concatenate((self.starts[keep], start + tail.starts)),
                        np.concatenate((self.ends[keep], start + tail.ends)), np.concatenate((self.ids[keep], tail.ids)))


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
        model = _gguf_vocab_model(path)
        if model is None:
            raise TokenizerError(f"{path} has no vocabulary (no {Keys.Tokenizer.MODEL} key); use the model's GGUF or a vocab GGUF")
        if model in ("none", "no_vocab"):
            raise TokenizerError(f"{path} has no vocabulary ({Keys.Tokenizer.MODEL} = '{model}'); use the model's GGUF or a vocab GGUF")
        llama_cpp = import_llama_cpp(TokenizerError, "reading a GGUF vocabulary")
        self._lib = llama_cpp
        try:
            with _quiet_llama():
                self._owner: LlamaModel | None = LlamaModel(llama_cpp, path, vocab_only=True)
        except ModelError:
            if _memory_limited():  # (a worker's --memory too low for the vocabulary is no damaged file)
                from ..sandbox import hint

                raise TokenizerError(f"llama.cpp could not load the vocabulary of {path} (tokenizer '{model}') within "
                                     f"the memory this process may use; {hint('memory_mb')}") from None
            raise TokenizerError(f"llama.cpp could not load the vocabulary of {path} (tokenizer '{model}'); "
                                 "the file may be damaged or from a newer llama.cpp") from None
        self._model = self._owner.model
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
        self._eog: dict[int, bool] = {}
        self._buf = ctypes.create_string_buffer(256)
        # what tokenizing a session's requests one after another keeps (`tokenize_after`)
        self._id_tables: tuple | None = None  # (`_tables`)
        self._spellings: dict = {}  # id of a tuple of ids -> (the tuple, its `_Spelled`)
        self._spellings_ids = 0  # the ids of the tuples kept there
        self._spellings_sweep = _SPELLINGS_KEPT  # (`_sweep_spellings` when they pass it)
        self._pieces_ids: dict[bytes, tuple[int, ...]] = {}  # (`_encode_pieces`)
        self._pieces_bytes = 0
        self._control_patterns: dict = {}  # (`_controls`)
        self._specials: SpecialTexts | None | bool = False  # (`_cuts`; False: not read yet)
        self._longest: int | None = None  # (`max_token_bytes`)

    @classmethod
    def of_model(cls, model, path: str | os.PathLike, *, add_bos: bool = False, name: str | None = None) -> LlamaCppTokenizer:
        """The vocabulary of a llama.cpp model already loaded (a `llama_model` pointer, e.g. the
        prefill runner's), without loading the file again. The owner frees the model; it must
        close this tokenizer first (using a closed one raises TokenizerError)."""
        import llama_cpp

        self = cls.__new__(cls)
        self._lib = llama_cpp
        self._owner = None  # not ours to free
        self._model = None
        self._use_vocab(model, Path(path), add_bos, name)
        return self

    def __repr__(self) -> str:
        return f"LlamaCppTokenizer({str(self.path)!r})"

    def close(self) -> None:
        # no call may reach llama.cpp with the vocabulary of a freed model
        self._vocab = None
        self._model = None
        owner, self._owner = getattr(self, "_owner", None), None
        if owner is not None:
            owner.free()

    def _open_vocab(self):
        if self._vocab is None:
            raise TokenizerError(f"the tokenizer of {self.name} is closed")
        return self._vocab

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def _encode(self, data: bytes, add_bos: bool) -> list[int]:
        """`data`'s ids; a long text in pieces cut where llama.cpp splits it anyway (`_cuts`: one call
        takes time quadratic in the special tokens of its text)."""
        at = self._cuts(data, add_bos) if len(data) > 2 * CHUNK else []
        if not at:
            return self._encode_call(data, add_bos)
        out: list[int] = []
        for begin, end in zip([0, *at], [*at, len(data)]):
            out += self._encode_call(data[begin:end], add_bos and not begin)
        return out

    def _cuts(self, data: bytes, add_bos: bool) -> list[int]:
        """Where `data` can be cut (`_cuts.cuts`), where `may_cut` says it can."""
        specials = self.special_texts() if self.may_cut(add_bos) else None
        return cuts(data, specials) if specials is not None else []

    def may_cut(self, add_bos: bool) -> bool:
        """Whether a text's pieces can be tokenized one by one: not where the vocabulary adds a
        token after the text too when it adds a BOS (add_eos, BERT's SEP; the last piece would
        end with it and no other)."""
        lib, vocab = self._lib, self._open_vocab()
        return not add_bos or not (lib.llama_vocab_get_add_eos(vocab)
                                   or int(lib.llama_vocab_type(vocab)) == int(lib.LLAMA_VOCAB_TYPE_WPM))

    def special_texts(self) -> SpecialTexts | None:
        """The special tokens llama.cpp splits a text at (its `cache_special_tokens`), read once."""
        if self._specials is False:
            lib, vocab = self._lib, self._open_vocab()
            special = int(lib.LLAMA_TOKEN_ATTR_CONTROL) | int(lib.LLAMA_TOKEN_ATTR_USER_DEFINED) | int(lib.LLAMA_TOKEN_ATTR_UNKNOWN)
            attrs = [int(lib.llama_vocab_get_attr(vocab, i)) for i in range(self.n_vocab)]
            ids = [i for i, a in enumerate(attrs) if a & special]
            self._specials = SpecialTexts.of([lib.llama_vocab_get_text(vocab, i) or b"" for i in ids],
                                             [bool(attrs[i] & int(lib.LLAMA_TOKEN_ATTR_LSTRIP)) for i in ids])
        return self._specials  # type: ignore[return-value]

    def max_token_bytes(self) -> int | None:
        """The longest token's text in bytes, read once: a bound on the bytes one token stands for
        (a byte-level BPE spells a byte in one or two, SentencePiece a space in three, a byte token
        as `<0x0A>`), so a text of B bytes has at least B / this many tokens (`fewest_tokens`).
        None for the vocabularies that may leave bytes out (WordPiece drops whitespace, Unigram
        folds it: llama-vocab.cpp); SentencePiece gives every byte no token spells a byte token,
        BPE every byte a token of its own where the vocabulary has one (a byte-level one has all)."""
        if self._longest is None:
            lib, vocab = self._lib, self._open_vocab()
            if int(lib.llama_vocab_type(vocab)) not in (int(lib.LLAMA_VOCAB_TYPE_SPM), int(lib.LLAMA_VOCAB_TYPE_BPE)):
                self._longest = 0
            else:
                self._longest = max(1, max((len(lib.llama_vocab_get_text(vocab, i) or b"") for i in range(self.n_vocab)), default=1))
        return self._longest or None

    def _encode_call(self, data: bytes, add_bos: bool) -> list[int]:
        lib = self._lib
        cap = len(data) + 8
        while True:
            out, cap = _array_of(lib.llama_token, cap)
            n = lib.llama_tokenize(self._open_vocab(), data, len(data), out, cap, add_bos, True)
            if n >= 0:
                return list(out[:n])
            if n == -2147483648:  # INT32_MIN: the result would not fit an int32
                raise TokenizerError("the text is too long to tokenize in one call")
            cap = -n

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, special tokens parsed; BOS only when asked (here or at load)."""
        return self._encode(utf8(text), self.add_bos if add_bos is None else add_bos)

    def tokenize_after(self, text: str, base: tuple[bytes, Sequence[int]] | None) -> tuple[int, ...]:
        """`tokenize(text, add_bos=False)`, reusing the ids of `base` (the bytes of a text tokenized
        before, and its ids without BOS) up to the last control token both texts share.

        llama.cpp splits a text at its special tokens before it tokenizes the pieces between them
        (llama-vocab.cpp, `tokenizer_st_partition`), so the ids up to a control token the two texts
        share, and from it on, are those of the whole text: request k+1 of a session shares its
        beginning with request k, and only the part from a control token before the divergence needs
        new ids (tests/test_tokenizers.py holds this against whole tokenization on the corpus's
        vocabularies). The ids come back as a tuple whose table (`_spelled`) is kept for the next call
        that starts from it: a session's requests chain, each the base of the next."""
        data = utf8(text)
        point = self._resume_point(data, base)
        if point is None:
            return self._remember(tuple(self._encode(data, False)))
        cut, start = point
        assert base is not None
        ids = tuple(base[1])
        return self._remember(ids[:cut] + self._encode_pieces(data[start:], self._spelled(ids)), (ids, cut, start))

    def _encode_pieces(self, data: bytes, spelled: _Spelled) -> tuple[int, ...]:
        """`data`'s ids, `data` split at the control tokens `spelled` has (llama.cpp splits there too,
        and tokenizes each piece between alone): each piece is tokenized once per tokenizer and its ids
        kept (a request's history repeats the messages of the requests before it, where a template
        rewrites what comes before them: Qwen3.5 dropping earlier reasoning once a user message comes).
        A control token that strips the whitespace beside it (llama.cpp's LSTRIP/RSTRIP) is left in
        its piece for llama.cpp."""
        controls = self._controls(spelled)
        if controls is None:
            return tuple(self._encode(data, False))
        pattern, ids_of = controls
        cache = self._pieces_ids
        if self._pieces_bytes > _PIECES_KEPT:
            cache.clear()
            self._pieces_bytes = 0
        out: list[int] = []
        at = 0
        for m in pattern.finditer(data):
            if m.start() > at:
                piece = data[at:m.start()]
                got = cache.get(piece)
                if got is None:
                    got = cache[piece] = tuple(self._encode(piece, False))
                    self._pieces_bytes += len(piece)
                out += got
            out.append(ids_of[m.group()])
            at = m.end()
        if at < len(data):
            out += self._encode(data[at:], False)  # (the text's end: new, and not a piece a later text repeats)
        return tuple(out)

    def _controls(self, spelled: _Spelled):
        """(a pattern matching the texts of `spelled`'s control tokens, longest first; text -> id), or
        None where it has none that do not strip whitespace."""
        key = tuple(np.unique(spelled.ids).tolist())
        cache = self._control_patterns
        if key not in cache:
            lib, vocab = self._lib, self._open_vocab()
            strips = int(lib.LLAMA_TOKEN_ATTR_LSTRIP) | int(lib.LLAMA_TOKEN_ATTR_RSTRIP)
            ids_of = {self.piece_bytes(i): i for i in key if not int(lib.llama_vocab_get_attr(vocab, i)) & strips}
            ids_of = {k: v for k, v in ids_of.items() if k}
            texts = sorted(ids_of, key=len, reverse=True)
            cache[key] = (re.compile(b"|".join(re.escape(t) for t in texts)), ids_of) if texts else None
        return cache[key]

    def tokenize_until(self, text: str, base: tuple[bytes, Sequence[int]] | None, at: int) -> tuple[int, tuple[int, ...]] | None:
        """The first ids of `tokenize(text, add_bos=False)`, down to every token that starts before
        byte `at` of the text, as (n, new): the whole text's ids are `base`'s first n ids (n >= 1),
        then `new`, then more that are not tokenized. None where `tokenize_after` would tokenize the
        text whole (see `_resume_point`): the caller then does.

        A render that diverges from what the server holds needs its ids only up to there: they stop
        at the next control token at or after `at` that `base` has too (where llama.cpp's split at
        special tokens ends the piece before it; tests/test_tokenizers.py holds the positions this
        gives against whole tokenization), not at the end of a long render. The control tokens are
        `_encode_pieces`' (none that strips the whitespace beside it)."""
        data = utf8(text)
        point = self._resume_point(data, base)
        if point is None:
            return None
        cut, start = point
        controls = self._controls(self._spelled(tuple(base[1])))  # type: ignore[index]
        found = controls[0].search(data, max(at, start)) if controls is not None else None
        return cut, tuple(self._encode(data[start:found.start() if found else len(data)], False))

    def _resume_point(self, data: bytes, base) -> tuple[int, int] | None:
        """(ids of `base` kept, byte where new ids start) for `tokenize_after`, or None where the
        text must be tokenized whole: no base, a vocabulary that is not BPE (SentencePiece prefixes
        a space), ids that do not spell the base's bytes exactly (whitespace a special token
        strips), or no control token whole within the shared bytes but the first."""
        if not base or not len(base[1]) or not self._tables()[2]:
            return None
        old, ids = base
        spelled = self._spelled(tuple(ids))
        if spelled.n_bytes != len(old):
            return None
        # the last control token that starts, whole, within the shared bytes
        k = int(np.searchsorted(spelled.ends, common_byte_prefix(data, old), side="right")) - 1
        if k < 0 or spelled.index[k] == 0:
            return None
        return int(spelled.index[k]), int(spelled.starts[k])

    def piece_lengths(self, ids: Sequence[int]) -> list[int]:
        """`len(self.piece_bytes(i))` for each of `ids`, read off the vocabulary's table at once."""
        if not len(ids):
            return []
        arr = np.asarray(ids)
        if arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= self.n_vocab:
            for i in ids:  # (the first that is no id is named: 7.5 read as 7, or past the table, before)
                _check_token_id(self, i)
        return self._lengths(arr.astype(np.int64, copy=False)).tolist()

    def _spelled(self, ids: tuple[int, ...]) -> _Spelled:
        """Where the control tokens of `ids` lie in the bytes they spell; kept while the tuple is held
        elsewhere, and for the last `_SPELLINGS_KEPT` ids of those that are not (`_sweep_spellings`;
        immutable: a base is reused for several texts)."""
        hit = self._spellings.get(id(ids))
        if hit is not None and hit[0] is ids:
            return hit[1]
        arr = np.asarray(ids, dtype=np.int64)
        return self._keep(ids, _Spelled.of(arr, self._lengths(arr), self._tables()[1]))

    def _remember(self, ids: tuple[int, ...], prefix: tuple[tuple[int, ...], int, int] | None = None) -> tuple[int, ...]:
        """`ids` with its table (`_spelled`), built from `prefix` (a tuple it starts with, how many of
        its ids, and the bytes they spell) where given: only the new ids are read, not the whole
        request again."""
        if prefix is None:
            self._spelled(ids)
            return ids
        old, cut, start = prefix
        tail = np.asarray(ids[cut:], dtype=np.int64)
        self._keep(ids, self._spelled(old).extended(cut, start, _Spelled.of(tail, self._lengths(tail), self._tables()[1])))
        return ids

    def _keep(self, ids: tuple[int, ...], spelled: _Spelled) -> _Spelled:
        self._spellings[id(ids)] = (ids, spelled)  # (the tuple kept alive, so its id names no other)
        self._spellings_ids += len(ids)
        if self._spellings_ids > self._spellings_sweep:
            self._sweep_spellings()
        return spelled

    def _sweep_spellings(self) -> None:
        """Forget the tables of the tuples no one but this cache holds, the oldest first, down to
        `_SPELLINGS_KEPT` ids. A tuple still held elsewhere is kept: a long session's study holds
        every request's ids and reads their tables again (`cost.predicted_divergences`); dropping
        them by count made a 294k-token study build 450 tables anew, 1.5 s. The next sweep comes
        when the ids kept have doubled."""
        cache = self._spellings
        held = sum(len(t) for t, _ in cache.values())
        for key in list(cache):
            if held <= _SPELLINGS_KEPT:
                break
            entry = cache[key]
            if _refs_to_first(entry) <= _ONLY_IN_ENTRY:
                held -= len(entry[0])
                del cache[key], entry
        self._spellings_ids = held
        self._spellings_sweep = max(_SPELLINGS_KEPT, 2 * held)

    def _lengths(self, arr):
        """Per id of `arr`: its piece's length in bytes. The table over the vocabulary is filled as ids
        are met (a session uses a few thousand of a vocabulary's 150-250k), the control flags with it."""
        lengths, control, _ = self._tables()
        out = lengths[arr]
        missing = out < 0
        if missing.any():
            lib, vocab = self._lib, self._open_vocab()
            for i in np.unique(arr[missing]).tolist():
                lengths[i] = len(self.piece_bytes(i))
                control[i] = bool(lib.llama_vocab_is_control(vocab, i))
            out = lengths[arr]
        return out

    def _tables(self):
        """Per token id, its piece's length in bytes (-1 until met) and whether it is a control token
        (numpy arrays over the whole vocabulary, filled by `_lengths`); and whether the vocabulary is BPE."""
        tables = self._id_tables
        if tables is None:
            lib = self._lib
            splits = int(lib.llama_vocab_type(self._open_vocab())) == int(lib.LLAMA_VOCAB_TYPE_BPE)
            tables = self._id_tables = (np.full(self.n_vocab, -1, dtype=np.int64), np.zeros(self.n_vocab, dtype=bool), splits)
        return tables

    def is_eog(self, token_id: int) -> bool:
        """Whether the token ends a generation (`llama_vocab_is_eog`; kept per id: a session's
        generated turns ask it of every token they have)."""
        _check_token_id(self, token_id)  # (first: 7.0 finds the answer kept for 7, and is no id)
        got = self._eog.get(token_id)
        if got is None:
            got = self._eog[token_id] = bool(self._lib.llama_vocab_is_eog(self._open_vocab(), int(token_id)))
        return got

    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for (special tokens as their text)."""
        cached = self._pieces.get(token_id)
        if cached is not None:
            if type(token_id) is not int:  # (7.0 finds the piece kept for 7, and is no id)
                _check_token_id(self, token_id)
            return cached
        _check_token_id(self, token_id)
        lib = self._lib
        buf = self._buf
        n = lib.llama_token_to_piece(self._open_vocab(), token_id, buf, len(buf), 0, True)
        if n < 0:
            self._buf = buf = _array_of(ctypes.c_char, -n)[0]
            n = lib.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
        piece = buf.raw[:n]
        self._pieces[token_id] = piece
        return piece

    def piece(self, token_id: int) -> str:
        return self.piece_bytes(token_id).decode("utf-8", "replace")

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], Offsets]:
        return self.offsets_of(text, self._encode(utf8(text), False))

    def offsets_of(self, text: str, ids: Sequence[int]) -> tuple[list[int], Offsets]:
        """`ids` (`text`'s tokens without BOS, tokenized before: the turns study has them) with each
        token's character offsets, read off their pieces, as `tokenize_with_offsets` gives them."""
        data = utf8(text)
        ids = list(ids)
        return ids, _char_offsets(text, data, _align_pieces(data, list(map(self.piece_bytes, ids))))

    def detokenize(self, ids: Sequence[int]) -> str:
        lib = self._lib
        cap = sum(len(self.piece_bytes(i)) for i in ids) + 16  # (each id checked first: `_check_token_id`)
        arr, _ = _array_of(lib.llama_token, len(ids))
        arr[:len(ids)] = ids
        buf, cap = _array_of(ctypes.c_char, cap)
        n = lib.llama_detokenize(self._open_vocab(), arr, len(ids), buf, cap, False, True)
        if n < 0:
            buf, cap = _array_of(ctypes.c_char, -n)
            n = lib.llama_detokenize(self._vocab, arr, len(ids), buf, cap, False, True)
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
            raise TokenizerError("reading a tokenizer.json needs the tokenizers package; run `pip install 'tmplkit[vocab]'`") from None
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception on bad JSON
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TokenizerError(f"{path} is not a usable tokenizer.json ({first}); give the model's own tokenizer.json, "
                                 "or a .gguf or vocab:NAME") from None
        if self._tok.get_vocab_size(with_added_tokens=True) == 0:
            raise TokenizerError(f"{path} has no vocabulary; give the model's tokenizer.json")
        _refuse_sparse_ids(self._tok, path)
        self.path = path
        self.name = name or (path.parent.name + "/" + path.name if path.parent.name else path.name)
        self.n_vocab = self._tok.get_vocab_size(with_added_tokens=True)
        self.add_bos = add_bos

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; with add_bos (default: as opened), the tokenizer's own post-processing (BOS etc.) too."""
        add = self.add_bos if add_bos is None else add_bos
        return list(_hf_encode(self._tok, text, add).ids)

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], Offsets]:
        enc = _hf_encode(self._tok, text, False)
        return list(enc.ids), [(int(s), int(e)) for s, e in enc.offsets]

    def detokenize(self, ids: Sequence[int]) -> str:
        ids = list(ids)
        for i in ids:  # (`tokenizers` decodes an id past the vocabulary as "", and -1 as an OverflowError)
            _check_token_id(self, i)
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        return self.detokenize([token_id])


class GGUFBPETokenizer(HFTokenizer):
    """A GGUF's BPE vocabulary rebuilt in the `tokenizers` package (`gguf_vocab`), for a machine
    without llama-cpp-python: the same ids as llama.cpp, special tokens parsed, BOS/EOS as the
    vocabulary says when asked."""

    def __init__(self, path: str | os.PathLike, *, add_bos: bool = False, name: str | None = None):
        path = Path(path)
        self._tok, vocab_bos, vocab_eos, bos_id, eos_id, self._eog = gguf_bpe_tokenizer(path)
        self.path = path
        self.name = name or path.name
        self.n_vocab = self._tok.get_vocab_size(with_added_tokens=True)
        self.add_bos = add_bos
        # llama_tokenize's add_special: BOS and EOS where the vocabulary adds them
        self._bos = [bos_id] if vocab_bos and bos_id is not None else []
        self._eos = [eos_id] if vocab_eos and eos_id is not None else []
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values()}
        self._pieces: dict[int, bytes] = {}

    def __repr__(self) -> str:
        return f"GGUFBPETokenizer({str(self.path)!r})"

    def is_eog(self, token_id: int) -> bool:
        """Whether the token ends a generation, as llama.cpp's `llama_vocab_is_eog` says."""
        _check_token_id(self, token_id)  # (as llama.cpp's tokenizer refuses one: not False for no id)
        return token_id in self._eog

    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, as llama.cpp's `token_to_piece`: a special or
        user-defined token is its own text (some vocabularies add plain text such as "ö" that
        way), any other is GPT-2's printable characters mapped back to bytes."""
        cached = self._pieces.get(token_id)
        if cached is None or type(token_id) is not int:
            _check_token_id(self, token_id)  # (an id past the vocabulary has no piece, not b"")
        if cached is None:
            text = self._tok.id_to_token(int(token_id)) or ""
            cached = text.encode("utf-8") if text in self._special else byte_level_bytes(text)
            self._pieces[token_id] = cached
        return cached

    def piece(self, token_id: int) -> str:
        return self.piece_bytes(token_id).decode("utf-8", "replace")

    def detokenize(self, ids: Sequence[int]) -> str:
        return b"".join(self.piece_bytes(i) for i in ids).decode("utf-8", "replace")

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        ids = list(_hf_encode(self._tok, text, False).ids)
        return self._bos + ids + self._eos if (self.add_bos if add_bos is None else add_bos) else ids


_ARRAY_TYPES: dict[tuple[Any, int], Any] = {}


def _array_of(item: Any, n: int):
    """(a zeroed ctypes array of `item`, its length): at least `n` long, rounded up to an eighth of
    its power of two (8 types an octave, at most 1/8 more than asked: a whole power of two doubled
    a long text's buffer). A type made for each length (`llama_token * n`,
    `create_string_buffer(n)`) costs its making at every call (5% of tokenizing 3,000 short texts)
    and is left as garbage in a cycle that only the collector frees: thousands in a long session's
    study."""
    step = 1 << max(3, max(n, 64).bit_length() - 4)
    size = -(-max(n, 64) // step) * step
    kind = _ARRAY_TYPES.get((item, size))
    if kind is None:
        kind = _ARRAY_TYPES[item, size] = item * size
    return kind(), size


def _check_token_id(tokenizer, token_id) -> None:
    """TokenizerError unless `token_id` is an integer id of `tokenizer`'s vocabulary (`n_vocab`;
    llama.cpp reads its tables at an id unchecked, and std::out_of_range aborts the process)."""
    if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < tokenizer.n_vocab:
        raise TokenizerError(f"token id {token_id!r} is not in the vocabulary of {tokenizer.n_vocab} tokens of "
                             f"{tokenizer.name}; give ids this tokenizer made")


def _memory_limited() -> bool:
    """Whether this process runs under an address-space limit (a worker's --memory)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return False
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


def fewest_tokens(tokenizer, text: str) -> int:
    """A bound below the tokens `text` has, without tokenizing it (0 for a tokenizer that does not
    bound the bytes a token stands for: `LlamaCppTokenizer.max_token_bytes`): a text too long for a
    context is refused at once, not after minutes of tokenizing tens of millions of tokens."""
    longest = getattr(tokenizer, "max_token_bytes", lambda: None)()
    if not longest or not text:
        return 0
    return -(-len(utf8(text)) // longest)


def utf8(text: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (half of a UTF-16 pair, which a Python str can hold) is
    refused in one line, as a conversation file holding one is."""
    try:
        return text.encode("utf-8")
    except AttributeError:  # (None, bytes, a number: no text to tokenize)
        raise TypeError(f"the text to tokenize must be a str, got {type(text).__name__}") from None
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"the text holds '\\u{ord(text[exc.start]):04x}', half of a UTF-16 pair and no character, "
                             "which no tokenizer can encode; fix the text") from None


# How far a tokenizer.json's ids may run past its count of tokens (gaps where a model reserves ids):
# an id far beyond was a damaged file, which `tokenizers` then copied into a table that long
# (gigabytes, minutes) when the tokenizer was pickled for a worker.
_ID_SLACK = 1 << 20


def _refuse_sparse_ids(tok, path: Path) -> None:
    vocab = tok.get_vocab(with_added_tokens=True)
    top = max(vocab.values(), default=0)
    if top >= len(vocab) + _ID_SLACK:
        token = next(t for t, i in vocab.items() if i == top)
        raise TokenizerError(f"{path}: token {token[:40]!r} has id {top}, far past the vocabulary's {len(vocab)} tokens "
                             "(a damaged tokenizer.json); give the model's own tokenizer.json, or a .gguf or vocab:NAME")


def _hf_encode(tok, text: str, add_special_tokens: bool):
    """`tok.encode` of the `tokenizers` package, whose refusal of a lone surrogate (a TypeError) is
    `utf8`'s one line; nothing is checked before the call (a long render is read once)."""
    try:
        return tok.encode(text, add_special_tokens=add_special_tokens)
    except TypeError:
        utf8(text)
        raise
    except Exception as exc:  # (the Rust side's refusal, a plain Exception: "Missing [UNK] token from the vocabulary")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(f"the tokenizer cannot tokenize the text ({first}): its tokenizer.json is damaged or "
                             "incomplete; give the model's own tokenizer.json, or a .gguf or vocab:NAME") from None


def _gguf_tokenizer(path: Path, add_bos: bool, name: str | None = None) -> Tokenizer:
    """llama.cpp's tokenizer of a GGUF; without llama-cpp-python, the same vocabulary rebuilt in
    `tokenizers` where `gguf_vocab` can (BPE vocabularies of the pre-types it knows)."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None and importlib.util.find_spec("tokenizers") is not None:
        if supports(path):
            return GGUFBPETokenizer(path, add_bos=add_bos, name=name)
    return LlamaCppTokenizer(path, add_bos=add_bos, name=name)


def load_tokenizer(spec: str | os.PathLike, *, add_bos: bool = False) -> Tokenizer:
    """Open a tokenizer from a path or spec.

    - a `.gguf` file (a model or a vocab-only GGUF): llama.cpp, vocab only;
    - a `tokenizer.json` file, or a folder holding one: Hugging Face tokenizers;
    - `vocab:NAME`: a vocab-only GGUF of the pinned llama.cpp corpus, e.g. `vocab:qwen35`;
    - `hf:ORG/NAME`: the repo's tokenizer.json in the local Hugging Face cache (never downloads).

    >>> tok = load_tokenizer("vocab:qwen35")   # doctest: +SKIP
    """
    kind, path, name = locate_tokenizer(spec)
    if kind == "gguf":
        return _gguf_tokenizer(path, add_bos, name=name)
    return HFTokenizer(path, add_bos=add_bos, name=name)


def locate_tokenizer(spec: str | os.PathLike) -> tuple[str, Path, str | None]:
    """The file `spec` names, without loading it (a file's first bytes tell GGUF from JSON): ("gguf"
    or "json", its path, the name a tokenizer opened from it takes; None: its path's).
    TokenizerError, the loader's own, where it names nothing there (a missing file, a vocab the
    corpus lacks, a repo not in the cache): commands check their tokenizers with it before any work."""
    parsed = TokenizerSpec.parse(spec)
    text = parsed.text
    if not text.strip():  # (an empty path is the current folder to Path)
        raise TokenizerError(f"the tokenizer is empty; {_GIVE}")
    if parsed.kind == "vocab":
        try:
            return "gguf", corpus.vocab_path(parsed.name), text
        except SourceError as exc:
            raise TokenizerError(str(exc)) from None
    if parsed.kind == "hf":
        return "json", _hf_cached(parsed.name), f"hf:{parsed.name}"
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return "json", path / "tokenizer.json", None
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0], None
        raise TokenizerError(f"{path} holds no tokenizer.json (and not exactly one .gguf); give the file itself")
    if not path.exists():
        # ORG/NAME, a Hub repository; a path that names a tokenizer file is a file not found
        if text.count("/") == 1 and not text.startswith((".", "/", "~")) and path.suffix.lower() not in (".json", ".gguf"):
            return "json", _hf_cached(text), f"hf:{text}"
        raise TokenizerError(f"tokenizer file not found: {path}; {_GIVE}")
    if not path.is_file():
        raise TokenizerError(f"{path} is not a file; {_GIVE}")
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise TokenizerError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head[:4] == b"GGUF":
        return "gguf", path, None
    if path.suffix == ".json" or head.lstrip()[:1] == b"{":
        return "json", path, None
    if path.suffix == ".gguf":
        raise TokenizerError(f"{path} is not a GGUF file (no GGUF magic); it may be damaged or a Git LFS pointer")
    raise TokenizerError(f"{path} is neither a GGUF file nor a tokenizer.json; {_GIVE}")


def _hf_cached(repo_id: str) -> Path:
    """The repo's tokenizer.json in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise TokenizerError("reading the Hugging Face cache needs huggingface_hub; run `pip install huggingface_hub`") from None
    try:
        found = try_to_load_from_cache(repo_id, "tokenizer.json")
    except Exception as exc:  # invalid repo id
        raise TokenizerError(f"'{repo_id}' is not a Hugging Face repo id ({exc})") from None
    if not isinstance(found, str):
        raise TokenizerError(f"no tokenizer.json for '{repo_id}' in the local Hugging Face cache; download it first "
                             f"(e.g. `hf download {repo_id} tokenizer.json`) or give a path")
    return Path(found)
