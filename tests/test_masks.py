"""Training masks (tmplkit.masks): on our own templates (fixtures/masks) every masked turn is the
text fixtures/masks/expected.json gives; the header and the generation prompt are never masked;
the last turn's mask is the turns study's generated turn (less trailing whitespace); tokens follow the text; results are
JSON with a schema version; unproven boundaries are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit.errors import TmplkitError
from tmplkit.masks import (
    MASK_SCHEMA_VERSION,
    MaskError,
    assistant_mask,
    assistant_masks,
    left_out,
    text_mask,
    text_masks,
)
from tmplkit.session import for_server, load_conversation
from tmplkit.sources import ChatTemplate, load_one
from tmplkit.turns import session_requests

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "masks"
EXPECTED = {k: v for k, v in json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8")).items()
            if not k.startswith("_")}
CASES = [(name, conv) for name, convs in EXPECTED.items() for conv in convs]


def template(name: str) -> ChatTemplate:
    return load_one(str(FIXTURES / f"{name}.jinja"))


class CharTokenizer:
    """One token per character (ids are code points): the token mask must follow the text's exactly."""

    name = "chars"

    def tokenize_with_offsets(self, text: str):
        return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]

    def tokenize(self, text: str, *, add_bos=None):
        return self.tokenize_with_offsets(text)[0]

    def detokenize(self, ids) -> str:
        return "".join(map(chr, ids))


class PairTokenizer:
    """Two characters a token: a token that straddles a mask boundary is masked (transformers' rule)."""

    name = "pairs"

    def __init__(self):
        self.pieces: dict[str, int] = {}

    def tokenize_with_offsets(self, text: str):
        spans = [(i, min(i + 2, len(text))) for i in range(0, len(text), 2)]
        return [self.pieces.setdefault(text[a:b], len(self.pieces)) for a, b in spans], spans

    def tokenize(self, text: str, *, add_bos=None):
        return self.tokenize_with_offsets(text)[0]

    def detokenize(self, ids) -> str:
        texts = {i: p for p, i in self.pieces.items()}
        return "".join(texts[i] for i in ids)


@pytest.mark.parametrize(("name", "conv"), CASES)
def test_masked_text_is_what_the_template_prints_for_each_turn(name, conv):
    m = text_mask(template(name), FIXTURES / conv)
    assert [[text, t.rule] for text, t in zip(m.masked_text(), m.turns)] == EXPECTED[name][conv]


@pytest.mark.parametrize(("name", "conv"), CASES)
def test_no_header_and_no_generation_prompt_is_masked(name, conv):
    t = template(name)
    m = text_mask(t, FIXTURES / conv)
    messages = load_conversation(FIXTURES / conv).messages
    for turn in m.turns:
        if name == "header-ends-user" and messages[turn.messages[0] - 1]["role"] == "tool":
            continue  # it prints no tool result and no header after one: the turn follows the previous answer
        if name == "calls-end-opens-results" and messages[turn.messages[0] - 1]["role"] == "tool":
            # the turn goes on inside the assistant's after the results: it follows their closing bracket
            assert m.text[:turn.start].endswith("]"), m.text[:turn.start][-30:]
            continue
        # the assistant's header ends right before the mask: the mask starts after it
        # (or after the empty reasoning block the generation prompt closes, or the user's turn ends
        # with, which the history prints with the turn's reasoning in it: calls-before-text,
        # header-closes-reasoning; or after the generation prompt's `<think>\n`, which the history
        # writes again in the newest answer: think-block-last)
        assert m.text[:turn.start].endswith(("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n", "### Response:\n",
                                             "<|begin_assistant|>\n", "<|assistant_start|>",
                                             "<|assistant|>", "<|assistant|>\n",
                                             "<|start|>assistant", "</think>\n", "<|assistant|><think></think>",
                                             "</think>", "[/INST]", "ASSISTANT:", "<|turn|>assistant\n",
                                             "Source: assistant\n\n ")), \
            (name, m.text[:turn.start][-30:])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_last_turn_is_the_turns_studys_generated_turn(name):
    t = template(name)
    conv = load_conversation(FIXTURES / next((c for c in EXPECTED[name] if c.startswith("chat")), next(iter(EXPECTED[name]))))
    m = text_mask(t, conv)
    last = [r for r in session_requests(conv, t) if r.generated][-1]
    # (less the whitespace the template writes after the end of turn: the model does not write it)
    assert m.masked_text()[-1] == last.generated.rstrip()
    # (prompt-always writes the next turn's generation prompt after it whatever add_generation_prompt
    # says, which the template wrote, not the model: the turn leaves it out and the render ends with it)
    # (blank-line-before-prompt writes a line break after the newest message, turn or not: whitespace
    # aside, the render ends with the turn)
    # (results-closed-at-end closes the tool results before the turn at the render's end only, after
    # the turn: not the model's)
    assert m.text.rstrip().endswith(last.generated.rstrip()) or m.text.endswith(last.generated + last.generation_prompt) \
        or (name == "results-closed-at-end" and m.text.endswith(last.generated + "</results>"))


def test_a_tool_call_turn_the_template_writes_nothing_for_is_judged_not_left_out():
    # calls-unwritten (ours) has no tool support and ends an answer with `<|im_end|>` only once a
    # message follows: the tool-call turn's request generates nothing. It was
    # left out of the turns, its calls learned nowhere without a word; now it is a turn, which
    # learns its end marker alone, and the command names it.
    m = text_mask(template("calls-unwritten"), FIXTURES / "chat.json")
    messages = load_conversation(FIXTURES / "chat.json").messages
    from tmplkit.masks import markup_only_turns

    assert messages[4].get("tool_calls") and [t.messages for t in markup_only_turns(m, messages)] == [(4, 5)]


def test_a_tool_call_turn_written_only_once_followed_is_refused_in_its_own_words():
    # calls-when-followed (ours) writes the newest answer's content alone, its calls only once a
    # message follows: the turn's request generates nothing, and the turn was left out silently.
    with pytest.raises(MaskError, match=r"messages 4\.\.4 would mask nothing: the template writes its tool calls only "
                                        r"once another message follows"):
        text_mask(template("calls-when-followed"), FIXTURES / "chat.json")
    assert text_mask(template("calls-when-followed"), FIXTURES / "plain.json").masked_text() == \
        ["Hello.<|im_end|>", "Goodbye.<|im_end|>"]


def test_reasoning_dropped_from_the_history_is_not_masked_and_kept_reasoning_is():
    dropped = text_mask(template("reasoning-dropped"), FIXTURES / "chat.json")
    kept = text_mask(template("reasoning-kept"), FIXTURES / "chat.json")
    assert "Add them." not in dropped.text and "Add them." in kept.masked_text()[0]


