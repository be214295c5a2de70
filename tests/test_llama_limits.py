"""The llama.cpp settings of `prefill` and `replay` within what llama.cpp takes: sizes that fit its
32-bit fields, thread counts a ggml threadpool holds, -1 for every GPU layer, a batch cut to the
context (reported as used), a prompt that fits the context and a context that fits the machine,
all refused on one line before llama.cpp could abort, hang or allocate without end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tmplkit.cli import build_parser, main
from tmplkit.cli._common import prefill_settings
from tmplkit.errors import InputError
from tmplkit.server_rules import PrefillSettings

STABLE = str(Path(__file__).resolve().parent.parent / "fixtures" / "turns" / "stable.jinja")


# ---- the settings' ranges (no model) ---------------------------------------------------------------


@pytest.mark.parametrize("field, bad", [("n_ctx", 2**31), ("n_ctx", 2**32), ("n_ctx", 99999999999), ("n_batch", 2**32 + 1),
                                        ("n_ubatch", 2**32)])
def test_sizes_fit_llama_cpp_s_32_bit_fields(field, bad):
    with pytest.raises(InputError, match=rf"^{field} must be at most 2147483647 \(a 32-bit field of llama.cpp's\), got {bad}$"):
        PrefillSettings(**{field: bad})
    assert getattr(PrefillSettings(**{field: 2**31 - 1}), field) == 2**31 - 1


def test_threads_and_gpu_layers_ranges():
    for bad in (-1, 513, 20000, 100000):
        with pytest.raises(InputError, match=rf"^n_threads must be between 1 and 512 \(ggml's most\), or 0 for every core, got {bad}$"):
            PrefillSettings(n_threads=bad)
        with pytest.raises(InputError, match="^n_threads_batch must be between 1 and 512"):
            PrefillSettings(n_threads_batch=bad)
    assert PrefillSettings(n_threads=0).n_threads == 0 and PrefillSettings(n_threads=512).n_threads == 512
    for bad in (-2, -5, 2**31):
        with pytest.raises(InputError, match=rf"^n_gpu_layers must be -1 \(every layer\) or between 0 and 2147483647, got {bad}$"):
            PrefillSettings(n_gpu_layers=bad)
    assert PrefillSettings(n_gpu_layers=-1).n_gpu_layers == -1


@pytest.mark.parametrize("command", ["prefill", "replay"])
@pytest.mark.parametrize("flag, value, words", [
    ("-c", "4294967296", "-c/--ctx-size must be at most 2147483647 (a 32-bit field of llama.cpp's), got 4294967296"),
    ("-c", "99999999999", "-c/--ctx-size must be at most 2147483647 (a 32-bit field of llama.cpp's), got 99999999999"),
    ("-b", "4294967297", "-b/--batch-size must be at most 2147483647 (a 32-bit field of llama.cpp's), got 4294967297"),
    ("-ub", "2147483648", "-ub/--ubatch-size must be at most 2147483647 (a 32-bit field of llama.cpp's), got 2147483648"),
    ("-t", "-1", "-t/--threads must be between 1 and 512 (ggml's most), or 0 for every core, got -1"),
    ("-t", "100000", "-t/--threads must be between 1 and 512"),
])
def test_the_messages_name_the_flags(command, flag, value, words):
    args = build_parser().parse_args([command, "m.gguf", "--session", "s.json", flag, value])
    with pytest.raises(InputError) as exc:
        prefill_settings(args)
    assert str(exc.value) == words or str(exc.value).startswith(words)


def test_negative_gpu_layers_other_than_all_are_refused():
    args = build_parser().parse_args(["prefill", "m.gguf", "--session", "s.json", "-ngl", "-5"])
    with pytest.raises(InputError, match=r"^-ngl/--n-gpu-layers must be -1 \(every layer\) or between 0 and 2147483647, got -5$"):
        prefill_settings(args)
    args = build_parser().parse_args(["prefill", "m.gguf", "--session", "s.json", "-ngl", "-1", "-t", "0"])
    assert (prefill_settings(args).n_gpu_layers, prefill_settings(args).n_threads) == (-1, 0)


def test_replay_refuses_before_any_model_is_resolved(tmp_path, capsys, monkeypatch):
    import tmplkit.prefill.models

    def no_model(spec):
        raise AssertionError("the model was resolved before the settings were checked")

    monkeypatch.setattr(tmplkit.prefill.models, "resolve_model", no_model)
    session = tmp_path / "conv.json"
    session.write_text('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]')
    assert main(["--no-config", "replay", "tiny:qwen35", "--session", str(session), "-t", "20000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tmplkit: error: -t/--threads must be between 1 and 512") and err.count("\n") == 1, err


def test_help_gives_the_ranges(capsys):
    with pytest.raises(SystemExit):
        main(["prefill", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1 to 2147483647" in text and "1 to 512; 0: every core" in text and "-1: every layer" in text


# ---- the machine's memory (no model) ----------------------------------------------------------------


def test_a_context_the_machine_cannot_hold_is_refused(monkeypatch):
    from tmplkit.prefill import runner

    monkeypatch.setattr(runner, "machine_memory", lambda: 2**30)
    with pytest.raises(InputError) as exc:
        runner._check_memory(PrefillSettings(n_ctx=2**24, n_ubatch=16), 128)
    assert str(exc.value) == ("n_ctx=16777216 needs about 2.0 GiB for the context's cache and attention mask (128 bytes a "
                              "token), more than this machine's 1.0 GiB of memory; give n_ctx (-c) of at most 8388608")
    runner._check_memory(PrefillSettings(n_ctx=2**23, n_ubatch=16), 128)  # 1 GiB: fits
    runner._check_memory(PrefillSettings(n_ctx=2**31 - 1), 0)  # a recurrent model: nothing grows with n_ctx
    with pytest.raises(InputError, match=r"or a smaller n_ubatch \(-ub, 4096 now\)$"):
        runner._check_memory(PrefillSettings(n_ctx=2**20, n_batch=4096, n_ubatch=4096), 52 + 2 * 4096)
    memory = runner.machine_memory()
    assert memory is None or memory > 2**20


def test_a_huge_batch_size_allocates_what_the_batches_need():
    lc = pytest.importorskip("llama_cpp")
    from tmplkit.prefill._llama import TokenBatch

    batch = TokenBatch(lc, 10**6)
    try:
        assert batch._size == TokenBatch.FIRST
        batch.set(np.arange(TokenBatch.FIRST + 5, dtype=np.int32), 7, logits_last=True)
        assert batch._size == 2 * TokenBatch.FIRST and batch.n_tokens == TokenBatch.FIRST + 5
        assert batch._pos[TokenBatch.FIRST + 4] == TokenBatch.FIRST + 11 and batch._logits[TokenBatch.FIRST + 4] == 1
        with pytest.raises(ValueError, match="a batch holds 1 to 1000000 tokens"):
            batch.set(np.zeros(10**6 + 1, dtype=np.int32), 0, logits_last=True)
    finally:
        batch.free()


# ---- on the tiny model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    path = tmp_path_factory.mktemp("conv") / "conv.json"
    path.write_text('[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]')
    return str(path)


def _tmplkit(*argv: str) -> subprocess.CompletedProcess:
    """The command in a process of its own: llama.cpp's abort would end the test run itself."""
    env = {**os.environ, "TMPLKIT_LLAMA_LOG": "0"}
    return subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", *argv], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.model
