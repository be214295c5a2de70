"""The whole llama.cpp corpus: every template passes the round trip or is a listed expected failure.

The list (tests/corpus_expected_failures.json, name -> reason) must stay true: a listed template
that starts to pass fails the test too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit import corpus
from tmplkit.analyze import analyze
from tmplkit.delimiters import Delimiter
from tmplkit.sources import ChatTemplate
from tmplkit.spans import split_text

pytestmark = pytest.mark.corpus

ROOT = Path(__file__).parent.parent
EXPECTED_FAILURES = json.loads((Path(__file__).parent / "corpus_expected_failures.json").read_text(encoding="utf-8"))
TOKENS = json.loads((ROOT / "fixtures/templates/corpus_tokens.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def analyses() -> dict:
    if not corpus.is_fetched():
        pytest.skip("llama.cpp corpus not in the cache; run `tmplkit corpus fetch`")
    out = {}
    for path in sorted(corpus.templates_dir().glob("*.jinja")):
        tokens = TOKENS.get(path.stem, {})
        t = ChatTemplate(text=path.read_text(encoding="utf-8"), name=path.stem, source=str(path),
                         bos_token=tokens.get("bos_token"), eos_token=tokens.get("eos_token"))
        out[t.name] = analyze(t)
    return out


def test_corpus_is_complete(analyses):
    assert len(analyses) == 70
    assert set(EXPECTED_FAILURES) <= set(analyses), "the expected-failures list names templates not in the corpus"


def test_every_template_passes_or_is_an_expected_failure(analyses):
    unexpected = {n: (a.status, (a.errors or a.round_trip.problems)[:2]) for n, a in analyses.items()
                  if a.status != "pass" and n not in EXPECTED_FAILURES}
    assert not unexpected, f"templates failing that are not listed: {unexpected}"


def test_expected_failures_still_fail(analyses):
    now_passing = [n for n in EXPECTED_FAILURES if analyses[n].status == "pass"]
    assert not now_passing, f"listed as expected failures but passing now; remove them from the list: {now_passing}"
    assert all(reason.strip() for reason in EXPECTED_FAILURES.values())


def test_at_least_65_of_70_pass(analyses):
    assert sum(a.status == "pass" for a in analyses.values()) >= 65


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
