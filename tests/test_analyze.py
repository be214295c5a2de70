"""Differential analysis on small inline templates: each quirk the probes adapt to, each verdict."""

from __future__ import annotations

import pytest

from tmplkit.analyze import STATUSES, TOOL_PLACEMENTS, Analysis, analyze
from tmplkit.render import Limits
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
    assert a.status == "fail"
    assert any("render exactly like user messages" in e for e in a.errors)
    assert any("classified as a user message" in p for p in a.round_trip.problems)


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


def test_a_delimiter_matching_inside_template_text_fails_the_round_trip():
    # The tool marker also appears in the system text the template writes after a system prompt.
    t = ("{% for m in messages %}{% if m.role == 'system' %}<|im_start|>system\n{{ m.content }}\nResults arrive after <out>.<|im_end|>\n"
         "{% elif m.role == 'tool' %}{% if messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user\n{% endif %}<out>{{ m.content }}"
         "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
         "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}")
    a = analyze(T(t))
    assert a.tool_response_next == "<out>"
    assert a.status == "fail"
    assert any("where no message starts" in p for p in a.round_trip.problems)
