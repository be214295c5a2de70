#!/usr/bin/env python
"""The turns study's llama-server setting against the real llama-server, request by request.

    python scripts/bench_server_resume.py                      # the templates below, writes scripts/results/server-resume.json
    python scripts/bench_server_resume.py --templates Qwen3.5-4B --tokens 4000
    python scripts/bench_server_resume.py --ratios         # a 30k-token session, three ways, into the same JSON
    python scripts/bench_server_resume.py --model hybrid   # the tiny qwen35 hybrid, HYBRID_TEMPLATES, server-resume-hybrid.json

For each template: the pinned llama-server (scripts/build_llama_server.sh) started with the
template as its chat template, on the tiny random-weight model of the template's corpus vocabulary
(qwen35 when it has none): gemma3-shaped with a sliding window of 512, or with `--model hybrid`
the qwen35 hybrid (recurrent gated-delta-net layers and full attention, `tinyhybrid`), whose
recurrent state cannot roll back at all: both need checkpoints. One generated
agent session (`--tokens`, seed `--seed`) is sent request by request through /v1/chat/completions
(`tmplkit.drive_session`, max_tokens 1), and each request is predicted by the turns study's
llama-server setting over the server's own render (`tmplkit.server.resume.check_resume`): the
server's delimiter list for the template (from `--server-delimiters`), its batch, checkpoint
and restore rules with the server's settings. Prediction must equal measurement on every request:
tokens reused and processed, batch starts, checkpoints created and restored, full re-processing.

--ratios: for `RATIO_TEMPLATES`, a 30k-token agent session on llama-server's default checkpoint
settings (-ctxcp 32, -cms 8192), the tokens the real server processes after the first request,
three ways: its chat endpoint with its own delimiters, /completion with the same renders and
tmplkit's delimiters as `message_delimiters`, and the full-attention bound (the chat endpoint with
--swa-full, whose cache rolls back anywhere); the first two also predicted and compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _held_out import held_out  # scripts/, beside this file
from _machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tmplkit import load_one  # noqa: E402
from tmplkit.sources import corpus  # noqa: E402

# Templates covering the classes of `tmplkit server delimiters` on the family vocabularies
# (scripts/results/server-delimiters-family-vocab.json): the server's user starts agree with
# tmplkit's, take tool results for user messages, miss real user messages, or do not exist.
TEMPLATES = (
    "ibm-granite-granite-4.1", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "deepseek-ai-DeepSeek-V3.1",
    "microsoft-Phi-3.5-mini-instruct",
    "Qwen3.5-4B", "Qwen-Qwen3-0.6B", "openbmb-MiniCPM5-1B", "MiMo-VL",
    "Apertus-8B-Instruct", "inclusionai-ling-3.0-flash", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "LFM2-8B-A1B", "Kimi-K2-Instruct", "unsloth-mistral-Devstral-Small-2507",
)


RATIO_TEMPLATES = ("Qwen3.5-4B", "Qwen-Qwen3-0.6B", "MiMo-VL", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use")

# --model hybrid: the same classes on the tiny qwen35 hybrid (recurrent + full attention), with the
# Qwen3.5/3.6-family templates of the Hub corpus's development half among them (Qwen3.5-4B drops
# earlier reasoning at a new user message).
HYBRID_TEMPLATES = (
    "Qwen3.5-4B", "Qwen-Qwen3.5-0.8B", "XMB480-Qwen3.6-fixed-tool-calling",
    "lordx64-Qwen3.6-35B-A3B-Claude-4.7-Opus-Reasoning-Distilled", "Qwen-Qwen3-0.6B", "ibm-granite-granite-4.1",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "deepseek-ai-DeepSeek-V3.1", "microsoft-Phi-3.5-mini-instruct", "MiMo-VL",
    "Apertus-8B-Instruct", "LFM2-8B-A1B",
)


def template_path(name: str) -> Path:
    """A llama.cpp corpus template, else one of the Hub corpus's development half (only those)."""
    path = corpus.templates_dir() / f"{name}.jinja"
    if path.is_file() or name not in corpus.hub_dev_names():
        return path
    return corpus.hub_templates_dir() / f"{name}.jinja"


