"""Tokenizer adapters, their errors, and delimiters as tokens derived in context."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmplkit.analysis import Analysis, RoundTrip
from tmplkit.delimiters import Delimiter, split_text
from tmplkit.errors import SourceError, TokenizerError
from tmplkit.sources import corpus
from tmplkit.tokens.delimiter_ids import token_delimiters, tokenize_delimiters
from tmplkit.tokens.spans import SpanDetector
from tmplkit.tokens.tokenizers import HFTokenizer, Tokenizer, load_tokenizer

needs_corpus = pytest.mark.skipif(not corpus.is_fetched(), reason="the llama.cpp corpus is not fetched (tmplkit corpus fetch)")


@pytest.fixture(scope="module")
def tiny_hf(tiny_hf_folder):
    return tiny_hf_folder


def _check_offsets(tok: Tokenizer, text: str):
    ids, offsets = tok.tokenize_with_offsets(text)
    assert ids == tok.tokenize(text)
    assert len(offsets) == len(ids)
    prev_end = 0
    for s, e in offsets:
        assert 0 <= s <= e <= len(text)
        assert s >= prev_end - 1  # a multi-byte character split across tokens is covered by both
        prev_end = max(prev_end, e)
    return ids, offsets


# ---- llama.cpp -------------------------------------------------------------------------------


def test_llama_special_tokens_parsed_no_bos(qwen35):
    ids = qwen35.tokenize("<|im_start|>user\n")
    assert ids == [151644, 872, 198]
    assert qwen35.piece(151644) == "<|im_start|>"
    assert qwen35.detokenize(ids) == "<|im_start|>user\n"
    assert qwen35.name == "vocab:qwen35"
    assert isinstance(qwen35, Tokenizer)


def test_llama_offsets_the_real_case(qwen35):
    # `<tool_response>` is not one token, `>\n` is: the delimiter ends inside a token.
    text = "<|im_start|>user\n<tool_response>\nok"
    ids, offsets = _check_offsets(qwen35, text)
    pieces = [text[s:e] for s, e in offsets]
    assert pieces[:7] == ["<|im_start|>", "user", "\n", "<", "tool", "_response", ">\n"]
    end = len("<|im_start|>user\n<tool_response>")
    assert not any(e == end for _, e in offsets)


def test_llama_offsets_multibyte_split_across_tokens(qwen35):
    text = "héllo ünïcødé 😀😀 日本語テキスト\n"
    ids, offsets = _check_offsets(qwen35, text)
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    # every whole-character token reads back as its piece
    for i, (s, e) in enumerate(offsets):
        raw = qwen35.piece_bytes(ids[i])
        if text[s:e].encode() == raw:
            continue
        assert raw in text[s:e].encode()  # a partial character: its bytes lie inside the characters it covers


def test_llama_spm_space_prefix_and_stripped_whitespace(phi3):
    text = "<|user|>\nHi there<|end|>\n<|assistant|>\nYo<|end|>\n"
    ids, offsets = _check_offsets(phi3, text)
    assert phi3.piece(ids[0]) == "<|user|>"
    assert offsets[0] == (0, 8)
    covered = "".join(text[s:e] for s, e in offsets)
    assert "Hi" in covered and "Yo" in covered


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "user", "\n", " ", "\n\n", "é", "😀", "日本",
                                  "<tool_response>", "ab", "  x", "\t", "1234"]), max_size=30))
def test_llama_offsets_property(qwen35, parts):
    text = "".join(parts)
    ids, offsets = _check_offsets(qwen35, text)
    if text:  # byte-level BPE: the tokens cover the text exactly
        assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    data = b"".join(qwen35.piece_bytes(i) for i in ids)
    assert data == text.encode()


def _offsets_one_by_one(tok, text: str, ids) -> list[tuple[int, int]]:
    """Each token's character offsets the slow way: its piece found in the text's bytes where the
    pieces join to them, each byte offset counted in characters (the bytes that start one)."""
    data = text.encode()
    pieces = [tok.piece_bytes(i) for i in ids]
    assert b"".join(pieces) == data
    chars = [0]
    for b in data:
        chars.append(chars[-1] + ((b & 0xC0) != 0x80))
    # (a token may start or end inside a character: it covers all of it; byte k is in character
    # chars[k + 1] - 1)
    out, at = [], 0
    for p in pieces:
        start, end = at, at + len(p)
        first = chars[start + 1] - 1 if start < len(data) else len(text)
        out.append((first, chars[end] if end > start else first))
        at = end
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["<|im_start|>", "<|im_end|>", "user", "\n", " ", "é", "😀", "日本", "\u0301",
                                  "<tool_response>", "ab", "\t", "1234", "ü\n"]), min_size=1, max_size=40))
def test_offsets_read_off_the_vocabularys_table_are_those_of_each_piece(qwen35, parts):
    """`offsets_of` maps a whole request's byte offsets to characters at once (numpy): the offsets
    are those counted piece by piece, ids given as a list or as an array."""
    text = "".join(parts)
    ids = qwen35.tokenize(text)
    got_ids, offsets = qwen35.offsets_of(text, ids)
    assert got_ids == ids and offsets == _offsets_one_by_one(qwen35, text, ids)
    assert qwen35.offsets_of(text, np.asarray(ids, dtype=np.int32))[1] == offsets


def test_offsets_of_ids_the_vocabulary_lacks_are_refused(qwen35):
    for bad in ([-1], [qwen35.n_vocab], [1.0]):
        with pytest.raises(TokenizerError, match="is not in the vocabulary"):
            qwen35.offsets_of("x", bad)


def test_add_bos_only_when_asked(phi3):
    assert phi3.tokenize("hi")[0] != 1
    assert phi3.tokenize("hi", add_bos=True)[0] == 1


# ---- Hugging Face ------------------------------------------------------------------------------


def test_hf_file_and_folder(tiny_hf):
    for spec in (tiny_hf, tiny_hf / "tokenizer.json", str(tiny_hf / "tokenizer.json")):
        tok = load_tokenizer(spec)
        assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    text = "<|im_start|>user\nhéllo 😀x<|im_end|>\n"
    ids, offsets = _check_offsets(tok, text)
    assert tok.piece(ids[0]) == "<|im_start|>" and offsets[0] == (0, 12)
    assert tok.detokenize(ids) == text
    assert offsets[-1][1] == len(text)


def test_hf_refuses_an_id_its_vocabulary_lacks(tiny_hf):
    """`tokenizers` decodes an id past the vocabulary as "" and -1 as an OverflowError: each is one
    TokenizerError here, as in llama.cpp's tokenizer."""
    tok = load_tokenizer(tiny_hf)
    start = tok.tokenize("<|im_start|>")[0]
    assert tok.piece(start) == "<|im_start|>" and tok.detokenize([np.int64(start)]) == "<|im_start|>"
    for bad in (float(start), tok.n_vocab, 10**9, -1):
        with pytest.raises(TokenizerError, match="is not in the vocabulary"):
            tok.piece(bad)
        with pytest.raises(TokenizerError, match="is not in the vocabulary"):
            tok.detokenize([start, bad])


