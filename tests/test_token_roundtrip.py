"""The token-level round trip: corpus templates with their corpus vocab, the table, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit.analysis import Analysis, RoundTrip
from tmplkit.delimiters import Delimiter, split_text
from tmplkit.session.token_spans import conversation_spans
from tmplkit.sources import corpus
from tmplkit.tokens.roundtrip import (
    VOCAB_FOR_TEMPLATE,
    corpus_pairs,
    token_round_trip,
    vocab_for_template,
)
from tmplkit.tokens.tokenizers import load_tokenizer

EXPECTED_FAILURES_FILE = Path(__file__).with_name("token_roundtrip_expected_failures.json")
EXPECTED_FAILURES: dict[str, str] = json.loads(EXPECTED_FAILURES_FILE.read_text(encoding="utf-8"))


def _analysis(delims, rendered, expected, name="t"):
    return Analysis(name=name, source=name, status="pass", delimiters=tuple(delims),
                    round_trip=RoundTrip(True, tuple(expected), tuple(expected), rendered=rendered))


@pytest.fixture(scope="module")
def tokenizers_cache():
    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    cache = {}

    def get(vocab):
        if vocab not in cache:
            cache[vocab] = load_tokenizer(f"vocab:{vocab}")
        return cache[vocab]

    return get


# ---- the table -------------------------------------------------------------------------------


def test_vocab_table_is_one_table_of_known_vocabs():
    assert vocab_for_template("Qwen3.5-4B") == "qwen35"
    assert vocab_for_template("Qwen-Qwen3-0.6B") == "qwen2"
    assert vocab_for_template("meta-llama-Llama-3.3-70B-Instruct") == "llama-bpe"
    assert vocab_for_template("microsoft-Phi-3.5-mini-instruct") == "phi-3"
    assert vocab_for_template("google-gemma-4-31B-it") == "gemma-4"
    assert vocab_for_template("unsloth-gpt-oss-20b") is None
    assert all(kind in ("exact", "base") for _, _, kind in VOCAB_FOR_TEMPLATE)
    if corpus.is_fetched():
        known = set(corpus.list_vocabs())
        assert {v for _, v, _ in VOCAB_FOR_TEMPLATE} <= known
        names = {p.stem for p in corpus.templates_dir().glob("*.jinja")}
        # every pattern matches some corpus template, and the expected failures name real pairs
        import re

        assert all(any(re.search(p, n) for n in names) for p, _, _ in VOCAB_FOR_TEMPLATE)
        assert set(EXPECTED_FAILURES) <= {n for n, _ in corpus_pairs()}


# ---- the round trip, on a written analysis ---------------------------------------------------

RENDER = ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
          "<|im_start|>user\n<tool_response>\nT\n</tool_response><|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n")
DELIMS = (Delimiter("tool", "<|im_start|>user\n<tool_response>"), Delimiter("system", "<|im_start|>system\n"),
          Delimiter("assistant", "<|im_start|>assistant\n"), Delimiter("user", "<|im_start|>user\n"))


def test_token_round_trip_passes_and_fails_honestly(tokenizers_cache):
    tok = tokenizers_cache("qwen35")
    roles = ("system", "user", "assistant", "tool", "assistant")
    assert [s.role for s in split_text(RENDER, DELIMS)] == list(roles)
    rt = token_round_trip(_analysis(DELIMS, RENDER, roles), tok)
    assert rt.passed and rt.actual_roles == roles and rt.n_tokens == len(tok.tokenize(RENDER))
    d = json.loads(json.dumps(rt.to_dict()))
    assert d["passed"] and d["delimiters"]["tokenizer"] == "vocab:qwen35"
    # an expectation the delimiters cannot meet fails, with the reason
    bad = token_round_trip(_analysis(DELIMS, RENDER, ("system", "user", "assistant", "user", "assistant")), tok)
    assert not bad.passed and "expected" in bad.problems[0]
    # no render to tokenize
    empty = token_round_trip(Analysis(name="x", source="x", status="error", delimiters=DELIMS), tok)
    assert not empty.passed and empty.problems


PLAIN = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")


def test_a_delimiter_ending_inside_a_token_is_not_widened_into_the_content(tokenizers_cache):
    """`assistant: ` ends inside BPE's ` K` (its space joined to the probe's first letter): widened to
    whole tokens its ids were `assistant: K`, which split the probe render, whose contents all open
    with K, as the text and passed, and matched no assistant message of a real conversation (its
    spans went to the user, and `request` gave llama-server `assistant: K`; Mistral's `[/INST] ` so)."""
    from tmplkit.analysis import analyze
    from tmplkit.sources import ChatTemplate

    analysis = analyze(ChatTemplate(text=PLAIN, name="plain", source="test"))
    tok = tokenizers_cache("llama-bpe")
    rt = token_round_trip(analysis, tok)
    (assistant,) = [d for d in rt.delimiters.delimiters if d.role == "assistant"]
    assert assistant.token_text == "assistant:" and "K" not in "".join(d.token_text for d in rt.delimiters.delimiters)
    # those ids also match the generation prompt `assistant:` at the render's end, where the next
    # assistant turn opens (the text split misses it for the space): a start, said in a warning
    assert rt.passed and rt.delimiters.prompt_start == rt.n_tokens - 2, rt.problems
    assert any("also match the render's end ('assistant:'" in w for w in rt.delimiters.warnings)
    chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."},
            {"role": "user", "content": "Thanks"}]
    from tmplkit.sandbox import render
    from tmplkit.tokens.spans import SpanDetector

    ids = tok.tokenize(render(ChatTemplate(text=PLAIN, name="plain", source="test"), chat))
    spans = SpanDetector([(d.role, d.ids) for d in rt.delimiters.delimiters]).split(ids)
    assert spans.roles == ("user", "assistant", "user")


