"""Session verdicts on the templates that used to get them wrong (fixtures/turns), text and token
verdicts telling the same story, and the invariants that hold whatever the template is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmplkit import load_one
from tmplkit.sandbox import reads_clock
from tmplkit.session import Session, as_server_renders, for_server, generate_session
from tmplkit.session.requests import clock_at, turn_ending
from tmplkit.turns import session_requests, study_turns

FIX = Path(__file__).parent.parent / "fixtures" / "turns"


@pytest.fixture(scope="module")
def session():
    return generate_session(3000, seed=0, style="agent", requests=2)


def tmpl(name: str):
    return load_one(str(FIX / f"{name}.jinja"))


def _verdicts(name, session, tokenizer):
    text = study_turns(tmpl(name), session, switches=False)
    tokens = study_turns(tmpl(name), session, tokenizer=tokenizer, switches=False)
    return text, tokens


# ---- the classes of the issue, each on a template of ours, text and tokens agreeing --------------

def test_a_header_printed_whatever_add_generation_prompt_says_is_no_part_of_the_turn(session):
    from conftest import _corpus_vocab

    llama3 = _corpus_vocab("llama-bpe")  # Llama 3's vocabulary: its markers are special tokens
    t = tmpl("always-header")
    reqs = session_requests(session, t)
    # (the header is always there: the renders with and without add_generation_prompt are alike, and
    # the request's generation prompt is the header it ends with, which every render writes last)
    assert reqs[0].generation_prompt == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert turn_ending(for_server(t, session), session.messages[reqs[0].turn[0]]) == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert not reqs[0].generated.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    text, tokens = _verdicts("always-header", session, llama3)
    assert text.stable and tokens.stable


def test_an_end_of_generation_marker_is_not_a_divergence(session, qwen35):
    t = tmpl("end-markers")
    reqs = session_requests(session, t)
    assert all(not r.generated.endswith("<|return|>") for r in reqs)
    text, tokens = _verdicts("end-markers", session, qwen35)
    assert text.stable and tokens.stable


def test_a_turn_the_history_drops_diverges_at_the_generation_prompt(session, qwen35):
    text, tokens = _verdicts("drops-generated", session, qwen35)
    assert not text.stable and not tokens.stable
    assert text.first.cause == "generation prompt" and tokens.first.request == text.first.request


def test_a_forced_open_reasoning_prompt_the_history_renders_without_is_unstable(session, qwen35):
    text, tokens = _verdicts("forced-open-reasoning", session, qwen35)
    assert not text.stable and not tokens.stable
    assert text.first.cause == "generation prompt" and "START_THINKING" in text.first.detail


def test_the_renders_tmplkit_builds_keep_the_keys_the_client_sent():
    # An OpenAI-style agent: tool-call turns with content null, tool messages without a name. The
    # needle render of the newest turn keeps its tool calls, and the predicted follow-ups' tool
    # results are shaped like the session's own.
    from tmplkit.session.requests import _generated_turn, next_renders

    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    messages = ({"role": "user", "content": "Find x."}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "x is 1"}, {"role": "assistant", "content": "It is 1."},
                {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": None, "tool_calls": [call]})
    seen: list = []

    def draw(msgs, gp):
        seen.append([dict(m) for m in msgs])
        return "".join(str(m.get("content")) for m in msgs) + ("" if len(seen) > 1 else "X")

    _generated_turn(draw, list(messages), "request", "gp")
    assert seen[-1][-1]["tool_calls"] == [call] and seen[-1][-1]["content"] != messages[-1]["content"]
    renders = []
    t = tmpl("stable")
    conversation = for_server(t, Session(messages))
    original = conversation.render

    def spy(msgs=None, **kw):
        renders.append(msgs)
        return original(msgs, **kw)

    object.__setattr__(conversation, "render", spy)
    reqs = session_requests(conversation, t)
    next_renders(conversation, t, reqs)
    tool_results = [m for msgs in renders if msgs for m in msgs[len(messages) - 1:] if m.get("role") == "tool"]
    assert tool_results and all(set(m) == {"role", "tool_call_id", "content"} for m in tool_results)


# ---- every render of a session is one transformers makes of the same messages ----------------

@pytest.mark.parametrize("name", sorted(p.stem for p in FIX.glob("*.jinja")))
def test_every_request_is_what_transformers_renders_of_the_same_messages(name, session):
    ctu = pytest.importorskip("transformers.utils.chat_template_utils")
    t = tmpl(name)
    conversation = for_server(t, session)
    reqs = session_requests(session, t)
    for r in reqs[:6]:
        # (the list the server renders: a system message the template never reads folded into the next)
        given = as_server_renders(t, conversation.messages[:r.n_messages])
        messages = ctu._normalize_chat_messages([dict(m) for m in given])
        tools = [dict(x) for x in conversation.tools] if conversation.tools else None
        rendered, _ = ctu.render_jinja_template([messages], tools=tools, chat_template=t.text, add_generation_prompt=True,
                                                **conversation.variables_at(clock_at(r.time)))
        if not reads_clock(t.text):  # (a dated template is rendered at each request's own time; a random one draws)
            assert rendered[0] == r.text


# ---- whatever the template and the generated turn -------------------------------------------

_TEMPLATES = sorted(p.stem for p in FIX.glob("*.jinja"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(_TEMPLATES), st.integers(0, 10_000))
def test_a_request_that_does_not_extend_the_one_before_is_never_stable(name, seed):
    s = generate_session(1500, seed=seed, style="agent", requests=2)
    t = tmpl(name)
    reqs = session_requests(s, t)
    report = study_turns(t, s, switches=False)
    for d in report.divergences:
        if not reqs[d.request].text.startswith(reqs[d.request - 1].text):
            assert not d.stable, (name, seed, d.request)
    assert json.dumps(report.to_dict())  # and the report stays JSON


def test_an_ending_the_newest_turn_alone_has_is_markup_or_starts_where_its_content_ends():
    from tmplkit.sources import ChatTemplate

    hello = {"role": "assistant", "content": "Hello."}
    # A guard model's instructions after the conversation, naming the last speaker: they start right
    # after the turn's content, and no model writes them (its training mask learns the answer alone).
    guard = ChatTemplate("{% for m in messages %}\n\n{{ m.role }}: {{ m.content }}{% endfor %}\n\n<END>\n\n"
                         "Assess the {{ messages[-1].role }}.", "guard", "-")
    session = Session(({"role": "user", "content": "Hi"}, hello))
    assert turn_ending(for_server(guard, session), hello) == "<END>\n\nAssess the assistant."
    # A call written otherwise once it is followed (its id, as Apriel 1.5 writes it): the two renders
    # part inside the call's JSON, and the rest of the call is the model's to write.
    ids = ChatTemplate("{% for m in messages %}{% set newest = loop.last %}<{{ m.role }}>{{ m.content }}"
                       "{% for c in m.tool_calls | default([]) %}"
                       "[{\"name\": \"{{ c.function.name }}\"{% if not newest %}, \"id\": \"{{ c.id }}\"{% endif %}}]"
                       "{% endfor %}</{{ m.role }}>"
                       "{% endfor %}", "ids", "-")
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": "f", "arguments": {}}}]}
    assert turn_ending(for_server(ids, Session(({"role": "user", "content": "Hi"}, call))), call) == ""