def test_tokens_follow_the_text_and_labels_the_spans():
    m = assistant_mask(template("reasoning-kept"), CharTokenizer(), FIXTURES / "chat.json")
    masked = "".join(chr(i) for i, on in zip(m.input_ids, m.mask) if on)
    assert masked == "".join(m.text_mask.masked_text())
    assert len(m.labels) == len(m.input_ids)
    first_user = m.text.index("What is")
    assert m.labels[first_user] == "user" and m.labels[m.text.index("Add them.")] == "assistant"
    assert m.labels[m.text.index("a.txt\n</tool_response>")] in ("user", "tool")  # tool results are not learned
    assert not m.mask[m.text.index("a.txt\n</tool_response>")]
    for t in m.turns:
        assert (t.token_start, t.token_end) == (t.start, t.end)


def test_a_token_across_the_boundary_is_masked():
    t = template("reasoning-kept")
    chars = text_mask(t, FIXTURES / "plain.json")
    pairs = assistant_mask(t, PairTokenizer(), FIXTURES / "plain.json")
    for a, b in chars.ranges:
        assert all(pairs.mask[k] for k in range(a // 2, (b + 1) // 2))
        assert not pairs.mask[a // 2 - 1] or (a // 2 - 1) * 2 + 2 > a


def test_batch_form_equals_one_by_one():
    t = template("reasoning-dropped")
    convs = [FIXTURES / "chat.json", FIXTURES / "plain.json"]
    assert [m.to_dict() for m in assistant_masks(t, CharTokenizer(), convs)] == \
        [assistant_mask(t, CharTokenizer(), c).to_dict() for c in convs]
    assert [m.ranges for m in text_masks(t, convs)] == [text_mask(t, c).ranges for c in convs]


def test_one_tokenizer_is_checked_once_over_many_calls(monkeypatch):
    # (a data loader calls assistant_mask per example: each call tokenized the probe render again)
    import tmplkit.masks._mask as mask_mod

    checks = []
    check = mask_mod.token_delimiters
    monkeypatch.setattr(mask_mod, "token_delimiters", lambda *a, **k: checks.append(a) or check(*a, **k))
    t, tok = template("reasoning-kept"), CharTokenizer()
    first = assistant_mask(t, tok, FIXTURES / "plain.json")
    assert [assistant_mask(t, tok, FIXTURES / "plain.json").to_dict() for _ in range(3)] == [first.to_dict()] * 3
    assert len(checks) == 1
    assistant_mask(t, CharTokenizer(), FIXTURES / "plain.json")  # (another tokenizer is checked on its own)
    assert len(checks) == 2


def test_to_dict_is_json_with_a_schema_version():
    m = assistant_mask(template("header-ends-user"), CharTokenizer(), FIXTURES / "plain.json")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["schema_version"] == MASK_SCHEMA_VERSION == 1
    assert len(d["input_ids"]) == len(d["assistant_masks"]) == len(d["labels"]) == d["n_tokens"]
    assert d["n_masked"] == sum(d["assistant_masks"]) == len("Hello.</s>Goodbye.</s>")
    assert json.loads(json.dumps(text_mask(template("header-ends-user"), FIXTURES / "plain.json").to_dict()))["turns"]


def test_unproven_boundaries_are_refused():
    same = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "nodelims", "-")
    with pytest.raises(MaskError, match="not proven"):
        text_mask(same, FIXTURES / "plain.json")


def test_a_turn_whose_content_the_template_does_not_print_is_refused_not_masked_empty():
    # parts-only (ours) reads content only as text parts: given strings its render holds no answer,
    # and every turn would mask nothing; the library refuses in one line instead
    with pytest.raises(MaskError, match=r"messages 2\.\.2 would mask nothing: where the turn is written the render holds none of its content 'Hello\.'") as err:
        text_mask(template("parts-only"), FIXTURES / "plain.json")
    assert "\n" not in str(err.value)
    with pytest.raises(MaskError, match="would mask nothing"):
        assistant_masks(template("parts-only"), CharTokenizer(), [FIXTURES / "plain.json"])
    assert text_mask(template("parts-only"), FIXTURES / "plain-parts.json").masked_text() == [" Hello.", " Goodbye."]


def test_markup_written_after_a_turn_only_because_a_tool_result_follows_is_not_the_turns(corpus_template):
    # DeepSeek R1's distills write `<｜tool▁outputs▁begin｜>` after a call turn's end of sentence
    # before the first result only (the tool's proven delimiter is `<｜tool▁output▁begin｜>`): it was
    # masked as the turn's end, which a render with a user message after the turn does not write.
    m = text_mask(corpus_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), FIXTURES / "chat.json")
    call = next(text for text, t in zip(m.masked_text(), m.turns) if t.messages == (4, 5))
    assert "<｜tool▁calls▁begin｜>" in call and call.endswith("<｜end▁of▁sentence｜>")
    assert "<｜tool▁outputs▁begin｜>" in m.text


@pytest.mark.parametrize(("name", "end"), [("Apertus-8B-Instruct", "<|tools_suffix|>"),
                                           ("google-gemma-4-31B-it", "<|tool_response>")])
def test_a_call_turns_end_that_the_results_delimiter_begins_with_is_the_turns(corpus_template, name, end):
    # Apertus closes its calls with `<|tools_suffix|>` whatever follows, and Gemma 4's model hands over
    # to the tool with `<|tool_response>`; the tool results' proven delimiter begins with it, and a
    # call turn followed by results lost it from its mask (the turns study's generated turn keeps it;
    # Gemma 4's history drops the turn's reasoning, which the generated turn opens with).
    t = corpus_template(name)
    m = text_mask(t, FIXTURES / "chat.json")
    call = next(text for text, tu in zip(m.masked_text(), m.turns) if tu.messages == (4, 5))
    assert call.endswith(end) and m.text.count(end) >= 1
    generated = [r.generated for r in session_requests(load_conversation(FIXTURES / "chat.json"), t) if r.turn == (4, 5)]
    assert generated and generated[0].rstrip().endswith(call)


def test_an_answer_the_template_cuts_at_markup_it_holds_is_refused_in_words_that_say_so():
    # A template that keeps what follows `</think>` in an answer (as Qwen3's and Ring's do) writes
    # nothing of one that ends with it: the refusal named a form of content (string or parts) that
    # had nothing to do with it.
    cuts = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
                        "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "cuts", "-")
    chat = [{"role": "user", "content": "Show me."}, {"role": "assistant", "content": "Like <think>this</think>"},
            {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "Welcome."}]
    with pytest.raises(MaskError, match=r"messages 1\.\.1 would mask nothing: .* the content holds markup \('</think>'\) "
                                        "that the template may cut it at"):
        text_mask(cuts, chat)


def test_a_conversation_without_an_assistant_message_masks_nothing_and_the_command_says_so(tmp_path, capsys):
    # its mask is all zeros (as transformers gives it); the command said nothing of it, exit 0
    from tmplkit.cli import main

    path = tmp_path / "asks.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi."}, {"role": "user", "content": "Hello?"}]}))
    assert text_mask(template("reasoning-kept"), path).ranges == ()
    out = tmp_path / "mask.json"
    assert main(["mask", str(FIXTURES / "reasoning-kept.jinja"), "--session", str(path), "--tokenizer", "vocab:qwen35",
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no assistant message: nothing is masked" in err
    assert json.loads(out.read_text())["n_masked"] == 0
    assert main(["mask", str(FIXTURES / "reasoning-kept.jinja"), "--session", str(FIXTURES / "plain.json"),
                 "--tokenizer", "vocab:qwen35", "-o", str(out)]) == 0
    assert "nothing is masked" not in capsys.readouterr().err


def test_a_system_message_after_tool_results_that_the_template_hoists_keeps_the_calls_in_the_mask(tmp_path):
    # hoists-system-calls (ours, DeepSeek R1 Distill's shape): the template writes every system
    # message first, so the first request's short history is no longer whole in the render; the
    # tool-call turn's header was not found and its mask was its `<|end|>` alone (rule "history")
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}
    messages = [{"role": "user", "content": "List the files."}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "system", "content": "Be brief."},
                {"role": "assistant", "content": "One file."}]
    path = tmp_path / "late-system.json"
    path.write_text(json.dumps({"messages": messages}))
    m = text_mask(template("hoists-system-calls"), path)
    assert m.text.startswith("<s>Be brief.\n<|user|>List the files.")
    assert [(t.rule, m.text[t.start:t.end]) for t in m.turns] == [
        ("exact", '<call>ls {"path": "."}</call><|end|>'), ("exact", "One file.<|end|>")]