@pytest.mark.corpus
@pytest.mark.parametrize("command", ["prefill", "replay"])
def test_a_context_smaller_than_the_prompt_is_refused_before_decoding(command, conv):
    pytest.importorskip("llama_cpp")
    run = _tmplkit(command, "tiny:qwen35", "--session", conv, "--template", STABLE, "-c", "5", "-t", "1")
    assert run.returncode == 2 and run.stdout == "", run.stderr[-2000:]
    assert run.stderr.startswith("tmplkit: error: the prompt has ") and run.stderr.count("\n") == 1, run.stderr[-2000:]
    assert "more than the context size n_ctx=5; raise n_ctx (-c) to at least" in run.stderr


@pytest.mark.model
@pytest.mark.corpus
@pytest.mark.parametrize("command", ["prefill", "replay"])
def test_a_session_no_context_holds_is_refused_before_it_is_tokenized(command, tmp_path):
    """A session of millions of tokens (a template that writes one, or a pasted log) was tokenized
    whole before the context check: 145 s for 40M tokens. Its bytes bound its tokens from below."""
    pytest.importorskip("llama_cpp")
    big = tmp_path / "big.json"
    big.write_text(json.dumps([{"role": "user", "content": "word " * 400_000}, {"role": "assistant", "content": "ok"},
                               {"role": "user", "content": "again"}]))
    run = _tmplkit(command, "tiny:qwen35", "--session", str(big), "--template", STABLE, "-c", "512", "-t", "1")
    assert run.returncode == 2 and run.stdout == "" and run.stderr.count("\n") == 1, run.stderr[-2000:]
    assert " has at least " in run.stderr and "at most 256 to a token), more than the context size n_ctx=512" in run.stderr


