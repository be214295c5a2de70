"""Differential analysis on small inline templates: each quirk the probes adapt to, each verdict."""

from __future__ import annotations

import pytest

from tmplkit.analysis import STATUSES, TOOL_PLACEMENTS, Analysis, analyze
from tmplkit.delimiters import split_text
from tmplkit.sandbox import Limits, render
from tmplkit.sources import ChatTemplate

# ChatML with a tool role; the building block of most cases below.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls | default([]) %}<call>{{ c.function | tojson }}</call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def T(text: str, name: str = "t", bos: str | None = None, eos: str | None = None) -> ChatTemplate:
    return ChatTemplate(text=text, name=name, source="test", bos_token=bos, eos_token=eos)


def test_chatml_delimiters_and_result_shape():
    a = analyze(T(CHATML))
    assert a.status == "pass"
    assert (a.user_start, a.assistant_start, a.system_start, a.tool_response_start) == (
        "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_start|>system\n", "<|im_start|>tool\n")
    assert a.tool_response_next is None and a.tool_placement == "own_role"
    assert a.generation_prompt == "<|im_start|>assistant\n"
    assert [len(d.text) for d in a.delimiters] == sorted((len(d.text) for d in a.delimiters), reverse=True)
    assert set(a.to_dict()) == {"name", "source", "status", "user_start", "assistant_start", "system_start",
                                "tool_response_start", "tool_response_next", "generation_prompt", "tool_placement",
                                "reasoning_start", "reasoning_end", "earlier_reasoning", "generation_reasoning",
                                "capabilities", "delimiters", "round_trip", "errors", "warnings", "seconds"}
    assert set(a.to_dict()["round_trip"]) == {"passed", "expected_roles", "actual_roles", "problems"}
    assert a.status in STATUSES and a.tool_placement in TOOL_PLACEMENTS


def test_round_trip_conversation_is_long_and_mixed():
    rt = analyze(T(CHATML)).round_trip
    roles = [m["role"] for m in rt.messages]
    assert roles[0] == "system" and roles.count("tool") >= 2 and roles.count("user") >= 3
    assert any(m.get("tool_calls") for m in rt.messages)
    assert rt.render_kwargs["add_generation_prompt"] is True and rt.render_kwargs["tools"]
    assert rt.expected_roles == rt.actual_roles and rt.passed
    # It ends like an agent session in progress: a call with reasoning after the last user message, its response.
    last_user = max(i for i, m in enumerate(rt.messages) if m["role"] == "user")
    tail = rt.messages[last_user + 1:]
    assert [m["role"] for m in tail] == ["assistant", "tool"]
    assert tail[0].get("tool_calls") and tail[0].get("reasoning_content")


def test_no_delimiter_holds_probe_content_or_varying_text():
    a = analyze(T(CHATML))
    for d in a.delimiters:
        assert "Kq" not in d.text and "kq_lookup" not in d.text


def test_a_template_that_refuses_every_chat_is_unsupported_with_its_own_message():
    a = analyze(T("{{ raise_exception('This template needs a document.') }}"))
    assert a.status == "unsupported"
    assert "This template needs a document." in a.errors[0]
    assert isinstance(a, Analysis) and a.round_trip is None


def test_a_broken_template_is_an_error():
    assert analyze(T("{% for m in messages %}{{ m.content.nope() }}{% endfor %}")).status == "error"
    a = analyze(T("{% if %}"))
    assert a.status == "error" and "does not compile" in a.errors[0]


