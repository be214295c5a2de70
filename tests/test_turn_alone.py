"""The generated turn asked for alone (`session._turn_alone`): each request's turn read off two short
renders where that gives what the whole render gives, and the whole render kept wherever it might
not (scripts/turn_paths.py holds the same on every corpus template)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.session import for_server, generate_session, load_conversation
from tmplkit.session import requests as rq

FIX = Path(__file__).parent.parent / "fixtures" / "turns"


@pytest.fixture(scope="module")
def long_chat():
    """A chat of 160 requests, the later ones after hundreds of messages: where the short path pays."""
    turns = []
    for i in range(160):
        turns += [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
    return load_conversation([{"role": "system", "content": "Be brief."}] + turns)


@pytest.fixture(scope="module")
def long_agent():
    return generate_session(60000, seed=11, style="agent")


def _both(t, session):
    server = for_server(t, session)
    whole = tuple(rq.iter_requests(server, t, alone=False))
    return server, whole, tuple(rq.iter_requests(server, t))


def _served(t, server, monkeypatch) -> int:
    """How many of `server`'s requests had their turn read off the short renders."""
    served = []
    real = rq._turn_asked_alone
    with monkeypatch.context() as m:
        m.setattr(rq, "_turn_asked_alone", lambda *a: served.append(real(*a)) or served[-1])
        tuple(rq.iter_requests(server, t))
    return sum(s is not None for s in served)


@pytest.mark.parametrize("name", sorted(p.stem for p in FIX.glob("*.jinja")))
def test_the_short_path_reads_what_the_whole_renders_read_on_every_template_of_ours(name, long_chat):
    t = load_one(str(FIX / f"{name}.jinja"))
    _, whole, short = _both(t, long_chat)
    assert short == whole


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["Qwen3.5-4B", "Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-V3.2", "unsloth-Apriel-1.5",
                                  "google-gemma-4-31B-it-interleaved", "ibm-granite-granite-4.1"])
def test_the_short_path_reads_what_the_whole_renders_read_on_corpus_templates(name, long_agent, corpus_template, monkeypatch):
    t = corpus_template(name)
    server, whole, short = _both(t, long_agent)
    assert short == whole
    # (served: these templates' turns do not depend on the history before the newest user message)
    assert _served(t, server, monkeypatch) >= len(whole) // 2


def test_a_long_session_costs_one_long_render_a_request(long_chat, monkeypatch):
    t = load_one(str(FIX / "stable.jinja"))
    server = for_server(t, long_chat)
    tuple(rq.iter_requests(server, t))  # (the probes run once per template)
    long_renders = []
    for name in ("render", "render_with_prompt"):
        real = getattr(type(server), name)

        def spy(self, msgs=None, *a, real=real, **k):
            if len(msgs if msgs is not None else self.messages) > 64:
                long_renders.append(1)
            return real(self, msgs, *a, **k)

        monkeypatch.setattr(type(server), name, spy)
    reqs = tuple(rq.iter_requests(server, t))
    late = [r for r in reqs if r.n_messages >= 64]  # (from there on: before, two renders cost little)
    # each request once, and the last turn read the whole way to check the session (two more)
    assert len(late) > 100 and len(long_renders) <= len(late) + 2
    assert _served(t, server, monkeypatch) == len(late)  # (the last one's read both ways)


def test_a_turn_numbered_across_the_conversation_keeps_the_whole_renders(long_chat, monkeypatch):
    """The template numbers each assistant turn: asked for alone, every turn is turn 1. The probes
    show it, so the template is not trusted with the short path and every turn is read whole."""
    t = load_one(str(FIX / "turn-counter.jinja"))
    server, whole, short = _both(t, long_chat)
    assert short == whole
    assert whole[-1].generated.startswith("[turn 160] ")
    forced = tuple(rq.iter_requests(server, t, alone=True))
    assert forced != whole  # (the check is what keeps it out)
    assert not rq._trust("turns", server, t, rq._turns_agree)[0]
    assert _served(t, server, monkeypatch) == 0


def test_a_turn_that_changes_after_a_longer_history_than_the_probes_keeps_the_whole_renders(long_chat, monkeypatch):
    """Past five user messages the template writes its turns otherwise: the probes (three user
    messages at most) trust it, and the session's last turn, read both ways, does not."""
    t = load_one(str(FIX / "late-marker.jinja"))
    server, whole, short = _both(t, long_chat)
    assert short == whole
    assert whole[-2].generated.startswith("(a long chat) ")
    assert rq._trust("turns", server, t, rq._turns_agree)[0]
    assert tuple(rq.iter_requests(server, t, alone=True)) != whole
    assert _served(t, server, monkeypatch) == 1  # (the check's own short read of the last turn, and no other)