def tiny_model(vocab: str, kind: str):
    """The tiny model of `vocab` with its own template (the server is given the template): the
    sliding-window gemma3 one, or the qwen35 hybrid; and its memory for the prediction."""
    from tmplkit.prefill import tiny_hybrid_path, tiny_model_path
    from tmplkit.turns import MemoryModel

    if kind == "hybrid":
        return tiny_hybrid_path(vocab, None), MemoryModel("recurrent")
    return tiny_model_path(vocab, None), None


def _server_args(settings, template, extra=()) -> list[str]:
    from tmplkit.server.resume import server_settings_args

    return ["--jinja", "-c", str(settings.n_ctx), "-np", "1", "-t", "2", "-tb", "2", "--no-warmup", "--cache-ram", "0",
            *server_settings_args(settings), "-lv", "4", "--chat-template-file", str(template.source), *extra]


def run_one(binary, name: str, session, settings, classes: dict, known: dict, log_dir: Path, kind: str = "tiny") -> dict:
    from tmplkit.server.process import LlamaServer
    from tmplkit.server.resume import check_resume
    from tmplkit.server_rules import server_delimiter_list
    from tmplkit.tokens.roundtrip import vocab_for_template
    from tmplkit.tokens.tokenizers import LlamaCppTokenizer

    template = load_one(str(template_path(name)))
    vocab = vocab_for_template(name) or "qwen35"
    model, memory = tiny_model(vocab, kind)
    delims = server_delimiter_list(template, known)
    args = _server_args(settings, template)
    tok = LlamaCppTokenizer(model)
    t0 = time.perf_counter()
    try:
        with LlamaServer(binary, model, args, log=log_dir / f"{name}.log", startup_s=120) as server:
            check = check_resume(server, template, session, tokenizer=tok, delimiters=delims, settings=settings,
                                 memory=memory)
            memory_lines = [line.strip() for line in server.log_text().splitlines()
                            if "llama_memory_recurrent: size" in line or "llama_kv_cache: size" in line]
    finally:
        tok.close()
    out = check.to_dict()
    out.update(vocab=vocab, verdicts=classes.get(name, []), seconds=round(time.perf_counter() - t0, 1),
               model=Path(model).name, memory=(memory.to_dict() if memory else {"kind": "swa", "n_swa": 512}),
               server_memory=memory_lines)  # the server's own account: a KV cache and recurrent states for a hybrid
    return out


def run_ratios(binary, name: str, tokens: int, seed: int, known: dict, log_dir: Path) -> dict:
    """One template's 30k-token session three ways (module doc)."""
    from tmplkit.prefill import tiny_model_path
    from tmplkit.server.chat_session import drive_session
    from tmplkit.server.process import LlamaServer, message_delimiters
    from tmplkit.server.resume import check_resume, predict_requests, send_completions, server_renders
    from tmplkit.server_rules import PrefillSettings, server_delimiter_list
    from tmplkit.session import generate_session
    from tmplkit.tokens.roundtrip import vocab_for_template
    from tmplkit.tokens.tokenizers import LlamaCppTokenizer
    from tmplkit.turns import MemoryModel

    template = load_one(str(corpus.templates_dir() / f"{name}.jinja"))
    vocab = vocab_for_template(name) or "qwen35"
    model = tiny_model_path(vocab, None)
    session = generate_session(tokens, seed=seed, style="agent")
    settings = PrefillSettings(n_ctx=65536)  # llama-server's defaults: -b 2048 -ub 512 -ctxcp 32 -cms 8192
    tok = LlamaCppTokenizer(model)
    try:
        theirs = server_delimiter_list(template, known)
        ours = tuple((d.role, d.delimiter) for d in message_delimiters(template, tok))
        with LlamaServer(binary, model, _server_args(settings, template), log=log_dir / f"{name}-own.log") as srv:
            own = check_resume(srv, template, session, tokenizer=tok, delimiters=theirs, settings=settings)
            prompts = server_renders(srv, session)
        with LlamaServer(binary, model, _server_args(settings, template), log=log_dir / f"{name}-ours.log") as srv:
            sent = send_completions(srv, prompts, ours)
        predicted = predict_requests(prompts, tok, ours, settings, MemoryModel.swa(512, settings.n_ubatch))
        with LlamaServer(binary, model, _server_args(settings, template, ["--swa-full"]), log=log_dir / f"{name}-bound.log") as srv:
            bound = drive_session(srv, session, max_tokens=1)
    finally:
        tok.close()
    after = lambda per: sum(per[1:])  # noqa: E731
    n_own = own.total("n_processed")
    n_ours = after([r["n_processed"] for r in sent])
    n_bound = after([r.n_processed for r in bound])
    keys = ("n_prompt", "n_reused", "n_processed", "batch_starts", "checkpoints_created", "checkpoint_restored", "full_reprocess")
    return {"template": name, "vocab": vocab, "requests": len(prompts), "last_prompt": own.requests[-1].measured["n_prompt"],
            "sent_after_first": after([r.measured["n_prompt"] for r in own.requests]),
            "delimiters": {"server": [list(d) for d in theirs], "tmplkit": [list(d) for d in ours]},
            "processed_after_first": {"server's own": n_own, "tmplkit's via /completion": n_ours, "full-attention bound": n_bound},
            "x_bound": {"server's own": round(n_own / max(1, n_bound), 3), "tmplkit's via /completion": round(n_ours / max(1, n_bound), 3)},
            "tmplkit_over_server": round(n_ours / max(1, n_own), 3),
            "predicted_equal": {"server's own": own.equal,
                                "tmplkit's via /completion": all(all(p[k] == m[k] for k in keys) for p, m in zip(predicted, sent))},
            "full_reprocess": {"server's own": [r.index for r in own.requests if r.measured["full_reprocess"]],
                               "tmplkit's via /completion": [k for k, r in enumerate(sent) if r["full_reprocess"]]}}