def test_a_template_that_never_ends_times_out():
    a = analyze(T("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                limits=Limits(seconds=0.2))
    assert a.status == "timeout" and "took longer" in a.errors[0]


def test_system_folded_into_the_first_user_turn():
    gemma = (
        "{{ bos_token }}{% set ns = namespace(p='') %}{% if messages[0].role == 'system' %}{% set ns.p = messages[0].content + '\n\n' %}{% endif %}"
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tools are not supported') }}{% endif %}"
        "{% if m.role != 'system' %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
        "{% if m.role == 'user' %}{{ ns.p }}{% set ns.p = '' %}{% endif %}{{ m.content }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    a = analyze(T(gemma, bos="<bos>"))
    assert a.status == "pass", a.round_trip.problems
    assert a.capabilities["system"] == "inside_user" and a.system_start is None
    assert a.user_start == "<start_of_turn>user\n"
    assert a.tool_placement == "rejected" and any("Tools are not supported" in w for w in a.warnings)


def test_system_prompt_right_after_bos_has_no_delimiter():
    deepseek = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% elif m.role == 'user' %}<U>{{ m.content }}{% else %}<A>{{ m.content }}</s>{% endif %}{% endfor %}"
    a = analyze(T(deepseek, bos="<s>"))
    assert a.capabilities["system"] == "preamble" and a.system_start is None
    assert a.user_start == "<U>" and a.assistant_start == "<A>"


def test_system_rejected_is_a_warning_not_a_failure():
    t = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" + CHATML
    a = analyze(T(t))
    assert a.status == "pass" and a.capabilities["system"] == "rejected"
    assert any("System role not supported" in w for w in a.warnings)
    assert "system" not in a.round_trip.expected_roles


def test_date_in_the_system_header_is_not_part_of_the_delimiter():
    t = ("{% for m in messages %}{% if m.role == 'system' %}<|sys|>Today: {{ strftime_now('%d %b %Y') }}\n{{ m.content }}<|end|>"
         "{% else %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}{% endfor %}")
    a = analyze(T(t))
    assert a.system_start is not None and a.system_start.startswith("<|sys|>")
    assert "20" not in a.system_start


def test_tool_responses_rendered_as_user_messages_fail_the_round_trip():
    t = CHATML.replace("<|im_start|>{{ m.role }}", "<|im_start|>{{ 'user' if m.role == 'tool' else m.role }}")
    a = analyze(T(t))
    assert a.status == "impossible"
    assert any("render exactly like user messages" in e for e in a.errors)
    assert any("classified as a user message" in p for p in a.round_trip.problems)


def test_tool_turns_of_their_own_behind_a_shared_opener_are_placed_as_their_own():
    # User headers that vary (user, human) leave the user start `<|im_start|>`, which the tool
    # turns begin with too: they were placed inside the user turn.
    t = CHATML.replace("<|im_start|>{{ m.role }}", "<|im_start|>{{ ('human' if loop.index % 4 == 2 else 'user') if m.role == 'user' else m.role }}")
    a = analyze(T(t))
    assert a.status == "pass" and a.user_start == "<|im_start|>" and a.tool_response_start == "<|im_start|>tool\n"
    assert a.tool_placement == "own_role"


# A user message right after tool results written into their turn, after their closer alone (as
# DeepSeek V4 Flash writes it, `</tool_result>\n\n`); consecutive results the same way.
AFTER_RESULTS = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}{% if messages[loop.index0 - 1].role != 'tool' %}<|U|>{% else %}--{% endif %}"
    "<res>{{ m.content }}</res>"
    "{% elif m.role == 'user' and loop.index0 > 0 and messages[loop.index0 - 1].role == 'tool' %}--{{ m.content }}"
    "{% elif m.role == 'user' %}<|U|>{{ m.content }}{% elif m.role == 'system' %}<|S|>{{ m.content }}"
    "{% else %}<|A|>{{ m.content }}{% for c in m.tool_calls | default([]) %}<call>{{ c.function | tojson }}</call>{% endfor %}<|E|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|A|>{% endif %}"
)


def test_a_user_message_after_results_with_only_their_closer_gets_that_closer_as_its_start():
    # (it passed with delimiters that put that user message in the results' tool span: the round
    # trip puts an answer after every batch of results)
    a = analyze(T(AFTER_RESULTS))
    assert a.status == "pass", a.round_trip.problems
    assert ("user", "</res>--") in [(d.role, d.text) for d in a.delimiters]
    assert ("tool", "</res>--<res>") in [(d.role, d.text) for d in a.delimiters]
    text = render(T(AFTER_RESULTS), [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "r"}, {"role": "user", "content": "wait"}], add_generation_prompt=True)
    roles = [(s.role, text[s.start:s.end]) for s in split_text(text, a.delimiters)]
    assert ("user", "</res>--wait") in roles