def test_a_tool_call_turn_the_template_writes_as_its_end_alone_is_named(tmp_path, capsys):
    # string-built (ours) writes no tool calls: chat.json's tool-call turn masks its `<|end|>` alone,
    # as transformers' tags would; the command said nothing of the model learning to end at once
    from tmplkit.cli import main
    from tmplkit.masks import markup_only_turns
    from tmplkit.session import load_conversation

    conv = load_conversation(FIXTURES / "chat.json")
    m = text_mask(template("string-built"), conv)
    assert [(t.messages, m.text[t.start:t.end]) for t in markup_only_turns(m, conv.messages)] == [((4, 5), "<|end|>")]
    out = tmp_path / "mask.json"
    assert main(["mask", str(FIXTURES / "string-built.jinja"), "--session", str(FIXTURES / "chat.json"),
                 "--tokenizer", "vocab:qwen35", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 turn(s) learn their end marker alone" in err and "(messages 4..4)" in err
    # an answer that is a quoted tag is learned as such, not named
    quoted = load_conversation(FIXTURES / "quoted-delimiter-at-end.json")
    assert markup_only_turns(text_mask(template("no-end-of-turn"), quoted), quoted.messages) == ()


def test_a_turn_that_would_mask_only_its_end_is_refused_where_its_content_is_not_rendered(tmp_path):
    # A template that prints content only as a string, given text parts (as Qwen3-4B-Thinking-2507's
    # does): each turn masked only its `<|end|>`, teaching the model to end at once, silently.
    path = tmp_path / "strings-only.jinja"
    path.write_text("{% for m in messages %}<|{{ m.role }}|>{% if m.content is string %}{{ m.content }}{% endif %}"
                    "<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}", encoding="utf-8")
    strings_only = load_one(str(path))
    assert text_mask(strings_only, FIXTURES / "plain.json").masked_text() == ["Hello.<|end|>", "Goodbye.<|end|>"]
    with pytest.raises(MaskError, match=r"messages 2\.\.2 would mask nothing: .* none of its content 'Hello\.'"):
        text_mask(strings_only, FIXTURES / "plain-parts.json")


def test_instructions_the_template_writes_after_the_last_turn_are_not_the_turns():
    # instructions-after-last (ours, Command R+ tool_use's shape): the last turn's mask took the
    # system turn of instructions after it, and the first turn, not found as generated, masked nothing
    m = text_mask(template("instructions-after-last"), FIXTURES / "plain.json")
    assert m.masked_text() == ["Hello.<|END|>", "Goodbye.<|END|>"]
    assert [t.rule for t in m.turns] == ["exact", "exact"]
    reqs = session_requests(load_conversation(FIXTURES / "plain.json"), template("instructions-after-last"))
    assert [r.generated for r in reqs] == ["Hello.<|END|>", "Goodbye.<|END|>"]


def test_the_mask_command_refuses_a_mask_that_learns_nothing_in_one_line(capsys):
    from tmplkit.cli import main

    code = main(["mask", str(FIXTURES / "parts-only.jinja"), "--session", str(FIXTURES / "plain.json"),
                 "--tokenizer", "vocab:qwen35"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "would mask nothing" in err


def test_a_conversation_without_an_assistant_turn_masks_nothing():
    m = text_mask(template("reasoning-kept"), [{"role": "user", "content": "hi"}])
    assert m.turns == () and m.ranges == ()


@pytest.mark.corpus
def test_qwen35_tokens_on_a_corpus_template(qwen35):
    from tmplkit.sources.corpus import templates_dir

    t = load_one(str(templates_dir() / "Qwen3.5-4B.jinja"))
    m = assistant_mask(t, qwen35, FIXTURES / "chat.json")
    learned = qwen35.detokenize([i for i, on in zip(m.input_ids, m.mask) if on])
    assert learned.count("<|im_end|>") == 3 and "What is 2+2?" not in learned and "One file." in learned


LOOP = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"


@pytest.mark.parametrize("ending", ["{% if add_generation_prompt %}<|assistant|>\n{% else %}</s>{% endif %}",
                                    "{{ '<|assistant|>\\n' }}"])
def test_what_the_render_ends_with_after_the_last_turn_is_the_templates(ending):
    # an end of text after whitespace (Phi-3.5's `\n</s>`), a header printed whatever
    # add_generation_prompt says (Command R7B's): neither is the last turn's, as after the first turn
    m = text_mask(ChatTemplate(LOOP + ending, "ending", "-"), FIXTURES / "plain.json")
    assert m.masked_text() == ["Hello.<|end|>", "Goodbye.<|end|>"]


def _both_ways(t, conv, monkeypatch):
    from tmplkit.masks import _mask

    fast = text_mask(t, conv)
    with monkeypatch.context() as m:
        m.setattr(_mask, "_fast_turns", lambda *a: None)  # the requests' own way
        plain = text_mask(t, conv)
    return fast, plain


def _one_render(t, conv, monkeypatch):
    """The one-render path's turns on `conv` (None where it does not serve), and the proving path's."""
    from tmplkit.masks import _mask

    served = []
    real = _mask.one_render_turns
    with monkeypatch.context() as m:
        m.setattr(_mask, "_prefix_turns", lambda *a: None)  # no second fast path to fall back on
        m.setattr(_mask, "one_render_turns", lambda *a: served.append(real(*a)) or served[-1])
        fast = text_mask(t, conv)
    return (fast if served and served[-1] is not None else None), _both_ways(t, conv, monkeypatch)[1]


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.jinja")))
def test_the_prefix_fast_path_masks_what_the_requests_mask(name, monkeypatch):
    from tmplkit.session import generate_session

    t = template(name)
    compared = 0
    for conv in [FIXTURES / c for c in EXPECTED.get(name, {})] + [generate_session(3000, seed=1, style="agent")]:
        try:
            fast, plain = _both_ways(t, conv, monkeypatch)
        except MaskError:
            continue
        assert fast.turns == plain.turns
        compared += 1
    assert compared


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["Qwen3-Coder", "deepseek-ai-DeepSeek-V3.2", "microsoft-Phi-3.5-mini-instruct",
                                  "unsloth-gpt-oss-20b", "google-gemma-4-31B-it"])
def test_the_prefix_fast_path_masks_what_the_requests_mask_on_corpus_templates(name, monkeypatch, corpus_template):
    from tmplkit.masks import check_conversations

    t = corpus_template(name)  # (gpt-oss-20b from the Hub corpus's development half)
    compared = 0
    for conv in check_conversations():
        try:
            fast, plain = _both_ways(t, conv, monkeypatch)
        except TmplkitError:  # a conversation the template refuses
            continue
        assert fast.turns == plain.turns
        compared += 1
    assert compared


# Templates of both kinds: those the one-render path serves (ChatML, Llama 3, Gemma, Phi-3.5, ...)
# and those it must leave to the proof (reasoning dropped, a system prompt moved, tool results merged).
ONE_RENDER_CORPUS = ["Qwen3-Coder", "Qwen3.5-4B", "deepseek-ai-DeepSeek-V3.2", "microsoft-Phi-3.5-mini-instruct",
                     "unsloth-gpt-oss-20b", "google-gemma-4-31B-it", "meta-llama-Llama-3.3-70B-Instruct", "Kimi-K2-Instruct",
                     "mistralai-Mistral-Nemo-Instruct-2407", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
                     "MiniMax-M1", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "MiMo-VL",
                     "Kimi-K2-Thinking", "unsloth-Apriel-1.5", "meetkai-functionary-medium-v3.2",
                     "Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai-DeepSeek-V3.1", "MiniMax-M2"]
# Generated sessions of both styles, seeds and sizes the probes do not use.
ONE_RENDER_SESSIONS = [dict(target_tokens=4000, seed=11, style="agent"), dict(target_tokens=2500, seed=5),
                       dict(target_tokens=6000, seed=2, style="agent")]


def _held_one_render(t, monkeypatch) -> int:
    """How many conversations the one-render path served on `t`, each turn for turn equal to the proving path."""
    from tmplkit.masks import check_conversations
    from tmplkit.session import generate_session

    served = 0
    for conv in check_conversations() + [generate_session(**kw) for kw in ONE_RENDER_SESSIONS]:
        try:
            fast, plain = _one_render(t, conv, monkeypatch)
        except TmplkitError:  # a conversation the template refuses
            continue
        if fast is not None:
            assert fast.turns == plain.turns and fast.text == plain.text
            served += 1
    return served


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.jinja")))
def test_the_one_render_path_masks_what_the_requests_mask(name, monkeypatch):
    _held_one_render(template(name), monkeypatch)


def test_the_one_render_path_serves_chatml_with_one_render_a_session(monkeypatch):
    # the benchmark's template: served, and with two long renders (the whole and the last request)
    # past the probes; the rest are short (a turn asked for alone, the turns' endings)
    from tmplkit.masks import _mask
    from tmplkit.session import generate_session

    t = template("reasoning-kept")
    assert _held_one_render(t, monkeypatch) >= 5
    server = for_server(t, generate_session(6000, seed=4, style="agent"))
    text_mask(t, server)  # the probes run once per template
    calls = []
    real = type(server).render
    with monkeypatch.context() as m:
        m.setattr(type(server), "render", lambda self, msgs=None, **k: calls.append(len(msgs or self.messages))
                  or real(self, msgs, **k))
        m.setattr(_mask, "_prefix_turns", lambda *a: pytest.fail("the one-render path did not serve"))
        text_mask(t, server)
    # (the probes of a turn's ending render five messages at most: one after a tool result)
    assert len([n for n in calls if n > 5]) == 2 and len(server.messages) in calls


@pytest.mark.corpus
@pytest.mark.parametrize("name", ONE_RENDER_CORPUS)
def test_the_one_render_path_masks_what_the_requests_mask_on_corpus_templates(name, monkeypatch, corpus_template):
    _held_one_render(corpus_template(name), monkeypatch)


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["Qwen3.5-4B", "Qwen-Qwen3-0.6B"])
def test_a_template_that_drops_earlier_reasoning_is_served_with_one_long_render(name, monkeypatch, corpus_template):
    """Qwen3's history drops each earlier turn's reasoning once a user message follows: those turns
    are found as the proving path finds them from their requests, without rendering the requests
    (the request the whole render implies, the turn asked for alone): each conversation turn for turn
    as proved, and a session's mask with two long renders, not two a request."""
    from tmplkit.masks import _mask
    from tmplkit.session import generate_session

    t = corpus_template(name)
    assert _held_one_render(t, monkeypatch) >= 5
    server = for_server(t, generate_session(6000, seed=4, style="agent", requests=6), inputs="transformers")
    mask = text_mask(t, server)  # (the probes run once per template)
    assert {x.rule for x in mask.turns} >= {"history", "exact"}  # (earlier turns' reasoning dropped, the last's kept)
    calls = []
    real = type(server).render
    with monkeypatch.context() as m:
        m.setattr(type(server), "render", lambda self, msgs=None, **k: calls.append(len(msgs or self.messages))
                  or real(self, msgs, **k))
        m.setattr(_mask, "_located_turns", lambda *a: pytest.fail("the one-render path did not serve"))
        m.setattr(_mask, "_prefix_turns", lambda *a: pytest.fail("the one-render path did not serve"))
        assert text_mask(t, server).turns == mask.turns
    # (the probes of a turn's ending render five messages at most: one after a tool result)
    assert len([n for n in calls if n > 5]) == 2 and len(server.messages) in calls


def test_an_answer_the_user_quotes_hides_no_empty_mask():
    # (the refusal looked for the content anywhere in the render: a user who asks "Reply with yes"
    # holds "yes", and the empty mask came back silently)
    t = load_one(str(FIXTURES / "parts-only.jinja"))
    conv = [{"role": "user", "content": [{"type": "text", "text": "Reply with yes"}]}, {"role": "assistant", "content": "yes"}]
    with pytest.raises(MaskError, match=r"would mask nothing: where the turn is written the render holds none of its content 'yes'"):
        text_mask(t, conv)


@pytest.mark.corpus
def test_a_run_of_answers_whose_history_drops_each_ones_reasoning_is_masked():
    # (one stretch was cut from a turn's generated text: a run of two answers, each with reasoning the
    # history drops, matched no form, and its mask was silently empty: rule "dropped")
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    conv = [{"role": "user", "content": "Tell me two facts."},
            {"role": "assistant", "reasoning_content": "First fact.", "content": "Water is wet."},
            {"role": "assistant", "reasoning_content": "Second fact.", "content": "Fire is hot."},
            {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "You're welcome."}]
    m = text_mask(load_one(str(corpus.templates_dir() / "Qwen3.5-4B.jinja")), conv)
    first = m.turns[0]
    assert first.messages == (1, 3) and first.rule == "history", m.turns
    learned = m.text[first.start:first.end]
    assert "Water is wet." in learned and "Fire is hot." in learned and "fact." not in learned


@pytest.mark.corpus
def test_a_tool_result_that_ends_like_an_earlier_answer_leaves_the_turn_where_it_is():
    # Bielik 11B v3 drops a tool result's <|im_end|> once a turn follows it; a result that ended
    # as an earlier answer does (a footer both print) put the final answer's header at that answer:
    # the user message after it was masked, the final answer not.
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    foot = "\n-- end of output (exit status 0), generated by the sandbox runner v2 --"
    call = {"type": "function", "function": {"name": "run", "arguments": {"cmd": "make test"}}}
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What did the last run print?"},
            {"role": "assistant", "content": "It printed:\nok" + foot}, {"role": "user", "content": "Run the tests again."},
            {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "3 passed" + foot},
            {"role": "assistant", "content": "All tests pass."}]
    m = text_mask(load_one(str(corpus.templates_dir() / "Bielik-11B-v3.0-Instruct.jinja")), conv)
    masked = "".join(m.masked_text())
    assert "All tests pass." in masked and "Run the tests again." not in masked, m.turns


@pytest.mark.corpus
def test_a_call_written_otherwise_once_followed_is_masked_to_its_end():
    # Apriel 1.5 writes a call's "id" only once the call is followed: the two renders part inside
    # the call's JSON, and `}]</tool_calls>` with the end of turn was cut off as the newest turn's own.
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    m = text_mask(load_one(str(corpus.templates_dir() / "unsloth-Apriel-1.5.jinja")),
                  [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [call]}])
    # (and its end, `<|end|>\n</s>`, which Apriel writes after every assistant turn and transformers'
    # mask of the annotated copy holds: a content that ends with markup was cut before its end marker)
    assert m.masked_text()[0].endswith('{"city": "Paris"}}]</tool_calls>\n<|end|>\n</s>'), m.masked_text()


