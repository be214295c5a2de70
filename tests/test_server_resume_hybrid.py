"""The turns study's llama-server setting against the real llama-server on the tiny hybrid (llama.cpp's
qwen35: gated-delta-net layers and full attention): a recurrent state cannot roll back, so the server
resumes only from a checkpoint or from zero. Each request predicted with a recurrent memory from the
server's render, its delimiter list and its rules must equal its log; the server's log shows both
memories (a KV cache and recurrent states). Needs scripts/build_llama_server.sh's binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit.sources import corpus

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.corpus]

RESULTS = Path(__file__).resolve().parent.parent / "scripts" / "results"


@pytest.fixture(scope="module")
def session():
    from tmplkit.session import generate_session

    return generate_session(8000, seed=0, style="agent")  # request 9 follows a new user message


@pytest.mark.parametrize("name, what", [
    # tool results taken for user messages; the template drops earlier reasoning at request 9 and
    # none of the 6 checkpoints kept lies before it: the whole prompt again
    ("Qwen3.5-4B", "full reprocess"),
    # real user messages missed: checkpoints of the recurrent state restored
    ("Apertus-8B-Instruct", "restored"),
    # a handler that sets no delimiters: only the near-end checkpoints, every request resumed at the end
    ("LFM2-8B-A1B", "resumed"),
])
def test_prediction_equals_the_servers_log_on_the_hybrid(llama_server_path, session, name, what, tmp_path):
    from tmplkit.prefill import tiny_hybrid_path
    from tmplkit.server.process import LlamaServer
    from tmplkit.server.resume import check_resume, server_settings_args
    from tmplkit.server_rules import PrefillSettings, load_server_delimiters, server_delimiter_list
    from tmplkit.sources import load_one
    from tmplkit.tokens.roundtrip import vocab_for_template
    from tmplkit.tokens.tokenizers import LlamaCppTokenizer
    from tmplkit.turns import MemoryModel

    template = load_one(str(corpus.templates_dir() / f"{name}.jinja"))
    delims = server_delimiter_list(template, load_server_delimiters(RESULTS / "server-delimiters.json"))
    settings = PrefillSettings(n_ctx=16384, max_checkpoints=6, checkpoint_min_step=256)
    model = tiny_hybrid_path(vocab_for_template(name) or "qwen35", None)
    args = ["--jinja", "-c", "16384", "-np", "1", "-t", "2", "-tb", "2", "--no-warmup", "--cache-ram", "0",
            *server_settings_args(settings), "-lv", "4", "--chat-template-file", str(template.source)]
    tok = LlamaCppTokenizer(model)
    try:
        with LlamaServer(llama_server_path, model, args, log=tmp_path / "server.log", startup_s=120) as server:
            check = check_resume(server, template, session, tokenizer=tok, delimiters=delims, settings=settings,
                                 memory=MemoryModel("recurrent"))
            log = server.log_text()
    finally:
        tok.close()
    assert "llama_memory_recurrent: size" in log and "llama_kv_cache: size" in log  # hybrid: both memories
    assert check.equal, check.mismatches()
    measured = [r.measured for r in check.requests]
    assert len(measured) >= 10 and all(m["checkpoints_created"] for m in measured)
    if what == "full reprocess":
        assert any(m["full_reprocess"] for m in measured[1:])
    elif what == "restored":
        assert any(m["checkpoint_restored"] is not None for m in measured[1:])
    else:
        assert all(m["n_reused"] > 0 and not m["full_reprocess"] for m in measured[1:])