@pytest.mark.parametrize("text", [None, b"hi", 5])
def test_a_text_that_is_no_str_is_named_by_every_tokenizer(text, qwen35, tiny_hf):
    """An AttributeError ('NoneType' object has no attribute 'encode') from inside before."""
    for tok in (qwen35, load_tokenizer(tiny_hf)):
        for call in (tok.tokenize, tok.tokenize_with_offsets):
            with pytest.raises(TypeError, match="the text to tokenize must be a str, got " + type(text).__name__):
                call(text)


def test_hf_add_bos_default_is_as_opened(tiny_hf, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import processors

    tok = tokenizers.Tokenizer.from_file(str(tiny_hf / "tokenizer.json"))
    start = tok.token_to_id("<|im_start|>")
    tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", start)])
    tok.save(str(tmp_path / "tokenizer.json"))
    plain, bos = load_tokenizer(tmp_path), load_tokenizer(tmp_path / "tokenizer.json", add_bos=True)
    assert bos.tokenize("hello") == [start] + plain.tokenize("hello")
    assert plain.tokenize("hello", add_bos=True) == bos.tokenize("hello")
    assert bos.tokenize("hello", add_bos=False) == plain.tokenize("hello")


def test_hf_cache_spec(tiny_hf, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    shutil.copy(tiny_hf / "tokenizer.json", snap / "tokenizer.json")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    tok = load_tokenizer("hf:acme/tiny")
    assert tok.name == "hf:acme/tiny" and tok.tokenize("<|im_end|>") == [1]
    with pytest.raises(TokenizerError, match="not in|no tokenizer.json"):
        load_tokenizer("hf:acme/missing")


# ---- errors: one line, a TokenizerError --------------------------------------------------------


def _one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg and msg
    return msg


def test_missing_file(tmp_path):
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(tmp_path / "nope.gguf")
    assert "not found" in _one_line(e)


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(bad)
    assert "not a GGUF" in _one_line(e)
    other = tmp_path / "vocab.bin"
    other.write_bytes(b"\x00\x01garbage")
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(other)
    assert "neither a GGUF file nor a tokenizer.json" in _one_line(e)


def test_gguf_without_vocabulary(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "novocab.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("no vocab here")
    w.add_context_length(128)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(path)
    assert "has no vocabulary" in _one_line(e)


@needs_corpus
def test_truncated_gguf(tmp_path):
    data = corpus.vocab_path("qwen35").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:5000])
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(cut)
    assert "corrupted or truncated" in _one_line(e)


def test_bad_tokenizer_json(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(bad)
    assert "not a usable tokenizer.json" in _one_line(e) and "give the model's own tokenizer.json" in _one_line(e)
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(tmp_path)  # the folder holds that same bad file
    _one_line(e)


def test_unknown_vocab_and_empty_folder(tmp_path):
    if corpus.is_fetched():
        with pytest.raises(TokenizerError) as e:
            load_tokenizer("vocab:no-such-vocab")
        assert "no vocab" in _one_line(e)
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(tmp_path)
    assert "no tokenizer.json" in _one_line(e)


# ---- delimiters as tokens, in context ----------------------------------------------------------

QWEN_RENDER = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nRun it.<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"run\"}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nok 1\n</tool_response>\n<tool_response>\nok 2\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nDone.<|im_end|>\n"
    "<|im_start|>user\nThanks<|im_end|>\n"
)
QWEN_DELIMS = (
    Delimiter("tool", "<|im_start|>user\n<tool_response>"),
    Delimiter("tool", "</tool_response>\n<tool_response>"),
    Delimiter("system", "<|im_start|>system"),
    Delimiter("assistant", "<|im_start|>assistant"),
    Delimiter("user", "<|im_start|>user"),
)
QWEN_ROLES = ("system", "user", "assistant", "tool", "tool", "assistant", "user")


def _analysis(delims, rendered, expected, name="test"):
    rt = RoundTrip(True, tuple(expected), tuple(expected), rendered=rendered)
    return Analysis(name=name, source=name, status="pass", delimiters=tuple(delims), round_trip=rt)


def test_token_delimiters_qwen35_tool_response_ends_inside_a_token(qwen35):
    assert [s.role for s in split_text(QWEN_RENDER, QWEN_DELIMS)] == list(QWEN_ROLES)
    td = token_delimiters(_analysis(QWEN_DELIMS, QWEN_RENDER, QWEN_ROLES), qwen35)
    assert td.passed, td.problems
    by_text = {d.text: d for d in td.delimiters}
    tool = by_text["<|im_start|>user\n<tool_response>"]
    assert tool.occurrences == 1 and not tool.aligned and tool.stable
    assert tool.ids == (151644, 872, 198, 27, 14172, 9655)  # `>\n` dropped
    assert tool.token_text == "<|im_start|>user\n<tool_response"
    assert "ends inside token '>\\n'" in tool.adjusted
    # tokenized on its own (llama-server's way) it ends in `>`, which the render never holds
    assert tool.standalone_ids[-1] != tool.ids[-1] and tool.standalone_ids[:-1] == tool.ids
    nxt = by_text["</tool_response>\n<tool_response>"]
    assert nxt.ids[-2:] == (14172, 9655) and nxt.adjusted
    user = by_text["<|im_start|>user"]
    assert user.aligned and user.stable and user.adjusted is None and user.ids == (151644, 872)
    assert user.occurrences == 2
    # longest first, in tokens
    assert [len(d.ids) for d in td.delimiters] == sorted((len(d.ids) for d in td.delimiters), reverse=True)
    # exports
    md = td.message_delimiters()
    assert {"role": "tool", "delimiter": "<|im_start|>user\n<tool_response"} in md
    assert {"role": "user", "ids": [151644, 872]} in td.id_lists()
    assert json.loads(json.dumps(td.to_dict()))["passed"] is True
    # and the ids split the tokenized render into the expected roles
    assert SpanDetector(td).split(qwen35.tokenize(QWEN_RENDER)).roles == QWEN_ROLES


def test_core_takes_delimiters_and_a_render(qwen35):
    # the core needs no Analysis: the same result from the delimiters and the render alone
    via_analysis = token_delimiters(_analysis(QWEN_DELIMS, QWEN_RENDER, QWEN_ROLES, name="qwen"), qwen35)
    core = tokenize_delimiters(reversed(QWEN_DELIMS), QWEN_RENDER, qwen35, template="qwen")
    assert core == via_analysis and core.template == "qwen" and core.passed
    # the names stay importable from their module and the package
    import tmplkit
    from tmplkit.tokens import delimiter_ids as token_delims

    assert token_delims.token_delimiters is token_delimiters is tmplkit.token_delimiters
    assert token_delims.TokenDelimiters is type(core)


def test_standalone_delimiters_miss_in_context(qwen35):
    """What llama-server does: tokenize the delimiter text alone. It misses every tool response."""
    ids = qwen35.tokenize(QWEN_RENDER)
    alone = SpanDetector([(d.role, d.text) for d in QWEN_DELIMS], tokenizer=qwen35).split(ids)
    assert alone.roles.count("tool") == 0
    assert alone.roles == ("system", "user", "assistant", "user", "assistant", "user")


def test_text_delimiter_starting_inside_a_token(qwen35):
    # `User:` style: the delimiter's leading newline merges with the one before it
    rendered = "System: be nice\n\nUser: hi\n\nAssistant: yo\n\nUser: bye\n\nAssistant:"
    delims = (Delimiter("user", "\nUser:"), Delimiter("assistant", "\nAssistant:"), Delimiter("system", "System:"))
    roles = ("system", "user", "assistant", "user", "assistant")
    assert [s.role for s in split_text(rendered, delims)] == list(roles)
    td = token_delimiters(_analysis(delims, rendered, roles), qwen35)
    assert td.passed, td.problems
    user = next(d for d in td.delimiters if d.role == "user")
    assert not user.aligned and "starts inside token" in user.adjusted
    assert SpanDetector(td).split(qwen35.tokenize(rendered)).roles == roles


def test_delimiter_absent_from_render_is_a_warning(qwen35):
    delims = QWEN_DELIMS + (Delimiter("tool", "<|im_start|>tool\n"),)
    td = token_delimiters(_analysis(delims, QWEN_RENDER, QWEN_ROLES), qwen35)
    assert td.passed
    extra = next(d for d in td.delimiters if d.text == "<|im_start|>tool\n")
    assert extra.occurrences == 0 and "unchecked" in extra.adjusted
    assert any("does not start a message" in w for w in td.warnings)


def test_token_delimiters_with_hf(tiny_hf):
    tok = load_tokenizer(tiny_hf)
    rendered = ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nworld<|im_end|>\n"
                "<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n")
    delims = (Delimiter("user", "<|im_start|>user\n"), Delimiter("assistant", "<|im_start|>assistant\n"),
              Delimiter("tool", "<|im_start|>user\n<tool_response>"))
    roles = ("user", "assistant", "tool")
    td = token_delimiters(_analysis(delims, rendered, roles), tok)
    assert td.passed, td.problems
    assert SpanDetector(td).split(tok.tokenize(rendered)).roles == roles


