"""The turns study names the cause where an earlier assistant turn is written otherwise: an empty
reasoning block the history drops, an answer dropped, tool calls rewritten (fixtures of ours)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.errors import InputError
from tmplkit.session import Session, for_server, load_conversation, session_from_json
from tmplkit.session.requests import written_always
from tmplkit.turns import CAUSES, session_requests, study_turns

FIX = Path(__file__).parent.parent / "fixtures" / "turns"


def _call(i: int, name: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}


def _study(name: str, messages, **kw):
    return study_turns(load_one(str(FIX / f"{name}.jinja")), Session(tuple(messages), ()), **kw)


def test_an_empty_reasoning_block_the_history_drops_is_reasoning_dropped():
    # `<think>` and `<tool_call>` share `<t`: the texts part inside the unit, read from its start
    messages = [{"role": "user", "content": "List it."}, {"role": "assistant", "content": "", "tool_calls": [_call(1, "ls")]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "assistant", "content": "One file."}]
    first = _study("empty-think-newest", messages).first
    assert first.request == 1 and first.cause == "reasoning dropped"
    assert "'<think>'" in first.detail and "an empty reasoning block" in first.detail
    # the switches were tried: the report says none of the template's keeps it
    assert first.detail.endswith("no switch the template reads keeps it")
    assert "keeps it" not in _study("empty-think-newest", messages, switches=False).first.detail


def test_a_reasoning_switch_that_keeps_the_session_stable_is_named():
    messages = [{"role": "user", "content": "Is 91 prime?"},
                {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No."},
                {"role": "user", "content": "And 97?"}, {"role": "assistant", "content": "Yes."}]
    first = _study("drops-reasoning", messages).first
    assert first.cause == "reasoning dropped" and first.detail.endswith("; stable with keep_reasoning=True")


def test_an_earlier_answer_dropped_is_named():
    messages = [{"role": "user", "content": "Is 91 prime?"},
                {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No."},
                {"role": "user", "content": "And 97?"},
                {"role": "assistant", "reasoning_content": "No divisor.", "content": "Yes."}]
    first = _study("drops-answer", messages).first
    assert first.request == 1 and first.cause == "answer dropped" and "answer of message 1" in first.detail


def test_tool_calls_the_history_writes_otherwise_are_named():
    messages = [{"role": "user", "content": "List it."},
                {"role": "assistant", "content": "", "tool_calls": [_call(1, "ls"), _call(2, "pwd")]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "tool", "tool_call_id": "c2", "content": "/"},
                {"role": "assistant", "content": "", "tool_calls": [_call(3, "cat"), _call(4, "wc")]},
                {"role": "tool", "tool_call_id": "c3", "content": "hello"}, {"role": "tool", "tool_call_id": "c4", "content": "1"},
                {"role": "assistant", "content": "It says hello."}]
    report = _study("call-ids-in-history", messages)
    first = report.first
    # (request 1 too: the ending the newest turn alone has was taken to be `"}]<|im_end|>\n` of its
    # JSON, which the held turn then lacked, so the first rewrite was not seen)
    assert first.request == 1 and first.cause == "tool calls rewritten" and "message 1" in first.detail
    assert '"id": "c1"' in first.request_text and '"id": "c1"' not in first.held_text
    assert first.held_text.endswith('{"name": "pwd"}]<|im_end|>\n')
    assert report.causes() == {"tool calls rewritten": 2} and set(report.causes()) <= set(CAUSES)


def test_an_empty_reasoning_block_dropped_from_the_history_is_reasoning_dropped():
    # the block lies in request 1's history (the tool-call turn after the last user message), and is
    # gone once a user message follows: the divergence is before request 1's generation prompt
    messages = [{"role": "user", "content": "List it."}, {"role": "assistant", "content": "", "tool_calls": [_call(1, "ls")]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "assistant", "content": "One file."},
                {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "Bye."}]
    first = _study("empty-think-after-user", messages, switches=False).first
    assert first.request == 2 and first.cause == "reasoning dropped" and "'<think>'" in first.detail


def test_an_empty_answer_the_history_drops_is_answer_dropped():
    messages = [{"role": "user", "content": "Think about 91."},
                {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": None},
                {"role": "user", "content": "And?"}, {"role": "assistant", "content": "Composite."}]
    first = _study("drops-answer", messages, switches=False).first
    assert first.request == 1 and first.cause == "answer dropped" and "empty answer" in first.detail


def test_reasoning_under_another_key_is_found():
    # the reasoning given as `thinking` (gpt-oss's key), kept by the template only in the newest turn;
    # as a trainer gives it (llama-server refuses the null `reasoning_content` and drops `thinking`)
    messages = [{"role": "user", "content": "Is 91 prime?"},
                {"role": "assistant", "thinking": "91 = 7 * 13.", "reasoning_content": None, "content": "No."},
                {"role": "user", "content": "And 97?"}, {"role": "assistant", "content": "Yes."}]
    src = ("{% for m in messages %}{% if m.role == 'assistant' %}<|a|>{% if loop.last and m.thinking %}<analysis>"
           "{{ m.thinking }}</analysis>{% endif %}{{ m.content }}<|e|>{% else %}<|u|>{{ m.content }}<|e|>{% endif %}"
           "{% endfor %}{% if add_generation_prompt %}<|a|>{% endif %}")
    from tmplkit.sources import ChatTemplate

    template = ChatTemplate(src, "thinking-newest", "-")
    first = study_turns(template, Session(tuple(messages), ()), switches=False, inputs="transformers").first
    assert first.cause == "reasoning dropped" and "reasoning of message 1" in first.detail
    with pytest.raises(InputError, match="'reasoning_content' is null, which llama-server refuses"):
        study_turns(template, Session(tuple(messages), ()), switches=False)


def test_an_earlier_message_a_classifier_leaves_out_is_message_dropped():
    from datetime import datetime

    from tmplkit.turns import Request, divergences

    question = "Alpha " * 60  # long enough that the tool result lies far after the divergence
    messages = ({"role": "user", "content": question}, {"role": "assistant", "content": "", "tool_calls": [_call(1, "ls")]},
                {"role": "tool", "tool_call_id": "c1", "content": "Tool said"}, {"role": "assistant", "content": "Beta."},
                {"role": "user", "content": "Gamma?"})
    when = datetime(2026, 1, 1)
    prev = Request(0, 3, f"<h>{question}</h><ai></ai><r>Tool said</r><gp>", "<gp>", "Beta.", (3, 4), "prefix", when)
    cur = Request(1, 5, "<h>Gamma?</h><gp>", "<gp>", "", (5, 5), "", when)
    first = divergences((prev, cur), messages)[0]
    assert first.cause == "message dropped" and first.detail.startswith("message 0 (user) is in the held text")


def test_a_held_turn_that_closes_its_reasoning_at_once_where_the_history_writes_it_says_so():
    from datetime import datetime

    from tmplkit.turns import Request, divergences

    # Command R7B's shape: the prompt opens the reasoning block, the newest turn closes it at once,
    # the history writes the turn's reasoning into it
    messages = ({"role": "user", "content": "Go."}, {"role": "assistant", "reasoning_content": "Plan it.", "content": "Done."},
                {"role": "user", "content": "Next."})
    when = datetime(2026, 1, 1)
    prev = Request(0, 1, "<u>Go.</u><a><|START_THINKING|>", "<a><|START_THINKING|>", "<|END_THINKING|>Done.</a>", (1, 2),
                   "prefix", when)
    cur = Request(1, 3, "<u>Go.</u><a><|START_THINKING|>Plan it.<|END_THINKING|>Done.</a><u>Next.</u><a><|START_THINKING|>",
                  "<a><|START_THINKING|>", "", (3, 3), "", when)
    first = divergences((prev, cur), messages)[0]
    assert first.cause == "reasoning dropped" and first.detail.startswith("the held turn closes its reasoning at once")


MASKS = Path(__file__).parent.parent / "fixtures" / "masks"
_ALWAYS = "Source: assistant\nDestination: user\n\n "


@pytest.mark.parametrize("conv", ["plain.json", "chat.json", "agent.json"])
def test_a_generation_prompt_written_whatever_add_generation_prompt_says_is_the_requests_prompt(conv):
    # prompt-always (fixtures/masks) ends every render with `Source: assistant\nDestination: user\n\n `,
    # with add_generation_prompt or without, and writes the turn it generated after `Source: assistant\n\n `:
    # the held text parts from the next request inside request 0's prompt (it was "last user message",
    # the prompt taken for none, and each generated turn ran on into the next turn's prompt)
    t = load_one(str(MASKS / "prompt-always.jinja"))
    conversation = load_conversation(MASKS / conv)
    reqs = session_requests(conversation, t)
    assert all(r.generation_prompt == _ALWAYS and r.text.endswith(_ALWAYS) for r in reqs)
    assert all(r.generated.endswith(" <step> ") and "Source:" not in r.generated for r in reqs if r.generated)
    first = study_turns(t, conversation, switches=False).first
    r0 = reqs[0]
    assert first.request == 1 and first.cause == "generation prompt", first
    assert len(r0.text) - len(_ALWAYS) <= first.position < len(r0.text)
    assert r0.held[first.position:].startswith("Destination: user\n\n ")


def test_a_generation_prompt_written_only_when_asked_for_is_left_as_it_was():
    # source-destination (fixtures/templates) is prompt-always with the prompt written only with
    # add_generation_prompt: the two renders differ, the prompt is what the one with it adds (nothing
    # is read off the renders for it), and the study says as it did what it now says of prompt-always
    t = load_one(str(FIX.parent / "templates" / "source-destination.jinja"))
    conversation = load_conversation(MASKS / "plain.json")
    server = for_server(t, conversation)
    assert written_always(server, server.messages[2]) == ""
    reqs = session_requests(conversation, t)
    assert [r.generation_prompt for r in reqs] == [_ALWAYS, _ALWAYS]
    assert [r.generated for r in reqs] == ["Hello. <step> ", "Goodbye. <step> "]
    assert study_turns(t, conversation, switches=False).first.cause == "generation prompt"


@pytest.mark.corpus
def test_codellama_70b_diverges_in_the_generation_prompt_it_writes_whatever_add_generation_prompt_says(corpus_template):
    # CodeLlama 70b (Hub, development half): every render ends with `Source: assistant\nDestination:
    # user\n\n `, the history writes the turn after `Source: assistant\n\n `: request 0's prompt is
    # written otherwise once the model has answered (it was "last user message", at the same place)
    t = corpus_template("codellama-CodeLlama-70b-Instruct-hf")
    conversation = load_conversation(MASKS / "plain.json")
    reqs = session_requests(conversation, t)
    assert [r.generation_prompt for r in reqs] == [_ALWAYS, _ALWAYS]
    assert [r.generated for r in reqs] == ["Hello. <step> ", "Goodbye. <step> "]
    first = study_turns(t, conversation, switches=False).first
    assert (first.request, first.position, first.cause) == (1, 80, "generation prompt"), first
    assert reqs[0].held[:first.position].endswith("Hi <step> Source: assistant\n")


def test_a_turn_opener_written_before_an_always_written_prompt_is_the_next_turns():
    # always-opener (ours, Command R7B's shape) ends every render with `<|START|><|ASSISTANT|>`; the
    # renders of a turn newest and followed part after `<|START|>`, at the role's unit: `<|START|>`
    # opens the next turn (the generated turns ended with it, and the prompt was `<|ASSISTANT|>`)
    t = load_one(str(FIX / "always-opener.jinja"))
    conversation = load_conversation(MASKS / "agent.json")
    reqs = session_requests(conversation, t)
    assert all(r.generation_prompt == "<|START|><|ASSISTANT|>" for r in reqs)
    assert [r.generated for r in reqs if r.generated] == ['Let me list them.<|CALL|>ls {"path": "."}<|END|>', "a.txt<|END|>"]
    assert study_turns(t, conversation, switches=False).stable


def test_a_system_message_a_request_adds_ahead_of_the_history_is_the_system_prompts_cause():
    # hoists-system (ours, DeepSeek R1's shape) writes every system message first: the request adds
    # one mid-chat, written where the held text has the first user message ("last user message")
    t = load_one(str(FIX / "hoists-system.jinja"))
    chat = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello."},
            {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Say goodbye."},
            {"role": "assistant", "content": "Au revoir."}]
    first = study_turns(t, session_from_json(chat), switches=False).first
    assert (first.request, first.position, first.cause) == (1, 0, "system prompt"), first
    assert "new system message 2" in first.detail


@pytest.mark.parametrize("gap", ["", "\n", " \n"])
def test_a_unit_that_ends_every_turn_stays_the_turns_before_an_always_written_prompt(tmp_path, gap):
    # the same shape without an opener: `<|end|>` ends the user's turn too, so the renders parting
    # after it at the role's unit leave it the turn's (the model writes it); whitespace between a
    # message and its `<|end|>` changes nothing (it was taken for the next turn's opener there)
    path = tmp_path / "end-unit.jinja"
    path.write_text("{% for m in messages %}<|{{ m.role | upper }}|>{{ m.content }}" + gap + "<|end|>{% endfor %}<|ASSISTANT|>",
                    encoding="utf-8")
    reqs = session_requests(load_conversation(MASKS / "plain.json"), load_one(str(path)))
    assert [r.generation_prompt for r in reqs] == ["<|ASSISTANT|>", "<|ASSISTANT|>"]
    assert [r.generated for r in reqs] == [f"Hello.{gap}<|end|>", f"Goodbye.{gap}<|end|>"]


@pytest.mark.corpus
def test_command_r7b_generated_turns_end_at_their_end_of_turn(corpus_template):
    # Command R7B tool_use writes `<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>` whatever
    # add_generation_prompt says: the turn the model generates ends at `<|END_OF_TURN_TOKEN|>`
    t = corpus_template("CohereForAI-c4ai-command-r7b-12-2024-tool_use")
    reqs = session_requests(load_conversation(MASKS / "agent.json"), t)
    assert all(r.generation_prompt.startswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>") for r in reqs)
    assert all(r.generated.endswith("<|END_OF_TURN_TOKEN|>") for r in reqs if r.generated)


# A tool-calling exchange and a second user message: three requests (after the user, after the tool result, after the user).
_CALL = _call(1, "ls")
_EXCHANGE = ({"role": "user", "content": "List the files."},
             {"role": "assistant", "content": "Let me look at the files in the folder first.", "tool_calls": [_CALL]},
             {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "assistant", "content": "One file: a.txt."},
             {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "You are welcome."})


def test_a_classifiers_task_line_that_names_the_newest_message_is_template_text():
    report = _study("classifier-task-line", _EXCHANGE, switches=False)
    first = report.first
    assert report.causes() == {"template text": 2}  # (it was "other")
    assert first.request == 1 and first.detail.startswith("the divergence lies in the template's own text before the first message")
    assert "USER QUERY" in first.held_text and "AGENT RESPONSE" in first.request_text
    from tmplkit.turns.formats import format_turns

    text = format_turns([report], "text")  # (both texts shown, as for other causes read off them)
    assert f"    held:    {first.held_text!r}\n    request: {first.request_text!r}" in text


def test_a_judges_instructions_after_the_messages_are_template_text():
    report = _study("reward-trailer", _EXCHANGE, switches=False)
    # request 2: after the assistant's words, the instructions alone (request 1's divergence lies
    # right after the newest user message, which the earlier checks claim first); none is "other"
    assert "other" not in report.causes() and report.divergences[1].cause == "template text"
    second = report.divergences[1]
    assert second.detail.startswith("the divergence lies in the template's own text after request 1's last message")
    assert second.held_text.endswith("#### Instructions ####\nScore the assistant's last reply from")


def test_a_turn_closed_before_a_prompt_without_its_header_is_generation_prompt():
    report = _study("closes-before-prompt", _EXCHANGE, switches=False)
    second = report.divergences[1]
    assert second.request == 2 and second.cause == "generation prompt"  # (it was "other")
    assert second.detail.startswith("request 1 ends with '<turn|>\\n<|channel>thought\\n' after its last message")
    assert "'<|turn>model\\nOne file" in second.detail


def test_an_opening_written_always_before_a_history_of_user_messages_is_generation_prompt():
    report = _study("user-turns-only", _EXCHANGE, switches=False)
    assert report.causes() == {"generation prompt": 1}  # (it was "other")
    last = report.divergences[-1]
    assert last.detail.startswith("request 1 ends with '<|end|><|assistant|><think></think>' after its last message")
    assert "<|user|>Thanks." in last.detail


def test_the_newest_query_written_otherwise_once_a_newer_one_comes_is_last_user_message():
    # request 1 ends with a tool result; its newest user message (message 0) loses ` /think` in request 2
    report = _study("marks-newest-query", _EXCHANGE, switches=False)
    assert [d.cause for d in report.divergences] == ["", "last user message"]  # (it was "other")
    assert report.divergences[1].detail == "request 1's newest user message (message 0) is rendered differently once a newer one comes"


def test_template_text_is_not_placed_where_no_message_is_found_as_it_is(tmp_path):
    # a judge that writes the conversation as JSON: no message's text is in the render as it is
    # (escaped), and the divergence was placed "before the first message" though it lies after the
    # conversation; the messages are found as `tojson` writes them
    path = tmp_path / "json-judge.jinja"
    path.write_text("<|im_start|>user\nJudge this:\n{{ messages | tojson }}\nReply with a score.<|im_end|>\n"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", encoding="utf-8")
    messages = [{"role": "user", "content": 'List the files.\nAll of them, "please".'},
                {"role": "assistant", "content": "Two files:\na.txt, b.txt."},
                {"role": "user", "content": "Thanks.\nBye."}, {"role": "assistant", "content": "You are welcome.\nBye."}]
    first = study_turns(load_one(str(path)), Session(tuple(messages), ()), switches=False).first
    assert first.request == 1 and first.cause == "template text"
    assert first.detail.startswith("the divergence lies in the template's own text after request 0's last message")


def test_a_render_no_tokenizer_can_encode_is_the_templates_error_not_the_runs(tmp_path):
    # (a lone surrogate the template writes: a worker's UnicodeEncodeError, which named no template
    # and gave no advice)
    from tmplkit.tokens.tokenizers import load_tokenizer

    path = tmp_path / "half.jinja"
    path.write_text("{% for m in messages %}{{ '<|' ~ m.role ~ '\\ud800|>' }}{{ m.content }}<|end|>{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}", encoding="utf-8")
    messages = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye."}, {"role": "assistant", "content": "Bye."}]
    report = study_turns(load_one(str(path)), Session(tuple(messages), ()), tokenizer=load_tokenizer("vocab:qwen35"),
                         switches=False)
    assert report.error.startswith("tokenizing its renders (the template writes the text): the text holds '\\ud800'")
