"""A GGUF's BPE vocabulary as a Hugging Face `tokenizers` tokenizer: the token round trip without
compiling llama.cpp.

llama.cpp tokenizes a BPE ("gpt2") vocabulary in four steps, each rebuilt here from the GGUF alone:
split the text at special tokens (those whose type is control, user-defined or unknown: its
`cache_special_tokens`, src/llama-vocab.cpp), split each other fragment by the pre-type's regular
expressions in turn (`llm_tokenizer_bpe`, src/llama-vocab.cpp:280-400), map bytes to GPT-2's
printable characters, and merge by rank (for the llama3 pre-type a fragment that is itself a token
is taken whole: `ignore_merges`). BOS and EOS follow `tokenizer.ggml.add_bos_token` /
`add_eos_token`, else the pre-type's default (src/llama-vocab.cpp:2176-2185, 2636-2646).

Only the pre-types below are rebuilt, those of the corpus vocabularies that templates pair with;
`tests/test_gguf_vocab.py` holds the ids equal to llama.cpp's on every corpus render. Other
vocabularies (SentencePiece ones, other pre-types) still need llama-cpp-python.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ..errors import GGUFError, TokenizerError
from ..sources.gguf_meta import Keys, read_metadata

__all__ = ["PRE_TYPES", "byte_level_bytes", "gguf_bpe_tokenizer", "supports", "bytes_to_unicode"]

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)

# tokenizer.ggml.pre -> (regular expressions applied in turn, ignore_merges, default add_bos);
# the expressions as llama.cpp 0.3.36 writes them (src/llama-vocab.cpp:284-400).
PRE_TYPES: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "llama-bpe": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
                  True, True),
    "qwen2": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
              False, False),
    "qwen35": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
               False, False),
    "command-r": ((r"\p{N}", _GPT2), False, False),
    "deepseek-llm": (("[\r\n]", _DEEPSEEK_LETTERS, "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                      r"\s+$", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}+"),
                     False, False),
}

_SPECIAL_TYPES = {2, 3, 4}  # unknown, control, user-defined: the token types llama.cpp splits at
_K_PRE, _K_TYPES, _K_MERGES = "tokenizer.ggml.pre", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"
_K_ADD_BOS, _K_ADD_EOS = "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"

# The tokens that end a generation, as llama.cpp 0.3.36 finds them by their text
# (src/llama-vocab.cpp, `special_eog_ids`): a generated turn is held up to the first of them.
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
# Fill-in-the-middle tokens llama.cpp also counts as ending a generation: the metadata's id, else
# the first of these texts the vocabulary has.
_FIM_EOG = (
    (Keys.Tokenizer.FIM_PAD_ID, ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    (Keys.Tokenizer.FIM_REP_ID, ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    (Keys.Tokenizer.FIM_SEP_ID, ("<|file_sep|>",)),
)


def _byte_level_map() -> dict[str, int]:
    # GPT-2's bytes_to_unicode, inverted: printable bytes stand for themselves, the other 68 are
    # shifted to U+0100 upwards in byte order.
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(0x100 + i): b for i, b in enumerate(others)}


_BYTE_OF = _byte_level_map()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of bytes to printable characters (what a byte-level BPE vocabulary lists).

    >>> m = bytes_to_unicode(); m[ord("a")], m[ord(" ")]
    ('a', 'Ġ')
    """
    return {b: ch for ch, b in _BYTE_OF.items()}


def byte_level_bytes(token: str) -> bytes:
    """The bytes a byte-level BPE token's text stands for (a character outside the map as its UTF-8)."""
    out = bytearray()
    for ch in token:
        b = _BYTE_OF.get(ch)
        out += bytes([b]) if b is not None else ch.encode("utf-8")
    return bytes(out)


def _text(raw) -> str | None:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None