def test_a_short_session_keeps_the_whole_renders(monkeypatch):
    """Where no request's history reaches 64 messages, two short renders cost about what one whole one
    does: the short path and its checks are not worth it."""
    t = load_one(str(FIX / "stable.jinja"))
    server = for_server(t, generate_session(3000, seed=0, style="agent", requests=2))
    assert _served(t, server, monkeypatch) == 0


# ---- the follow-ups the divergence-aware setting predicts from, spliced -----------------------

def _follow_ups(t, session, monkeypatch=None):
    server = for_server(t, session)
    reqs = tuple(rq.iter_requests(server, t))
    whole = rq.next_renders(server, t, reqs, alone=False)
    spliced = []
    real = rq.spliced_follow_ups
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rq, "spliced_follow_ups", lambda *a: spliced.append(real(*a)) or spliced[-1])
        fast = rq.next_renders(server, t, reqs)
    return server, reqs, whole, fast, sum(s is not None for s in spliced)


@pytest.mark.parametrize("name", sorted(p.stem for p in FIX.glob("*.jinja")))
def test_spliced_follow_ups_are_the_whole_renders_on_every_template_of_ours(name, long_chat):
    _, _, whole, fast, _ = _follow_ups(load_one(str(FIX / f"{name}.jinja")), long_chat)
    assert fast == whole


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["Qwen3.5-4B", "Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-V3.2", "unsloth-Apriel-1.5",
                                  "google-gemma-4-31B-it-interleaved", "mistralai-Mistral-Nemo-Instruct-2407"])
def test_spliced_follow_ups_are_the_whole_renders_on_corpus_templates(name, long_agent, corpus_template):
    """Qwen3.5 drops the reasoning of every turn since the newest user message once another comes,
    Mistral Nemo moves the system prompt into the newest user message: both inside what is spliced."""
    _, reqs, whole, fast, spliced = _follow_ups(corpus_template(name), long_agent)
    assert fast == whole
    assert spliced >= len([r for r in reqs if r.n_messages >= 64]) // 2


def test_follow_ups_of_a_template_that_numbers_its_turns_are_rendered_whole(long_chat):
    t = load_one(str(FIX / "turn-counter.jinja"))
    server, reqs, whole, fast, spliced = _follow_ups(t, long_chat)
    assert fast == whole and spliced == 0
    assert rq.next_renders(server, t, reqs, alone=True) != whole  # (the probes are what keep it out)


def test_a_copy_of_an_earlier_message_keeps_the_whole_renders():
    """The template marks every user message equal to the newest one: when a question comes again,
    an earlier copy of it renders otherwise, in the history the splice keeps as it was. Probes
    without copies trust the template, and so does the last request, asked once; the copies are
    what keep those requests whole."""
    turns = []
    for i in range(160):
        # (the last ones asked once: the session's last request, read both ways, agrees)
        turns += [{"role": "user", "content": f"Question {i % 7 if i < 150 else i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
    chat = load_conversation([{"role": "system", "content": "Be brief."}] + turns)
    t = load_one(str(FIX / "marks-copies-of-newest.jinja"))
    server, reqs, whole, fast, _ = _follow_ups(t, chat)
    assert fast == whole
    assert rq.next_renders(server, t, reqs, alone=True) != whole
    assert tuple(rq.iter_requests(server, t)) == tuple(rq.iter_requests(server, t, alone=False))


def test_a_history_written_otherwise_once_the_turn_exists_is_read_whole_where_the_next_request_shows_it(monkeypatch):
    """The template marks the tool result before a call that repeats the call before it: asked for
    alone the repeated call has no call before it, and reads as a prefix; the whole render writes
    the mark once the call exists, so the turn is located (`newest-turn`). The probes repeat no
    call and the last turn is an answer; the next request, which holds the mark, is what shows it."""
    call = lambda i, path: {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"path": "{path}"}}'}}  # noqa: E731
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(40):
        again = f"a{i}.py" if i % 4 == 0 else f"b{i}.py"
        messages += [{"role": "user", "content": f"Task {i}."},
                     {"role": "assistant", "content": "", "tool_calls": [call(2 * i, f"a{i}.py")]},
                     {"role": "tool", "tool_call_id": f"c{2 * i}", "content": "x"},
                     {"role": "assistant", "content": "", "tool_calls": [call(2 * i + 1, again)]},
                     {"role": "tool", "tool_call_id": f"c{2 * i + 1}", "content": "y"},
                     {"role": "assistant", "content": f"Done {i}."}]
    t = load_one(str(FIX / "loop-guard.jinja"))
    server, whole, short = _both(t, load_conversation(messages))
    assert short == whole
    assert {r.rule for r in whole} == {"prefix", "newest-turn"}
    monkeypatch.setattr(rq, "_confirmed", lambda conversation, endings, messages, pending, following: pending[0])
    assert tuple(rq.iter_requests(server, t)) != whole  # (unchecked, the repeated calls read as prefixes)
