"""The turns study names the cause where an earlier assistant turn is written otherwise: an empty
reasoning block the history drops, an answer dropped, tool calls rewritten (fixtures of ours)."""

from __future__ import annotations

from pathlib import Path

from tmplkit import load_one
from tmplkit.session import Session
from tmplkit.turns import CAUSES, study_turns

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
    assert first.cause == "reasoning dropped" and first.detail.endswith("; stable with preserve_thinking=True")


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
    assert first.request == 2 and first.cause == "tool calls rewritten" and "message 4" in first.detail
    assert '"id": "c3"' in first.request_text and '"id": "c3"' not in first.held_text
    assert set(report.causes()) <= set(CAUSES)