def test_a_user_message_after_results_with_nothing_between_them_fails():
    t = AFTER_RESULTS.replace("== 'tool' %}--{{ m.content }}", "== 'tool' %}{{ m.content }}")
    assert t != AFTER_RESULTS
    a = analyze(T(t))
    assert a.status == "fail"
    assert any(p.startswith("the request after a user message that follows tool results: message 4 (user)")
               for p in a.round_trip.problems), a.round_trip.problems


def test_a_first_user_message_without_a_system_message_and_without_a_start_fails():
    # (every render the verdict proved started with a system message: a template that opens a first
    # user message with nothing when no system message comes first passed)
    t = CHATML.replace("<|im_start|>{{ m.role }}\n{{ m.content }}",
                       "{% if loop.first and m.role == 'user' %}{{ m.content }}{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}{% endif %}")
    assert t != CHATML
    a = analyze(T(t))
    assert a.status == "fail"
    assert "the request without a system message: message 0 (user): its content lies before the first delimiter" in a.round_trip.problems


def test_a_last_answer_written_inside_a_reasoning_block_it_never_closes_passes():
    # A conversation that ends with an answer, as a trainer renders it, where the template writes
    # `<think>\n` before the last answer and no end to it: no delimiter can part the two, and the
    # answer is still in its own turn (it failed: "its content lies in a reasoning span").
    t = ("{% for m in messages %}{% if m.role == 'assistant' %}<|A|>"
         "{% if loop.last and not add_generation_prompt %}<think>\n{{ m.content }}"
         "{% else %}{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}</think>\n{% endif %}{{ m.content }}{% endif %}<|E|>"
         "{% else %}<|{{ m.role }}|>{{ m.content }}<|E|>{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<|A|><think>\n{% endif %}")
    a = analyze(T(t))
    assert a.status == "pass", a.round_trip.problems
    assert ("reasoning", "<think>\n") in [(d.role, d.text) for d in a.delimiters]


def test_grouped_tool_responses_in_a_list_share_one_span():
    t = ("{% for m in messages %}{% if m.role == 'tool' %}{% if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user\n<results>[{% else %}, {% endif %}"
         "{{ m.content }}{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}]<|im_end|>\n{% endif %}"
         "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}")
    a = analyze(T(t))
    assert a.status == "pass", a.round_trip.problems
    assert a.tool_response_start == "<|im_start|>user\n<results>[" and a.tool_response_next is None
    assert a.capabilities["tool_responses_grouped"] is True and a.capabilities["tool_responses_separated"] is False


def test_probes_adapt_to_content_parts_string_arguments_and_extra_variables():
    parts = CHATML.replace("{{ m.content }}", "{{ m.content[0].text }}")
    a = analyze(T(parts))
    assert a.status == "pass" and "content_parts" in a.capabilities["adaptations"]
    strings = CHATML.replace("{{ c.function | tojson }}", "{{ c.function.name + c.function.arguments }}")
    a = analyze(T(strings))
    assert a.status == "pass" and "string_arguments" in a.capabilities["adaptations"]
    functions = "{{ 'Functions: ' + functions + '\n' }}" + CHATML
    a = analyze(T(functions))
    assert a.status == "pass" and "variable:functions" in a.capabilities["adaptations"]


def test_tool_responses_probed_without_calls_when_calls_are_rejected():
    t = "{% for m in messages %}{% if m.tool_calls %}{% set x = [] %}{{ x.append(1) }}{% endif %}{% endfor %}" + CHATML
    a = analyze(T(t))
    assert a.status == "pass"
    assert a.tool_response_start == "<|im_start|>tool\n"
    assert "tool_responses_without_calls" in a.capabilities["adaptations"]
    assert any("tool calls are rejected" in w for w in a.warnings)


def test_dropped_tool_messages_are_expected_absent():
    t = CHATML.replace("{% for m in messages %}", "{% for m in messages if m.role != 'tool' %}")
    a = analyze(T(t))
    assert a.status == "pass" and a.tool_placement == "dropped" and a.tool_response_start is None
    assert "tool" not in a.round_trip.expected_roles


def test_thinking_switches_that_change_the_render_are_reported():
    t = CHATML + "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    assert analyze(T(t)).capabilities["thinking_flags"] == ["enable_thinking"]
    assert analyze(T(CHATML)).capabilities["thinking_flags"] == []


