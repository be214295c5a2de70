"""End to end on llama-server itself: given tmplkit's delimiters in the /completion body, it ends
prompt batches and takes context checkpoints only at real user messages of a Qwen-style agent
session; given its own two delimiters, it puts them on tool responses too (read from its log).

Needs the llama-server binary scripts/build_llama_server.sh builds from the pinned sdist (or
$TMPLKIT_LLAMA_SERVER), llama-cpp-python and the corpus (for the tiny Qwen3.5-vocab model).
"""

from __future__ import annotations

import pytest

from tmplkit import analyze
from tmplkit.server.process import LlamaServer, MessageDelimiter, completion_request, read_prefill_log, server_message_starts

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.corpus]

N_BATCH, N_UBATCH, MIN_STEP = 2048, 512, 512


@pytest.fixture(scope="module")
def setup(llama_server_path):
    binary = llama_server_path
    from tmplkit.prefill import generate_session, tiny_model_path
    from tmplkit.server_rules import server_delimiter_list
    from tmplkit.session import messages_for
    from tmplkit.sources import load_one
    from tmplkit.tokens.delimiter_ids import token_delimiters
    from tmplkit.tokens.spans import SpanDetector
    from tmplkit.tokens.tokenizers import LlamaCppTokenizer

    model = tiny_model_path("qwen35")  # gemma3 (sliding window: llama-server takes checkpoints) with Qwen3.5's template
    template = load_one(model)
    tok = LlamaCppTokenizer(model)
    session = generate_session(8000, seed=1, requests=3)
    conversation = {"messages": messages_for(template, session.messages), "tools": list(session.tools)}
    analysis = analyze(template)
    ours = completion_request(template, tok, conversation, analysis=analysis, n_predict=1)
    own = [MessageDelimiter(role, text) for role, text in server_delimiter_list(template)]
    ids = tok.tokenize(ours.prompt, add_bos=True)  # as llama-server tokenizes a prompt string
    spans = SpanDetector(token_delimiters(analysis, tok)).split(ids)
    yield dict(binary=binary, model=model, ours=ours, own=own, ids=ids, tok=tok, template=template, analysis=analysis,
               session=session, users=set(spans.starts("user")), tools=set(spans.starts("tool")))
    tok.close()


SERVER_ARGS = ["-c", "16384", "-b", str(N_BATCH), "-ub", str(N_UBATCH), "-t", "2", "-tb", "2", "-np", "1",
               "-ctxcp", "32", "-cms", str(MIN_STEP), "--cache-ram", "0", "--metrics", "-lv", "5"]


def _prefill(setup, body: dict, log) -> tuple:
    with LlamaServer(setup["binary"], setup["model"], SERVER_ARGS, log=log) as server:
        before = server.metrics().get("llamacpp:n_decode_total", 0)
        answer = server.post("/completion", body)
        calls = server.metrics().get("llamacpp:n_decode_total", 0) - before
        text = server.log_text()
    assert answer["timings"]["prompt_n"] == len(setup["ids"])  # it saw the tokens we split
    return read_prefill_log(text), int(calls)


def test_tmplkit_delimiters_keep_llama_server_off_tool_responses(setup, tmp_path):
    n, users, tools = len(setup["ids"]), setup["users"], setup["tools"]
    assert len(users) == 3 and len(tools) >= 15
    # what llama-server's split will find with these delimiters (its algorithm, ported)
    ours_body = setup["ours"].to_dict()
    assert {p for r, p in server_message_starts(setup["ids"], setup["ours"].message_delimiters, setup["tok"]) if r == "user"} == users

    log, calls = _prefill(setup, ours_body, tmp_path / "ours.log")
    near_end = {n - 4 - N_UBATCH, n - 4}  # its two end-of-prompt checkpoints (PR 20288)
    breaks = set(log.breaks(N_BATCH, n))
    assert breaks & users, log  # it did break at real user messages (the test is not vacuous)
    assert breaks <= users | near_end, (sorted(breaks - users - near_end), log)
    assert log.checkpoints and not set(log.checkpoints) & tools, log
    assert all(c in users or c >= n - 4 - N_UBATCH for c in log.checkpoints), log

    own_body = dict(ours_body, message_delimiters=[d.to_dict() for d in setup["own"]])
    own_log, own_calls = _prefill(setup, own_body, tmp_path / "own.log")
    own_breaks = set(own_log.breaks(N_BATCH, n))
    assert own_breaks & tools and set(own_log.checkpoints) & tools, own_log
    assert own_calls > calls
    print(f"\n{n} tokens, {len(users)} user messages, {len(tools)} tool responses; "
          f"tmplkit's delimiters: {calls} decode calls, {len(breaks & tools)} breaks and "
          f"{len(set(log.checkpoints) & tools)} checkpoints on tool responses; llama-server's two: {own_calls} decode calls, "
          f"{len(own_breaks & tools)} breaks and {len(set(own_log.checkpoints) & tools)} checkpoints on tool responses")



def test_a_resume_restores_the_checkpoint_tmplkit_runner_predicts(setup, tmp_path):
    from tmplkit.prefill import PrefillRunner, PrefillSettings, ServerGated
    from tmplkit.session import messages_for, next_user_turn
    from tmplkit.tokens.delimiter_ids import token_delimiters
    from tmplkit.tokens.spans import SpanDetector

    later = next_user_turn(setup["session"])  # the agent answers, the user asks again
    first = setup["ours"]
    second = completion_request(setup["template"], setup["tok"], {"messages": messages_for(setup["template"], later.messages),
                                                                  "tools": list(later.tools)}, analysis=setup["analysis"], n_predict=1)
    ids1, ids2 = setup["ids"], setup["tok"].tokenize(second.prompt, add_bos=True)
    with LlamaServer(setup["binary"], setup["model"], SERVER_ARGS, log=tmp_path / "resume.log") as server:
        server.post("/completion", first.to_dict())
        cold = read_prefill_log(server.log_text())
        mark = len(server.log_text())
        answer = server.post("/completion", second.to_dict())
        warm = read_prefill_log(server.log_text()[mark:])

    # tmplkit's runner, by llama-server's rules (ServerGated) with tmplkit's spans, on the same model
    settings = PrefillSettings(n_ctx=16384, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=2, n_threads_batch=2,
                               max_checkpoints=32, checkpoint_min_step=MIN_STEP)
    detector = SpanDetector(token_delimiters(setup["analysis"], setup["tok"]))
    with PrefillRunner(setup["model"], settings) as runner:
        run = runner.run(ids1, detector.split(ids1), ServerGated())
        resumed = runner.resume(ids2, detector.split(ids2), ServerGated())
    assert tuple(c.start for c in run.decode_calls) == cold.batch_starts
    assert tuple(c.n_tokens for c in run.checkpoints) == cold.checkpoints
    assert resumed.restored is not None and warm.restored == (resumed.restored.n_tokens,)
    assert resumed.restored.n_tokens in setup["users"]  # the last real user message, not a tool response
    assert answer["timings"]["cache_n"] == resumed.n_reused and answer["timings"]["prompt_n"] == resumed.n_processed
    print(f"\nresume {len(ids1)} -> {len(ids2)} tokens: llama-server and tmplkit's runner both restore the checkpoint at "
          f"{resumed.restored.n_tokens} and recompute {resumed.n_processed} tokens")