def test_no_delimiters_fails_cleanly(tiny_hf):
    td = token_delimiters(_analysis((), "x", ()), load_tokenizer(tiny_hf))
    assert not td.passed and td.problems


@pytest.mark.parametrize("given", ["<|im_start|>user\n", None, {"delimiters": (), "status": "pass"}])
def test_token_delimiters_refuses_what_is_no_analysis(tiny_hf, given):
    # (read by attribute, these came back as a failed result, "no delimiters were given": a
    # template's text or a dict passed by mistake looked like an analysis without delimiters)
    with pytest.raises(TypeError, match=r"expected an Analysis, got \w+: give tmplkit.analyze\(TEMPLATE\)"):
        token_delimiters(given, load_tokenizer(tiny_hf))


def test_whitespace_dropped_after_special_token_is_noted(phi3):
    # llama.cpp strips the newline after phi-3's special tokens: the delimiter's "\n" has no token
    rendered = "<|system|>\nS<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n<|user|>\nBye<|end|>\n"
    delims = (Delimiter("system", "<|system|>\n"), Delimiter("user", "<|user|>\n"), Delimiter("assistant", "<|assistant|>\n"))
    roles = ("system", "user", "assistant", "user")
    td = token_delimiters(_analysis(delims, rendered, roles), phi3)
    assert td.passed, td.problems
    user = next(d for d in td.delimiters if d.role == "user")
    assert user.ids == tuple(phi3.tokenize("<|user|>")) and user.token_text == "<|user|>"
    assert "drops" in user.adjusted
    assert SpanDetector(td).split(phi3.tokenize(rendered)).roles == roles


