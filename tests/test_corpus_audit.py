"""The llama.cpp corpus (the templates the tests use, `_kept`): every template passes the round trip
or is a listed expected failure.

The list (tests/corpus_expected_failures.json, name -> reason) must stay true: a listed template
that starts to pass fails the test too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _kept import held_out, kept_paths

from tmplkit.analysis import analyze
from tmplkit.delimiters import Delimiter, split_text
from tmplkit.sources import ChatTemplate, corpus

pytestmark = pytest.mark.corpus

ROOT = Path(__file__).parent.parent
EXPECTED_FAILURES = json.loads((Path(__file__).parent / "corpus_expected_failures.json").read_text(encoding="utf-8"))
TOKENS = json.loads((ROOT / "fixtures/templates/corpus_tokens.json").read_text(encoding="utf-8"))


def _analyze_corpus(with_tokens: bool) -> dict:
    if not corpus.is_fetched():
        pytest.skip("llama.cpp corpus not in the cache; run `tmplkit corpus fetch`")
    out = {}
    for path in kept_paths():
        tokens = TOKENS.get(path.stem, {}) if with_tokens else {}
        t = ChatTemplate(text=path.read_text(encoding="utf-8"), name=path.stem, source=str(path),
                         bos_token=tokens.get("bos_token"), eos_token=tokens.get("eos_token"))
        out[t.name] = analyze(t)
    return out


@pytest.fixture(scope="module")
def analyses() -> dict:
    return _analyze_corpus(with_tokens=True)


@pytest.fixture(scope="module")
def bare_analyses() -> dict:
    """As a bare .jinja is analyzed: bos/eos unknown (what `tmplkit table corpus:llama.cpp` shows)."""
    return _analyze_corpus(with_tokens=False)


def test_corpus_is_complete(analyses):
    assert len(analyses) == 43  # (70 in the corpus, 27 held out)
    kept = {n for n in EXPECTED_FAILURES if not held_out(n)}
    assert kept <= set(analyses), "the expected-failures list names templates not in the corpus"


def test_every_template_passes_or_is_an_expected_failure(analyses):
    unexpected = {n: (a.status, (a.errors or a.round_trip.problems)[:2]) for n, a in analyses.items()
                  if a.status != "pass" and n not in EXPECTED_FAILURES}
    assert not unexpected, f"templates failing that are not listed: {unexpected}"


def test_expected_failures_still_fail(analyses):
    # (a listed template held out of the tests is held to its entry by `make audit`, which .ci/run
    # runs over all 70: an entry that passes fails that audit)
    now_passing = [n for n in EXPECTED_FAILURES if n in analyses and analyses[n].status == "pass"]
    assert not now_passing, f"listed as expected failures but passing now; remove them from the list: {now_passing}"
    assert all(reason.strip() for reason in EXPECTED_FAILURES.values())


def test_at_most_5_fail(analyses):
    assert sum(a.status == "pass" for a in analyses.values()) >= len(analyses) - 5


def test_tool_start_derived_wherever_tool_messages_render(analyses):
    missing = [n for n, a in analyses.items()
               if a.tool_placement in ("own_role", "inside_user", "inside_assistant") and not a.tool_response_start]
    assert not missing
    unknown = [n for n, a in analyses.items() if a.tool_placement == "unknown"]
    assert not unknown


def test_no_delimiter_holds_probe_content(analyses):
    for name, a in analyses.items():
        for d in a.delimiters:
            assert d.text.strip(), (name, d)
            assert "Kq" not in d.text and "kq_lookup" not in d.text, (name, d)
        rendered = a.round_trip.rendered if a.round_trip else ""
        for m in (a.round_trip.messages if a.round_trip else ()):
            content = m.get("content")
            if isinstance(content, str) and content:
                assert not any(content in d.text for d in a.delimiters), (name, content)
        assert not rendered or a.round_trip.actual_roles


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "Qwen3-Coder", "Qwen3.5-4B"])
def test_qwen3_tool_responses_have_their_own_delimiter(analyses, name):
    a = analyses[name]
    assert a.status == "pass"
    assert a.tool_placement == "inside_user"
    assert a.user_start == "<|im_start|>user\n"
    assert a.tool_response_start.startswith(a.user_start) and a.tool_response_start != a.user_start
    assert a.tool_response_start.startswith("<|im_start|>user\n<tool_response>")
    assert a.tool_response_next.startswith("<tool_response>")


def test_split_prefers_the_longest_real_delimiter(analyses):
    a = analyses["Qwen3-Coder"]
    rt = a.round_trip
    spans = split_text(rt.rendered, a.delimiters)
    # Every tool response starts a tool span, never a user span, although the user start matches there too.
    tool_starts = [s.start for s in spans if s.role == "tool"]
    assert len(tool_starts) == sum(m["role"] == "tool" for m in rt.messages)
    for pos in tool_starts:
        assert rt.rendered.startswith(a.user_start, pos) or rt.rendered.startswith(a.tool_response_next, pos)
    # With the user start alone, the first response of each group is classified as a user message.
    only_user = [d for d in a.delimiters if d.role != "tool"]
    assert [s.role for s in split_text(rt.rendered, only_user)].count("user") > [s.role for s in spans].count("user")
    # Order of the given list does not matter: splitting sorts longest first.
    assert split_text(rt.rendered, list(reversed(a.delimiters))) == spans
    assert split_text(rt.rendered, [Delimiter("user", a.user_start), Delimiter("tool", a.tool_response_start)]) == \
        split_text(rt.rendered, [Delimiter("tool", a.tool_response_start), Delimiter("user", a.user_start)])


def test_round_trips_keep_their_conversation(analyses):
    for name, a in analyses.items():
        if a.status != "pass":
            continue
        rt = a.round_trip
        assert rt.messages and rt.rendered and "add_generation_prompt" in rt.render_kwargs, name
        assert rt.expected_roles == rt.actual_roles, name


# Templates whose analysis may differ with and without their bos/eos tokens, with the reason. None
# does: the analysis must not rest on an EOS that ends one kind of turn and not another.
TOKEN_DEPENDENT: dict[str, str] = {}

ANALYSIS_FIELDS = ("status", "user_start", "assistant_start", "system_start", "tool_response_start",
                   "tool_response_next", "generation_prompt", "tool_placement", "delimiters")


def test_unknown_bos_and_eos_give_the_same_analysis(analyses, bare_analyses):
    assert set(TOKEN_DEPENDENT) <= set(analyses) and all(r.strip() for r in TOKEN_DEPENDENT.values())
    differ = {}
    for name, a in analyses.items():
        b = bare_analyses[name]
        diff = {f: (getattr(b, f), getattr(a, f)) for f in ANALYSIS_FIELDS if getattr(a, f) != getattr(b, f)}
        if diff and name not in TOKEN_DEPENDENT:
            differ[name] = diff
    assert not differ, f"analysis without bos/eos (first) differs from the one with them (second): {differ}"


# End-of-turn markers of the corpus: the EOS tokens, and closers the templates write themselves.
END_MARKERS = {t["eos_token"] for t in TOKENS.values() if isinstance(t, dict) and t.get("eos_token")} | {
    "<|im_end|>", "<|end|>", "<|eot_id|>", "<end_of_turn>", "<turn|>", "<|END_OF_TURN_TOKEN|>", "<|eot|>", "<|eom|>",
    "<|call|>", "<|user_end|>", "<|assistant_end|>", "<|end_of_msg|>", "[e~[", "<|END_RESPONSE|>",
    "<|END_ACTION|>", "<|END_TOOL_RESULT|>", "[/TOOL_RESULTS]", "</tool_response>", "</tool_call>",
}


def test_no_delimiter_holds_the_previous_turns_end(analyses, bare_analyses):
    """No delimiter starts with whitespace or holds an end-of-turn marker, except where the documented
    fallback takes the previous turn's closer as the start (Mistral's `[/INST]`, Apertus' `<|tools_suffix|>[`,
    and an answer after tool results at the results' `[/TOOL_RESULTS]`, with `[/TOOL_RESULTS][TOOL_RESULTS]`
    the tool start that wins between two results)."""
    for name, a in list(analyses.items()) + list(bare_analyses.items()):
        closer_starts = {"user_closer": "assistant", "call_closer": "tool"}
        fallback = {role for cap, role in (("assistant_start", "assistant"), ("tool_response_start", "tool"))
                    if a.capabilities.get(cap) in closer_starts}
        if a.capabilities.get("assistant_after_tool") == "after_closer":
            fallback |= {"assistant", "tool"}
        for d in a.delimiters:
            assert not d.text[:1].isspace(), (name, d)
            if d.role not in fallback:
                assert not [m for m in END_MARKERS if m in d.text], (name, d)
        gp = a.generation_prompt or ""
        assert not gp[:1].isspace(), (name, gp)
        assert not [m for m in END_MARKERS if gp.startswith(m)], (name, gp)


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct", "Kimi-K2-Thinking"])
def test_kimi_tool_start_is_the_opener_and_system_turns_keep_their_role(analyses, name):
    # The tool's name follows `<|im_system|>`, so the tool start is the opener alone; the system start
    # shares it and is longer, so longest-first splitting keeps system turns apart.
    a = analyses[name]
    assert a.status == "pass"
    assert a.tool_response_start == "<|im_system|>" and a.system_start == "<|im_system|>system<|im_middle|>"
    spans = split_text(a.round_trip.rendered, a.delimiters)
    system = next(m["content"] for m in a.round_trip.messages if m["role"] == "system")
    at = a.round_trip.rendered.index(system)
    assert next(s for s in spans if s.start <= at < s.end).role == "system"
    tools = [m["content"] for m in a.round_trip.messages if m["role"] == "tool"]
    for content in tools:
        at = a.round_trip.rendered.index(content)
        assert next(s for s in spans if s.start <= at < s.end).role == "tool"


# Reasoning markup is part of the turn's content, not of the role's start: the assistant start is
# the role marker alone, and reasoning gets delimiters of its own (issue 11, item 1).
@pytest.mark.parametrize("name,start,reasoning_start,reasoning_end", [
    ("Qwen-Qwen3-0.6B", "<|im_start|>assistant\n", "<think>\n", "</think>\n\n"),
    ("inclusionai-ling-3.0-flash", "<role>ASSISTANT</role>\n", "<think>", "</think>"),
    ("Kimi-K3", '<|open|>message role="assistant"<|sep|>', "<|open|>think<|sep|>", "<|close|>think<|sep|>"),
    ("Kimi-K2-Thinking", "<|im_assistant|>assistant<|im_middle|>", "<think>", "</think>"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "<|im_start|>assistant\n", "<think>\n", "</think>\n"),
    ("deepseek-ai-DeepSeek-V3.1", "<｜Assistant｜>", "<think>", "</think>"),
    ("deepseek-ai-DeepSeek-V4-Flash-0731", "<｜Assistant｜>", "<think>", "</think>"),
    ("Spark2.5", "<｜start▁of▁sentence｜><|Bot|>", "<think>", "</think>"),
    ("Qwen3.5-4B", "<|im_start|>assistant\n", "<think>\n", "</think>\n\n"),
    ("MiniMax-M3", "]~b]ai\n", "<mm:think>", "</mm:think>"),
])
def test_reasoning_has_delimiters_of_its_own_and_the_assistant_start_holds_with_every_thinking_switch(
        analyses, name, start, reasoning_start, reasoning_end):
    _reasoning_has_delimiters_of_its_own(analyses[name], start, reasoning_start, reasoning_end)


def test_gpt_oss_answer_after_the_analysis_channel_and_its_developer_system_start(corpus_template):
    # The answer is a message of its own after the analysis channel: its start ends the reasoning;
    # the system prompt goes into the developer message after a default header (gpt-oss-20b, from
    # the Hub corpus's development half).
    a = analyze(corpus_template("unsloth-gpt-oss-20b"))
    _reasoning_has_delimiters_of_its_own(a, "<|start|>assistant", "<|channel|>analysis<|message|>", None)
    assert a.system_start == "<|start|>developer<|message|># Instructions\n\n"


def _reasoning_has_delimiters_of_its_own(a, start, reasoning_start, reasoning_end):
    assert a.status == "pass", a.round_trip.problems
    assert (a.assistant_start, a.reasoning_start, a.reasoning_end) == (start, reasoning_start, reasoning_end)
    roles = {d.role: d.text for d in reversed(a.delimiters)}
    # (An answer after tool results may have an assistant delimiter of its own, the results' closer.)
    assistants = [d.text for d in a.delimiters if d.role == "assistant"]
    assert start in assistants and not any(reasoning_start in d for d in assistants)
    assert roles["reasoning"] == reasoning_start
    assert roles.get("reasoning_end") == reasoning_end


@pytest.mark.parametrize("name,earlier,generation", [
    # Qwen3.5 opens the reasoning itself unless thinking is switched off, and drops it from earlier turns.
    ("Qwen3.5-4B", "dropped", {"default": "open", "enable_thinking=False": "closed", "enable_thinking=True": "open"}),
    # Qwen3 leaves it to the model, or closes it when thinking is off.
    ("Qwen-Qwen3-0.6B", "dropped", {"default": "model", "enable_thinking=False": "closed", "enable_thinking=True": "model"}),
    # DeepSeek V3.1 closes it by default; `thinking=True` opens it.
    ("deepseek-ai-DeepSeek-V3.1", None, {"default": "closed", "enable_thinking=False": "closed", "enable_thinking=True": "open",
                                         "thinking=False": "closed", "thinking=True": "open"}),
    ("inclusionai-ling-3.0-flash", "kept", {"default": "open", "enable_thinking=False": "closed", "enable_thinking=True": "open"}),
])
def test_generation_prompt_opens_closes_or_leaves_reasoning_per_thinking_switch(analyses, name, earlier, generation):
    a = analyses[name]
    assert a.earlier_reasoning == earlier
    assert a.generation_reasoning == generation


@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "llama-cpp-deepseek-r1"])
def test_a_generation_prompt_that_opens_reasoning_gives_its_start_without_guessing_its_end(analyses, name):
    # These templates drop reasoning from every earlier answer, so no render shows how it ends.
    a = analyses[name]
    assert a.status == "pass", a.round_trip.problems
    assert a.reasoning_start == "<think>\n" and a.reasoning_end is None
    assert a.generation_reasoning == {"default": "open"} and a.generation_prompt.endswith("<think>\n")


def test_reasoning_lands_in_a_reasoning_span_inside_the_assistant_turn(analyses):
    for name in ("Qwen3.5-4B", "inclusionai-ling-3.0-flash", "Kimi-K3", "Spark2.5"):
        a = analyses[name]
        rt = a.round_trip
        spans = split_text(rt.rendered, a.delimiters)
        kept = [m["reasoning_content"] for m in rt.messages if m.get("reasoning_content") and m["reasoning_content"] in rt.rendered]
        assert kept, name
        for text in kept:
            at = rt.rendered.index(text)
            k = next(i for i, s in enumerate(spans) if s.start <= at < s.end)
            assert spans[k].role == "reasoning" and spans[k - 1].role == "assistant", name
        assert "reasoning" in rt.expected_roles and rt.expected_roles == rt.actual_roles


def test_every_template_that_renders_reasoning_text_has_a_reasoning_delimiter(analyses):
    missing = []
    for name, a in analyses.items():
        if a.status != "pass":
            continue
        rt = a.round_trip
        if any(m.get("reasoning_content") and m["reasoning_content"] in rt.rendered for m in rt.messages):
            if not (a.reasoning_start or a.reasoning_end):
                missing.append(name)
    assert not missing


@pytest.mark.parametrize("name,system_start", [
    ("Kimi-K2-Instruct", "<|im_system|>system<|im_middle|>"),
    ("CohereForAI-c4ai-command-r-plus-tool_use", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"),
])
def test_system_start_leaves_a_default_system_prompt_to_the_content(analyses, name, system_start):
    assert analyses[name].system_start == system_start


def test_generation_prompt_and_tool_start_of_the_apriel_templates(analyses, bare_analyses):
    for found in (analyses, bare_analyses):
        assert found["unsloth-Apriel-1.5"].tool_response_start == "<|tool_result|>\n"
        assert found["unsloth-Apriel-1.5"].tool_response_next is None
        assert found["Apriel-1.6-15b-Thinker-fixed"].generation_prompt == "<|begin_assistant|>\nHere are my reasoning steps:\n"