@pytest.mark.corpus
def test_the_one_render_path_leaves_a_turn_it_reads_only_in_part_to_the_proving_path(monkeypatch):
    # Kimi K2 Thinking asked for a turn alone writes it without the reasoning the whole render keeps:
    # only `<think>` matched, and the one-render path masked that alone (the proving path: all of it).
    from tmplkit.masks import _mask
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    t = load_one(str(corpus.templates_dir() / "Kimi-K2-Thinking.jinja"))
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "reasoning_content": "Add them.", "content": "4"},
            {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "Bye."}]
    fast = text_mask(t, conv)
    monkeypatch.setattr(_mask, "_fast_turns", lambda *a: None)
    assert fast.masked_text() == text_mask(t, conv).masked_text()
    assert fast.masked_text()[1] == "<think>Add them.</think>4<|im_end|>"


def test_an_end_of_turn_after_a_line_break_is_masked_and_the_next_messages_opening_is_not():
    # end-when-followed (ours) writes `\n<|end|>` only once a message follows, as Apriel 1.6 does:
    # markup after whitespace was taken for the template's and the end of turn left out; the call's
    # "id", printed only once followed, cut the calls' turn short before its end
    m = text_mask(template("end-when-followed"), FIXTURES / "chat.json")
    assert [x.endswith("\n<|end|>") for x in m.masked_text()] == [True, True, False], m.masked_text()
    assert m.masked_text()[1].startswith("<calls>")
    # five parallel calls: an "id" put in after each one's arguments, the turn masked to its end
    calls = [{"type": "function", "id": f"call_{i}", "function": {"name": "ls", "arguments": {"path": p}}}
             for i, p in enumerate("abcde")]
    chat = [{"role": "user", "content": "List both."}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "a.txt"}, {"role": "tool", "content": "b.txt"},
            {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks."}]
    both = text_mask(template("end-when-followed"), chat).masked_text()
    assert both[0].startswith("<calls>[") and both[0].endswith(']</calls>\n<|end|>') and '"id": "call_4"' in both[0], both
    # llama2 (ours) opens each user turn with the <s> the render opens with: the next message's
    llama2 = load_one(str(FIXTURES.parent / "templates" / "llama2.jinja"))
    assert text_mask(llama2, FIXTURES / "plain.json").masked_text() == [" Hello. </s>", " Goodbye. </s>"]


def test_a_tool_call_turn_the_template_does_not_write_is_refused_not_masked_empty():
    # no-tool-support (ours) skips tool results and runs the calls' turn on into the answer after
    # them: the turn of the calls masked nothing, rule "history", silently
    t = load_one(str(FIXTURES.parent / "templates" / "no-tool-support.jinja"))
    with pytest.raises(MaskError, match=r"messages 4\.\.4 would mask nothing: it has tool calls the template does not "
                                        r"write") as err:
        text_mask(t, FIXTURES / "chat.json")
    assert "\n" not in str(err.value)
    assert text_mask(t, FIXTURES / "plain.json").masked_text() == ["Hello.<|end|>", "Goodbye.<|end|>"]


def test_an_answer_that_quotes_a_delimiter_is_masked_whole_and_labelled_the_assistants():
    # (the quoted `<|im_start|>user\n` was taken for the next message's and cut the mask there)
    m = assistant_mask(template("reasoning-kept"), CharTokenizer(), FIXTURES / "quoted-delimiter.json")
    quoted = m.text.index("<|im_start|>user\nHi")
    assert m.mask[quoted] and m.labels[quoted] == "assistant"
    assert m.text_mask.masked_text()[0].endswith("comes after the marker.<|im_end|>")
    assert [s.role for s in m.text_mask.spans] == ["system", "user", "assistant", "user", "assistant"]


def test_an_answer_that_ends_with_a_quoted_delimiter_is_masked_whole_and_labelled_the_assistants():
    # no-end-of-turn (ours) ends a turn only with the next header: an answer ending with `<|user|>`
    # runs into it, and the quote was taken for the next message's delimiter and cut the mask there
    m = assistant_mask(template("no-end-of-turn"), CharTokenizer(), FIXTURES / "quoted-delimiter-at-end.json")
    assert m.text_mask.masked_text() == ["A user turn opens with <|user|>", "<|user|>",
                                         "With <|assistant|>, and a user turn with <|user|>"]
    for t in m.turns:  # the quote is the assistant's, the next header (after the `\n`) the user's
        assert m.labels[t.end - len("<|user|>")] == "assistant" and m.labels[t.end - 1] == "assistant"
        assert t.end + 1 == len(m.text) or m.labels[t.end + 1] == "user"
    assert [s.role for s in m.text_mask.spans] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]