def test_neighbour_merging_at_some_occurrences_only():
    """DeepSeek's markers as text in the Llama 3 vocab: after `...｜>` the `<` of the next marker
    merges into `><`, after a word it does not. The ids match from a boundary common to all."""
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched")
    tok = load_tokenizer("vocab:llama-bpe")
    rendered = ("<|begin_of_text|>sys<｜User｜>hi<｜Assistant｜>yo<｜end▁of▁sentence｜><｜User｜>bye"
                "<｜Assistant｜>ok<｜end▁of▁sentence｜><｜User｜>x<｜Assistant｜>")
    delims = (Delimiter("user", "<｜User｜>"), Delimiter("assistant", "<｜Assistant｜>"))
    roles = ("user", "assistant", "user", "assistant", "user", "assistant")
    td = token_delimiters(_analysis(delims, rendered, roles), tok)
    assert td.passed, td.problems
    user = next(d for d in td.delimiters if d.role == "user")
    assert not user.stable and user.token_text.startswith("｜User") and "differ between its 3 occurrences" in user.adjusted
    assert SpanDetector(td).split(tok.tokenize(rendered)).roles == roles


def test_ids_survive_content_that_merges_with_the_delimiter_end(qwen35):
    """`...<tool_response>\\n` ends in the token `>\\n`; a response starting with a newline turns
    it into `>\\n\\n`. The ids stop before it, so real conversations still match."""
    delims = (Delimiter("tool", "<|im_start|>user\n<tool_response>\n"), Delimiter("user", "<|im_start|>user\n"),
              Delimiter("assistant", "<|im_start|>assistant\n"))
    probe = ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"
             "<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n")
    roles = ("user", "assistant", "tool")
    td = token_delimiters(_analysis(delims, probe, roles), qwen35)
    assert td.passed, td.problems
    tool = next(d for d in td.delimiters if d.role == "tool")
    assert tool.aligned and tool.token_text == "<|im_start|>user\n<tool_response"
    assert "content starting with '\\n'" in tool.adjusted
    real = probe.replace("<tool_response>\nresult", "<tool_response>\n\n  indented result") + "<|im_start|>user\n\nnext"
    assert SpanDetector(td).split(qwen35.tokenize(real)).roles == ("user", "assistant", "tool", "user")
    # the exact tokens of the text would have missed the tool response
    exact = [(d.role, qwen35.tokenize(d.text)) for d in delims]
    assert SpanDetector(exact).split(qwen35.tokenize(real)).roles != ("user", "assistant", "tool", "user")


