"""The prompt cache simulated over token positions, the cost settings, the divergence-aware policy,
and token-level divergence."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.errors import InputError
from tmplkit.server_rules import DivergenceAware, PrefillSettings, ServerGated, get_policy
from tmplkit.session import Session, generate_session
from tmplkit.session.requests import iter_next_renders
from tmplkit.tokens.spans import SpanDetector
from tmplkit.turns import MemoryModel, ServerSimulation, study_turns
from tmplkit.turns.simulation import plan_batches

FIX = Path(__file__).parent.parent / "fixtures" / "turns"
SETTINGS = PrefillSettings(n_batch=2048, n_ubatch=512, max_checkpoints=32, checkpoint_min_step=8192)


class FakeTokenizer:
    """Characters as token ids: enough for SpanDetector over delimiter strings."""

    def tokenize(self, text, *, add_bos=None):
        return [ord(c) for c in text]


def spans_of(ids):
    return SpanDetector([("user", "U"), ("assistant", "A")], FakeTokenizer()).split(ids)


def prompt(n_turns: int, body: int = 300) -> list[int]:
    out = []
    for _ in range(n_turns):
        out += [ord("U")] + [ord("u")] * body + [ord("A")] + [ord("a")] * body
    return out


def test_memory_models():
    swa = MemoryModel.swa(512, 512)
    assert swa.swa_cells == 1024 and swa.pos_min(5000) == 5000 - 1024 and swa.pos_min(10) == 0
    assert MemoryModel("recurrent").pos_min(100) == 99 and MemoryModel("full").pos_min(100) == 0
    assert MemoryModel.parse("swa:256").n_swa == 256 and MemoryModel.parse("recurrent").kind == "recurrent"
    with pytest.raises(InputError):
        MemoryModel.parse("swa:x")


@pytest.mark.parametrize("kwargs", [dict(kind="bogus"), dict(kind="swa"), dict(kind="swa", n_swa=512, swa_cells=256)])
def test_a_memory_the_simulation_does_not_know_is_refused(kwargs):
    # (a kind it did not know was simulated as full attention; a window without cells held nothing)
    with pytest.raises(InputError):
        MemoryModel(**kwargs)


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), float("inf"), "10", True])
def test_a_study_with_a_time_limit_that_is_no_time_is_refused(timeout):
    from tmplkit.turns import study_turns

    with pytest.raises(InputError, match="timeout"):
        study_turns(load_one(str(FIX.parent / "templates" / "chatml.jinja")),
                    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], timeout=timeout)


def test_full_attention_recomputes_from_the_divergence():
    sim = ServerSimulation(MemoryModel("full"), SETTINGS)
    a = prompt(6)
    assert sim.resume(a).n_recomputed == len(a)
    b = a[:1000] + [ord("x")] * 50
    r = sim.resume(b)
    assert (r.n_common, r.n_reused, r.n_recomputed, r.restored) == (1000, 1000, 50, None)
    assert sim.resume(b).n_recomputed == 1  # a repeated prompt still decodes its last token


def test_sliding_window_extends_without_restore_and_restores_before_a_far_divergence():
    sim = ServerSimulation(MemoryModel.swa(512), SETTINGS)
    a = prompt(8)
    first = sim.resume(a, spans_of(a), "gated")
    assert first.checkpoints  # user starts and near the end
    sim.generate([ord("g")] * 20)
    longer = sim.held + prompt(1)
    r = sim.resume(longer, spans_of(longer), "gated")
    assert r.restored is None and r.n_recomputed == len(longer) - len(a) - 20
    # diverge early: the newest checkpoint at or before the divergence is restored, one token before it
    cut = 2000
    other = longer[:cut] + [ord("z")] * 100
    r = sim.resume(other, spans_of(other), "gated")
    assert r.restored is not None and r.restored <= cut
    assert r.n_reused == r.restored - 1 and r.n_recomputed == len(other) - r.n_reused


def test_plan_batches_is_the_runners_schedule():
    a = prompt(4)
    store_sim = ServerSimulation(MemoryModel.swa(512), SETTINGS).store
    batches = plan_batches(len(a), 0, spans_of(a), "gated", SETTINGS, store_sim, 1, MemoryModel.swa(512))
    assert batches[0].begin == 0 and batches[-1].end == len(a)
    assert all(b.end == c.begin for b, c in zip(batches, batches[1:]))
    assert [c.n_tokens for c in store_sim] == [b.begin for b in batches if b.checkpoint and b.begin > 0]


def test_divergence_aware_keeps_only_its_checkpoints():
    a = prompt(10)
    policy = DivergenceAware.for_prompt([1500, len(a) + 40], len(a))
    assert policy.positions == {1501, len(a) - 4}
    sim = ServerSimulation(MemoryModel.swa(512), SETTINGS)
    r = sim.resume(a, spans_of(a), policy)
    assert set(r.checkpoints) == {1501, len(a) - 4}
    assert get_policy("divergence-aware").positions is None  # the registry's instance predicts from the spans


def test_divergence_aware_survives_eviction_where_llama_server_does_not():
    # 40 requests of tool rounds after one user message, then a rewrite right after that message:
    # llama-server's checkpoints (its gate at every user start, two near the end of each request)
    # fill the store and evict the one before the rewrite; the divergence-aware one keeps it.
    base = prompt(1)
    held_len = len(base)
    results = {}
    for name, policy in (("server", ServerGated()), ("aware", None)):
        sim = ServerSimulation(MemoryModel.swa(512), SETTINGS)
        ids = list(base)
        for _ in range(40):
            pol = policy or DivergenceAware.for_prompt([held_len], len(ids))
            sim.resume(ids, spans_of(ids), pol)
            ids = sim.held + [ord("U")] + [ord("t")] * 150
        rewritten = ids[:held_len] + [ord("r")] * 20 + ids[held_len + 20:]
        pol = policy or DivergenceAware.for_prompt([], len(rewritten))
        results[name] = sim.resume(rewritten, spans_of(rewritten), pol)
    assert results["aware"].n_reused >= held_len - 5
    assert results["server"].n_reused < results["aware"].n_reused


@pytest.fixture(scope="module")
def agent():
    return generate_session(3000, seed=0, style="agent", requests=2)


def test_costs_on_a_template_that_drops_reasoning(agent, qwen35):
    r = study_turns(load_one(str(FIX / "drops-reasoning.jinja")), agent, tokenizer=qwen35, switches=False)
    c = r.cost
    assert set(c.requests) == {"full attention", "llama-server", "tmplkit", "divergence-aware"}
    bound = c.total("full attention", first=False)
    for name in ("llama-server", "tmplkit", "divergence-aware"):
        assert c.total(name, first=False) >= bound  # the physical limit
        assert all(x >= y for x, y in zip(c.recomputed(name), c.recomputed("full attention")))
    assert c.total("divergence-aware", first=False) <= 1.1 * bound
    # the token divergence is where the text diverges
    first = r.first
    assert first.token_position is not None and first.token_position < first.n_held_tokens and not first.token_note


def test_settings_chosen_are_simulated_alike_and_without_divergence_aware_no_next_render_is_made(agent, qwen35, monkeypatch):
    template = load_one(str(FIX / "drops-reasoning.jinja"))
    whole = study_turns(template, agent, tokenizer=qwen35, switches=False).cost
    from tmplkit.turns import pipeline

    made = []
    monkeypatch.setattr(pipeline, "iter_next_renders", lambda *a, **k: made.append(1) or iter_next_renders(*a, **k))
    some = study_turns(template, agent, tokenizer=qwen35, switches=False, settings=("tmplkit", "llama-server")).cost
    assert not made and set(some.requests) == {"full attention", "llama-server", "tmplkit"}
    for name in some.requests:
        assert some.requests[name] == whole.requests[name]
    assert study_turns(template, agent, tokenizer=qwen35, switches=False, settings=["divergence-aware"]).cost.requests[
        "divergence-aware"] == whole.requests["divergence-aware"] and made
    with pytest.raises(InputError, match="unknown setting fastest; give some of llama-server, tmplkit, divergence-aware"):
        study_turns(template, agent, tokenizer=qwen35, settings=["fastest"])


def test_stable_template_recomputes_only_new_tokens(agent, qwen35):
    r = study_turns(load_one(str(FIX / "stable.jinja")), agent, tokenizer=qwen35, switches=False)
    assert r.stable
    c = r.cost
    for k, done in enumerate(c.requests["full attention"][1:], start=1):
        # all that is held is reused; the new tokens (tool results, the generation prompt) are computed
        assert done.n_common == done.n_reused and done.n_recomputed == c.n_tokens[k] - done.n_common
    # a short prompt's memory still holds position 0, so llama-server's rule (n_past <= n_tokens,
    # pos_min >= pos_min_thold) looks for a checkpoint although the prompt extends what is held
    assert c.requests["tmplkit"][1].restored is not None


def test_ids_that_differ_where_the_text_is_the_same(qwen35):
    # The generated turn starts with newlines that merge with the generation prompt's own newline
    # when the next request is tokenized whole.
    s = Session(({"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\n\nok"},
                 {"role": "user", "content": "more"}))
    r = study_turns(load_one(str(FIX / "stable.jinja")), s, tokenizer=qwen35, switches=False)
    (d,) = r.divergences
    assert d.position == d.n_held  # the text is a prefix
    assert not d.stable and d.cause == "token ids" and "request/turn boundary" in d.token_note


def test_divergence_aware_sees_a_rewrite_of_the_last_user_message_on_a_strict_template(qwen35):
    # The system prompt moves into each new last user message (Mistral Nemo), and the template
    # refuses a user message right after a tool call: the rewrite of a user message is predicted
    # from the request that first holds it, through the follow-up "tool results, a reply, the next
    # user message", so its checkpoint exists when the user speaks again.
    from tmplkit.session.requests import next_renders
    from tmplkit.turns import session_requests

    template = load_one(str(FIX / "strict-alternation.jinja"))
    session = generate_session(12000, seed=3, style="agent", requests=3)
    reqs = session_requests(session, template)
    follow = next_renders(session, template, reqs)
    system = session.messages[0]["content"]
    assert reqs[0].generated and reqs[0].text.startswith("<|im_start|>user\n" + system)
    # request 0 ends with a tool call: its "new user message" follow-up is refused; the tool results
    # keep the system prompt where it is, the completed follow-up moves it away from the first message
    answered, completed = follow[0]
    assert answered.startswith("<|im_start|>user\n" + system)
    assert completed.startswith("<|im_start|>user\n") and not completed.startswith("<|im_start|>user\n" + system)
    c = study_turns(template, session, tokenizer=qwen35, switches=False).cost
    bound = c.total("full attention", first=False)
    # (without the completed follow-up it recomputed 1.17x the bound, more than gated's 1.01x)
    assert c.total("divergence-aware", first=False) <= 1.02 * bound
    assert c.total("divergence-aware", first=False) <= c.total("tmplkit", first=False)


def test_where_ids_part_is_kept_per_tokenized_session_not_shared_by_a_copy():
    from dataclasses import replace

    from tmplkit.turns.divergence import TokenizedRequests

    tokens = TokenizedRequests(((1, 2, 3), (1, 2, 3, 4)), ((9,), ()))
    assert tokens.common(1) == 3  # request 1 against request 0 and its turn (1, 2, 3, 9)
    assert replace(tokens, requests=((1, 2, 3), (1, 5))).common(1) == 1