@pytest.mark.corpus
def test_a_history_form_that_runs_over_the_next_delimiter_whole_ends_before_it(corpus_template):
    # CodeLlama 70b: the turn ends before the next user's whole `Source: user\n\n `, which is that
    # message's, not a quote of the answer's (the turn as generated, its `Source: assistant\nDestination:
    # user\n\n ` the template's, was a history form running over it; it is now found as generated)
    m = text_mask(corpus_template("codellama-CodeLlama-70b-Instruct-hf"), FIXTURES / "plain.json")
    assert m.masked_text()[0] == "Hello. <step>" and m.turns[0].rule == "exact", m.masked_text()


@pytest.mark.parametrize("conv", ["plain.json", "chat.json", "agent.json"])
def test_the_last_turn_leaves_out_a_generation_prompt_written_whatever_add_generation_prompt_says(conv):
    # prompt-always (ours) ends every render with `Source: assistant\nDestination: user\n\n `, the
    # generation prompt, with add_generation_prompt or without: the last turn took it in up to `user`
    # (`Goodbye. <step> Source: assistant\nDestination: user`); it ends at ` <step>`, as the others do
    t = template("prompt-always")
    m = text_mask(t, FIXTURES / conv)
    server = for_server(t, load_conversation(FIXTURES / conv), inputs="transformers")
    assert m.text == server.render(add_generation_prompt=False) == server.render(add_generation_prompt=True)
    assert m.text.endswith(" <step> Source: assistant\nDestination: user\n\n ")
    masked = m.masked_text()
    assert all(x.endswith(" <step>") and "Source:" not in x for x in masked), masked
    assert m.turns[-1].end == len(m.text) - len(" Source: assistant\nDestination: user\n\n ")


