"""The GGUF BPE vocabularies rebuilt in `tokenizers` tokenize exactly as llama.cpp does: ids,
offsets and BOS on every corpus template's round-trip render with its paired vocabulary, and on
text that exercises each pre-type's expressions; without llama-cpp-python the loader opens them."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tmplkit.analysis import analyze
from tmplkit.errors import TokenizerError
from tmplkit.sources import corpus, load_one
from tmplkit.tokens.gguf_vocab import PRE_TYPES, supports
from tmplkit.tokens.roundtrip import corpus_pairs
from tmplkit.tokens.tokenizers import GGUFBPETokenizer, LlamaCppTokenizer, load_tokenizer

pytestmark = pytest.mark.corpus

# Our own text: contractions, digit runs, mixed scripts, runs of spaces and newlines, punctuation
# next to letters, marks, trailing spaces: where the pre-types' expressions differ.
SAMPLES = (
    "I'll say it's 1234567 + 89 = ?  They'RE here.\n\n\n  indented\tcode() {x:=[1,2]}\r\n",
    "Héllo wörld, naïve café — 東京タワー 서울 Ωmega K 𝐀 \u0301combining e\u0301 ‘quotes’ ！全角",
    "<|im_start|>user\n<tool_response>\n{\"ok\": true}\n</tool_response><|im_end|>\n   \n",
    "trailing spaces   ",
)


def _vocabs() -> list[str]:
    if not corpus.is_fetched():
        return []
    return sorted({v for _, v in corpus_pairs() if supports(corpus.vocab_path(v))})


@pytest.fixture(scope="module")
def pairs():
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    opened: dict[str, tuple] = {}

    def get(vocab: str):
        if vocab not in opened:
            path = corpus.vocab_path(vocab)
            opened[vocab] = (GGUFBPETokenizer(path), LlamaCppTokenizer(path))
        return opened[vocab]

    return get


def test_the_corpus_vocabularies_templates_pair_with_are_rebuilt():
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    # every BPE vocabulary a corpus template pairs with: the pre-types the table covers
    assert set(_vocabs()) == set(PRE_TYPES)
    assert {"phi-3", "gemma-4"}.isdisjoint(_vocabs())  # SentencePiece-style: llama.cpp only


@pytest.mark.parametrize("vocab", _vocabs())
def test_samples_tokenize_as_llama_cpp(pairs, vocab):
    ours, ref = pairs(vocab)
    for text in SAMPLES:
        assert ours.tokenize(text) == ref.tokenize(text), text
        assert ours.tokenize_with_offsets(text) == ref.tokenize_with_offsets(text), text
    assert ours.tokenize("x", add_bos=True) == ref.tokenize("x", add_bos=True)
    ids = ref.tokenize(SAMPLES[1])
    assert ours.detokenize(ids) == ref.detokenize(ids)
    assert [ours.piece(i) for i in ids] == [ref.piece(i) for i in ids]


def test_an_id_no_vocabulary_has_is_refused_as_llama_cpp_refuses_it(pairs):
    """The rebuilt vocabulary gave b"" for an id past its end, False for is_eog, an OverflowError for
    -1, and the piece of 7 for 7.0 (a table keyed by id): each is one TokenizerError, as llama.cpp's."""
    ours, ref = pairs("qwen35")
    ours.piece_bytes(7), ours.is_eog(7)  # (kept in its tables first: 7.0 must not find them)
    for bad in (7.0, ref.n_vocab, 10**9, -1):
        for tok in (ours, ref):
            for ask in (tok.piece_bytes, tok.piece, tok.is_eog):
                with pytest.raises(TokenizerError, match="is not in the vocabulary"):
                    ask(bad)
    assert ours.piece_bytes(np.int64(7)) == ref.piece_bytes(7) == b"("


def test_every_corpus_round_trip_render_tokenizes_as_llama_cpp(pairs):
    checked = 0
    for name, vocab in corpus_pairs():
        if not supports(corpus.vocab_path(vocab)):
            continue
        rt = analyze(load_one(corpus.templates_dir() / f"{name}.jinja")).round_trip
        if rt is None or not rt.rendered:
            continue
        ours, ref = pairs(vocab)
        assert ours.tokenize(rt.rendered) == ref.tokenize(rt.rendered), name
        checked += 1
    assert checked >= 20


def test_without_llama_cpp_the_loader_rebuilds_the_vocabulary(monkeypatch):
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    tok = load_tokenizer("vocab:qwen35")
    assert isinstance(tok, GGUFBPETokenizer)
    assert tok.tokenize("<|im_start|>user\n") == [151644, 872, 198]
    assert tok.name == "vocab:qwen35"