def test_a_tool_delimiter_matching_inside_template_text_passes_with_a_warning():
    # The tool marker also appears in the system text the template writes after a system prompt:
    # every message's content lies in its own role's span, so no consumer is misled; the warning
    # says where the stray match is and what it does.
    t = ("{% for m in messages %}{% if m.role == 'system' %}<|im_start|>system\n{{ m.content }}\nResults arrive after <out>.<|im_end|>\n"
         "{% elif m.role == 'tool' %}{% if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user\n{% endif %}<out>{{ m.content }}"
         "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
         "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}")
    a = analyze(T(t))
    assert a.tool_response_next == "<out>"
    assert a.status == "pass" and a.round_trip.passed
    stray = [w for w in a.warnings if "where no message starts" in w]
    assert stray and "inside a system message's turn" in stray[0] and "'<out>.<|im_end|>" in stray[0]
    assert "a span detector opens a tool span there" in stray[0]
    # A user start quoted there fails: a server ends a batch at it and a trainer sees a user turn.
    quoted = t.replace("Results arrive after <out>.", "Users write after <|im_start|>user\n.")
    b = analyze(T(quoted))
    assert b.status == "fail"
    assert any(p.startswith("a user delimiter matches at character") and "inside a system message's turn" in p
               for p in b.round_trip.problems)


# Apriel 1.5's shape: every turn ends `\n<|end|>\n` (an answer adds the EOS), and a call's id is
# printed only when a response follows, so the text after a call does not start with its closer.
APRIEL = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|tool_result|>\n{{ m.content }}\n<|end|>\n"
    "{% elif m.role == 'assistant' %}<|assistant|>\n{{ m.content }}"
    "{% if m.tool_calls %}{{ '\\n' }}<tool_calls>[{% for c in m.tool_calls %}"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}"
    "{% if m is not sameas messages[-1] %}, \"id\": \"{{ c.id }}\"{% endif %}}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]</tool_calls>{% endif %}{{ '\\n<|end|>\\n' + eos_token }}"
    "{% else %}<|{{ m.role }}|>\n{{ m.content }}\n<|end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.mark.parametrize("eos", [None, "", "</s>"])
def test_the_closer_calls_and_responses_share_is_not_part_of_the_response_start(eos):
    a = analyze(T(APRIEL, eos=eos))
    assert a.status == "pass", a.round_trip.problems
    assert a.tool_response_start == "<|tool_result|>\n" and a.tool_response_next is None
    assert not any("<|end|>" in d.text for d in a.delimiters)


def test_delimiters_do_not_depend_on_knowing_the_bos_and_eos_tokens():
    known = analyze(T(APRIEL, bos="<s>", eos="</s>"))
    unknown = analyze(T(APRIEL))
    assert (known.status, known.delimiters) == (unknown.status, unknown.delimiters)


def test_generation_prompt_leaves_the_user_turns_closing_newline_to_it():
    # Apriel 1.6: a user turn's `\n` is printed only when a turn follows; the answer opens `\n<|begin_assistant|>\n`.
    t = ("{% for m in messages %}{{ '' if loop.first else '\n' }}<|begin_{{ m.role }}|>\n{{ m.content }}{% endfor %}"
         "{{ '\n<|begin_assistant|>\nHere are my reasoning steps:\n' if add_generation_prompt else '' }}")
    a = analyze(T(t))
    assert a.generation_prompt == "<|begin_assistant|>\nHere are my reasoning steps:\n"
    assert a.assistant_start == "<|begin_assistant|>\n"


def test_a_default_system_prompt_and_its_heading_are_system_content():
    # Solar: the system turn opens with a default prompt under its own heading, then the given one.
    solar = ("{% for m in messages %}{% if m.role == 'system' %}<|begin|>system<|content|>## Provider System Prompt\n\n"
             "You are a model.\n\n## System Prompt\n\n{{ m.content }}<|end|>"
             "{% else %}<|begin|>{{ m.role }}<|content|>{{ m.content }}<|end|>{% endif %}{% endfor %}")
    a = analyze(T(solar))
    assert a.status == "pass" and a.system_start == "<|begin|>system<|content|>"
    # gpt-oss: a heading written right before the given prompt, and only when there is one, is kept.
    harmony = ("{% for m in messages %}{% if m.role == 'system' %}<|start|>developer<|message|># Instructions\n\n{{ m.content }}<|end|>"
               "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}")
    a = analyze(T(harmony))
    assert a.status == "pass" and a.system_start == "<|start|>developer<|message|># Instructions\n\n"