def test_a_prompt_written_whatever_add_generation_prompt_says_leaves_the_turns_to_the_proving_path(monkeypatch):
    # prompt-always (ours): no request is a prefix of the whole render (each ends with the prompt,
    # which the history writes otherwise), so neither fast path serves it and the proving path does
    t = template("prompt-always")
    for conv in ("plain.json", "chat.json", "agent.json"):
        one, proved = _one_render(t, FIXTURES / conv, monkeypatch)
        fast, plain = _both_ways(t, FIXTURES / conv, monkeypatch)
        assert one is None and fast.turns == plain.turns == proved.turns
        assert plain.masked_text()[-1].endswith(" <step>"), plain.masked_text()


@pytest.mark.corpus
def test_the_last_turn_leaves_out_the_prompt_codellama_70b_writes_whatever_add_generation_prompt_says(corpus_template):
    # CodeLlama 70b (Hub, development half) ends every render with `Source: assistant\nDestination:
    # user\n\n `: the last turn's mask was `Goodbye. <step> Source: assistant\nDestination: user`
    m = text_mask(corpus_template("codellama-CodeLlama-70b-Instruct-hf"), FIXTURES / "plain.json")
    assert m.masked_text() == ["Hello. <step>", "Goodbye. <step>"], m.masked_text()


def test_the_last_turn_ends_where_its_turn_ends_not_in_the_next_header():
    # header-ahead (ours) ends each turn by opening the next one's header (` <step> Source: `): a
    # turn followed by a message leaves `Source: ` to the next one's `Source: user\n\n `, and the last
    # turn took it in (the render ends with it).
    t = load_one(str(FIXTURES.parent / "templates" / "header-ahead.jinja"))
    expected = {"plain.json": ["Hello. <step>", "Goodbye. <step>"],
                "chat.json": ["4 <step>", ' <call>ls {"path": "."}</call> <step>', "a.txt <step>"]}
    for conv, masked in expected.items():
        m = text_mask(t, FIXTURES / conv)
        assert m.text.endswith(" <step> Source: ")
        assert m.masked_text() == masked, m.masked_text()


@pytest.mark.parametrize("name", ["header-ahead", "source-destination"])
def test_the_prompt_ending_a_history_header_written_otherwise_repeats_is_not_masked(name):
    # The history writes the header `Source: assistant\n\n `, the generation prompt `Source:
    # assistant\nDestination: user\n\n `: past the shared `assistant\n`, the history's `\n ` is the
    # prompt's ending `\n\n ` again, which the model never writes (each mask started with `\n `).
    # An answer's own opening after it stays the answer's: an empty content before a call's ` <call>`.
    t = load_one(str(FIXTURES.parent / "templates" / f"{name}.jinja"))
    assert text_mask(t, FIXTURES / "plain.json").masked_text() == ["Hello. <step>", "Goodbye. <step>"]
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  Hello."},
            {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]
    assert text_mask(t, conv).masked_text() == ["  Hello. <step>", "Goodbye. <step>"]


