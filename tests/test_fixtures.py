"""Our own small templates, one per family, analyze to exactly what fixtures/templates/expected.json says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit.analysis import analyze
from tmplkit.delimiters import split_text
from tmplkit.sandbox import render
from tmplkit.sources import ChatTemplate

FIXTURES = Path(__file__).parent.parent / "fixtures" / "templates"
EXPECTED = {k: v for k, v in json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8")).items() if not k.startswith("_")}
FAMILIES = tuple(EXPECTED)
# The fixtures whose round trip passes (the others are expected to fail or be refused, with the reason).
PASSING = tuple(name for name in FAMILIES if EXPECTED[name]["status"] == "pass")


def fixture(name: str) -> ChatTemplate:
    path = FIXTURES / f"{name}.jinja"
    tokens = EXPECTED[name]
    return ChatTemplate(text=path.read_text(encoding="utf-8"), name=name, source=str(path),
                        bos_token=tokens["bos_token"], eos_token=tokens["eos_token"])


def observed(name: str) -> dict:
    a = analyze(fixture(name))
    caps = a.capabilities
    return {
        "bos_token": EXPECTED[name]["bos_token"],
        "eos_token": EXPECTED[name]["eos_token"],
        "status": a.status,
        "user_start": a.user_start,
        "assistant_start": a.assistant_start,
        "system_start": a.system_start,
        "tool_response_start": a.tool_response_start,
        "tool_response_next": a.tool_response_next,
        "generation_prompt": a.generation_prompt,
        "tool_placement": a.tool_placement,
        "reasoning_start": a.reasoning_start,
        "reasoning_end": a.reasoning_end,
        "earlier_reasoning": a.earlier_reasoning,
        "generation_reasoning": a.generation_reasoning,
        "system": caps.get("system"),
        "system_required": caps.get("system_required"),
        "tool_calls": caps.get("tool_calls"),
        "tool_responses_grouped": caps.get("tool_responses_grouped"),
        "assistant_after_tool": caps.get("assistant_after_tool"),
        "thinking_flags": caps.get("thinking_flags"),
        "delimiters": [[d.role, d.text] for d in a.delimiters],
        "round_trip_roles": list(a.round_trip.expected_roles) if a.round_trip else [],
        "warnings": list(a.warnings),
        "errors": list(a.errors) + (list(a.round_trip.problems) if a.round_trip else []),
    }


def test_every_family_has_a_fixture_and_an_expectation():
    on_disk = {p.stem for p in FIXTURES.glob("*.jinja")}
    assert on_disk == set(FAMILIES) == set(EXPECTED)
    assert len(PASSING) >= 17


@pytest.mark.parametrize("name", FAMILIES)
def test_fixture_analysis_is_exactly_as_expected(name):
    assert observed(name) == EXPECTED[name]


@pytest.mark.parametrize("name", PASSING)
def test_fixture_round_trip_passes_and_its_render_is_reproducible(name):
    a = analyze(fixture(name))
    rt = a.round_trip
    assert rt.passed, rt.problems
    assert rt.actual_roles == rt.expected_roles
    # The round trip keeps what the token-level check needs to redo it.
    assert render(fixture(name), list(rt.messages), **rt.render_kwargs) == rt.rendered
    assert tuple(s.role for s in split_text(rt.rendered, a.delimiters)) == rt.actual_roles


def test_qwen_style_tool_response_wins_over_user_start():
    a = analyze(fixture("chatml-tools-in-user"))
    text = "<|im_start|>user\nquestion<|im_end|>\n<|im_start|>user\n<tool_response>\nresult\n</tool_response>\n<tool_response>\nmore\n</tool_response><|im_end|>\n"
    assert [s.role for s in split_text(text, a.delimiters)] == ["user", "tool", "tool"]