def test_variants_where_no_single_sequence_marks_every_occurrence():
    """`</think>` after `<think>` tokenizes as `></ think >`, after a word as `</ think >`; and
    `think >` alone also ends `<think>`. Only matching both variants marks exactly the starts."""
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched")
    tok = load_tokenizer("vocab:deepseek-llm")
    rendered = "<｜User｜>q1</think>a1<｜User｜>q2<think>z</think>a2<｜User｜>q3<think></think>a3"
    delims = (Delimiter("user", "<｜User｜>"), Delimiter("assistant", "</think>"))
    roles = ("user", "assistant", "user", "assistant", "user", "assistant")
    assert [s.role for s in split_text(rendered, delims)] == list(roles)
    td = token_delimiters(_analysis(delims, rendered, roles), tok)
    assert td.passed, td.problems
    think = next(d for d in td.delimiters if d.text == "</think>")
    assert len(think.alternatives) == 1 and "variants" in think.adjusted
    assert {m["delimiter"] for m in td.message_delimiters() if m["role"] == "assistant"} == {"</think>", "></think>"}
    assert len([x for x in td.id_lists() if x["role"] == "assistant"]) == 2
    assert SpanDetector(td).split(tok.tokenize(rendered)).roles == roles


# Corpus templates that render the generated agent session, each with a vocabulary of its family:
# BPE vocabularies (llama.cpp tokenizes the text between special tokens alone, so the ids are
# reused) and SentencePiece ones (a space prefix after a special token: tokenized whole instead).
_INCREMENTAL = [("Qwen3.5-4B", "qwen35"), ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "llama-bpe"),
                ("deepseek-ai-DeepSeek-V3.1", "deepseek-llm"), ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "command-r"),
                ("google-gemma-4-31B-it", "gemma-4"), ("microsoft-Phi-3.5-mini-instruct", "phi-3"),
                ("mistralai-Mistral-Nemo-Instruct-2407", "llama-spm")]


def _agent_requests(name: str, vocab: str):
    """(template, tokenizer, session, requests): a generated agent session on corpus template `name`
    with corpus vocabulary `vocab` (skipped without llama-cpp-python, the corpus or the template)."""
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched")
    from tmplkit.session import generate_session
    from tmplkit.sources import load_one
    from tmplkit.turns import session_requests

    try:
        template = load_one("corpus:llama.cpp", name)
    except SourceError:
        pytest.skip(f"{name} is not in the corpus")
    session = generate_session(6000, seed=3, style="agent", requests=3)
    return template, load_tokenizer(f"vocab:{vocab}"), session, session_requests(session, template)


@pytest.mark.corpus
@pytest.mark.parametrize("name,vocab", _INCREMENTAL)
def test_a_session_tokenized_from_shared_beginnings_is_tokenized_as_a_whole(name, vocab):
    """Each request reuses the ids of the one before up to a control token they share: the ids are
    exactly those of the request tokenized whole, with and without a BOS, and for the next renders
    tokenized from their request's ids."""
    from tmplkit.turns import next_renders
    from tmplkit.turns.divergence import tokenize_texts

    template, tok, session, reqs = _agent_requests(name, vocab)
    texts = [r.text for r in reqs]
    for add_bos in (False, True):
        bos = tok.tokenize("", add_bos=True) if add_bos else []
        whole = [tuple(ids if not bos or ids[:len(bos)] == bos else bos + ids) for ids in (tok.tokenize(t, add_bos=False) for t in texts)]
        assert tokenize_texts(texts, tok, add_bos=add_bos) == tuple(whole)
    pool: list = []  # (the turns study keeps one across requests: each render starts from its nearest)
    for k, renders in enumerate(next_renders(session, template, reqs)[:8]):
        whole = tuple(tuple(tok.tokenize(t, add_bos=False)) for t in renders)
        shared = tokenize_texts(renders, tok, base=(texts[k], tok.tokenize(texts[k], add_bos=False)), chain=False)
        assert shared == whole
        assert tokenize_texts(renders, tok, base=(texts[k], tok.tokenize(texts[k], add_bos=False)), pool=pool) == whole
        bos = tuple(tok.tokenize("", add_bos=True))
        assert tokenize_texts(renders, tok, add_bos=True, pool=pool) == tuple(w if w[:len(bos)] == bos else bos + w for w in whole)