def test_a_vocabulary_it_does_not_rebuild_is_a_one_line_error():
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    path = corpus.vocab_path("phi-3")
    assert not supports(path)
    with pytest.raises(TokenizerError, match="needs llama-cpp-python") as exc:
        GGUFBPETokenizer(path)
    assert "\n" not in str(exc.value)


def test_a_damaged_bpe_vocabulary_is_a_one_line_error(tmp_path):
    # merges that name tokens the vocabulary lacks: tokenizers refuses them; the user gets one line
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b"])
    w.add_token_merges(["x y"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert supports(path)
    with pytest.raises(TokenizerError, match="does not load") as exc:
        GGUFBPETokenizer(path)
    assert "\n" not in str(exc.value)


def test_a_turns_study_with_the_rebuilt_vocabulary_is_llama_cpps(pairs):
    """Without llama-cpp-python a GGUF opens as the rebuilt vocabulary: the turns study takes it as
    it takes llama.cpp's (its delimiters tokenized with offsets it reads itself, the held turn cut
    at the token that ends generation): the same report whole."""
    from tmplkit.session import generate_session
    from tmplkit.turns import study_turns

    template = load_one("corpus:llama.cpp", "Qwen3.5-4B")
    session = generate_session(3000, seed=0, style="agent", requests=2)
    rebuilt, llama = pairs("qwen35")
    reports = [study_turns(template, session, tokenizer=tok, switches=False).to_dict() for tok in (rebuilt, llama)]
    assert reports[0]["cost"] is not None and "tmplkit" in reports[0]["cost"]["totals"]
    assert reports[0]["divergences"] and reports[0]["notes"] == []
    assert reports[0] == reports[1]


@pytest.mark.parametrize("vocab", _vocabs())
def test_the_tokens_that_end_generation_are_llama_cpps(pairs, vocab):
    rebuilt, llama = pairs(vocab)
    ours = {i for i in range(rebuilt.n_vocab) if rebuilt.is_eog(i)}
    assert ours and ours == {i for i in range(llama.n_vocab) if llama.is_eog(i)}


@pytest.mark.parametrize("damage, says", [
    ("duplicate", "token 4 repeats the text of token 3"),
    ("no newline byte", "no token for byte 0x0A, which its SentencePiece tokenizer falls back to"),
])
def test_a_vocabulary_llama_cpp_would_abort_on_is_refused_before_it_loads(tmp_path, damage, says):
    # (llama.cpp asserted at load on a token repeated, and threw an uncaught `at` when a text needed a
    # byte its SentencePiece vocabulary lacks: the process died with SIGABRT and a backtrace)
    gguf = pytest.importorskip("gguf")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    path = tmp_path / "damaged.gguf"
    path.write_bytes(corpus.vocab_path("llama-spm").read_bytes())
    reader = gguf.GGUFReader(str(path), "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    if damage == "duplicate":
        field.parts[field.data[4]][:] = field.parts[field.data[3]][:]  # (`<0x01>` made `<0x00>`: same length)
    else:
        for i in field.data:
            if bytes(field.parts[i]) == b"<0x0A>":
                field.parts[i][:] = np.frombuffer(b"<0xZZ>", dtype=np.uint8)
    reader.data.flush()
    del reader
    with pytest.raises(TokenizerError, match=says) as exc:
        load_tokenizer(str(path))
    assert "\n" not in str(exc.value) and "llama.cpp would abort" in str(exc.value)
    load_tokenizer("vocab:llama-spm").close()  # (the vocabulary it was made from loads)


def test_a_vocabulary_is_checked_once_per_file_as_it_stands(tmp_path, monkeypatch):
    # (each check reads every token, 0.1-0.3 s; a runner or a suite loads one model again and again)
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    from tmplkit.tokens import vocab_check

    path = tmp_path / "v.gguf"
    path.write_bytes(corpus.vocab_path("qwen35").read_bytes())
    reads = []
    real = vocab_check.read_metadata
    monkeypatch.setattr(vocab_check, "read_metadata", lambda *a, **k: reads.append(1) or real(*a, **k))
    assert vocab_check.checked_vocabulary(path) == vocab_check.checked_vocabulary(path) == ("gpt2", None)
    assert len(reads) == 1
    path.write_bytes(path.read_bytes() + b"\0")  # (changed: read again)
    assert vocab_check.checked_vocabulary(path) == ("gpt2", None) and len(reads) == 2