COLONS = ("{%- if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set msgs = messages[1:] %}"
          "{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
          "{% for m in msgs %}{% if m.role == 'user' %}{{ 'User: ' + ((sys + '\\n\\n') if loop.first and sys else '') + "
          "m.content + '\\n\\n' }}{% elif m.role == 'assistant' %}{{ 'Assistant: ' + m.content + eos_token }}{% endif %}"
          "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")


def test_a_delimiter_is_not_cut_back_to_punctuation_any_message_may_write(tokenizers_cache):
    """`User: ` after `</s>` (one token `>User` in llama-bpe) was cut back to its one token common to
    every occurrence, `:`: the probe's contents hold no colon, so it split the probe as the text and
    passed, and every colon of a real message opened a user span (Hub: microsoft bitnet's
    `Assistant: `, BAAI Emu3's `USER: ` and `TOOL: `)."""
    from tmplkit.analysis import analyze
    from tmplkit.sandbox import render
    from tmplkit.sources import ChatTemplate
    from tmplkit.tokens.spans import SpanDetector

    template = ChatTemplate(text=COLONS, name="colons", source="test", eos_token="</s>")
    tok = tokenizers_cache("llama-bpe")
    rt = token_round_trip(analyze(template), tok)
    assert all(any(c.isalnum() for c in d.token_text) for d in rt.delimiters.delimiters), rt.delimiters.id_lists()
    chat = [{"role": "user", "content": "Give me a list"},
            {"role": "assistant", "content": "Here it is: apples, pears. Note: ripe ones only."},
            {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You are welcome"}]
    if rt.passed:  # (proven: then every message in a span of its own, no colon opening one)
        ids = [(d.role, q) for d in rt.delimiters.delimiters for q in (d.ids,) + d.alternatives]
        spans = SpanDetector(ids).split(tok.tokenize(render(template, chat)))
        assert spans.roles == ("user", "assistant", "user", "assistant"), spans.roles


HASHES = ("{% for m in messages %}{% if m.role == 'system' %}{{ '### System:\n' + m.content + '\n\n' }}"
          "{% elif m.role == 'user' %}{{ '### User:\n' + m.content + '\n\n' }}"
          "{% elif m.role == 'assistant' %}{{ '### Assistant:\n' + m.content }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '### Assistant:\n' }}{% endif %}")


def test_a_delimiter_at_the_start_of_a_text_is_matched_as_sentencepiece_spells_it_there(tokenizers_cache):
    """SentencePiece writes a word space before a text's first piece: `### User:` starts `▁###` there
    and `##` `#` after a newline. The probe starts with a system message, so the user's ids came
    from mid-text only, and a conversation that opens with a user message (most do) got no span for
    it while the audit passed (the Hub's Upstage SOLAR Instruct writes this template)."""
    from tmplkit.analysis import analyze
    from tmplkit.sandbox import render
    from tmplkit.sources import ChatTemplate
    from tmplkit.tokens.spans import SpanDetector

    template = ChatTemplate(text=HASHES, name="hashes", source="test")
    tok = tokenizers_cache("llama-spm")
    rt = token_round_trip(analyze(template), tok)
    assert rt.passed, rt.problems
    # the whole generation prompt at the render's end is the text split's own start, not one the ids
    # alone find: no warning that it opens "without the whitespace its content follows"
    assert rt.delimiters.prompt_start is None and not any("render's end" in w for w in rt.delimiters.warnings)
    chat = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help?"},
            {"role": "user", "content": "Tell me a joke"}]
    for add_bos in (False, True):  # (after BOS, a control token, SentencePiece writes the space as well)
        ids = tok.tokenize(render(template, chat), add_bos=add_bos)
        spans = SpanDetector(rt.delimiters).split(ids)
        assert spans.roles == ("user", "assistant", "user") and spans[0].pos == int(add_bos), (add_bos, spans)


MARKED = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{{ '<|user|>' + m.content }}"
          "{% elif m.role == 'assistant' %}{{ '<|assistant|>' + m.content }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_delimiter_after_content_is_matched_whatever_the_content_ends_with(tokenizers_cache):
    """A textual `<|assistant|>` written right after the user's content, in a vocabulary without it
    as a token: the probe's contents all end in `Zx`, and `?<` is one token in llama-bpe, so after a
    question the assistant's ids were not there, and its turn went to the user's span."""
    from tmplkit.analysis import analyze
    from tmplkit.sandbox import render
    from tmplkit.sources import ChatTemplate
    from tmplkit.tokens.spans import SpanDetector

    template = ChatTemplate(text=MARKED, name="marked", source="test", bos_token="<s>", eos_token="</s>")
    chat = [{"role": "user", "content": "What is it?"}, {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": "Sure."}, {"role": "assistant", "content": "Yes!"}]
    for vocab in ("llama-bpe", "qwen2"):
        tok = tokenizers_cache(vocab)
        rt = token_round_trip(analyze(template), tok)
        assert rt.passed, rt.problems
        spans = SpanDetector(rt.delimiters).split(tok.tokenize(render(template, chat)))
        assert spans.roles == ("user", "assistant", "user", "assistant"), (vocab, spans.roles)


def test_a_delimiter_with_markup_is_not_cut_back_to_a_bare_word(tokenizers_cache):
    """`</think>` after varied neighbours shares the core `think>` at every occurrence, and the step
    that drops what content merges with (`>K`) cut it to `think`, after the check that a candidate
    keeps something of its delimiter had run: every "I think" opened an assistant span (DeepSeek
    V3.2's assistant start on its own vocabulary, Kimi K2's reasoning end)."""
    from tmplkit.tokens.delimiter_ids import tokenize_delimiters
    from tmplkit.tokens.spans import SpanDetector

    delims = [Delimiter("assistant", "</think>"), Delimiter("user", "<|user|>")]
    render = "<|user|>KqU1Zx</think>KqA1Zx<|user|>KqU2Zx\n</think>KqA2Zx<|user|>KqU3Zx </think>KqA3Zx"
    for vocab in ("llama-bpe", "gpt-2", "llama-spm"):
        tok = tokenizers_cache(vocab)
        td = tokenize_delimiters(delims, render, tok)
        assert td.passed, td.problems
        for text in [d.token_text for d in td] + [t for d in td for t in d.alternative_texts]:
            assert any(not c.isalnum() and not c.isspace() for c in text), (vocab, text)
        ids = tok.tokenize("<|user|>I think so, and you</think>Yes.")
        assert SpanDetector(td).split(ids).roles == ("user", "assistant"), vocab


# ---- across the corpus -------------------------------------------------------------------------


def _pairs():
    try:
        return corpus_pairs()
    except Exception:
        return []


def _analyze(name):
    try:
        from tmplkit.analysis import analyze
        from tmplkit.sources import load_one
    except ImportError:
        pytest.skip("tmplkit.analyze is not available")
    try:
        return analyze(load_one(corpus.templates_dir() / f"{name}.jinja"))
    except NotImplementedError:
        pytest.skip("tmplkit.analyze is not available in this checkout")


@pytest.mark.corpus
@pytest.mark.skipif(not corpus.is_fetched(), reason="the llama.cpp corpus is not fetched")
@pytest.mark.parametrize("name,vocab", _pairs(), ids=[n for n, _ in _pairs()])
def test_corpus_token_round_trip(tokenizers_cache, name, vocab):
    analysis = _analyze(name)
    if analysis.round_trip is None or not analysis.round_trip.passed:
        pytest.skip(f"the text round trip does not pass ({analysis.status}); the audit reports it")
    rt = token_round_trip(analysis, tokenizers_cache(vocab))
    if name in EXPECTED_FAILURES:
        assert not rt.passed, f"{name} passes now: remove it from {EXPECTED_FAILURES_FILE.name}"
        pytest.xfail(EXPECTED_FAILURES[name])
    assert rt.passed, "; ".join(rt.problems)
    assert rt.actual_roles == tuple(analysis.round_trip.expected_roles)


# ---- the CLI and its library twin ----------------------------------------------------------------


@pytest.fixture
def written_analysis(monkeypatch):
    """Stand in for analyze() with the written Qwen delimiters, so the CLI path runs on its own."""
    from tmplkit import analysis as module

    def fake(template):
        from tmplkit.sandbox import render

        msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
                {"role": "tool", "content": "T"}, {"role": "assistant", "content": "B"}]
        rendered = render(template, msgs)
        roles = tuple(s.role for s in split_text(rendered, DELIMS))
        return _analysis(DELIMS, rendered, roles, name=template.name)

    monkeypatch.setattr(module, "analyze", fake)


def test_spans_cli_and_library(tokenizers_cache, tmp_path, capsys):
    # (the real analysis on both sides: the command analyzes in its worker, where no stand-in reaches)
    pytest.importorskip("tmplkit.sandbox")
    from tmplkit.cli import main
    from tmplkit.sources import load_one

    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps([
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {}}}]},
        {"role": "tool", "content": "a.py\nb.py"}, {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "Thanks."}]))
    template_path = corpus.templates_dir() / "Qwen3.5-4B.jinja"
    lib = conversation_spans(load_one(template_path), tokenizers_cache("qwen35"), conv)
    assert lib.spans.roles == ("system", "user", "assistant", "tool", "assistant", "user")

    assert main(["spans", "--template", str(template_path), "--tokenizer", "vocab:qwen35", str(conv)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(json.dumps(lib.to_dict()))
    assert [s["role"] for s in out["spans"]] == list(lib.spans.roles)
    assert out["user_starts"] == lib.spans.starts("user")

    assert main(["spans", "--template", str(template_path), "--tokenizer", "vocab:qwen35", "--format", "text", str(conv)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1].startswith("system")


def test_spans_cli_bad_tokenizer_is_one_line(tmp_path, capsys):
    from tmplkit.cli import main

    conv = tmp_path / "conv.json"
    conv.write_text('[{"role": "user", "content": "hi"}]')
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    # without the extra, the refusal to open any GGUF comes first (tests/test_cli_conventions.py)
    pytest.importorskip("llama_cpp", reason="a .gguf tokenizer needs llama-cpp-python (the 'llama' extra)")
    assert main(["spans", str(tpl), "--tokenizer", str(tmp_path / "missing.gguf"), "--session", str(conv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tmplkit: error: tokenizer file not found") and err.count("\n") == 1


def test_spans_tokenize_the_conversation_once_and_judge_it_as_tokenized_twice(tokenizers_cache, monkeypatch):
    # `spans` tokenized its render once for the spans and again with offsets for the disagreements;
    # llama.cpp's offsets are read off the ids it has (a long session's render tokenized once).
    from tmplkit.analysis import analyze
    from tmplkit.session import render_conversation
    from tmplkit.session.token_spans import split_disagreements
    from tmplkit.sources import load_one
    from tmplkit.tokens.spans import SpanDetector

    tok = tokenizers_cache("qwen35")
    template = load_one(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    conv = [{"role": "user", "content": "List files."}, {"role": "assistant", "content": "<|im_start|>user\nquoted"},
            {"role": "user", "content": "Thanks."}]
    rendered = render_conversation(template, conv, add_generation_prompt=False)
    seen: list[str] = []
    cls = type(tok)
    real_tokenize, real_offsets = cls.tokenize, cls.tokenize_with_offsets
    monkeypatch.setattr(cls, "tokenize", lambda self, text, **k: seen.append(text) or real_tokenize(self, text, **k))
    monkeypatch.setattr(cls, "tokenize_with_offsets", lambda self, text: seen.append(text) or real_offsets(self, text))
    got = conversation_spans(template, tok, conv)
    assert seen.count(rendered) == 1
    monkeypatch.undo()
    assert got.spans.roles == ("user", "assistant", "user", "user")  # (the quoted header read as a start)
    assert got.disagreements == split_disagreements(rendered, analyze(template).delimiters, tok, SpanDetector(got.delimiters))