@pytest.mark.corpus
@pytest.mark.parametrize("name,vocab", _INCREMENTAL)
def test_where_next_renders_diverge_is_read_as_from_their_whole_ids(name, vocab):
    """The divergence-aware policy's predicted positions: a next render's ids are read only up to
    the control token after where it diverges (`tokenize_until`), and each position is the one its
    ids tokenized whole give, with and without a BOS."""
    from tmplkit.markup import lcp
    from tmplkit.turns import next_renders
    from tmplkit.turns.cost import predicted_divergences
    from tmplkit.turns.divergence import tokenize_requests

    template, tok, session, reqs = _agent_requests(name, vocab)
    nxt = next_renders(session, template, reqs)
    seen = 0
    for add_bos in (False, True):
        bos = tuple(tok.tokenize("", add_bos=True)) if add_bos else ()
        tokens = tokenize_requests(reqs, tok, add_bos=add_bos)
        whole = []
        for k, renders in enumerate(nxt):
            ids = [tuple(tok.tokenize(t, add_bos=False)) for t in renders]
            at = {lcp(tokens.held(k), i if not bos or i[:len(bos)] == bos else bos + i) for i in ids}
            whole.append(tuple(sorted(p for p in at if p < len(tokens.held(k)))))
        assert predicted_divergences(tokens, nxt, tok, add_bos=add_bos, texts=[r.text for r in reqs]) == tuple(whole)
        seen += sum(map(len, whole))
    if vocab == "qwen35":
        assert seen  # (Qwen3.5 drops earlier reasoning at a new user message: positions to predict)


@pytest.mark.corpus
@pytest.mark.parametrize("vocab", ["qwen35", "gemma-4", "phi-3"])
def test_where_a_token_ends_from_its_pieces_is_where_the_offsets_say(vocab):
    """The turns study reads where token j of a request ends from the ids it already has (their
    pieces' bytes); it must equal the tokenizer's own offsets, multi-byte characters included."""
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched")
    from tmplkit.turns.divergence import _token_end

    tok = load_tokenizer(f"vocab:{vocab}")
    text = "<|im_start|>user\nhéllo wörld 漢字 🙂 and   spaces\n<|im_end|>\n<start_of_turn>model\nok 🙂🙂 ü<end_of_turn>" * 20
    ids, offsets = tok.tokenize_with_offsets(text)
    assert tok.piece_lengths(ids) == [len(tok.piece_bytes(i)) for i in ids]
    assert tok.piece_lengths(tuple(ids)) == tok.piece_lengths(list(ids)) and tok.piece_lengths([]) == []
    assert [_token_end(tok, text, ids, j) for j in range(len(ids))] == [e for _, e in offsets]


