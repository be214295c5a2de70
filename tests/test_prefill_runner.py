"""The prefill runner on real models: batch structure by policy, checkpoints, resume, correctness, errors.

The real model is Gemma 3 270M Q4_K_M (sliding-window attention: it cannot roll its memory back, so
checkpoints are taken); its GGUF has no chat template, so sessions are rendered with the model's own
from the Hub corpus's development half (`corpus.gemma_template_path`). Qwen-style sessions
(tool results inside user turns) run on the tiny gemma3 model with the real qwen35 vocabulary.

About the logit tolerances: llama.cpp does not give bitwise-equal logits for every way of batching
the same prompt, and Gemma 3 270M Q4_K_M amplifies the difference. Measured here (max abs
difference of the 262,144 last-token logits, which range over about +-20):
- the same prompt prefilled twice the same way: 0.0 (deterministic);
- batched differently (other policy, other n_ubatch), or resumed from a checkpoint: 0.7-2.2. The
  sliding-window cache is a ring of cells; how the prompt was batched (or restored) decides which
  cell holds which position, so attention sums the same terms in another order; batches of 2-7
  tokens also take another CPU kernel. Flash attention on adds more, so these tests turn it off.
So each comparison is measured against that noise: a cold prefill with n_ubatch 512 instead of 128
(a legitimate recomputation) gives the reference difference `noise`; a prefill that should match
must be within max(3 x noise, 0.5) and 4.0, have a KL divergence below 0.05, and its top token must
be among the cold prefill's top 3.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tmplkit.errors import InputError, ModelError, SourceError, TmplkitError
from tmplkit.sources import corpus

pytestmark = [pytest.mark.model, pytest.mark.corpus]
llama_cpp = pytest.importorskip("llama_cpp")

from tmplkit.prefill import PrefillRunner, PrefillSettings, ServerGated, build_prompt, generate_session, server_spans, tiny_model_path  # noqa: E402
from tmplkit.session import Session  # noqa: E402
from tmplkit.sources import load_one  # noqa: E402
from tmplkit.tokens.delimiter_ids import text_delimiters  # noqa: E402
from tmplkit.tokens.tokenizers import LlamaCppTokenizer  # noqa: E402

# TMPLKIT_TEST_GPU_LAYERS: layers offloaded to a GPU (scripts/gpu_check.sh sets 99); 0 here
GPU_LAYERS = int(os.environ.get("TMPLKIT_TEST_GPU_LAYERS", "0"))
SMALL = dict(n_ctx=4096, n_batch=512, n_ubatch=128, n_threads=2, checkpoint_min_step=1024, flash_attn="off",
             n_gpu_layers=GPU_LAYERS)


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def kl(p_logits, q_logits):
    p, q = softmax(p_logits), softmax(q_logits)
    return float(np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30))))


@pytest.fixture(scope="module")
def gemma():
    try:
        return corpus.gemma_model_path()
    except SourceError as exc:  # a GPU machine may lack the model package (scripts/gpu_check.sh)
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def gemma_tok(gemma):
    tok = LlamaCppTokenizer(gemma)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def gemma_template():
    try:
        return load_one(corpus.gemma_template_path())
    except SourceError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def gemma_prompt(gemma_tok, gemma_template):
    session = generate_session(2600, seed=11, style="user-turns")
    return build_prompt(session, gemma_template, gemma_tok, add_bos=True)


@pytest.fixture(scope="module")
def runner(gemma):
    with PrefillRunner(gemma, **SMALL) as r:
        yield r


@pytest.fixture(scope="module")
def policy_runs(runner, gemma_prompt):
    out = {}
    for policy in ("none", "every-user-start", "gated"):
        rep = runner.run(gemma_prompt.tokens, gemma_prompt.spans, policy)
        out[policy] = (rep, runner.logits())
    return out


def test_model_is_detected_as_needing_checkpoints(runner):
    assert runner.info.n_swa == 512 and runner.info.seq_rm == "part"
    assert not runner.info.can_roll_back and runner.checkpointing
    assert runner.info.add_bos and runner.info.chat_template is None


def test_every_user_start_reproduces_the_regression(policy_runs, gemma_prompt):
    users = gemma_prompt.spans.starts("user")
    assert len(users) >= 10
    none, _ = policy_runs["none"]
    every, _ = policy_runs["every-user-start"]
    assert none.breaks()["user start"] == 0
    # about one decode call per user start (a few coincide with a full batch or the near-end rule)
    assert every.breaks()["user start"] >= len(users) - 3
    assert every.n_decode_calls >= none.n_decode_calls + len(users) - 5
    starts = {c.start for c in every.decode_calls}
    assert sum(u in starts for u in users) >= len(users) - 3


def test_gated_breaks_only_where_a_checkpoint_is_due(policy_runs, gemma_prompt):
    n = len(gemma_prompt.tokens)
    last_user = gemma_prompt.spans.last_user_start()
    gated, _ = policy_runs["gated"]
    none, _ = policy_runs["none"]
    assert set(gated.rules()) <= {"last user message", "no checkpoint yet", "min step"}
    assert gated.rules().get("last user message") == 1
    ck = [c.n_tokens for c in gated.checkpoints]
    assert last_user in ck and n - 4 - 128 in ck and n - 4 in ck
    assert [c.n_tokens for c in none.checkpoints] == [n - 4 - 128, n - 4]
    # every checkpoint is at a batch start, saved before that batch was decoded
    starts = {c.start for c in gated.decode_calls}
    assert set(ck) <= starts
    for c in gated.checkpoints:
        assert c.pos_max == c.n_tokens - 1 and c.bytes > 0
    assert gated.n_decode_calls < policy_runs["every-user-start"][0].n_decode_calls
    # no batch is cut in vain: a checkpoint is taken wherever gated ends a batch early
    assert {c.start + c.size for c in gated.decode_calls if c.rule} <= set(ck)


def test_llama_servers_gate_also_cuts_where_no_checkpoint_follows(runner, gemma_prompt, policy_runs):
    gated, _ = policy_runs["gated"]
    server = runner.run(gemma_prompt.tokens, gemma_prompt.spans, ServerGated())
    ck = [c.n_tokens for c in server.checkpoints]
    in_vain = {c.start + c.size for c in server.decode_calls if c.rule} - set(ck)
    assert in_vain and server.n_decode_calls > gated.n_decode_calls  # (a cut can also save a full-batch boundary)
    # llama-server's first checkpoint holds the BOS token alone (the first user message follows
    # it); gated's first is at the first user start worth a batch (n_ubatch = 128 tokens or more)
    assert ck[0] == 1 and server.decode_calls[0].size == 1
    gck = [c.n_tokens for c in gated.checkpoints]
    assert 128 <= gck[0] < 512 and gck[0] in gemma_prompt.spans.starts("user")  # in the first batch
    assert gated.decode_calls[0].size == gck[0]
    assert ck[-3:] == gck[-3:]  # the last user message and the near-end ones


def assert_close(logits, cold, noise):
    diff = float(np.abs(logits - cold).max())
    assert diff <= min(4.0, max(3 * noise, 0.5)), (diff, noise)
    assert kl(cold, logits) < 0.05
    assert int(np.argmax(logits)) in np.argsort(-cold)[:3].tolist()


@pytest.fixture(scope="module")
def noise(gemma, gemma_prompt, policy_runs):
    """How far a legitimate recomputation (n_ubatch 512 instead of 128) moves the logits."""
    with PrefillRunner(gemma, **{**SMALL, "n_ubatch": 512}) as r:
        r.run(gemma_prompt.tokens, gemma_prompt.spans, "none")
        return float(np.abs(r.logits() - policy_runs["none"][1]).max())


def test_only_the_last_token_gets_logits_and_all_policies_agree(policy_runs, runner, gemma_prompt, noise):
    ref = policy_runs["none"][1]
    assert ref.shape == (runner.info.n_vocab,)
    runner.run(gemma_prompt.tokens, gemma_prompt.spans, "none")
    assert float(np.abs(runner.logits() - ref).max()) == 0.0  # deterministic
    for policy in ("every-user-start", "gated"):
        assert_close(policy_runs[policy][1], ref, noise)
    for rep, _ in policy_runs.values():
        assert rep.decode_calls[-1].reason == "end" and rep.decode_calls[-1].start + rep.decode_calls[-1].size == rep.n_prompt


def test_resume_restores_the_last_user_checkpoint_and_matches_a_cold_prefill(gemma, gemma_tok, gemma_template):
    """The agent replaces its last tool result (e.g. a re-run command): the prompt differs from the
    last user message on, about 450 tokens before the end, beyond what the sliding window keeps."""
    base = list(generate_session(1500, seed=12, style="user-turns").messages)
    a = "Tool result (run):\n```\n" + "\n".join(f"tests/test_a.py::test_{i} PASSED" for i in range(30)) + "\n```"
    b = "Tool result (run):\n```\n" + "\n".join(f"tests/test_b.py::test_{i} FAILED" for i in range(30)) + "\n```"
    old = build_prompt(Session(tuple(base[:-1] + [{"role": "user", "content": a}])), gemma_template, gemma_tok, add_bos=True)
    new = build_prompt(Session(tuple(base[:-1] + [{"role": "user", "content": b}])), gemma_template, gemma_tok, add_bos=True)
    last_user = old.spans.last_user_start()
    assert new.spans.last_user_start() == last_user
    with PrefillRunner(gemma, **SMALL) as r:
        r.run(new.tokens, new.spans, "gated")
        cold = r.logits()
        r.run(old.tokens, old.spans, "gated")
        rep = r.resume(new.tokens, new.spans, "gated")
        warm = r.logits()
        assert rep.restored is not None and rep.restored.n_tokens == last_user
        # llama-server's rule: resume from the checkpoint's pos_max, one token before it
        assert rep.n_reused == last_user - 1 and rep.n_processed == len(new.tokens) - rep.n_reused
        assert r.tokens == list(new.tokens)
        assert r._context.pos_range()[1] == len(new.tokens) - 1
        rep2 = r.resume(new.tokens, new.spans, "gated")  # the same prompt again: only its last token
        assert rep2.n_processed == 1 and rep2.restored is None
    with PrefillRunner(gemma, **{**SMALL, "n_ubatch": 512}) as r:
        r.run(new.tokens, new.spans, "gated")
        noise = float(np.abs(r.logits() - cold).max())
    assert_close(warm, cold, noise)


def test_resume_without_checkpoints_recomputes_everything(gemma, gemma_prompt):
    tokens = list(gemma_prompt.tokens)
    changed = tokens[:-300] + [t if t < 200 else 1000 for t in tokens[-300:]]
    with PrefillRunner(gemma, **SMALL, checkpoints=False) as r:
        r.run(tokens, gemma_prompt.spans, "gated")
        assert not r.checkpointing
        rep = r.resume(changed, None, "gated")
        assert rep.n_reused == 0 and rep.n_processed == len(changed) and not rep.checkpoints


def test_swa_full_can_roll_back_and_takes_no_checkpoints():
    tokens = np.random.default_rng(3).integers(0, 150000, 3000).tolist()
    with PrefillRunner(tiny_model_path("qwen35"), **SMALL, swa_full=True) as r:
        assert r.info.n_swa == 0 and r.info.can_roll_back and not r.checkpointing
        rep = r.run(tokens, None, "gated")
        assert not rep.checkpoints and rep.breaks() == {"full": 5, "user start": 0, "near end": 0, "end": 1}
        rep = r.resume(tokens[:2000] + [5] * 100)  # rolls back without any checkpoint
        assert rep.n_reused == 2000 and rep.n_processed == 100


def test_qwen_tool_responses_get_no_break_and_no_checkpoint_with_tmplkit_spans():
    model = tiny_model_path("qwen35")
    tok = LlamaCppTokenizer(model)
    template = load_one(model)  # the tiny model carries the Qwen3.5 template
    session = generate_session(6000, seed=13, style="tool-role")
    prompt = build_prompt(session, template, tok)
    sspans = server_spans(prompt.tokens, template, tok)
    # delimiters derived once and passed in give the same prompt (the template is not analyzed again)
    again = build_prompt(session, template, tok, delimiters=reversed(text_delimiters(template)[0]))
    assert (again.tokens, again.spans.starts("tool"), again.derived_by) == (prompt.tokens, prompt.spans.starts("tool"), "given")
    tok.close()
    tools = set(prompt.spans.starts("tool"))
    assert len(tools) >= 15 and len(prompt.spans.starts("user")) <= 5
    # llama-server's user delimiter sees each tool turn (not each further response in it) as a user start
    tool_turns = tools & set(sspans.starts("user"))
    assert len(tool_turns) >= 12
    with PrefillRunner(model, **{**SMALL, "n_ctx": 8192}) as r:
        for policy in ("every-user-start", "gated"):
            rep = r.run(prompt.tokens, prompt.spans, policy)
            assert not tools & {c.start for c in rep.decode_calls}
            assert not tools & {c.n_tokens for c in rep.checkpoints}
        rep = r.run(prompt.tokens, sspans, "every-user-start")
        assert len(tool_turns & {c.start for c in rep.decode_calls}) >= len(tool_turns) - 3


def test_a_run_makes_exactly_the_batches_and_checkpoints_its_schedule_plans(runner, gemma_prompt, policy_runs):
    from tmplkit.prefill import BatchSchedule, get_policy

    n = len(gemma_prompt.tokens)
    for policy in ("none", "every-user-start", "gated"):
        rep, _ = policy_runs[policy]
        plan = BatchSchedule(get_policy(policy), gemma_prompt.spans, n, n_batch=512, n_ubatch=128, min_step=1024,
                             checkpointing=True).plan()
        assert [(c.start, c.size, c.reason, c.rule) for c in rep.decode_calls] == \
            [(b.begin, b.size, b.reason, b.rule) for b in plan]
        assert [(c.n_tokens, c.why) for c in rep.checkpoints] == [(b.begin, b.checkpoint) for b in plan if b.checkpoint]


def test_decode_generated_extends_the_memory_one_token_per_call_without_checkpoints():
    """After a prompt, the model's reply decoded as llama-server generates it; the next request
    (the reply and a new user turn appended) reuses all of it from memory."""
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 150000, 1500).tolist()
    reply = rng.integers(0, 150000, 40).tolist()
    more = rng.integers(0, 150000, 300).tolist()
    with PrefillRunner(tiny_model_path("qwen35"), **SMALL) as r:
        with pytest.raises(InputError, match="no prompt has been processed"):
            r.decode_generated(reply)
        first = r.run(prompt, None, "none")
        gen = r.decode_generated(reply)
        assert r.tokens == prompt + reply
        assert r._context.pos_range()[1] == len(prompt) + len(reply) - 1
        assert [(c.start, c.size, c.reason) for c in gen.decode_calls] == \
            [(len(prompt) + i, 1, "generated") for i in range(len(reply))]
        assert gen.n_prompt == len(prompt) and gen.n_generated == len(reply) == gen.n_decode_calls
        assert [c.n_tokens for c in r.store] == [c.n_tokens for c in first.checkpoints]  # none taken while generating
        teacher_forced = r.logits()
        nxt = r.resume(prompt + reply + more, None, "none")
        assert nxt.n_reused == len(prompt) + len(reply) and nxt.n_processed == len(more) and nxt.restored is None
        assert r.tokens == prompt + reply + more
        # a request that rewrites the reply (a template dropping its reasoning, say) falls back to
        # the prompt's near-end checkpoint, 4 tokens before the prompt's end
        rewritten = prompt + [7] * 10 + more
        back = r.resume(rewritten, None, "none")
        assert back.restored is not None and back.restored.n_tokens == len(prompt) - 4
        assert r.tokens == rewritten
        with pytest.raises(InputError, match="more than the context size"):
            r.decode_generated([5] * 4096)
        assert r.decode_generated([]).n_decode_calls == 0
    with PrefillRunner(tiny_model_path("qwen35"), **SMALL) as cold:
        cold.run(prompt + reply, None, "none")
        assert np.abs(cold.logits() - teacher_forced).max() < 0.05 * np.abs(teacher_forced).max() + 1e-3


# ---- bad input -------------------------------------------------------------------------------------


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, TmplkitError)
    return text


def test_a_file_llama_cpp_cannot_load(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelError) as exc:
        PrefillRunner(bad)
    assert "llama.cpp cannot load" in one_line(exc) and "give a GGUF model file that llama.cpp reads" in one_line(exc)
    with pytest.raises(ModelError, match="model file not found"):
        PrefillRunner(tmp_path / "missing.gguf")


def test_a_model_whose_vocabulary_llama_cpp_would_abort_on_is_refused(tmp_path):
    # (a token repeated: llama.cpp's load asserts, and the process died with SIGABRT and a backtrace)
    gguf = pytest.importorskip("gguf")
    bad = tmp_path / "model.gguf"
    bad.write_bytes(tiny_model_path("qwen35").read_bytes())
    reader = gguf.GGUFReader(str(bad), "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    field.parts[field.data[1]][:] = field.parts[field.data[0]][:]  # ("!" and '"': one byte each)
    reader.data.flush()
    del reader
    with pytest.raises(ModelError) as exc:
        PrefillRunner(bad)
    assert "a damaged vocabulary (token 1 repeats the text of token 0" in one_line(exc)


def test_prompts_that_do_not_fit(runner):
    with pytest.raises(InputError) as exc:
        runner.run([2] * 5000)
    assert "5000 tokens, more than the context size n_ctx=4096" in one_line(exc)
    for past in (10**7, 2**70):
        with pytest.raises(InputError, match="outside the model's vocabulary"):
            runner.run([2, past])
    with pytest.raises(InputError, match="empty"):
        runner.run([])
    # (each was read by int(): 7.5 as 7, "7" as 7; a word raised a ValueError from inside)
    for bad, said in (([2, 7.5], "holds 7.5, which is no token id"), ([2, "7"], "holds '7', which is no token id"),
                      ([2, "seven"], "holds 'seven'"), ("hello", "is a str, not token ids"),
                      ([[2, 3]], "not a flat list of token ids"), ([2, True], "holds a boolean"),
                      ([True, False], "holds a boolean"), (np.array([True]), "holds a boolean")):
        with pytest.raises(InputError) as exc:
            runner.run(bad)
        assert said in one_line(exc)
    assert runner.run(np.array([2, 3], dtype=np.int32), None, "none").n_processed == 2
    with pytest.raises(InputError, match="flash_attn must be one of"):
        PrefillSettings(flash_attn="maybe")


def test_a_failing_decode_is_a_model_error_and_leaves_no_state(runner, gemma_prompt, monkeypatch):
    runner.run(gemma_prompt.tokens[:600], None, "none")
    assert runner.tokens
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, batch: 1)
    with pytest.raises(ModelError) as exc:
        runner.run(gemma_prompt.tokens[:600], None, "none")
    assert "no memory slot for the batch" in one_line(exc)
    assert runner.tokens == [] and len(runner.store) == 0
    monkeypatch.undo()
    assert runner.run(gemma_prompt.tokens[:600], None, "none").n_processed == 600
