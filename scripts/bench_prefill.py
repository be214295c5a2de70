#!/usr/bin/env python
"""Prefill benchmark: tmplkit's batch policies against llama-server, in one run, medians of repeats.

    python scripts/bench_prefill.py                        # full run (about 45 minutes on 2 cores)
    python scripts/bench_prefill.py --quick                # smaller sessions, 1 repeat (a few minutes)
    python scripts/bench_prefill.py --no-server            # tmplkit only
    python scripts/bench_prefill.py --session S.json --template SRC --rounds 5 --diagnose --no-server
                                                           # a session of your own (or --prompt TEXT)

Sections (all in one process; variants interleaved within each repeat, each repeat starting one
variant later than the one before):

1. gemma: Gemma 3 270M Q4_K_M, a generated Gemma-format coding-agent session (tool results sent
   back as user turns). tmplkit's runner with `none`, `every-user-start`, `gated`, and llama-server
   (built from the same sdist by scripts/build_llama_server.sh) without and with its message
   delimiters, driven over 127.0.0.1 (`POST /completion` with the token ids, n_predict 0,
   cache_prompt false); llama-server's figures are its own timings (prompt_n, prompt_ms) and its
   decode calls the change of `llamacpp:n_decode_total` in /metrics.
2. qwen: the tiny gemma3 model with the real qwen35 vocabulary and the Qwen3.5 template (tool
   results inside user turns): each policy with tmplkit's spans, and llama-server's two delimiters
   with `every-user-start` and llama-server's own gate (`ServerGated`); counts of batch breaks and
   checkpoints that land on a tool response.
3. resume: the session, then the session with the agent's answer and a new user turn appended:
   tokens reused and recomputed and seconds, by spans / checkpoints on or off; llama-server's own
   cache_n / prompt_n for the same two requests (cache_prompt true) as a cross-check.

4. given (`--session FILE` or `--prompt FILE`, instead of gemma and qwen): a session written
   elsewhere (OpenAI-style messages JSON) rendered with `--template` (default: Gemma's turn format
   for the Gemma model, else the model's own), or a prompt text already rendered, on `--model`
   (default Gemma 3 270M). `--diagnose` adds variants that take one suspect at a time out of
   `gated`: `gated-breaks-no-saves` (gated's batches exactly, saving only the near-end checkpoints
   `none` saves too), and `gated-poll-off` (ggml's per-graph threadpool instead of llama-server's
   persistent, polling one).

Every run's decode calls are in the JSON with their seconds (`runs[label][i]["calls"]`: start,
size, reason, rule, seconds) and its checkpoints with theirs; `same_batches` lists the batches
(same start and size) that several variants decode, with their median seconds per variant.
Writes JSON (default scripts/results/prefill.json) and prints a markdown summary; the sessions used
are saved next to the JSON so `tmplkit prefill` can be run on them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from _machine import cpu_model  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tmplkit.errors import InputError  # noqa: E402
from tmplkit.prefill import (  # noqa: E402
    BatchSchedule,
    FixedBreaks,
    PrefillRunner,
    PrefillSettings,
    ServerGated,
    build_prompt,
    generate_session,
    get_policy,
    load_session,
    next_user_turn,
    save_session,
    server_delimiter_list,
    server_spans,
    tiny_model_path,
)
from tmplkit.prefill._llama import effective_repack  # noqa: E402
from tmplkit.prefill.report import write_json  # noqa: E402
from tmplkit.prefill.tinymodel import TinyConfig  # noqa: E402
from tmplkit.server.process import LlamaServer  # noqa: E402
from tmplkit.session import Session  # noqa: E402
from tmplkit.sources import corpus, load_one  # noqa: E402
from tmplkit.tokens.delimiter_ids import text_delimiters  # noqa: E402

# Gemma 3's own turn format (<start_of_turn>user / model), no tool role: the GGUF carries no template,
# the Hub corpus development half has the model's (corpus.gemma_template_path)
GEMMA_TEMPLATE = corpus.GEMMA_TEMPLATE
QWEN_TEMPLATE = "Qwen3.5-4B"


# ---- llama-server ---------------------------------------------------------------------------------


class Server(LlamaServer):
    """llama-server on 127.0.0.1 (tmplkit.server.process.LlamaServer), plus one timed prefill request."""

    def __init__(self, binary: str, model: str, args: list[str], log: Path):
        super().__init__(binary, model, args, log=log)

    def completion(self, tokens, delimiters=None, cache_prompt=False) -> dict:
        body: dict = {"prompt": list(tokens), "n_predict": 0, "cache_prompt": cache_prompt}
        if delimiters:
            body["message_delimiters"] = [{"role": r, "delimiter": d} for r, d in delimiters]
        m0 = self.metrics()
        res = self.post("/completion", body)
        m1 = self.metrics()
        t = res["timings"]
        return {"prompt_n": t["prompt_n"], "cache_n": t.get("cache_n", 0), "prompt_ms": t["prompt_ms"],
                "tokens_per_second": t["prompt_n"] / (t["prompt_ms"] / 1000.0),
                "decode_calls": int(m1.get("llamacpp:n_decode_total", 0) - m0.get("llamacpp:n_decode_total", 0))}


def server_args(s: PrefillSettings, threads: int) -> list[str]:
    args = ["-c", str(s.n_ctx), "-b", str(s.n_batch), "-ub", str(s.n_ubatch), "-t", str(threads), "-tb", str(threads),
            "-np", "1", "-fa", s.flash_attn, "-ctxcp", str(s.max_checkpoints), "-cms", str(s.checkpoint_min_step),
            "--cache-ram", "0", "--metrics", "-ngl", str(s.n_gpu_layers)]
    if not effective_repack(s.repack):
        args.append("--no-repack")
    return args


# ---- helpers --------------------------------------------------------------------------------------


def med(xs):
    return statistics.median(xs) if xs else None


def summarize(rep) -> dict:
    return {"tokens_per_second": rep.tokens_per_second, "seconds": rep.seconds, "decode_calls": rep.n_decode_calls,
            "checkpoints": [c.n_tokens for c in rep.checkpoints], "rules": rep.rules(), "breaks": rep.breaks(),
            "n_processed": rep.n_processed, "n_reused": rep.n_reused,
            "outside_decode": (rep.seconds - rep.decode_seconds) / rep.seconds if rep.seconds else 0.0,
            "checkpoint_seconds": rep.checkpoint_seconds, "load_average": round(os.getloadavg()[0], 2),
            # every decode call: [start, size, reason, rule, seconds]; every checkpoint: [n_tokens, bytes, seconds, why]
            "calls": [[c.start, c.size, c.reason, c.rule, round(c.seconds, 6)] for c in rep.decode_calls],
            "checkpoint_records": [[c.n_tokens, c.bytes, round(c.seconds, 6), c.why] for c in rep.checkpoints]}


def same_batches(runs: dict) -> list[dict]:
    """Batches (same start and size) decoded by more than one variant: median seconds per variant,
    over all its runs, so one batch's cost can be compared across policies and repeats."""
    by_batch: dict[tuple[int, int], dict[str, list[float]]] = {}
    for label, rs in runs.items():
        for r in rs:
            for start, size, _reason, _rule, secs in r.get("calls", ()):
                by_batch.setdefault((start, size), {}).setdefault(label, []).append(secs)
    return [{"start": start, "size": size, "median_seconds": {k: med(v) for k, v in per.items()},
             "all_seconds": per}
            for (start, size), per in sorted(by_batch.items()) if len(per) > 1]