def test_the_session_pipeline_and_the_prompt_ask_whether_a_text_fits_before_tokenizing_it(monkeypatch):
    from tmplkit.errors import InputError
    from tmplkit.prefill.prompt import build_prompt
    from tmplkit.session import session_from_json
    from tmplkit.sources import load_one
    from tmplkit.turns import pipeline

    class Never:
        def tokenize(self, *a, **k):
            raise AssertionError("tokenized before the fit was asked")

    def refuse(text, what="the prompt"):
        raise InputError(f"{what}: {len(text)} characters do not fit")

    monkeypatch.setattr(pipeline, "tokenize_requests", Never().tokenize)
    session = session_from_json([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                                 {"role": "user", "content": "more"}])
    template = load_one(STABLE)
    with pytest.raises(InputError, match="request 1 with the turn generated after it: "):
        pipeline.prepare_session(session, template, Never(), fits=refuse)
    with pytest.raises(InputError, match="the prompt: "):
        build_prompt(session, template, Never(), fits=refuse)


def test_the_fit_is_asked_of_the_request_with_the_most_bytes_not_the_most_characters(monkeypatch):
    """A template that drops earlier reasoning once a user message comes: the request before holds
    a reasoning block of CJK text (three bytes a character), the last one more characters but
    fewer bytes. The fit is bounded by bytes, so it is the one asked."""
    from tmplkit.session import session_from_json
    from tmplkit.sources import load_one
    from tmplkit.turns import pipeline

    asked = []

    class Stop(Exception):
        pass

    def fits(text, what="the prompt"):
        asked.append((what, len(text.encode())))
        raise Stop

    session = session_from_json([{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "ok", "reasoning_content": "\u601d" * 3000},
                                 {"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "fine"}])
    template = load_one(str(Path(__file__).parent.parent / "fixtures" / "turns" / "drops-reasoning.jinja"))
    reqs = tuple(pipeline.iter_requests(session, template))
    held = [len(r.held.encode()) for r in reqs]
    assert len(reqs[1].held) > len(reqs[0].held) and held[0] > held[1]  # (the case: fewer characters, more bytes)
    with pytest.raises(Stop):
        pipeline.prepare_session(session, template, object(), fits=fits)
    assert asked == [("request 0 with the turn generated after it", held[0])]


@pytest.mark.model
@pytest.mark.corpus
def test_a_quantized_k_cache_that_does_not_fit_the_heads_is_refused_with_flash_attention_off(conv):
    # (llama.cpp checks it only with flash attention on or auto; with -fa off it aborted the
    # process, exit 134 and a gdb dump: the tiny model's key heads are 8 wide, q8_0's blocks 32)
    pytest.importorskip("llama_cpp")
    for fa in ("off", "on"):
        run = _tmplkit("prefill", "tiny:qwen35", "--session", conv, "--template", STABLE, "-ctk", "q8_0", "-fa", fa,
                       "-t", "1")
        assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr[-2000:]
        assert "K cache type q8_0 with block size 32 does not divide" in run.stderr, run.stderr[-2000:]


@pytest.mark.model
@pytest.mark.corpus
def test_a_batch_of_one_token_and_a_batch_cut_to_the_context(conv, tmp_path):
    pytest.importorskip("llama_cpp")
    out = tmp_path / "r.json"
    # -b 1: llama.cpp's two-token probe of the memory would not fit a batch
    run = _tmplkit("prefill", "tiny:qwen35", "--session", conv, "--template", STABLE, "--settings", "gated", "-t", "1",
                   "-b", "1", "--format", "json", "-o", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())["results"][0]["report"]
    assert {c["size"] for c in report["decode_calls"]} == {1}
    # -b 4 -ub 9 -c 16: the ubatch is cut to the batch, and the report says so
    run = _tmplkit("prefill", "tiny:qwen35", "--session", conv, "--template", STABLE, "--settings", "gated", "-t", "1",
                   "-c", "16", "-b", "4", "-ub", "9", "--format", "json", "-o", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    report = data["results"][0]["report"]
    assert (data["settings"]["n_batch"], data["settings"]["n_ubatch"]) == (4, 4)
    assert (report["settings"]["n_batch"], report["settings"]["n_ubatch"], report["settings"]["n_ctx"]) == (4, 4, 16)
    assert max(c["size"] for c in report["decode_calls"]) == 4


_ONE_TOKEN_CONTEXT = """
from tmplkit.errors import InputError
from tmplkit.prefill import PrefillRunner, tiny_model_path

with PrefillRunner(tiny_model_path("qwen35"), n_ctx=1, n_batch=2**31 - 1, n_ubatch=2**31 - 1, n_threads=1, poll=None) as r:
    assert (r.settings.n_batch, r.settings.n_ubatch) == (1, 1) and r.info.seq_rm == "part", (r.settings, r.info)
    assert r.run([2]).n_prompt == 1
    try:
        r.run([2, 3])
    except InputError as exc:
        print(exc)
"""


@pytest.mark.model
@pytest.mark.corpus
def test_a_batch_larger_than_the_context_is_cut_to_it():
    pytest.importorskip("llama_cpp")
    run = subprocess.run([sys.executable, "-c", _ONE_TOKEN_CONTEXT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("the prompt has 2 tokens, more than the context size n_ctx=1; raise n_ctx (-c) to at least 2")


@pytest.mark.model
@pytest.mark.corpus
@pytest.mark.parametrize("hybrid", [False, True])
def test_a_context_the_machine_cannot_hold_is_refused_before_it_is_allocated(hybrid, monkeypatch):
    pytest.importorskip("llama_cpp")
    from tmplkit.prefill import PrefillRunner, runner, tiny_hybrid_path, tiny_model_path
    from tmplkit.prefill._llama import CELL_BYTES, Context

    def no_context(*args, **kwargs):
        raise AssertionError("the context was allocated")

    monkeypatch.setattr(runner, "machine_memory", lambda: 2**28)
    model = tiny_hybrid_path("qwen35") if hybrid else tiny_model_path("qwen35")
    real_context = Context
    probes = []

    def probe_only(llama_cpp, model_, settings, **kwargs):  # the probe's context alone (n_ctx 256)
        if settings.n_ctx != 256:
            no_context()
        probes.append(settings)
        return real_context(llama_cpp, model_, settings, **kwargs)

    monkeypatch.setattr("tmplkit.prefill._llama.Context", probe_only)
    monkeypatch.setattr(runner, "Context", no_context)
    with pytest.raises(InputError) as exc:
        PrefillRunner(model, n_ctx=2**20, n_threads=1)
    text = str(exc.value)
    assert "more than this machine's 0.2 GiB of memory; give n_ctx (-c) of at most" in text and "\n" not in text
    per_token = int(text.split("(")[1].split(" bytes a token")[0])
    # the cells, the mask's row, and the K and V of the attention layers that keep every position
    assert per_token > CELL_BYTES + 2 * 512 and len(probes) == 1