def supports(path: str | Path) -> bool:
    """Whether the GGUF's vocabulary is a BPE one of a pre-type rebuilt here (reads two keys).

    Asked once per template by `--tokenizer auto` and again when opening: the answer is kept per
    file state, since reading the header steps over every token string."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return False
    return _supports(str(p.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _supports(path: str, mtime_ns: int, size: int) -> bool:
    try:
        md = read_metadata(path, lambda k: k in (Keys.Tokenizer.MODEL, _K_PRE))
    except GGUFError:
        return False
    return _text(md.get(Keys.Tokenizer.MODEL)) == "gpt2" and _text(md.get(_K_PRE)) in PRE_TYPES


def gguf_bpe_tokenizer(path: str | Path):
    """(a `tokenizers.Tokenizer` that tokenizes as llama.cpp does with special tokens parsed,
    add_bos, add_eos, bos id, eos id, the ids that end a generation: `end_of_generation`) for a GGUF
    whose vocabulary `supports` says is rebuilt.

    Raises TokenizerError naming what is missing otherwise.
    """
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise TokenizerError("reading a GGUF vocabulary without llama-cpp-python needs the tokenizers package; "
                             "run `pip install 'tmplkit[vocab]'`") from None
    md = _read_vocab(Path(path))
    tokens = [md[Keys.Tokenizer.LIST][i].decode("utf-8", "replace") for i in range(len(md[Keys.Tokenizer.LIST]))]
    merges = [tuple(m.decode("utf-8", "replace").split(" ", 1)) for m in md[_K_MERGES].values()]
    regexes, ignore_merges, bos_default = PRE_TYPES[_text(md[_K_PRE]) or ""]
    vocab = {tok: i for i, tok in enumerate(tokens)}  # a repeated text keeps its last id, as in llama.cpp
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[m for m in merges if len(m) == 2], ignore_merges=ignore_merges))
    except Exception as exc:  # tokenizers raises a plain Exception on merges that name no token
        raise TokenizerError(f"{path}: its BPE vocabulary does not load ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                             "the file may be damaged: use llama-cpp-python ('tmplkit[llama]') or another GGUF") from None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    types = md.get(_K_TYPES) or []
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in _SPECIAL_TYPES and tokens[i]])
    add_bos = bool(md.get(_K_ADD_BOS, bos_default))
    add_eos = bool(md.get(_K_ADD_EOS, False))
    return tok, add_bos, add_eos, md.get(Keys.Tokenizer.BOS_ID), md.get(Keys.Tokenizer.EOS_ID), end_of_generation(vocab, md)


def end_of_generation(vocab: dict[str, int], md: dict) -> frozenset[int]:
    """The ids llama.cpp's `llama_vocab_is_eog` answers true for: `vocab` (text -> id) and the
    vocabulary's metadata, by the rules of `_EOG_TEXTS` and `_FIM_EOG`, less `<|end|>` where the
    vocabulary also ends generations with `<|call|>` or `<|calls|>` and with `<|return|>` (gpt-oss) or
    `<|flush|>`, and less `</s>` where `<|tool_response>` or `<|plamo:eos|>` is there."""
    n = len(md.get(Keys.Tokenizer.LIST) or ())
    eog = {i for text, i in vocab.items() if text in _EOG_TEXTS}
    for key, candidates in _FIM_EOG:
        found = md.get(key)
        if not isinstance(found, int):
            found = next((vocab[t] for t in candidates if t in vocab), None)
        if found is not None:
            eog.add(found)
    for key in (Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID):
        if isinstance(md.get(key), int):
            eog.add(md[key])
    texts = {vocab_text: i for vocab_text, i in vocab.items() if i in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
    return frozenset(i for i in eog if 0 <= i < n)


def _read_vocab(path: Path) -> dict:
    wanted = {Keys.Tokenizer.MODEL, _K_PRE, Keys.Tokenizer.LIST, _K_MERGES, _K_TYPES, _K_ADD_BOS, _K_ADD_EOS,
              Keys.Tokenizer.BOS_ID, Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID,
              *(key for key, _ in _FIM_EOG)}
    every = {Keys.Tokenizer.LIST: lambda md: set(range(len(md[Keys.Tokenizer.LIST]))),
             _K_MERGES: lambda md: set(range(len(md[_K_MERGES])))}
    try:
        md = read_metadata(path, lambda k: k in wanted, every)
    except GGUFError as exc:
        raise TokenizerError(str(exc)) from None
    model, pre = _text(md.get(Keys.Tokenizer.MODEL)), _text(md.get(_K_PRE))
    if model != "gpt2" or pre not in PRE_TYPES:
        raise TokenizerError(f"{path}: its vocabulary ({model or 'none'}, pre-tokenizer {pre or 'none'}) needs "
                             "llama-cpp-python; run `pip install 'tmplkit[llama]'`")
    if not isinstance(md.get(Keys.Tokenizer.LIST), dict) or not isinstance(md.get(_K_MERGES), dict):
        raise TokenizerError(f"{path}: no token list or merges in its vocabulary; give the model's GGUF or a vocab GGUF")
    return md