def test_an_id_outside_the_vocabulary_is_a_tokenizer_error_not_an_abort():
    # llama.cpp reads its table unchecked: std::out_of_range ended the whole process (SIGABRT)
    code = ("import tmplkit\nt = tmplkit.load_tokenizer('vocab:qwen35')\n"
            "for f in (lambda: t.detokenize([10**12]), lambda: t.piece(-1), lambda: t.is_eog(10**9)):\n"
            "    try:\n        f()\n    except tmplkit.TokenizerError as e:\n        print('refused', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("refused token id") == 3, proc.stderr


def test_an_id_that_is_no_integer_is_refused_even_where_the_integer_was_asked_before(qwen35):
    """`is_eog` and `piece_bytes` keep their answers per id: a float equal to an id asked before
    finds that answer in the table, and must still be refused as the first time."""
    eog = qwen35.tokenize("<|im_end|>", add_bos=False)[0]
    assert qwen35.is_eog(eog) is True
    with pytest.raises(TokenizerError, match="is not in the vocabulary"):
        qwen35.is_eog(float(eog))
    # the pieces too (kept per id for the offsets of every token of a session)
    assert qwen35.piece_bytes(eog) == b"<|im_end|>" and qwen35.piece_bytes(np.int64(eog)) == b"<|im_end|>"
    with pytest.raises(TokenizerError, match="is not in the vocabulary"):
        qwen35.piece_bytes(float(eog))
    with pytest.raises(TokenizerError, match="is not in the vocabulary"):
        qwen35.piece(float(eog))
    # and the lengths read off the vocabulary's table (7.5 was read as 7, an id past it an IndexError)
    assert qwen35.piece_lengths([eog, np.int64(eog)]) == [len(b"<|im_end|>")] * 2
    for bad in ([eog, 7.5], [qwen35.n_vocab], [-1], [float(eog)]):
        with pytest.raises(TokenizerError, match="is not in the vocabulary"):
            qwen35.piece_lengths(bad)
    # and detokenize, which filled llama.cpp's array before it checked them (ctypes' TypeError)
    assert qwen35.detokenize(np.array([eog])) == "<|im_end|>"
    for bad in ([eog, 7.5], [None], ["7"]):
        with pytest.raises(TokenizerError, match="is not in the vocabulary"):
            qwen35.detokenize(bad)


def _special_soup(tok, n: int, seed: int = 0) -> bytes:
    """`n` parts: the vocabulary's special tokens (the longest and the shortest, some cut in half)
    between bits of text and whitespace, side by side and overlapping as a cut must survive."""
    import random

    rnd = random.Random(seed)
    texts = list(tok.special_texts().texts)
    choices = texts[:40] + texts[-40:]
    words = [b"hello", b" world", b"\n", b"  ", b" ", b"\n\n", "é漢".encode(), b"x", b"<", b"|", b">", b"[", b"]"]
    parts = []
    for _ in range(n):
        if rnd.random() < 0.4:
            t = rnd.choice(choices)
            parts.append(t[:max(1, len(t) // 2)] if rnd.random() < 0.2 else t)
        else:
            parts.append(rnd.choice(words))
    return b"".join(parts)


@pytest.mark.corpus
def test_a_long_text_cut_where_llama_cpp_splits_it_has_the_ids_of_the_whole():
    """llama.cpp's one call is quadratic in a text's special tokens, so a long text is tokenized in
    pieces cut before special tokens (`_cuts`): on every vocabulary of the corpus the pieces' ids are
    the whole text's, with and without a BOS (cut at every special token it can be, or every 40 bytes)."""
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched")
    from tmplkit.tokens._cuts import cuts
    from tmplkit.tokens.tokenizers import LlamaCppTokenizer

    checked = 0
    for path in sorted((corpus.vocab_path("qwen35").parent).glob("*.gguf")):
        tok = LlamaCppTokenizer(path)
        if tok.special_texts() is None:
            continue
        data = _special_soup(tok, 2000)
        for add_bos, chunk in ((False, 1), (False, 40), (True, 1)):
            if not tok.may_cut(add_bos):
                continue  # (a vocabulary that ends a text with a token of its own when it adds the BOS: never cut)
            at = cuts(data, tok.special_texts(), chunk)
            pieces: list[int] = []
            for begin, end in zip([0, *at], [*at, len(data)]):
                pieces += tok._encode_call(data[begin:end], add_bos and not begin)
            assert len(at) > 100 and pieces == tok._encode_call(data, add_bos), (path.name, add_bos, chunk)
        checked += 1
    assert checked >= 15


@pytest.mark.corpus
def test_a_long_chat_is_tokenized_in_pieces_as_a_whole(qwen35):
    """`tokenize` of a text past the cut size: the same ids as llama.cpp's one call, in pieces."""
    from tmplkit.tokens._cuts import CHUNK

    text = "".join(f"<|im_start|>user\nmessage {i}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok {i}<|im_end|>\n"
                   for i in range(3 * CHUNK // 80))
    assert len(text) > 2 * CHUNK and qwen35._cuts(text.encode(), False)
    assert qwen35.tokenize(text, add_bos=True) == qwen35._encode_call(text.encode(), True)
    assert qwen35.tokenize_with_offsets(text)[0] == qwen35._encode_call(text.encode(), False)


def _partition(data: bytes, order) -> list:
    """llama.cpp's `tokenizer_st_partition` as a model: each special text in `order`, its leftmost
    occurrences taken one after another in every piece of raw text not yet taken."""
    frags: list = [(0, len(data))]
    for t in order:
        out: list = []
        for f in frags:
            if isinstance(f, bytes):
                out.append(f)
                continue
            pos, hi = f
            while (m := data.find(t, pos, hi)) >= 0:
                out += [(pos, m)] if m > pos else []
                out.append(t)
                pos = m + len(t)
            out += [(pos, hi)] if pos < hi else []
        frags = out
    return [f if isinstance(f, bytes) else ("raw", data[f[0]:f[1]]) for f in frags]


_SMALL = st.text(alphabet="ab<>", min_size=1, max_size=4).map(str.encode)


@given(st.lists(_SMALL, min_size=1, max_size=6, unique=True), st.text(alphabet="ab<>", max_size=80).map(str.encode))
@settings(max_examples=400, deadline=None)
def test_cuts_are_where_the_partition_splits_anyway(specials, data):
    """Whatever the special texts (nested, overlapping, of one length), the pieces between the cuts
    partition as the whole text does, in either order llama.cpp may take texts of one length."""
    from tmplkit.tokens._cuts import SpecialTexts, cuts

    sp = SpecialTexts.of(specials, [False] * len(specials))
    at = cuts(data, sp, 1)
    for order in (sorted(specials, key=lambda t: (-len(t), t)), sorted(specials, key=lambda t: (-len(t), tuple(-c for c in t)))):
        whole = _partition(data, order)
        pieces = [f for begin, end in zip([0, *at], [*at, len(data)]) for f in _partition(data[begin:end], order)]
        assert pieces == whole, (order, at)


# ---- a bound below a text's tokens, without tokenizing it ---------------------------------------------------

@pytest.mark.parametrize("vocab", ["qwen35", "llama-spm", "gpt-2", "bert-bge", "phi-3", "command-r"])
def test_fewest_tokens_is_never_more_than_a_text_has(vocab):
    from tmplkit.sources.corpus import is_fetched
    from tmplkit.tokens.tokenizers import fewest_tokens

    pytest.importorskip("llama_cpp")
    if not is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    tok = load_tokenizer(f"vocab:{vocab}")
    longest = tok.max_token_bytes()
    if vocab == "bert-bge":  # (WordPiece drops whitespace: 5,000 spaces are no token; no bound)
        assert longest is None and fewest_tokens(tok, " " * 5000) == 0 == len(tok.tokenize(" " * 5000))
        return
    assert longest >= max(len(tok.piece_bytes(i)) for i in range(0, tok.n_vocab, 97))
    for text in ("", "hello world " * 300, "é日本😀" * 200, " " * 5000, "\n\t" * 700, "<|im_start|>user\nhi<|im_end|>" * 60,
                 "x" * 20000, "<0x0A>" * 300, "".join(chr(c) for c in range(32, 3000))):
        n = len(tok.tokenize(text))
        assert fewest_tokens(tok, text) <= n, (vocab, text[:20], n)
    assert fewest_tokens(tok, "a" * (100 * longest)) == 100


def test_fewest_tokens_of_a_tokenizer_that_does_not_say_its_longest_token_is_none():
    from tmplkit.tokens.tokenizers import fewest_tokens

    assert fewest_tokens(object(), "x" * 10**6) == 0


def test_a_tokenized_texts_table_is_kept_while_its_ids_are_held(qwen35, monkeypatch):
    """`tokenize_after` keeps each result's table (where its control tokens lie) for the next text
    that starts from it. A table whose ids the caller still holds is kept past the cache's bound (a
    294k-token study holds every request's ids and read their tables again: dropping them by count
    built 450 anew, 1.5 s); those of ids no one else holds are dropped."""
    from tmplkit.tokens import tokenizers

    monkeypatch.setattr(tokenizers, "_SPELLINGS_KEPT", 100)
    tok = tokenizers.LlamaCppTokenizer(qwen35.path)
    built, of = [], tokenizers._Spelled.of
    monkeypatch.setattr(tokenizers._Spelled, "of", lambda *a: built.append(1) or of(*a))
    held, base = [], None
    for k in range(8):  # (a chain, as a session's requests are tokenized: each from the one before)
        text = f"<|im_start|>user\nrequest {k}: " + "read the file again " * 10 + "<|im_end|>\n"
        held.append(tok.tokenize_after(text, base))
        base = (text.encode(), held[-1])
    assert sum(map(len, held)) >= 4 * tokenizers._SPELLINGS_KEPT
    built.clear()
    for ids in held:
        tok._spelled(ids)
    assert not built  # every table still there: no ids read again (before: the first six)
    del held[:6], base
    for k in range(40):  # more, past the bound: the tables of the ids let go are dropped
        tok.tokenize_after(f"<|im_start|>user\nmore {k} " + "words " * 30 + "<|im_end|>\n", None)
    assert len(tok._spellings) < 20 and all(id(ids) in tok._spellings for ids in held)


def test_tokenizing_leaves_no_garbage_for_the_collector(qwen35):
    """Each call's buffer was an array of a type made for its length: a type per call, left in a
    cycle only the collector frees (two thousand in a long session's study)."""
    import gc

    qwen35.tokenize("warm up")
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for k in range(200):
            assert qwen35.detokenize(qwen35.tokenize("word " * k + "<|im_end|>")) == "word " * k + "<|im_end|>"
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert "PyCArrayType" not in kinds


def _word_level(tmp_path, vocab: dict):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                                "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                                "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    return path


def test_a_tokenizer_json_with_an_id_far_past_its_vocabulary_is_refused_as_it_loads(tmp_path):
    # (taken: pickled for a worker, `tokenizers` built a table that long: 12 GB and no output for a minute)
    pytest.importorskip("tokenizers")
    with pytest.raises(TokenizerError, match=r"token '\[UNK\]' has id 4000000000, far past the vocabulary's 2 tokens") as e:
        load_tokenizer(str(_word_level(tmp_path, {"a": 0, "[UNK]": 4_000_000_000})))
    assert "\n" not in str(e.value)


def test_a_tokenizer_json_that_cannot_tokenize_is_a_tokenizer_error_not_a_traceback(tmp_path):
    # (its unk_token missing from the vocabulary: `tokenizers` raised a plain Exception, and `audit`
    # printed a traceback with exit 1, a failed gate's code)
    pytest.importorskip("tokenizers")
    tok = load_tokenizer(str(_word_level(tmp_path, {"a": 0})))
    with pytest.raises(TokenizerError, match=r"cannot tokenize the text \(WordLevel error: Missing \[UNK\] token"):
        tok.tokenize("b")