def test_a_prefix_turn_keeps_the_whitespace_its_model_writes_first():
    # The request is a prefix of the history: a `\n` the model writes first after the prompt's
    # `<start_of_turn>model\n` is its own, though the prompt ends with `\n` too.
    t = ChatTemplate(text="{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
                          "{{ m.content }}<end_of_turn>\n{% endfor %}"
                          "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}", name="gemma-like", source="-")
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nHello."}]
    assert text_mask(t, conv).masked_text() == ["\nHello.<end_of_turn>"]


@pytest.mark.parametrize("conv", ["chat-tools.json", "agent.json"])
def test_a_turn_followed_by_tool_results_ends_before_their_header(conv):
    # header-ahead (ours): the tool result's start was proven as `tool\n\n ` alone, so an answer
    # with calls followed by results ended in their header: `... </call> <step> Source:`
    t = load_one(str(FIXTURES.parent / "templates" / "header-ahead.jinja"))
    m = text_mask(t, FIXTURES / conv)
    assert " <step> Source: tool\n\n " in m.text
    masked = m.masked_text()
    assert all(x.endswith(" <step>") and "Source:" not in x for x in masked), masked
    assert any(x.endswith("</call> <step>") for x in masked), masked


@pytest.mark.corpus
def test_the_last_turn_leaves_out_the_next_header_a_user_model_ends_with(corpus_template):
    # UserLM-8b's render ends by opening the next user header (the model it serves writes the user):
    # the last turn ends at its `<|eot_id|>`, as the first does
    m = text_mask(corpus_template("microsoft-UserLM-8b"), FIXTURES / "plain.json")
    assert m.text.endswith("<|start_header_id|>user<|end_header_id|>")
    assert [x.strip() for x in m.masked_text()] == ["Hello.<|eot_id|>", "Goodbye.<|eot_id|>"], m.masked_text()