def main() -> int:
    from tmplkit.server.process import llama_server_binary
    from tmplkit.server_rules import PrefillSettings, load_server_delimiters
    from tmplkit.session import generate_session

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--templates", default=",".join(TEMPLATES), help="corpus template names, comma-separated")
    p.add_argument("--tokens", type=int, default=6000, help="the session generator's target")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ctx-checkpoints", type=int, default=6, help="-ctxcp (small, so that eviction happens)")
    p.add_argument("--checkpoint-min-step", type=int, default=256, help="-cms")
    p.add_argument("--batch", type=int, default=2048, help="-b")
    p.add_argument("--ubatch", type=int, default=512, help="-ub")
    p.add_argument("--server-delimiters", default=str(ROOT / "scripts" / "results" / "server-delimiters.json"))
    p.add_argument("--classes", default=str(ROOT / "scripts" / "results" / "server-delimiters-family-vocab.json"),
                   help="the verdicts per template on the family vocabularies")
    p.add_argument("--ratios", action="store_true", help="the 30k-token comparison instead (module doc)")
    p.add_argument("--ratio-tokens", type=int, default=40000, help="--ratios: the generator's target (about 31k tokens)")
    p.add_argument("--model", choices=("tiny", "hybrid"), default="tiny",
                   help="the tiny sliding-window model (default), or the tiny qwen35 hybrid (HYBRID_TEMPLATES by default, "
                        "JSON in scripts/results/server-resume-hybrid.json)")
    p.add_argument("--hub-server-delimiters", default=str(ROOT / "scripts" / "results" / "server-delimiters-hub.json"),
                   help="the server's delimiter lists and verdicts for the Hub corpus's development half")
    p.add_argument("--json", default=None, help="default scripts/results/server-resume.json (-hybrid.json with --model hybrid)")
    args = p.parse_args()
    hybrid = args.model == "hybrid"
    args.json = args.json or str(ROOT / "scripts" / "results" / f"server-resume{'-hybrid' if hybrid else ''}.json")
    if hybrid and args.templates == ",".join(TEMPLATES):
        args.templates = ",".join(HYBRID_TEMPLATES)
    binary = llama_server_binary()
    if binary is None:
        p.error("llama-server is not built: run `bash scripts/build_llama_server.sh`")
    names = [n for n in args.templates.split(",") if n]
    for n in names:
        if not template_path(n).is_file():
            p.error(f"--templates: no corpus template {n!r} (nor one of the Hub corpus's development half)")
        if held_out(n):
            p.error(f"--templates: {n!r} is one of the corpus templates the figures leave out")
    known = {**load_server_delimiters(args.hub_server_delimiters), **load_server_delimiters(args.server_delimiters)}
    if args.ratios:
        return _ratios_main(args, binary, names if args.templates != ",".join(TEMPLATES) else list(RATIO_TEMPLATES), known)
    classes = {r["template"]: [f"{v} (Hub run)" for v in r["verdicts"]]
               for r in json.loads(Path(args.hub_server_delimiters).read_text())["results"]}
    classes.update({r["template"]: r["verdicts"] for r in json.loads(Path(args.classes).read_text())["results"]})
    settings = PrefillSettings(n_ctx=32768, n_batch=args.batch, n_ubatch=args.ubatch, max_checkpoints=args.ctx_checkpoints,
                               checkpoint_min_step=args.checkpoint_min_step)
    session = generate_session(args.tokens, seed=args.seed, style="agent")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tmplkit-resume-") as tmp:
        for name in names:
            try:
                row = run_one(binary, name, session, settings, classes, known, Path(tmp), args.model)
            except Exception as exc:  # one template's failure is a row, not the end of the run
                row = {"template": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            print(f"{name}: " + (row.get("error") or f"{'equal' if row['equal'] else 'DIFFERS'} over "
                                 f"{row['requests_checked']} requests ({row['seconds']} s)"), file=sys.stderr)
            for m in row.get("mismatches", [])[:3]:
                print("   " + m, file=sys.stderr)
    print(_table(rows))
    result = {"session": {"seed": args.seed, "tokens": args.tokens},
              "settings": {"n_batch": args.batch, "n_ubatch": args.ubatch, "ctx_checkpoints": args.ctx_checkpoints,
                           "checkpoint_min_step": args.checkpoint_min_step, "n_swa": 0 if hybrid else 512,
                           "model": "tiny qwen35 hybrid (recurrent + full attention)" if hybrid else "tiny gemma3 (window 512)"},
              "equal": sum(1 for r in rows if r.get("equal")), "templates": len(rows), "rows": rows,
              "run": {"command": "python scripts/bench_server_resume.py " + " ".join(sys.argv[1:]), "cpu": cpu_model(),
                      "cores": os.cpu_count()}}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(out.read_text()) if out.is_file() else {}
    if "ratios" in old:  # the other mode's figures stay
        result["ratios"] = old["ratios"]
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(r.get("equal") for r in rows) else 1


def _ratios_main(args, binary, names, known) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tmplkit-ratios-") as tmp:
        for name in names:
            t0 = time.perf_counter()
            rows.append(run_ratios(binary, name, args.ratio_tokens, args.seed, known, Path(tmp)))
            print(f"{name}: {rows[-1]['processed_after_first']} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    print("| template | requests, last prompt | server's own delimiters | tmplkit's via /completion | full-attention bound | "
          "tmplkit / server | predicted = measured |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        n, x = r["processed_after_first"], r["x_bound"]
        own, ours, bound = n["server's own"], n["tmplkit's via /completion"], n["full-attention bound"]
        ok = "yes" if all(r["predicted_equal"].values()) else "NO"
        x_own, x_ours = x["server's own"], x["tmplkit's via /completion"]
        print(f"| {r['template']} | {r['requests']}, {r['last_prompt']:,} | {own:,} ({x_own}x) | "
              f"{ours:,} ({x_ours}x) | {bound:,} | {r['tmplkit_over_server']} | {ok} |")
    out = Path(args.json)
    data = json.loads(out.read_text()) if out.is_file() else {}
    data["ratios"] = {"tokens": args.ratio_tokens, "seed": args.seed, "rows": rows,
                      "run": {"command": "python scripts/bench_server_resume.py " + " ".join(sys.argv[1:]), "cpu": cpu_model()}}
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(all(r["predicted_equal"].values()) for r in rows) else 1


def _table(rows) -> str:
    lines = ["| template | server's delimiters vs tmplkit's | requests | prediction = measurement | "
             "tokens processed after the first | whole prompt again |", "|---|---|---:|---|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['template']} | | | error: {r['error'][:80]} | | |")
            continue
        full = ", ".join(map(str, r["full_reprocess"])) or "never"
        lines.append(f"| {r['template']} | {'; '.join(r['verdicts'])} | {r['requests_checked']} | "
                     f"{'yes' if r['equal'] else 'NO'} | {r['processed_after_first']:,} | {full} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
