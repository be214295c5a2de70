"""The turns study's llama-server setting against the real llama-server: a generated agent session
sent request by request through /v1/chat/completions, each request predicted from the server's
render, its delimiter list and its rules, and the prediction equal to what its log says.

On the tiny sliding-window model (gemma3-shaped, window 512; the hybrid: test_server_resume_hybrid.py), with
few checkpoints kept (-ctxcp 6) and a small minimum step, so that eviction, restores and a full
re-processing all happen. Needs the llama-server binary scripts/build_llama_server.sh builds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit.sources import corpus

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.corpus]

RESULTS = Path(__file__).resolve().parent.parent / "scripts" / "results" / "server-delimiters.json"


@pytest.fixture(scope="module")
def binary(llama_server_path):
    return llama_server_path


@pytest.fixture(scope="module")
def session():
    from tmplkit.session import generate_session

    return generate_session(8000, seed=0, style="agent")  # request 9 follows a new user message


@pytest.mark.parametrize("name, what", [
    # a hard-coded list (Qwen3-Coder's) whose tool delimiter the vocabulary splits otherwise: tool
    # results are user starts, 6 checkpoints do not reach back past them, the whole prompt again
    ("Qwen3.5-4B", "full reprocess"),
    # the autoparser's two logged delimiters; Phi-3.5 renders no tool results, so every request
    # goes back to a checkpoint while the memory still holds position 0
    ("microsoft-Phi-3.5-mini-instruct", "restored"),
    # a handler that sets no delimiters: only the near-end checkpoints
    ("LFM2-8B-A1B", "restored"),
])
def test_prediction_equals_the_servers_log_on_every_request(binary, session, name, what, tmp_path):
    from tmplkit.prefill import tiny_model_path
    from tmplkit.server.process import LlamaServer
    from tmplkit.server.resume import check_resume, server_settings_args
    from tmplkit.server_rules import PrefillSettings, load_server_delimiters, server_delimiter_list
    from tmplkit.sources import load_one
    from tmplkit.tokens.roundtrip import vocab_for_template
    from tmplkit.tokens.tokenizers import LlamaCppTokenizer

    template = load_one(str(corpus.templates_dir() / f"{name}.jinja"))
    delims = server_delimiter_list(template, load_server_delimiters(RESULTS))
    assert (len(delims) == 0) == (name == "LFM2-8B-A1B")
    settings = PrefillSettings(n_ctx=16384, max_checkpoints=6, checkpoint_min_step=256)
    model = tiny_model_path(vocab_for_template(name) or "qwen35", None)
    args = ["--jinja", "-c", "16384", "-np", "1", "-t", "2", "-tb", "2", "--no-warmup", "--cache-ram", "0",
            *server_settings_args(settings), "-lv", "4", "--chat-template-file", str(template.source)]
    tok = LlamaCppTokenizer(model)
    try:
        with LlamaServer(binary, model, args, log=tmp_path / "server.log", startup_s=120) as server:
            check = check_resume(server, template, session, tokenizer=tok, delimiters=delims, settings=settings)
    finally:
        tok.close()
    assert check.equal, check.mismatches()
    measured = [r.measured for r in check.requests]
    assert len(measured) >= 10 and all(m["checkpoints_created"] for m in measured)
    if what == "full reprocess":
        assert any(m["full_reprocess"] for m in measured[1:])
    else:
        assert any(m["checkpoint_restored"] is not None for m in measured[1:])
    assert check.to_dict()["requests"][0]["predicted"]["n_reused"] == 0
