"""Reasoning markers: derived on their own, never part of the assistant start, proved by the round trip."""

from __future__ import annotations

import json
from pathlib import Path

from tmplkit.analysis import analyze
from tmplkit.auditing import format_table
from tmplkit.delimiters import REASONING_ROLES, ROLES, Delimiter, sort_delimiters, split_text
from tmplkit.sources import ChatTemplate
from tmplkit.tokens.spans import SpanDetector

FIXTURES = Path(__file__).parent.parent / "fixtures" / "templates"


def T(text: str, name: str = "t") -> ChatTemplate:
    return ChatTemplate(text=text, name=name, source="test")


def reasoning_fixture() -> ChatTemplate:
    return ChatTemplate(text=(FIXTURES / "reasoning.jinja").read_text(encoding="utf-8"), name="reasoning",
                        source="fixture", eos_token="<|end|>")


# A Qwen3-like turn: reasoning kept after the last user message only, and given as message content.
QWEN3 = (
    "{%- set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_fixture_reasoning_is_inside_the_assistant_turn_and_the_assistant_start_is_the_role_marker():
    a = analyze(reasoning_fixture())
    assert a.status == "pass", a.round_trip.problems
    assert (a.assistant_start, a.reasoning_start, a.reasoning_end) == ("<|assistant|>\n", "<think>", "</think>\n")
    rt = a.round_trip
    spans = split_text(rt.rendered, a.delimiters)
    for m in rt.messages:
        if m.get("reasoning_content") and m["reasoning_content"] in rt.rendered:
            at = rt.rendered.index(m["reasoning_content"])
            k = next(i for i, s in enumerate(spans) if s.start <= at < s.end)
            assert spans[k].role == "reasoning" and spans[k - 1].role == "assistant"
    assert rt.expected_roles == rt.actual_roles and "reasoning_end" in rt.actual_roles


def test_generation_prompt_verdict_per_thinking_switch_and_earlier_turns():
    a = analyze(reasoning_fixture())
    assert a.earlier_reasoning == "dropped"
    assert a.generation_reasoning == {"default": "open", "enable_thinking=False": "closed", "enable_thinking=True": "open"}
    q = analyze(T(QWEN3))
    assert q.status == "pass", q.round_trip.problems
    assert (q.assistant_start, q.reasoning_start, q.reasoning_end) == ("<|im_start|>assistant\n", "<think>\n", "</think>\n\n")
    assert q.generation_reasoning == {"default": "model", "enable_thinking=False": "closed", "enable_thinking=True": "model"}
    d = q.to_dict()
    assert d["earlier_reasoning"] == "dropped" and d["generation_reasoning"]["enable_thinking=False"] == "closed"


def test_a_template_without_reasoning_has_no_reasoning_delimiters():
    a = analyze(T("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
    assert a.reasoning_start is None and a.reasoning_end is None and a.earlier_reasoning is None
    assert a.generation_reasoning == {} and not any(d.role in REASONING_ROLES for d in a.delimiters)


def test_reasoning_that_lands_outside_the_assistant_turn_fails_the_round_trip():
    # The reasoning is written after the assistant's turn, inside a user turn.
    broken = QWEN3.replace("<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n",
                           "{% endif %}{{ m.content }}<|im_end|>\n{% if m.reasoning_content and loop.index0 > ns.last %}"
                           "<|im_start|>user\n<think>\n{{ m.reasoning_content }}\n</think>\n\n<|im_end|>\n{% endif %}")
    a = analyze(T(broken))
    assert a.status == "fail"
    assert any("(assistant): its content lies in a user span" in p for p in a.round_trip.problems)


def test_reasoning_markup_quoted_in_a_system_prompt_is_a_warning_not_a_failure():
    quoting = QWEN3.replace("{%- for m in messages %}<|im_start|>{{ m.role }}\n",
                            "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'system' %}Think inside <think>\n and close with </think>\n\n. {% endif %}")
    a = analyze(T(quoting))
    assert a.status == "pass", a.round_trip.problems
    # The markers are still named, but left out of the delimiters: splitting by them would put the
    # system prompt's text in a reasoning span (issue: reasoning delimiters that swallow a system message).
    assert (a.reasoning_start, a.reasoning_end) == ("<think>\n", "</think>\n\n")
    assert not [d for d in a.delimiters if d.role in ("reasoning", "reasoning_end")]
    assert any("left out of the delimiters" in w for w in a.warnings)
    system = next(m["content"] for m in a.round_trip.messages if m["role"] == "system")
    at = a.round_trip.rendered.index(system)
    assert next(sp for sp in split_text(a.round_trip.rendered, a.delimiters) if sp.start <= at < sp.end).role == "system"


def test_reasoning_with_no_opener_of_its_own_is_said_in_a_warning():
    # The reasoning follows the role marker directly; only its end is marked.
    bare = QWEN3.replace("<think>\n{{ m.reasoning_content }}\n</think>\n\n", "{{ m.reasoning_content }}\n[FINAL]\n")
    a = analyze(T(bare))
    assert a.status == "pass", a.round_trip.problems
    assert a.reasoning_start is None and a.reasoning_end == "[FINAL]\n"
    assert any("no opening marker" in w for w in a.warnings)


def test_reasoning_roles_sort_after_message_roles_and_are_never_user_starts():
    assert set(REASONING_ROLES).isdisjoint(ROLES)
    ds = sort_delimiters([Delimiter("reasoning", "<u>"), Delimiter("user", "<u>"), Delimiter("reasoning_end", "</u>")])
    assert [d.role for d in ds] == ["reasoning_end", "user", "reasoning"]

    class Chars:
        name = "chars"

        def tokenize(self, text, add_bos=False):
            return [ord(c) for c in text]

    det = SpanDetector([Delimiter("user", "U:"), Delimiter("assistant", "A:"), Delimiter("reasoning", "<t>"),
                        Delimiter("reasoning_end", "</t>")], tokenizer=Chars())
    spans = det.split([ord(c) for c in "U:hiA:<t>hmm</t>yoU:again"])
    assert spans.roles == ("user", "assistant", "reasoning", "reasoning_end", "user")
    assert spans.starts("user") == [0, 18] and spans.last_user_start() == 18
    assert not spans.is_user_start(6)


def test_table_has_reasoning_columns():
    a = analyze(reasoning_fixture())
    rows = json.loads(format_table([a], "json"))["rows"]
    assert rows[0]["reasoning_start"] == "<think>" and rows[0]["reasoning_end"] == "</think>\n"
    assert rows[0]["generation_reasoning"]["enable_thinking=False"] == "closed"
    md = format_table([a], "markdown")
    assert "| reasoning | reasoning end | generation reasoning |" in md
    assert "`<think>`" in md and "enable_thinking=False:closed" in md
    csv = format_table([a], "csv")
    assert csv.splitlines()[0].endswith("reasoning_start,reasoning_end,generation_reasoning,reason")