# GLM 4.6's shape: reasoning is kept for turns after the last user message only; earlier turns get
# an empty `<think></think>`. With enable_thinking off, the last user message gets `/nothink`.
GLM = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' %}<|user|>\n{{ m.content }}{% if enable_thinking is defined and not enable_thinking %}/nothink{% endif %}"
    "{% elif m.role == 'assistant' %}<|assistant|>\n<think>{% if loop.index0 > ns.last %}{{ m.reasoning_content | default('') }}{% endif %}</think>\n"
    "{{ m.content }}{% for c in m.tool_calls | default([]) %}{{ '\\n' }}<tool_call>{{ c.function.name }}\n{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
    "{% elif m.role == 'tool' %}<|observation|>\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% else %}<|{{ m.role }}|>\n{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}{{ '\\n' }}<think></think>{% endif %}{% endif %}"
)


def test_reasoning_kept_after_the_last_user_message_is_not_cut_into_the_assistant_start():
    a = analyze(T(GLM))
    assert a.status == "pass", a.round_trip.problems
    # Reasoning markup is no part of the assistant start: it has delimiters of its own.
    assert (a.assistant_start, a.reasoning_start, a.reasoning_end) == ("<|assistant|>\n", "<think>", "</think>\n")
    assert a.capabilities["thinking_flags"] == ["enable_thinking"]
    rt = a.round_trip
    last_user = max(i for i, m in enumerate(rt.messages) if m["role"] == "user")
    kept = [m for m in rt.messages[last_user:] if m.get("reasoning_content")]
    assert kept and all(m["reasoning_content"] in rt.rendered for m in kept)


def test_delimiters_hold_with_every_value_of_a_thinking_switch():
    # DeepSeek V4's shape: an answer opens `</think>`, or `<think>reasoning</think>` when thinking.
    v4 = ("{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}{% elif m.role == 'tool' %}<｜Tool｜>{{ m.content }}"
          "{% elif m.role == 'system' %}{{ m.content }}{% else %}<｜Assistant｜>{% if thinking is defined and thinking %}<think>{{ m.reasoning_content | default('') }}</think>"
          "{% else %}</think>{% endif %}{{ m.content }}{% for c in m.tool_calls | default([]) %}<call>{{ c.function.arguments | tojson }}</call>{% endfor %}"
          "<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<｜Assistant｜>{{ '<think>' if thinking is defined and thinking else '</think>' }}{% endif %}")
    a = analyze(T(v4))
    assert a.status == "pass", a.round_trip.problems
    assert a.assistant_start == "<｜Assistant｜>" and a.capabilities["thinking_flags"] == ["thinking"]
    # A switch that renders answers with another marker altogether fails the verdict, and says so.
    other = v4.replace("<｜Assistant｜>{% if thinking", "{{ '<｜Thinker｜>' if thinking is defined and thinking else '<｜Assistant｜>' }}{% if thinking")
    b = analyze(T(other))
    assert b.status == "fail"
    assert any(p.startswith("with thinking=True: ") for p in b.round_trip.problems)


@pytest.mark.parametrize("body,mode", [
    # ChatML prints every role by name: the developer message in a turn of its own
    ("<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n", "own"),
    # a template that takes a developer message as its system message
    ("<|im_start|>{{ 'system' if m.role == 'developer' else m.role }}\n{{ m.content }}<|im_end|>\n", "as_system"),
    # one that prints only the roles it names: the instructions vanish without a word
    ("{% if m.role in ['system', 'user', 'assistant', 'tool'] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}",
     "dropped"),
    # one that raises on a role it does not know
    ("{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('Unexpected message role.') }}"
     "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n", "rejected"),
])
def test_what_a_template_does_with_a_developer_message(body, mode):
    # as transformers gives it (llama-server gives it as system: tests/test_engine_parity.py)
    src = "{% for m in messages %}" + body + "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    a = analyze(T(src))
    assert a.status == "pass" and a.capabilities["developer"] == mode
