"""Replay on a model: the recompute `tmplkit.turns` predicts equals the runner's, request by request."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit.session import generate_session
from tmplkit.sources import corpus, load_one

CHATML = load_one(str(Path(__file__).resolve().parent.parent / "fixtures" / "templates" / "chatml.jinja"))

pytestmark = [pytest.mark.model, pytest.mark.corpus]


def replay(model_path, template, session):
    from tmplkit.prefill import PrefillRunner
    from tmplkit.prefill.compare import resolve_template
    from tmplkit.replay import replay_session

    # one thread and no busy-polling threadpool: a generated turn is decoded one token per call
    with PrefillRunner(model_path, n_ctx=32768, n_threads=1, poll=None) as runner:
        return replay_session(runner, session, resolve_template(template, runner))


def test_prediction_equals_replay_on_the_tiny_qwen35_model():
    pytest.importorskip("llama_cpp")
    from tmplkit.prefill import tiny_model_path

    session = generate_session(1500, seed=3, style="agent", requests=2)
    rep = replay(tiny_model_path(), load_one(corpus.templates_dir() / "Qwen3.5-4B.jinja"), session)
    assert set(rep.requests) == {"llama-server", "tmplkit", "divergence-aware"}
    assert rep.matches, rep.mismatches()
    # the second user request makes the template drop reasoning: a checkpoint is restored there
    assert any(r.restored is not None for r in rep.requests["tmplkit"])
    for name in rep.requests:
        assert all(r.n_recomputed >= b for r, b in zip(rep.requests[name], rep.bound))  # the full-attention bound
        assert all(r.n_reused + r.n_recomputed == r.n_prompt for r in rep.requests[name])


def test_prediction_equals_replay_on_gemma():
    pytest.importorskip("llama_cpp")
    try:
        path = corpus.gemma_model_path()
    except Exception as exc:  # the model package is optional
        pytest.skip(str(exc))
    session = generate_session(1200, seed=4, style="user-turns", requests=2)
    # the GGUF carries no chat template: the model's own from the Hub corpus, as the benchmarks use
    if not corpus.is_hub_fetched():
        pytest.skip("the Hub corpus is not in the cache; run `tmplkit corpus fetch hub`")
    rep = replay(path, load_one(corpus.gemma_template_path()), session)
    assert rep.matches, rep.mismatches()


@pytest.mark.parametrize("settings", [("bogus",), ("tmplkit", "Tmplkit"), ()])
def test_a_setting_it_does_not_know_is_refused_before_the_model_runs(settings):
    # (an unknown name replayed nothing and said nothing: an empty replay)
    from tmplkit.errors import InputError
    from tmplkit.replay import replay_session

    with pytest.raises(InputError, match="setting"):
        replay_session(None, generate_session(1000, seed=0), CHATML, settings=settings)


def test_a_context_too_small_names_the_size_the_whole_session_needs():
    # (it named the first request past the limit: -c 1000 said 1506, -c 1506 then said 1729, ...)
    pytest.importorskip("llama_cpp")
    from tmplkit.errors import InputError
    from tmplkit.prefill import PrefillRunner, tiny_model_path
    from tmplkit.replay import replay_session

    session = generate_session(1500, seed=3, style="agent", requests=3)
    template = load_one(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    sizes = []
    for n_ctx in (600, 1200):
        with PrefillRunner(tiny_model_path(), n_ctx=n_ctx, n_threads=1, poll=None) as runner:
            with pytest.raises(InputError, match=r"raise n_ctx \(-c\) to at least (\d+)") as err:
                replay_session(runner, session, template, settings=("none",))
        sizes.append(int(err.value.args[0].split("at least ")[1].split()[0]))
    assert sizes[0] == sizes[1] > 1200