EMPTY, HI, AGAIN, OK = ({"role": "assistant", "content": ""}, {"role": "user", "content": "Hi"},
                        {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Ok."})


@pytest.mark.parametrize("conv", [[HI, EMPTY, AGAIN, OK], [HI, OK, AGAIN, EMPTY], [HI, EMPTY]])
def test_an_empty_answer_masks_none_of_its_header(conv):
    # header-before-content (ours) writes an empty answer as the bare `<|turn|>assistant`, where the
    # generation prompt is `<|turn|>assistant\n` (Seed-OSS's shape): the turn was found after
    # `<|turn|>`, and its mask was the header's word `assistant`
    m = text_mask(template("header-before-content"), conv)
    assert m.masked_text() == ["Ok.<|eot|>"] * conv.count(OK), m.masked_text()
    empty = m.turns[conv.index(EMPTY) // 2]
    assert empty.start == empty.end and m.text[:empty.start].endswith("<|turn|>assistant")


@pytest.mark.corpus
def test_an_empty_answer_masks_none_of_its_header_on_seed_oss(corpus_template):
    m = text_mask(corpus_template("praxisresearch-hf_seed_36b_sgtr_benign_0"), [HI, EMPTY, AGAIN, OK])
    assert m.masked_text() == ["Ok.<seed:eos>"], m.masked_text()
    # (where the proven header begins with the end of the turn before it, `<|end|>\n<|assistant|>\n`,
    # an empty answer's `<|end|>` is its own, not the header's)
    m = text_mask(corpus_template("ChenWeiLi-MedPhi-3-mini_v1"), [HI, EMPTY, AGAIN, OK])
    assert m.masked_text() == ["<|end|>", "Ok.<|end|>"], m.masked_text()


@pytest.mark.corpus
def test_a_tokenizer_that_cannot_spell_the_render_is_refused_as_spans_refuses_it(capsys, tmp_path):
    # a lowercasing BERT vocabulary: `spans` refused it in one line, exit code 1, and `mask` gave a
    # mask of ids that spell another text than the template writes; both refuse it with one check
    pytest.importorskip("llama_cpp")
    from tmplkit.cli import main
    from tmplkit.tokens.tokenizers import load_tokenizer

    bert = load_tokenizer("vocab:bert-bge")
    with pytest.raises(MaskError, match="its delimiters are not proven on this tokenizer") as err:
        assistant_mask(template("reasoning-kept"), bert, FIXTURES / "plain.json")
    assert err.value.exit_code == 1 and "\n" not in str(err.value)
    with pytest.raises(MaskError, match="not proven on this tokenizer"):
        assistant_masks(template("reasoning-kept"), bert, [FIXTURES / "plain.json"])
    args = [str(FIXTURES / "reasoning-kept.jinja"), "--session", str(FIXTURES / "plain.json"), "--tokenizer", "vocab:bert-bge"]
    assert main(["spans", *args, "-o", str(tmp_path / "spans.json")]) == 1
    spans = capsys.readouterr().err
    out = tmp_path / "mask.json"
    assert main(["mask", *args, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not out.exists()
    assert spans[spans.index("not proven"):spans.index("); ")] in err


def test_a_stretch_put_in_a_turn_does_not_run_across_the_next_header():
    # calls-closed-otherwise (ours) writes no tool results and a followed call otherwise than the
    # model does (its "id", then `</call_list>` for `</calls>`): no history form of the calls' turn
    # reaches its end, and the search for one with a stretch put in ran across the next assistant
    # header into the answer that quotes the call: two masks over one answer, the header masked
    call = {"type": "function", "id": "call_1", "function": {"name": "ls", "arguments": {"path": "."}}}
    conv = [{"role": "user", "content": "List."}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "a.txt"}, {"role": "assistant", "content": 'I called {"path": "."}}]</calls>'},
            {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "Bye."}]
    m = text_mask(template("calls-closed-otherwise"), conv)
    assert m.masked_text() == ['<calls>[{"name": "ls", "arguments": {"path": "."}', 'I called {"path": "."}}]</calls>',
                               "Bye."], m.masked_text()
    assert all(a.end <= b.start for a, b in zip(m.turns, m.turns[1:]))


# An OpenAI-style client's instructions, a tool result the template writes as JSON (quotes escaped,
# so its text is not in the render as sent), and the rest of a chat.
_LEFT_OUT = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "List it."},
             {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                  "function": {"name": "ls", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "a \"quoted\" name"},
             {"role": "assistant", "content": "Un fichier."}]


def test_the_mask_names_the_messages_the_render_leaves_out():
    # transformers gives the developer message as it is; a template that prints only the roles it
    # names leaves it out, so the example teaches an answer without it: the mask says so (the tool
    # result written otherwise, as JSON, is in the render: a needle in its place is)
    conv = load_conversation(_LEFT_OUT)
    masked = text_mask(template("named-roles"), conv)
    assert masked.left_out == (0,) and "Answer in French." not in masked.text
    assert '"a \\"quoted\\" name"' in masked.text and masked.to_dict()["left_out"] == [0]
    assert assistant_mask(template("named-roles"), CharTokenizer(), conv).to_dict()["left_out"] == [0]
    # a template that prints every role leaves nothing out, nor one that writes it in capitals
    assert text_mask(template("reasoning-kept"), conv).left_out == ()
    shouted = ChatTemplate(template("reasoning-kept").text.replace("{{ m.content }}<|im_end|>", "{{ m.content | upper }}<|im_end|>"),
                           "shouted", "-")
    server = for_server(shouted, conv, inputs="transformers")  # (the analysis proves no such template: asked directly)
    text = server.render(add_generation_prompt=False)
    assert "ANSWER IN FRENCH." in text and left_out(server, text) == ()


def test_the_messages_left_out_cost_one_render_more(monkeypatch):
    # however many a long session holds (a template that drops every tool result)
    asks = [m for k in range(5) for m in ({"role": "developer", "content": f"Rule {k}."}, {"role": "user", "content": f"Q{k}"},
                                         {"role": "assistant", "content": f"A{k}"})]
    server = for_server(template("named-roles"), load_conversation(asks), inputs="transformers")
    text = server.render(add_generation_prompt=False)
    calls = []
    real = type(server).render
    monkeypatch.setattr(type(server), "render", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    assert left_out(server, text) == (0, 3, 6, 9, 12) and len(calls) == 1


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_greeting_before_the_first_user_message_is_said_not_silently_left_unmasked(tmp_path, capsys):
    # (no request asks for it, so the mask learns nothing there: "0 of 12 tokens learned in 0 turns"
    # said nothing of it, where transformers' generation tags mask it)
    from tmplkit.cli import main

    chatml = ChatTemplate(text=CHATML, name="chatml", source="test")
    chat = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    masked = text_mask(chatml, chat)
    assert [(t.messages, t.rule) for t in masked.turns] == [((1, 2), "unasked"), ((3, 4), "exact")]
    assert masked.masked_text() == ["ok<|im_end|>"]
    assert masked.turns[0].start == masked.turns[0].end == masked.text.index("<|im_start|>assistant\nHello")
    assert [(t.messages, t.rule) for t in text_mask(chatml, chat[:2]).turns] == [((1, 2), "unasked")]
    (tmp_path / "chatml.jinja").write_text(CHATML)
    (tmp_path / "chat.json").write_text(json.dumps(chat[:2]))
    code = main(["--no-config", "mask", str(tmp_path / "chatml.jinja"), "--session", str(tmp_path / "chat.json"),
                 "--tokenizer", "vocab:qwen35", "--format", "text"])
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith("-- 0 of 13 tokens learned in 0 turns; nothing learned in 1 assistant "
                                               "turn(s) before the first user message, which no request asks for "
                                               "(messages 1..1)"), out


@pytest.mark.parametrize("name, content, end", [
    ("chatml", "</b>\n", "<|im_end|>"), ("chatml", "<div></div>", "<|im_end|>"),
    ("llama2", "Wrap it in <i>italic</i>", "</s>"), ("llama2", "x[1]", "</s>"),
])
def test_a_last_turn_whose_content_ends_with_markup_keeps_its_end_marker(name, content, end):
    # (a rule for the end of text a template writes after the newest turn only, Phi-3.5's `\n</s>`,
    # took the turn's own end marker after markup in the content for it: the model never learned
    # to stop after such a last answer, while the same answer earlier in the chat was masked whole)
    tpl = load_one(str(Path(__file__).resolve().parent.parent / "fixtures" / "templates" / f"{name}.jinja"))
    answer = {"role": "assistant", "content": content}
    chat = [{"role": "user", "content": "Close the tag."}, answer, {"role": "user", "content": "Again."}, answer]
    first, last = text_mask(tpl, chat).masked_text()
    assert first == last and last.rstrip().endswith(end) and content.strip() in last, (first, last)


def test_a_turn_that_runs_on_into_a_user_message_is_refused_not_masked(corpus_template):
    """A guard model's template quotes the whole chat inside one user prompt (`USER: ...`,
    `ASSISTANT: ...`) and writes another prompt where the last message is the user's: the turn found
    as generated ran from the user's quoted message to the end, and the mask taught the user's words
    (Qwen3Guard, exit 0). An end marker the next delimiter begins with (EXAONE's `[|endofturn|]`,
    proven as the start of `[|endofturn|]\\n[|user|]`) is still the turn's own."""
    from tmplkit.masks import MaskError, text_mask

    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "see <think>no</think>"},
            {"role": "user", "content": "SECRET USER TEXT"}, {"role": "assistant", "content": "done"}]
    with pytest.raises(MaskError, match=r"would mask message 2 \(user\) too") as e:
        text_mask(corpus_template("Qwen-Qwen3Guard-Gen-4B"), chat)
    assert "\n" not in str(e.value)
    masked = text_mask(corpus_template("LGAI-EXAONE-EXAONE-3.5-7.8B-Instruct"), chat)  # (not refused)
    assert [m.strip()[:len(a)] for m, a in zip(masked.masked_text(), ("see <think>no</think>", "done"))] == \
        ["see <think>no</think>", "done"] and not any("SECRET" in m for m in masked.masked_text())


def test_an_end_of_turn_the_next_delimiter_begins_with_is_the_turns_own(corpus_template):
    """EXAONE's user delimiter is proven as `[|endofturn|]\\n[|user|]`: every turn but the last was cut
    where that delimiter starts and lost the end marker the model writes (the last kept it), so a
    model trained on the mask would not learn to end its turns. Command R's next header, which the
    render does not end with, still ends the turn before it."""
    from tmplkit.masks import text_mask

    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye."}]
    masked = text_mask(corpus_template("LGAI-EXAONE-EXAONE-3.5-7.8B-Instruct"), chat)
    assert masked.masked_text() == ["Hello.[|endofturn|]", "Bye.[|endofturn|]"]
    masked = text_mask(corpus_template("CohereForAI-c4ai-command-r7b-12-2024-tool_use"), chat)
    assert all("<|START_OF_TURN_TOKEN|>" not in m for m in masked.masked_text()), masked.masked_text()
