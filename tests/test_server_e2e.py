"""On the pinned llama-server itself: the delimiters its chat endpoint takes for a template, and a
session sent request by request through /v1/chat/completions with what the log says of each.

Needs the llama-server binary scripts/build_llama_server.sh builds (or $TMPLKIT_LLAMA_SERVER),
llama-cpp-python and the corpus (for the tiny models: gemma3, sliding window, so llama-server
takes context checkpoints for them; the hybrid, tinyhybrid: test_server_resume_hybrid.py).
"""

from __future__ import annotations

import json

import pytest

from tmplkit import analyze
from tmplkit.server.process import LlamaServer
from tmplkit.sources import corpus

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.corpus]


@pytest.fixture(scope="module")
def binary(llama_server_path):
    return llama_server_path


def _template(name: str):
    from tmplkit.sources import load_one

    return load_one(str(corpus.templates_dir() / f"{name}.jinja"))


def test_a_session_request_by_request_and_what_the_log_says(binary, tmp_path):
    from tmplkit.prefill import generate_session, tiny_model_path
    from tmplkit.server.chat_session import drive_session

    session = generate_session(8000, seed=0, style="agent")  # request 9 follows a new user message
    args = ["--jinja", "-c", "16384", "-np", "1", "-t", "2", "-tb", "2", "--no-warmup", "--cache-ram", "0",
            "-ctxcp", "32", "-cms", "512", "-lv", "4"]
    with LlamaServer(binary, tiny_model_path("qwen35"), args, log=tmp_path / "server.log") as server:
        served = drive_session(server, session, max_tokens=2, seed=0)
    assert len(served) >= 8
    for prev, r in zip((None, *served), served):
        p = r.prefill
        # the server's answer and its log tell the same counts
        assert (r.n_prompt, r.n_reused, r.n_processed) == (p.n_prompt, p.n_reused, p.n_processed)
        assert p.level == "trace" and p.batch_starts[0] == r.n_reused and sum(p.batch_sizes) == r.n_processed
        assert p.checkpoints_created, r  # a sliding-window model: checkpoints on every request
        assert p.full_reprocess is False
        if prev is not None and r.n_reused < prev.n_prompt - 8:
            # the template rewrote history (a new user message drops the past turns' reasoning):
            # the server went back to a checkpoint, at most the shared prefix
            assert p.checkpoints_restored and p.checkpoints_restored[0] <= p.n_common + 1
    news = [r for r in served[1:] if r.prefill.checkpoints_restored]
    assert news, "no request went back to a checkpoint: the test is vacuous"
    assert json.loads(json.dumps([r.to_dict() for r in served]))[0]["n_reused"] == 0


@pytest.mark.parametrize("name, model, route, verdict", [
    # on text (the byte vocabulary) the hard-coded Qwen3-Coder list keeps tool results apart ...
    ("Qwen3.5-4B", "bytes", "specialized", "agree"),
    # ... but with the corpus's vocab-only GGUF, where `<tool_response>` is text, its tool delimiter
    # tokenized on its own ends in '>' where the prompt has '>\n': tool results count as user messages
    ("Qwen3.5-4B", "family", "specialized", "tool results taken for user messages"),
    # the autoparser's two delimiters on a template with tool results inside user turns: issue 25213
    ("Qwen-Qwen3-0.6B", "bytes", "autoparser", "tool results taken for user messages"),
    ("meta-llama-Llama-3.2-3B-Instruct", "bytes", "autoparser", "agree"),
    ("LFM2-8B-A1B", "bytes", "specialized", "no delimiters at all"),
])
def test_the_chat_endpoints_delimiters_read_off_the_server(binary, name, model, route, verdict, tmp_path):
    from tmplkit.server.delimiter_comparison import compare_delimiters
    from tmplkit.server.delimiters import server_delimiters

    template = _template(name)
    analysis = analyze(template)
    d = server_delimiters(template, binary, model, analysis=analysis, log_dir=tmp_path)
    assert d.status == "ok" and d.route == route and not d.undecided
    c = compare_delimiters(d, analysis)
    assert c.verdicts == (verdict,), c.to_dict()
    roles = [m["role"] for m in d.messages]
    users = [i for i, r in enumerate(roles) if r == "user"]
    assert c.tmplkit == tuple(users)  # tmplkit starts exactly the user messages
    if verdict == "tool results taken for user messages":
        assert {r for _, r in c.extra} == {"tool"} and not c.missed and "25213" in c.advice()
    if name == "meta-llama-Llama-3.2-3B-Instruct":
        assert [x.to_dict() for x in d.delimiters] == [
            {"role": "assistant", "delimiter": "<|start_header_id|>assistant<|end_header_id|>"},
            {"role": "user", "delimiter": "<|start_header_id|>user<|end_header_id|>"}]
    if name == "Qwen-Qwen3-0.6B":
        assert [x.delimiter for x in d.delimiters] == ["<|im_start|>assistant", "<|im_start|>user"]
    if name == "Qwen3.5-4B":
        assert d.handler == "Qwen3-Coder" and d.delimiters is None  # the server does not log its list
    if name == "LFM2-8B-A1B":
        assert d.user_starts == () and [i for i, _ in c.missed] == users


def test_the_command_prints_the_comparison_as_json(binary, tmp_path, capsys):
    from tmplkit.cli import main

    if not corpus.is_hub_fetched():
        pytest.skip("the Hub corpus is not in the cache; run `tmplkit corpus fetch hub`")
    path = corpus.gemma_template_path()
    assert main(["--no-config", "server", "delimiters", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema_version"] == 1 and out["templates"] == 1 and out["counts"]["agree"] == 1
    (row,) = out["results"]
    assert row["server"]["route"] == "autoparser" and row["verdicts"] == ["agree"]
    assert [d["delimiter"] for d in row["server"]["delimiters"]] == ["<start_of_turn>model", "<start_of_turn>user"]


def test_the_command_fails_on_a_difference_where_asked(binary, tmp_path, capsys):
    from tmplkit.cli import main

    run = ["--no-config", "server", "delimiters", "--server", str(binary), "--format", "json"]
    agrees = str(corpus.templates_dir() / "meta-llama-Llama-3.2-3B-Instruct.jinja")
    differs = str(corpus.templates_dir() / "Qwen-Qwen3-0.6B.jinja")  # tool results taken for user messages
    assert main([*run, agrees, differs]) == 0  # a report by default
    capsys.readouterr()
    assert main([*run, agrees, differs, "--fail-on", "differs"]) == 1
    out = json.loads(capsys.readouterr().out)  # the comparison all the same
    assert out["counts"]["agree"] == 1 and out["counts"]["tool results taken for user messages"] == 1
    assert main([*run, agrees, "--fail-on", "unchecked"]) == 0
