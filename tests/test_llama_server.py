"""What tmplkit hands llama-server: the /completion body, its message_delimiters, and the split
llama-server makes with them (its algorithm, ported), without a server. The end-to-end run on a
real llama-server is in test_llama_server_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit import analyze
from tmplkit.cli import main
from tmplkit.errors import AnalysisError, TokenizerError
from tmplkit.sandbox import render
from tmplkit.server.process import (
    CompletionRequest,
    MessageDelimiter,
    _split_problem,
    completion_request,
    message_delimiters,
    read_prefill_log,
    server_message_starts,
)
from tmplkit.sources import corpus, load_one
from tmplkit.tokens.delimiter_ids import token_delimiters
from tmplkit.tokens.spans import SpanDetector

pytestmark = pytest.mark.corpus

# An agent turn: a user request, two tool calls answered in one user turn (Qwen3.5's template
# wraps tool responses in <|im_start|>user), a second user request.
CONVERSATION = {
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "run", "arguments": {"cmd": "pytest -x"}}},
            {"type": "function", "function": {"name": "read", "arguments": {"path": "a.py"}}}]},
        {"role": "tool", "content": "1 failed"},
        {"role": "tool", "content": "\ndef f():\n    return 1\n"},
        {"role": "assistant", "content": "Fixed."},
        {"role": "user", "content": "Thanks. Now run it again."},
    ],
    "tools": [{"type": "function", "function": {"name": "run", "description": "Run a command.",
                                                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}],
}
# llama-server's own two delimiters for this family (server_rules.SERVER_DELIMITERS)
SERVER_OWN = (MessageDelimiter("assistant", "<|im_start|>assistant"), MessageDelimiter("user", "<|im_start|>user"))


@pytest.fixture(scope="module")
def qwen_template():
    return load_one(str(corpus.templates_dir() / "Qwen3.5-4B.jinja"))


def test_completion_body_is_what_llama_server_reads(qwen_template, qwen35, tmp_path):
    req = completion_request(qwen_template, qwen35, CONVERSATION)
    body = req.to_dict()
    # exactly the fields tools/server reads: prompt, message_delimiters, cache_prompt
    assert set(body) == {"prompt", "message_delimiters", "cache_prompt"} and body["cache_prompt"] is True
    assert body["prompt"] == render(qwen_template, CONVERSATION["messages"], tools=CONVERSATION["tools"],
                                    add_generation_prompt=True)
    assert body["prompt"].endswith("<|im_start|>assistant\n<think>\n")  # the generation prompt
    assert all(set(d) == {"role", "delimiter"} and d["role"] in ("system", "user", "assistant", "tool")
               for d in body["message_delimiters"])
    # the text of tmplkit's token-checked delimiters, each tokenizing on its own to the checked ids
    td = token_delimiters(analyze(qwen_template), qwen35)
    assert {d.role for d in td} >= {"reasoning", "reasoning_end"}  # (Qwen3.5's, which the server is not given)
    assert sorted(map(json.dumps, body["message_delimiters"])) == sorted(map(json.dumps, td.message_delimiters()))
    assert {"role": "tool", "delimiter": "<|im_start|>user\n<tool_response"} in body["message_delimiters"]
    # longest first in tokens, since llama-server takes the first that matches
    lengths = [len(qwen35.tokenize(d["delimiter"])) for d in body["message_delimiters"]]
    assert lengths == sorted(lengths, reverse=True)
    assert json.loads(json.dumps(body)) == body
    with_n = completion_request(qwen_template, qwen35, CONVERSATION, n_predict=0, cache_prompt=False).to_dict()
    assert with_n["n_predict"] == 0 and with_n["cache_prompt"] is False


def test_llama_server_split_breaks_only_at_real_users_with_tmplkit_delimiters(qwen_template, qwen35):
    req = completion_request(qwen_template, qwen35, CONVERSATION)
    ids = qwen35.tokenize(req.prompt)
    tmplkit_spans = SpanDetector(token_delimiters(analyze(qwen_template), qwen35)).split(ids)
    real_users = tmplkit_spans.starts("user")
    tools = set(tmplkit_spans.starts("tool"))
    assert len(real_users) == 2 and tools
    ours = server_message_starts(ids, req.message_delimiters, qwen35)
    assert [p for r, p in ours if r == "user"] == real_users
    # llama-server's own two delimiters take the tool responses' user turn for a user message
    own = [p for r, p in server_message_starts(ids, SERVER_OWN, qwen35) if r == "user"]
    assert len(own) == 3 and set(own) - set(real_users) <= tools and set(own) & tools


def test_server_split_is_llama_servers_algorithm():
    # common_chat_msg_delimiters::split: first in list order wins, the scan moves on by one token
    class Chars:  # one token per character
        def tokenize(self, text, add_bos=False):
            return [ord(c) for c in text]

    ids = [ord(c) for c in "xUTyUz"]
    first_wins = server_message_starts(ids, [MessageDelimiter("user", "U"), MessageDelimiter("tool", "UT")], Chars())
    assert first_wins == [("user", 1), ("user", 4)]
    by_one = server_message_starts(ids, [MessageDelimiter("tool", "UT"), MessageDelimiter("user", "T")], Chars())
    assert by_one == [("tool", 1), ("user", 2)]  # a match inside the previous one counts


def test_a_split_that_misplaces_user_starts_is_refused(qwen_template, qwen35):
    prompt = render(qwen_template, CONVERSATION["messages"], tools=CONVERSATION["tools"])
    analysis = analyze(qwen_template)
    assert _split_problem(prompt, analysis.delimiters, message_delimiters(qwen_template, qwen35, analysis=analysis), qwen35) is None
    problem = _split_problem(prompt, analysis.delimiters, SERVER_OWN, qwen35)
    assert "3 user-message starts, the text has 2" in problem


def test_a_delimiter_that_tokenizes_otherwise_alone_is_refused(qwen_template, qwen35):
    class Retokenizing:  # the vocabulary, except that the tool delimiter alone gains a token
        name = "qwen35-variant"

        def __getattr__(self, attr):
            return getattr(qwen35, attr)

        def tokenize(self, text, add_bos=None):
            ids = qwen35.tokenize(text, add_bos=add_bos)
            return ids + [0] if text == "<|im_start|>user\n<tool_response" else ids

    with pytest.raises(AnalysisError, match="tokenizes on its own to .* not to the ids checked in context"):
        message_delimiters(qwen_template, Retokenizing())


def test_request_cli(qwen_template, qwen35, tmp_path, capsys):
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps(CONVERSATION))
    src = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    assert main(["request", src, "--session", str(conv), "--tokenizer", "vocab:qwen35"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == completion_request(qwen_template, qwen35, CONVERSATION).to_dict()
    assert main(["request", src, "--delimiters-only", "--tokenizer", "vocab:qwen35"]) == 0
    assert json.loads(capsys.readouterr().out) == body["message_delimiters"]
    out = tmp_path / "body.json"
    assert main(["request", src, "--session", str(conv), "--tokenizer", "vocab:qwen35", "--n-predict", "8", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["n_predict"] == 8
    for bad in (["request", src, "--tokenizer", "vocab:qwen35"],
                ["request", src, "--session", str(conv), "--delimiters-only", "--tokenizer", "vocab:qwen35"]):
        assert main(bad) == 2
        assert "give --session FILE (the conversation), or --delimiters-only" in capsys.readouterr().err
    # (--no-generation-prompt with the list alone was taken and did nothing; --n-predict was refused)
    for extra, says in ((["--n-predict", "8"], "--n-predict goes in a request body"),
                        (["--no-generation-prompt"], "--no-generation-prompt is how the request body's prompt")):
        assert main(["request", src, "--delimiters-only", "--tokenizer", "vocab:qwen35", *extra]) == 2
        assert says in capsys.readouterr().err


@pytest.fixture
def spaced_tokenizer(tmp_path):
    """A WordPiece tokenizer (BERT's normaliser and pre-tokenizer) that cannot spell `<|im_start|>`: its ids
    decode to `< | im _ start | >`. llama-server, given that text, would tokenize it to the same ids."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    words = ["[UNK]", "<", "|", "im", "_", "start", "end", ">", "user", "assistant", "system", "tool", "hi", "hello"]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    folder = tmp_path / "wordpiece"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(params=["spaced", "vocab:bert-bge"])
def mismatched(request, spaced_tokenizer, tmp_path):
    """(a tokenizer that cannot spell ChatML's delimiters, the ChatML template, a short chat)."""
    if request.param == "spaced":
        tokenizer = str(spaced_tokenizer)
    else:
        pytest.importorskip("llama_cpp")
        tokenizer = request.param
    template = Path(__file__).resolve().parent.parent / "fixtures" / "turns" / "stable.jinja"
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    return tokenizer, template, conv


def test_a_tokenizer_that_cannot_spell_the_delimiters_is_refused(mismatched, capsys):
    # the message delimiters are the text of token-checked ids: ids that decode to other text than the
    # template writes (a vocabulary that cannot spell `<|im_start|>`) are a tokenizer that does not match
    tokenizer, template, conv = mismatched
    for extra in (["--session", str(conv)], ["--delimiters-only"]):
        assert main(["--no-config", "request", str(template), "--tokenizer", tokenizer, *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("tmplkit: error: ") and err.count("\n") == 1, err
        assert "does not match the template" in err and "'<|im_start|>" in err and "--tokenizer" in err
    from tmplkit.tokens.tokenizers import load_tokenizer

    with pytest.raises(TokenizerError, match="does not match the template"):
        message_delimiters(load_one(str(template)), load_tokenizer(tokenizer))



def test_spans_and_mask_refuse_a_tokenizer_that_cannot_spell_the_delimiters_as_request_does(mismatched, tmp_path, capsys):
    # its ids split the render as the text does: `spans` gave spans and `mask` a mask over ids that are
    # not the model's, where `request` refused the tokenizer; one check in the tokens layer refuses it
    from tmplkit.masks import MaskError, assistant_mask, assistant_masks
    from tmplkit.tokens.tokenizers import load_tokenizer

    tokenizer, template, conv = mismatched
    tok = load_tokenizer(tokenizer)
    td = token_delimiters(analyze(load_one(str(template))), tok)
    assert not td.passed and td.mismatch and td.problems[0] == td.mismatch
    assert "does not match the template" in td.mismatch and "'<|im_start|>" in td.mismatch
    assert td.why_unproven().startswith("not proven on this tokenizer (the tokenizer ")
    with pytest.raises(MaskError, match="not proven on this tokenizer .the tokenizer .* does not match") as err:
        assistant_mask(load_one(str(template)), tok, conv)
    assert err.value.exit_code == 1
    with pytest.raises(MaskError, match="does not match the template"):
        assistant_masks(load_one(str(template)), tok, [conv])
    args = [str(template), "--session", str(conv), "--tokenizer", tokenizer]
    assert main(["--no-config", "spans", *args, "-o", str(tmp_path / "spans.json")]) == 1
    spans = capsys.readouterr().err
    assert spans.count("\n") == 1 and "not proven on this tokenizer" in spans and "does not match the template" in spans
    out = tmp_path / "mask.json"
    assert main(["--no-config", "mask", *args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists() and td.mismatch in err
    # and `request` says the same thing, in its own words and exit code
    assert main(["--no-config", "request", str(template), "--tokenizer", tokenizer, "--delimiters-only"]) == 2
    assert td.mismatch in capsys.readouterr().err


def test_a_special_token_that_takes_in_whitespace_still_spells_its_delimiter():
    # phi-3's own template with its own vocabulary: `<|end|>` takes in the `\n` after it, so the ids of
    # `<|end|>\n<|assistant|>\n` come back as `<|end|><|assistant|>`; the tokenizer matches its template
    # (`request` refused it as one that does not, while `spans` took it)
    pytest.importorskip("llama_cpp")
    from tmplkit.tokens.tokenizers import load_tokenizer

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched")
    template, tok = load_one(corpus.vocab_path("phi-3")), load_tokenizer("vocab:phi-3")
    td = token_delimiters(analyze(template), tok)
    assert td.passed and td.mismatch is None, td.problems
    assert "<|end|><|assistant|>" in [d.token_text for d in td]
    assert [m.to_dict() for m in message_delimiters(template, tok)] == [
        {"role": "assistant", "delimiter": "<|end|><|assistant|>"}, {"role": "user", "delimiter": "<|user|>"}]

def test_read_prefill_log():
    # lines as tools/server/server-context.cpp writes them (SLT_DBG / SLT_TRC, -lv 5)
    log = "\n".join([
        "slot update_slots: id  0 | task 0 | main/do_checkpoint = no, pos_min = -1, pos_max = -1",
        "slot update_slots: id  0 | task 0 | main/do_checkpoint = no, pos_min = 0, pos_max = 2047",
        "slot update_slots: id  0 | task 0 | main/do_checkpoint = yes, pos_min = 0, pos_max = 2999",
        "slot create_check: id  0 | task 0 | created context checkpoint 1 of 32 (pos_min = 0, pos_max = 2999, n_tokens = 3000, size = 0.1 MiB)",
        "slot update_slots: id  0 | task 0 | main/do_checkpoint = no, pos_min = 0, pos_max = 5047",
        "slot update_slots: id  0 | task 2 | restored context checkpoint (pos_min = 0, pos_max = 2999, n_tokens = 3000, "
        "n_past = 2999, size = 0.1 MiB)",
    ])
    got = read_prefill_log(log)
    assert got.batch_starts == (0, 2048, 3000, 5048) and got.checkpoints == (3000,) and got.restored == (3000,)
    assert got.breaks(2048, 6000) == (3000,)  # 2048 and 5048 end full batches; 6000 is the end
    assert CompletionRequest("p", ()).to_dict() == {"prompt": "p", "message_delimiters": [], "cache_prompt": True}


def test_a_llama_server_binary_that_cannot_run_is_one_line(tmp_path, capsys):
    from tmplkit.cli import main
    from tmplkit.errors import ModelError
    from tmplkit.server.process import LlamaServer

    with pytest.raises(ModelError, match="cannot run llama-server"):
        LlamaServer(tmp_path / "no-such-server", tmp_path / "m.gguf", log=tmp_path / "server.log")
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    from tmplkit.prefill import tiny_model_path

    assert main(["engine-parity", str(template), "--server", str(tmp_path / "no-such-server"),
                 "--model", str(tiny_model_path())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tmplkit: error: ") and "cannot run llama-server" in err and "Traceback" not in err


def test_openai_tool_call_arguments_are_parsed_as_llama_server_does(qwen_template, qwen35, tmp_path, capsys):
    # OpenAI logs keep arguments as a JSON string; Qwen's template iterates over them as a mapping
    conv = [{"role": "user", "content": "read it"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}]
    body = completion_request(qwen_template, qwen35, conv).to_dict()
    assert "<parameter=path>\na.py\n</parameter>" in body["prompt"]
    assert conv[1]["tool_calls"][0]["function"]["arguments"] == '{"path": "a.py"}'  # the caller's copy untouched
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(conv))
    src = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    assert main(["request", src, "--session", str(path), "--tokenizer", "vocab:qwen35", "--n-predict", "-3"]) == 2
    assert "--n-predict must be -1" in capsys.readouterr().err  # (the option, as typed)
    assert main(["request", src, "--session", str(path), "--tokenizer", "vocab:qwen35", "--n-predict", str(2**31)]) == 2
    assert "llama-server's int32" in capsys.readouterr().err
    assert main(["request", src, "--delimiters-only", "--tokenizer", "vocab:qwen35", "--n-predict", "5"]) == 2
    assert "leave it out with --delimiters-only" in capsys.readouterr().err


def test_every_corpus_template_with_a_vocab_gets_delimiters_llama_server_can_use():
    # docs/llama-server.md's claim: all template/vocabulary pairs of the corpus pass `request`'s checks
    pytest.importorskip("llama_cpp")
    from tmplkit.tokens.roundtrip import corpus_pairs
    from tmplkit.tokens.tokenizers import load_tokenizer

    pairs = corpus_pairs()
    assert len(pairs) == 27
    refused = {}
    for name, vocab in pairs:
        try:
            delims = message_delimiters(load_one(corpus.templates_dir() / f"{name}.jinja"), load_tokenizer(f"vocab:{vocab}"))
        except AnalysisError as exc:
            refused[name] = str(exc)
            continue
        assert delims and all(d.role in ("system", "user", "assistant", "tool") for d in delims), name
    assert refused == {}


def test_a_template_with_no_delimiters_is_refused_with_its_analysis_reason(tmp_path, capsys):
    # (it said "its delimiters do not split the tokens as the text (no delimiters were given ...)")
    (tmp_path / "raise.jinja").write_text('{{ raise_exception("the template says no") }}')
    assert main(["--no-config", "request", str(tmp_path / "raise.jinja"), "--delimiters-only", "--tokenizer", "vocab:qwen35"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no delimiters to give llama-server: its analysis is unsupported" in err
    assert "the template says no" in err and "do not split the tokens" not in err