def on_tool(rep, tool_starts: set[int]) -> dict:
    """Batch breaks and checkpoints at tool-response starts (tmplkit's spans)."""
    return {"breaks_on_tool": sum(1 for c in rep.decode_calls[1:] if c.start in tool_starts),
            "checkpoints_on_tool": sum(1 for c in rep.checkpoints if c.n_tokens in tool_starts)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- sections -------------------------------------------------------------------------------------

SERVER_NONE = "llama-server (no spans)"


@dataclass(frozen=True)
class Variant:
    """One measured variant: tmplkit's runner with a policy and spans, or llama-server."""

    label: str
    policy: object = None
    spans: object = None
    on_server: bool = False
    delimiters: tuple | None = None  # llama-server's message delimiters (None: no spans)
    overrides: tuple = ()  # settings this variant's runner changes, e.g. (("poll", None),): a runner of its own
    baseline_label: str | None = None  # what its paired ratio divides by (default `none`, or llama-server's)

    @property
    def baseline(self) -> str:
        return self.baseline_label or (SERVER_NONE if self.on_server else "none")


def prompt_from_text(text: str, template, tok, add_bos: bool):
    """A prompt text already rendered, as the runner takes it: tokens and tmplkit's spans (the
    template's delimiters, token ids checked on this text, as build_prompt does for a session)."""
    from tmplkit.prefill.prompt import Prompt
    from tmplkit.tokens.delimiter_ids import tokenize_delimiters
    from tmplkit.tokens.spans import SpanDetector

    tokens = tok.tokenize(text, add_bos=False)
    bos = tok.tokenize("", add_bos=True) if add_bos else []
    if bos and tokens[:len(bos)] != bos:
        tokens = bos + tokens
    tdelims = tokenize_delimiters(text_delimiters(template)[0], text, tok, template=template.name)
    if not tdelims.passed:
        raise SystemExit(f"template '{template.name}': its delimiters do not split this text's tokens: {tdelims.problems}")
    return Prompt(tuple(tokens), SpanDetector(tdelims).split(tokens), text, template.name, tdelims)


def diagnostic_variants(prompt, settings) -> list[Variant]:
    """Variants that take one suspect at a time out of `gated` (issue: gated slower than its breaks explain).

    `gated-breaks-no-saves`: gated's batches exactly (its early breaks as fixed ones, no spans),
    so only the near-end checkpoints are saved, as `none` saves them: against `gated`, the cost of
    its extra checkpoint saves; against `none`, the cost of its breaks. `*-poll-off`: ggml's
    per-graph threadpool instead of the persistent polling one (llama-server's default).
    """
    n = len(prompt.tokens)
    sched = lambda pol, spans: BatchSchedule(pol, spans, n, n_batch=settings.n_batch, n_ubatch=min(settings.n_ubatch, settings.n_batch),  # noqa: E731
                                             min_step=settings.checkpoint_min_step, checkpointing=True).plan()
    gated = sched(get_policy("gated"), prompt.spans)
    fixed = FixedBreaks([b.end for b in gated if b.rule])
    same = [(b.begin, b.end) for b in sched(fixed, None)] == [(b.begin, b.end) for b in gated]
    log(f"gated-breaks-no-saves: {'the same batches as gated' if same else 'WARNING: other batches than gated'}")
    off = (("poll", None),)
    return [Variant("gated-breaks-no-saves", fixed, None, baseline_label="none"),
            Variant("none-poll-off", "none", prompt.spans, overrides=off, baseline_label="none"),
            Variant("gated-poll-off", "gated", prompt.spans, overrides=off, baseline_label="none-poll-off")]


def bench_policies(name, model, template, source, settings, repeat, threads, server_bin, outdir,
                   diagnose=False, only=None):
    """Runner policies (tmplkit spans; also llama-server's spans) and llama-server, interleaved.

    `source`: a Session, or a prompt text already rendered. `only`: labels to run (default all)."""
    res: dict = {"model": str(model), "template": template.name, "settings": settings.to_dict(),
                 "load_average_start": round(os.getloadavg()[0], 2)}
    runners: dict[tuple, PrefillRunner] = {}
    with PrefillRunner(model, settings) as runner:
        runners[()] = runner
        tok = runner.tokenizer
        prompt = (prompt_from_text(source, template, tok, runner.info.add_bos) if isinstance(source, str)
                  else build_prompt(source, template, tok, add_bos=runner.info.add_bos))
        try:  # llama-server's two delimiters are known for a few template families only
            sdelims = server_delimiter_list(template)
        except InputError:
            sdelims = ()
        sspans = server_spans(prompt.tokens, template, tok) if sdelims else None
        runner.check_prompt(prompt.tokens)
        tool_starts = set(prompt.spans.starts("tool"))
        res.update(n_tokens=len(prompt.tokens), spans_by_role=prompt.role_counts(),
                   server_user_starts=len(sspans.starts("user")) if sspans else None,
                   tmplkit_user_starts=len(prompt.spans.starts("user")), tool_starts=len(tool_starts),
                   delimiters=[d.to_dict() for d in prompt.delimiters], server_delimiters=[list(d) for d in sdelims])
        log(f"[{name}] {len(prompt.tokens)} tokens, user starts: tmplkit {res['tmplkit_user_starts']}, "
            f"llama-server {res['server_user_starts']}, tool starts {len(tool_starts)}")
        jobs = [Variant("none", "none", prompt.spans), Variant("every-user-start", "every-user-start", prompt.spans),
                Variant("gated", "gated", prompt.spans)]
        if tool_starts and sspans:  # what llama-server's two delimiters do, with llama-server's own gate
            jobs += [Variant("every-user-start@server-spans", "every-user-start", sspans),
                     Variant("gated-llama-server@server-spans", ServerGated(), sspans)]
        if diagnose:
            jobs += diagnostic_variants(prompt, settings)
        server = None
        if server_bin:
            server = Server(server_bin, str(model), server_args(settings, threads), outdir / f"llama-server-{name}.log")
            jobs += [Variant(SERVER_NONE, on_server=True),
                     Variant("llama-server (its 2 delimiters)", on_server=True, delimiters=sdelims)][:2 if sdelims else 1]
        if only:
            jobs = [v for v in jobs if v.label in only]
        try:
            for v in jobs:
                if not v.on_server and v.overrides not in runners:
                    runners[v.overrides] = PrefillRunner(model, settings, **dict(v.overrides))
            for r in runners.values():
                r.run(prompt.tokens[:2 * settings.n_batch], None, "none")  # warm-up
            if server:
                server.completion(prompt.tokens[:2 * settings.n_batch])
            runs = run_rounds(name, jobs, runners, server, prompt, tool_starts, repeat)
        finally:
            if server:
                server.stop()
            for key, r in runners.items():
                if key:
                    r.close()
    res["runs"] = runs
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    res["median_tokens_per_second"] = {k: med([r["tokens_per_second"] for r in v]) for k, v in runs.items()}
    res["paired"] = paired_ratios(runs, {v.label: v.baseline for v in jobs})
    res["same_batches"] = same_batches(runs)
    # the runner's own share: time not spent inside llama_decode (batch filling, checkpoints, Python)
    res["outside_decode"] = med([r["outside_decode"] for v in jobs if not v.on_server for r in runs[v.label]])
    return res


def run_rounds(name, jobs, runners, server, prompt, tool_starts, repeat) -> dict[str, list]:
    """`repeat` rounds of every variant, each round starting one variant later (no variant always runs first)."""
    runs: dict[str, list] = {v.label: [] for v in jobs}
    for k in range(repeat):
        for v in jobs[k % len(jobs):] + jobs[:k % len(jobs)]:
            if v.on_server:
                d = server.completion(prompt.tokens, v.delimiters)
            else:
                rep = runners[v.overrides].run(prompt.tokens, v.spans, v.policy)
                d = summarize(rep)
                d.update(on_tool(rep, tool_starts))
            d["round"] = k
            runs[v.label].append(d)
            log(f"[{name}] {k + 1}/{repeat} {v.label:32s} {d['tokens_per_second']:9.1f} tok/s  {d['decode_calls']:4d} calls"
                f"  (load {os.getloadavg()[0]:.2f})")
    return runs


def paired_ratios(runs: dict, baseline: dict) -> dict:
    """Per variant, tokens/s over its baseline's in the same repeat (median, min, max over repeats).

    Variants run back to back within a repeat, so a ratio taken inside one repeat cancels the
    slow drifts of a shared machine that a ratio of medians keeps. `baseline`: label -> the
    label it is divided by (`none` for the runner's variants, llama-server without spans for
    llama-server's).
    """
    out = {}
    for label, rs in runs.items():
        base = runs.get(baseline[label])
        if not base:
            continue
        ratios = [r["tokens_per_second"] / b["tokens_per_second"] for r, b in zip(rs, base)]
        out[label] = {"median": med(ratios), "min": min(ratios), "max": max(ratios), "all": ratios}
    return out


def mid_task(session):
    """The session cut where the agent has just finished the tool steps of a request (at least six).

    A generated session stops wherever it reached its length, possibly right after a user
    request; resuming is interesting when the agent has worked for a while since the last user
    message (templates such as Qwen3.5's then drop that work's reasoning from the render)."""
    msgs = list(session.messages)
    requests = [i for i, m in enumerate(msgs) if m["role"] == "user" and not str(m.get("content", "")).startswith("Tool result")]
    if len(requests) >= 2 and len(msgs) - requests[-1] < 13:
        msgs = msgs[:requests[-1] - 1]  # drop the answer before the last request, and that request
    return Session(tuple(msgs), session.tools, session.source)


def bench_resume(name, model, template, session, settings, repeat, threads, server_bin, outdir):
    """Prefill the session (cut mid-task), then resume with the agent's answer and a new user turn appended."""
    session = mid_task(session)
    later = next_user_turn(session)
    with PrefillRunner(model, settings) as runner:
        tok = runner.tokenizer
        p1 = build_prompt(session, template, tok, add_bos=runner.info.add_bos)
        p2 = build_prompt(later, template, tok, add_bos=runner.info.add_bos)
        s1, s2 = server_spans(p1.tokens, template, tok), server_spans(p2.tokens, template, tok)
        common = next((i for i, (a, b) in enumerate(zip(p1.tokens, p2.tokens)) if a != b), min(len(p1.tokens), len(p2.tokens)))
        res: dict = {"n_tokens_before": len(p1.tokens), "n_tokens_after": len(p2.tokens), "common_prefix": common,
                     "last_user_start_before": p1.spans.last_user_start(),
                     "server_last_user_start_before": s1.last_user_start()}
        log(f"[{name}] resume: {len(p1.tokens)} -> {len(p2.tokens)} tokens, common prefix {common}")
        variants = [("gated, tmplkit spans", "gated", p1.spans, p2.spans, None)]
        if p1.spans.starts("tool"):
            variants.append(("gated, llama-server spans", ServerGated(), s1, s2, None))
        variants += [("none (near-end checkpoints only)", "none", p1.spans, p2.spans, None),
                     ("checkpoints off", "gated", p1.spans, p2.spans, False)]
        runs: dict[str, list] = {}
        runners = {None: runner}
        try:
            runner.run(p1.tokens[:2 * settings.n_batch], None, "none")  # warm-up
            res["cold_seconds"] = runner.run(p2.tokens, p2.spans, "gated").seconds
            for k in range(repeat):
                for label, policy, sp1, sp2, ckpt in variants:
                    if ckpt not in runners:
                        runners[ckpt] = PrefillRunner(model, settings, checkpoints=ckpt)
                    r = runners[ckpt]
                    r.run(p1.tokens, sp1, policy)
                    rep = r.resume(p2.tokens, sp2, policy)
                    d = summarize(rep)
                    d["restored"] = rep.restored.n_tokens if rep.restored else None
                    runs.setdefault(label, []).append(d)
                    log(f"[{name}] {k + 1}/{repeat} resume {label:34s} reused {rep.n_reused:6d} recomputed {rep.n_processed:6d} "
                        f"in {rep.seconds:7.2f} s (cold prefill {res['cold_seconds']:7.2f} s)")
        finally:
            for key, r in runners.items():
                if key is not None:
                    r.close()
    if server_bin:
        server = Server(server_bin, str(model), server_args(settings, threads), outdir / f"llama-server-{name}-resume.log")
        try:
            for label, delims in (("llama-server, its 2 delimiters", server_delimiter_list(template)),):
                for _ in range(repeat):
                    server.completion(p1.tokens, delims, cache_prompt=True)
                    r = server.completion(p2.tokens, delims, cache_prompt=True)
                    runs.setdefault(label, []).append({"n_reused": r["cache_n"], "n_processed": r["prompt_n"],
                                                       "seconds": r["prompt_ms"] / 1000, "decode_calls": r["decode_calls"]})
                    log(f"[{name}] resume {label:34s} reused {r['cache_n']:6d} recomputed {r['prompt_n']:6d} in {r['prompt_ms'] / 1000:7.2f} s")
                    server.completion(p1.tokens[:8], None, cache_prompt=False)  # leave the slot with another prompt
        finally:
            server.stop()
    res["runs"] = runs
    return res


# ---- report ---------------------------------------------------------------------------------------


def markdown(out: dict) -> str:
    lines = [f"`{out['command']}` ({out['machine']}, {out['threads']} threads, medians of the repeats given per section; "
             f"load average {out.get('load_average', '?')} at the start)", ""]
    for name in ("gemma", "qwen", "given"):
        sec = out.get(name)
        if not sec:
            continue
        m = sec["median_tokens_per_second"]
        base = m.get("none")
        srv = m.get(SERVER_NONE)
        shape = ""
        if name == "qwen" and out.get("tiny_model"):
            t = out["tiny_model"]
            shape = f" ({t['n_layer']} layers, {t['n_embd']} wide, {t['n_head']} query heads over {t['n_head_kv']} KV heads of {t['head_dim']})"
        n_rounds = len(next(iter(sec["runs"].values())))
        lines += [f"**{name}** ({n_rounds} repeats): `{Path(sec['model']).name}`{shape}, template {sec['template']}, "
                  f"{sec['n_tokens']} tokens; "
                  f"user starts: tmplkit {sec['tmplkit_user_starts']}, llama-server {sec['server_user_starts']}; "
                  f"tool-response starts {sec['tool_starts']}", "",
                  "| variant | tokens/s | vs none | paired (min-max) | vs llama-server no-spans | decode calls | checkpoints "
                  "| breaks on tool responses | checkpoints on tool responses | early-break rules |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        paired = sec.get("paired", {})
        for label, runs in sec["runs"].items():
            first = runs[0]
            tps = m[label]
            ck = first.get("checkpoints")
            vs_srv = f"{tps / srv:.3f}" if srv else "-"
            pr = paired.get(label)
            pr = f"{pr['median']:.3f} ({pr['min']:.3f}-{pr['max']:.3f})" if pr else "-"
            lines.append(
                f"| {label} | {tps:.1f} | {f'{tps / base:.3f}' if base else '-'} | {pr} | {vs_srv} | {first['decode_calls']} | "
                f"{len(ck) if ck is not None else '-'} | {first.get('breaks_on_tool', '-')} | {first.get('checkpoints_on_tool', '-')} | "
                f"{', '.join(f'{k} {v}' for k, v in sorted(first.get('rules', {}).items())) or '-'} |")
        if "load_average_start" in sec:
            lines.append(f"\nload average (1 min): {sec['load_average_start']} at the start of the section, "
                         f"{sec['load_average_end']} at its end; paired: each variant over its baseline in the same round "
                         f"(`none`; llama-server's over its own no-spans run; `gated-poll-off` over `none-poll-off`)")
        lines += same_batch_lines(sec)
        if sec.get("outside_decode") is not None:
            lines.append(f"\ntmplkit's runner outside `llama_decode` (filling batches, saving checkpoints, Python): "
                         f"{100 * sec['outside_decode']:.2f}% of its prefill time (median over its runs)")
        lines.append("")
    if out.get("suspects"):
        lines += suspect_lines(out["suspects"])
    for name in ("gemma_resume", "qwen_resume"):
        sec = out.get(name)
        if not sec:
            continue
        lines += [f"**{name}**: {sec['n_tokens_before']} -> {sec['n_tokens_after']} tokens, common prefix {sec['common_prefix']}, "
                  f"last user start before: tmplkit {sec['last_user_start_before']}, llama-server {sec['server_last_user_start_before']}; "
                  f"cold prefill of the new prompt {sec['cold_seconds']:.2f} s", "",
                  "| variant | restored checkpoint | tokens reused | tokens recomputed | seconds |",
                  "|---|---:|---:|---:|---:|"]
        for label, runs in sec["runs"].items():
            first = runs[0]
            secs = med([r["seconds"] for r in runs])
            lines.append(f"| {label} | {first.get('restored', '-')} | {first['n_reused']} | {first['n_processed']} | {secs:.2f} |")
        lines.append("")
    return "\n".join(lines)


def same_batch_lines(sec: dict) -> list[str]:
    """The batches both of two variants decode, summed (medians per batch): where their time differs."""
    lines = []
    for a, b in (("gated", "gated-breaks-no-saves"), ("gated-poll-off", "gated")):
        shared = [x for x in sec.get("same_batches", ()) if a in x["median_seconds"] and b in x["median_seconds"]]
        if shared:
            sa = sum(x["median_seconds"][a] for x in shared)
            sb = sum(x["median_seconds"][b] for x in shared)
            lines.append(f"\nthe {len(shared)} batches `{a}` and `{b}` both decode: {sa:.2f} s and {sb:.2f} s "
                         f"(sums of per-batch medians; ratio {sa / sb:.3f})")
    return lines


def bench_suspects(name, model, tokens, settings, at, size, rounds) -> dict:
    """The suspects of a slow `gated`, each measured on one batch: tokens [at, at + size) decoded
    from the same state again and again, with and without the suspect, in rotated order.

    Arms: `save` (a checkpoint saved right before the batch, as gated does before its extra
    batches: size query, buffer allocation, read, copy to bytes), `plain` (no save), `no-poll`
    (no save, ggml's per-graph threadpool instead of the persistent polling one). Each decode
    starts from the state after `at` tokens, restored from a snapshot, so every arm decodes the
    same batch on the same memory. Per arm: decode seconds, save seconds, minor page faults
    during the save and during the decode; ratios paired within a round against `plain`.
    """
    import resource

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def take(r) -> bytes:  # what PrefillRunner._save_checkpoint does with llama.cpp
        return r._context.read_state()[0]

    def restore(r, snap: bytes) -> None:
        r._context.remove_from(at)
        r._context.write_state(snap)
        r._context.remove_from(at)

    arr = np.asarray(tokens, dtype=np.int32)
    runners = {"poll": PrefillRunner(model, settings), "no-poll": PrefillRunner(model, settings, poll=None)}
    arms = [("save", "poll", True), ("plain", "poll", False), ("no-poll", "no-poll", False)]
    runs: dict[str, list] = {a[0]: [] for a in arms}
    try:
        snaps = {}
        for key, r in runners.items():
            r.run(tokens[:at], None, "none")
            snaps[key] = take(r)
        log(f"[{name}] suspects on batch [{at}, {at + size}); checkpoint {len(snaps['poll']) / 2**20:.1f} MiB")
        for k in range(rounds):
            for label, key, save in arms[k % len(arms):] + arms[:k % len(arms)]:
                r = runners[key]
                restore(r, snaps[key])
                f0, c0 = faults(), time.perf_counter()
                kept = take(r) if save else None
                save_s, save_f = time.perf_counter() - c0, faults() - f0
                f1, cpu0 = faults(), time.process_time()
                dec = r._decode(arr[at:at + size], at, logits_last=False)
                # CPU seconds of this process in the decode: the work done, less disturbed than the
                # wall clock by other processes on a shared machine (spinning threads count too)
                runs[label].append({"round": k, "decode_seconds": dec, "decode_cpu_seconds": time.process_time() - cpu0,
                                    "save_seconds": save_s, "save_faults": save_f, "decode_faults": faults() - f1,
                                    "load_average": round(os.getloadavg()[0], 2)})
                del kept
                log(f"[{name}] {k + 1}/{rounds} {label:8s} decode {dec:7.3f} s  save {save_s * 1000:7.2f} ms "
                    f"{save_f:6d} faults  (load {os.getloadavg()[0]:.2f})")
    finally:
        for r in runners.values():
            r.close()
    paired = {label: [x["decode_seconds"] / p["decode_seconds"] for x, p in zip(rs, runs["plain"])] for label, rs in runs.items()}
    return {"at": at, "size": size, "rounds": rounds, "checkpoint_bytes": len(snaps["poll"]), "runs": runs,
            "median_decode_seconds": {k: med([x["decode_seconds"] for x in v]) for k, v in runs.items()},
            "paired_vs_plain": {k: {"median": med(v), "min": min(v), "max": max(v)} for k, v in paired.items()}}


def suspect_lines(sec: dict) -> list[str]:
    lines = [f"**suspects** on batch [{sec['at']}, {sec['at'] + sec['size']}) ({sec['rounds']} rounds, rotated; "
             f"checkpoint {sec['checkpoint_bytes'] / 2**20:.1f} MiB)", "",
             "| arm | decode s (median) | paired vs plain (min-max) | decode CPU s (median) | save ms (median) | faults in save | faults in decode |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, rs in sec["runs"].items():
        p = sec["paired_vs_plain"][label]
        cpu = med([x.get("decode_cpu_seconds", float("nan")) for x in rs])
        lines.append(f"| {label} | {sec['median_decode_seconds'][label]:.3f} | {p['median']:.3f} ({p['min']:.3f}-{p['max']:.3f}) | "
                     f"{cpu:.2f} | {1000 * med([x['save_seconds'] for x in rs]):.2f} | {med([x['save_faults'] for x in rs]):.0f} | "
                     f"{med([x['decode_faults'] for x in rs]):.0f} |")
    return lines + [""]


def bench_given(args, settings, repeat, server_bin, outdir, t0) -> int:
    """The policies (and with --diagnose the suspects) on a session or prompt text of the user's."""
    from tmplkit.prefill.models import resolve_model

    model = resolve_model(args.model) if args.model else corpus.gemma_model_path()  # a path or a shortcut (tiny:qwen35-hybrid)
    if args.template:
        template = load_one(args.template)
    elif not args.model:
        template = load_one(corpus.gemma_template_path())
    else:
        template = load_one(model)
    source = load_session(args.session) if args.session else Path(args.prompt).read_text(encoding="utf-8")
    only = set(args.variants.split(",")) if args.variants else None
    out: dict = {"command": "python scripts/bench_prefill.py " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
                 "machine": f"{cpu_model() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}", "threads": args.threads,
                 "repeat": repeat, "llama_server": server_bin, "load_average": round(os.getloadavg()[0], 2),
                 "repack": effective_repack(settings.repack), "source": args.session or args.prompt}
    if args.suspects:
        with PrefillRunner(model, settings, n_ctx=256) as r:
            tokens = (prompt_from_text(source, template, r.tokenizer, r.info.add_bos) if isinstance(source, str)
                      else build_prompt(source, template, r.tokenizer, add_bos=r.info.add_bos)).tokens
        at = args.at if args.at is not None else (len(tokens) * 3 // 4) // settings.n_batch * settings.n_batch
        out["suspects"] = bench_suspects("given", model, tokens, settings, at, args.size or settings.n_batch, repeat)
    if not args.suspects or args.variants:
        out["given"] = bench_policies("given", model, template, source, settings, repeat, args.threads, server_bin,
                                      outdir, diagnose=args.diagnose, only=only)
    return _finish(out, args.out, t0)


def _finish(out: dict, path: str, t0: float) -> int:
    """Write the results JSON, print the markdown summary."""
    out["seconds"] = time.time() - t0
    out["markdown"] = markdown(out)
    write_json(path, out)
    print(out["markdown"])
    log(f"wrote {path} in {out['seconds']:.0f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sessions and 1 repeat")
    ap.add_argument("--rounds", "--repeat", type=int, default=None, dest="repeat",
                    help="interleaved rounds of every variant; ratios are paired within a round (default 7, 1 with --quick)")
    ap.add_argument("--qwen-repeat", type=int, default=None,
                    help="repeats of the qwen section (default: 9, 1 with --quick; a tiny-model run takes seconds)")
    ap.add_argument("--resume-repeat", type=int, default=1, help="repeats of the resume section (its token counts are exact)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=32768, help="the context size (default 32768; a longer session needs more)")
    ap.add_argument("--gemma-tokens", type=int, default=None)
    ap.add_argument("--qwen-tokens", type=int, default=None)
    ap.add_argument("--sections", default="gemma,qwen,resume")
    ap.add_argument("--tiny-heads", type=int, default=TinyConfig.n_head,
                    help=f"query heads of the tiny model (default {TinyConfig.n_head}; KV heads a quarter of them, at least 1; 64 wide)")
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                    help="flash attention for the runner and llama-server alike (default auto, llama-server's)")
    ap.add_argument("--server", default=None, help="llama-server binary (default: build or reuse it with scripts/build_llama_server.sh)")
    ap.add_argument("--no-server", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "scripts" / "results" / "prefill.json"))
    g = ap.add_argument_group("a session or prompt of your own (the 'given' section, instead of the generated ones)")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--session", metavar="FILE", help="OpenAI-style messages JSON, rendered with --template")
    src.add_argument("--prompt", metavar="FILE", help="a prompt text already rendered (spans from --template's delimiters)")
    g.add_argument("--template", metavar="SOURCE", help=f"its chat template (default: {GEMMA_TEMPLATE} on the Gemma model, "
                   "else the model's own)")
    g.add_argument("--model", metavar="FILE.gguf", help="the model, a GGUF or a shortcut such as tiny:qwen35-hybrid "
                   "(default: Gemma 3 270M Q4_K_M from the corpus)")
    g.add_argument("--diagnose", action="store_true", help="add the variants that take one suspect at a time out of gated")
    g.add_argument("--variants", metavar="LABELS", help="run only these variants (comma-separated labels)")
    g.add_argument("--suspects", action="store_true",
                   help="measure the suspects on one batch instead (a checkpoint save before it, the polling threadpool)")
    g.add_argument("--at", type=int, default=None, help="--suspects: the batch's first token (default: 3/4 into the prompt)")
    g.add_argument("--size", type=int, default=None, help="--suspects: the batch's size (default n_batch)")
    args = ap.parse_args(argv)
    args.argv = argv
    repeat = args.repeat or (1 if args.quick else 7)
    gemma_tokens = args.gemma_tokens or (4000 if args.quick else 16000)
    qwen_tokens = args.qwen_tokens or (8000 if args.quick else 30000)
    sections = set(args.sections.split(","))
    outdir = Path(args.out).parent
    outdir.mkdir(parents=True, exist_ok=True)
    server_bin = None
    if not args.no_server:
        server_bin = args.server or subprocess.run([str(ROOT / "scripts" / "build_llama_server.sh")], check=True,
                                                   capture_output=True, text=True).stdout.strip().splitlines()[-1]
    settings = PrefillSettings(n_ctx=args.n_ctx, n_batch=2048, n_ubatch=512, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
                               flash_attn=args.flash_attn)
    templates = corpus.templates_dir()
    qwen_tmpl = load_one(templates / f"{QWEN_TEMPLATE}.jinja")
    # (a GPU machine may lack the Gemma model and the Hub corpus: a given session on another model,
    # or the Qwen-style section alone, never asks for them)
    gemma = corpus.gemma_model_path() if sections & {"gemma", "resume"} and not (args.session or args.prompt) else None
    gemma_tmpl = load_one(corpus.gemma_template_path()) if gemma is not None else None
    if args.tiny_heads < 1 or 64 % args.tiny_heads:
        ap.error("--tiny-heads must divide 64")
    tiny_cfg = TinyConfig(n_head=args.tiny_heads, n_head_kv=max(1, args.tiny_heads // 4), head_dim=64 // args.tiny_heads)
    tiny = tiny_model_path("qwen35", config=tiny_cfg)

    def sized(model, tmpl, style, target, seed):
        delims = text_delimiters(tmpl)[0]
        with PrefillRunner(model, settings, n_ctx=256) as r:
            return generate_session(target, seed=seed, style=style,
                                    measure=lambda s: len(build_prompt(s, tmpl, r.tokenizer, add_bos=r.info.add_bos, delimiters=delims).tokens))

    t0 = time.time()
    if args.session or args.prompt:
        return bench_given(args, settings, repeat, server_bin, outdir, t0)
    out: dict = {"command": "python scripts/bench_prefill.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
                 "machine": f"{cpu_model() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}", "threads": args.threads,
                 "repeat": repeat, "tiny_model": asdict(tiny_cfg), "llama_server": server_bin,
                 "load_average": round(os.getloadavg()[0], 2), "repack": effective_repack(settings.repack)}
    if gemma:
        gsession = sized(gemma, gemma_tmpl, "user-turns", gemma_tokens, seed=0)
        save_session(gsession, outdir / "prefill-session-gemma.json")
    if sections & {"qwen", "resume"}:
        qsession = sized(tiny, qwen_tmpl, "tool-role", qwen_tokens, seed=0)
        save_session(qsession, outdir / "prefill-session-qwen.json")
    if "gemma" in sections:
        out["gemma"] = bench_policies("gemma", gemma, gemma_tmpl, gsession, settings, repeat, args.threads, server_bin, outdir)
    if "qwen" in sections:
        qrepeat = args.qwen_repeat or (1 if args.quick else max(9, repeat))
        out["qwen"] = bench_policies("qwen", tiny, qwen_tmpl, qsession, settings, qrepeat, args.threads, server_bin, outdir)
    if "resume" in sections:
        rr = args.resume_repeat
        out["gemma_resume"] = bench_resume("gemma", gemma, gemma_tmpl, gsession, settings, rr, args.threads, server_bin, outdir)
        out["qwen_resume"] = bench_resume("qwen", tiny, qwen_tmpl, qsession, settings, rr, args.threads, server_bin, outdir)
    return _finish(out, args.out, t0)


if __name__ == "__main__":
    sys.exit(main())
