#!/usr/bin/env python
"""Agent sessions turn by turn: the corpus table and the replay benchmark.

    python scripts/bench_turns.py corpus                 # every corpus template: stable?, cause, shares recomputed
    python scripts/bench_turns.py replay                 # the tiny Qwen3.5-vocab model and Gemma 3 270M
    python scripts/bench_turns.py replay --quick         # a short session, the tiny model only
    python scripts/bench_turns.py replay --models qwen   # one of the two models
    python scripts/bench_turns.py replay --models hybrid --json scripts/results/turns-hybrid.json
                                                         # the tiny qwen35 hybrid (recurrent + full attention)
    python scripts/bench_turns.py cold --models gemma    # the resumed session's first prefill, policies against none
    python scripts/bench_turns.py classes                # the corpus table's totals per class of the server's delimiters

corpus: one generated agent session (`--tokens`, default 40000, about 31,500 tokens in its last request; reasoning on every assistant turn,
parallel tool calls, several user requests) on every llama.cpp corpus template, tokenized with the
template's corpus vocabulary (qwen35 when it has none), the four settings of `tmplkit.turns.cost`
simulated (a sliding window of 512, llama-server's defaults; the llama-server setting with the
server's own delimiter list for each template, from `--server-delimiters`, default
scripts/results/server-delimiters.json, and on the pinned server's own renders, `/apply-template`,
for the templates engine parity finds rendered otherwise by llama.cpp's engine:
scripts/results/engine-parity.json). Prints a markdown table; the corpus templates whose
names are in the Hub corpus's held-out half are left out (scripts/_held_out.py).

replay: the same kind of session replayed on a model as llama-server serves it, one runner per
setting (llama-server's delimiters with its gate, tmplkit's with `gated`, tmplkit's with
`divergence-aware`) and one more with `none` for the first prefill, interleaved request by
request (each request starts with a different setting), so the settings share the machine's
state; per request the recompute seconds (prefill, restores included; the teacher-forced
generated turn excluded) and tokens, the prediction beside them, and paired ratios per request.
The goals of issue 12 are checked at the end. Results as JSON (default scripts/results/turns.json).

cold: the first prefill of a resumed session (issue 25213: a server restarted, or a session moved
to it), i.e. the session's last request prefilled into an empty memory: `none` against each
setting's policy with its spans, `--repeats` rounds (default 3), the order rotated per round,
paired ratios of none's seconds over each setting's (>= 0.98 is the goal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from _held_out import held_out  # scripts/, beside this file
from _machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tmplkit import load_one  # noqa: E402
from tmplkit.replay import REPLAYED  # noqa: E402  (llama-server, tmplkit, divergence-aware)
from tmplkit.session import generate_session  # noqa: E402
from tmplkit.sources import corpus  # noqa: E402
from tmplkit.turns import study_turns  # noqa: E402
from tmplkit.turns.formats import format_turns  # noqa: E402


def _tiny():
    from tmplkit.prefill import tiny_model_path

    return tiny_model_path(), corpus.templates_dir() / "Qwen3.5-4B.jinja", "agent"


def _hybrid():
    from tmplkit.prefill import tiny_hybrid_path

    return tiny_hybrid_path(), corpus.templates_dir() / "Qwen3.5-4B.jinja", "agent"


# label -> (model, template, session style); the Gemma GGUF carries no chat template: the model's own
# from the Hub corpus's development half; "hybrid": the tiny qwen35 hybrid (recurrent + full attention)
_MODELS = {"qwen": _tiny, "hybrid": _hybrid,
           "gemma": lambda: (corpus.gemma_model_path(), corpus.gemma_template_path(), "user-turns")}


def corpus_table(args) -> dict:
    from tmplkit.server_rules import load_server_delimiters
    from tmplkit.tokens.roundtrip import vocab_for_template
    from tmplkit.tokens.tokenizers import load_tokenizer

    session = generate_session(args.tokens, seed=args.seed, style="agent")
    server = load_server_delimiters(args.server_delimiters)
    engines = _engine_differs(args)
    tokenizers: dict = {}
    reports = []
    paths = sorted(corpus.templates_dir().glob("*.jinja"))
    left_out = [p for p in paths if held_out(p.stem)]
    for path in paths:
        if path in left_out:
            continue
        template = load_one(path)
        vocab = vocab_for_template(template.name) or "qwen35"
        if vocab not in tokenizers:
            tokenizers[vocab] = load_tokenizer(f"vocab:{vocab}")
        t0 = time.perf_counter()
        try:
            texts = _server_texts(template, vocab, session) if template.name in engines else None
            r = study_turns(template, session, tokenizer=tokenizers[vocab], server=server, server_texts=texts)
        except Exception as exc:  # one template's failure is a row, not the end of the table
            print(f"{template.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        # † : no corpus vocabulary for this family; its special tokens are split by qwen35's, so its
        # token-level verdicts ("token ids") are about that vocabulary, not the model's
        reports.append(r if vocab_for_template(template.name) else replace(r, template=r.template + " †"))
        print(f"{template.name}: {'stable' if r.stable else (r.first.cause if r.first else r.error)} "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    table = (format_turns(reports, "markdown") + "\n† tokenized with the qwen35 vocabulary (the corpus has none of the family's)"
             f"; {len(left_out)} corpus templates left out (their names are in the Hub corpus's held-out half)\n")
    print(table)
    n_req = max((r.n_requests for r in reports), default=0)
    print(f"session: seed {args.seed}, {n_req} requests, {session.roles.count('user')} user requests", file=sys.stderr)
    return {"session": {"seed": args.seed, "tokens": args.tokens, "requests": n_req}, "table": table,
            "server_delimiters": os.path.relpath(args.server_delimiters, ROOT), "left_out": len(left_out),
            "server_renders": sorted(engines),
            "reports": [{k: v for k, v in r.to_dict().items() if k != "divergences"} for r in reports]}


def classes_table(args) -> dict:
    """The saved corpus table (`corpus` in --json) summed per verdict of `tmplkit server delimiters`
    on the family vocabularies (--classes): templates, and the tokens recomputed after the first
    request by llama-server and by tmplkit's `gated`, against the full-attention bound. The ratio
    to the bound is over the templates the server renders as transformers does (the bound is
    of transformers' renders; where llama.cpp's engine keeps what transformers drops, the server
    recomputes less than that bound)."""
    data = json.loads(Path(args.json).read_text())
    verdicts = {r["template"]: r["verdicts"] for r in json.loads(Path(args.classes).read_text())["results"]}
    own = set(data["corpus"].get("server_renders", ()))
    out: dict = {}
    for rep in data["corpus"]["reports"]:
        name = rep["template"].removesuffix(" †")
        cost = rep.get("cost")
        if not cost or not {"llama-server", "tmplkit", "full attention"} <= set(cost["after_first"]):
            continue  # the server cannot render the session, or tmplkit's delimiters do not split its tokens
        for v in verdicts.get(name, ["not probed"]):
            row = out.setdefault(v, {"templates": 0, "server renders": 0, "llama-server": 0, "tmplkit": 0,
                                     "full attention": 0, "alike": {"llama-server": 0, "full attention": 0},
                                     "whole prompt again": 0})
            row["templates"] += 1
            row["server renders"] += name in own
            for k in ("llama-server", "tmplkit", "full attention"):
                row[k] += cost["after_first"][k]
            if name not in own:
                for k in ("llama-server", "full attention"):
                    row["alike"][k] += cost["after_first"][k]
            row["whole prompt again"] += sum(r["full_reprocess"] for r in cost["requests"]["llama-server"][1:])
    print("| the server's user starts vs tmplkit's | templates (on the server's renders) | llama-server | tmplkit (`gated`) | "
          "full attention | llama-server / bound, rendered alike | requests with the whole prompt again |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for v, r in out.items():
        ratio = r["alike"]["llama-server"] / max(1, r["alike"]["full attention"])
        print(f"| {v} | {r['templates']} ({r['server renders']}) | {r['llama-server']:,} | {r['tmplkit']:,} | "
              f"{r['full attention']:,} | {ratio:.3f} | {r['whole prompt again']} |")
    data["corpus"]["classes"] = out
    return data


def _engine_differs(args) -> set[str]:
    """The templates llama.cpp's engine renders otherwise (scripts/results/engine-parity.json), whose
    llama-server setting is then simulated on the server's own renders; none without the binary."""
    from tmplkit.server.process import llama_server_binary

    if args.no_server_render or llama_server_binary() is None:
        print("llama-server's own renders not used (--no-server-render, or no binary)", file=sys.stderr)
        return set()
    saved = json.loads((ROOT / "scripts" / "results" / "engine-parity.json").read_text())
    rows = saved["rows"] if isinstance(saved, dict) else saved  # (the report, or its rows as older runs wrote them)
    return {r["template"] for r in rows if r["status"] == "differs" and not held_out(r["template"])}


def _server_texts(template, vocab: str, session) -> list[str]:
    """Each request as the pinned llama-server renders it, on the tiny model of `vocab`."""
    import tempfile

    from tmplkit.prefill import tiny_model_path
    from tmplkit.server.process import LlamaServer, llama_server_binary
    from tmplkit.server.resume import server_renders

    args = ["--jinja", "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "--chat-template-file", str(template.source)]
    with tempfile.TemporaryDirectory(prefix="tmplkit-renders-") as tmp:
        with LlamaServer(llama_server_binary(), tiny_model_path(vocab, None), args, log=Path(tmp) / "server.log") as srv:
            return server_renders(srv, session)


def replay_bench(args) -> dict:
    from tmplkit.prefill import PrefillRunner
    from tmplkit.prefill.compare import resolve_template

    out = {}
    for label in (["qwen"] if args.quick else args.models.split(",")):
        path, template, style = _MODELS[label]()
        session = generate_session(args.tokens if not args.quick else 3000, seed=args.seed, style=style,
                                   requests=None if not args.quick else 2)
        # poll=None: four runners in one process, so no idle threadpool may spin while another decodes
        runners = {name: PrefillRunner(path, n_ctx=args.n_ctx, n_threads=args.threads, poll=None) for name in REPLAYED + ("none",)}
        try:
            tmpl = resolve_template(str(template) if template else None, runners["tmplkit"])
            out[label] = _interleaved(runners, session, tmpl)
        finally:
            for r in runners.values():
                r.close()
        _print_section(label, out[label])
    return out


def _interleaved(runners, session, template) -> dict:
    """Each setting on its own runner, request by request, the order rotated per request."""
    from tmplkit.replay import memory_of
    from tmplkit.turns.cost import policy_for, session_cost

    lead = runners["tmplkit"]
    tokens, spans, ahead, every = _prepared(session, template, lead)
    predicted = session_cost(tokens, spans, predicted=ahead, prefill=lead.settings, memory=memory_of(lead))
    rows = {name: [] for name in REPLAYED}
    first_none = None
    for runner in runners.values():  # a warm-up, so no setting pays for the first decode of the process
        runner.run(tokens.requests[0][:256], None, "none")
    for k, ids in enumerate(tokens.requests):
        order = list(REPLAYED[k % 3:] + REPLAYED[:k % 3])
        if k == 0:
            order.insert(0, "none")
        for name in order:
            runner = runners[name]
            if name == "none":
                first_none = runner.run(ids, None, "none").seconds
                continue
            s = every[name]
            pol = policy_for(s.policy, ahead, k, len(ids))
            sp = spans[s.delimiters][k]
            rep = runner.run(ids, sp, pol) if k == 0 else runner.resume(ids, sp, pol)
            if tokens.generated[k]:
                runner.decode_generated(tokens.generated[k])
            rows[name].append({"recomputed": rep.n_processed, "predicted": predicted.requests[name][k].n_recomputed,
                               "seconds": rep.seconds, "restored": rep.restored.n_tokens if rep.restored else None})
    bound = predicted.recomputed("full attention")
    return {"template": template.name, "requests": len(tokens.requests), "prompt_tokens": sum(map(len, tokens.requests)),
            "bound": list(bound), "rows": rows, "first_none_seconds": first_none}


def _prepared(session, template, runner):
    """The session's requests as `runner`'s model tokenizes them, their spans per delimiter set, the
    divergences their next renders predict (tmplkit.turns.prepare_session, as the replay prepares
    them), and the cost settings by name."""
    from tmplkit.replay import memory_of
    from tmplkit.turns import prepare_session
    from tmplkit.turns.cost import default_settings

    p = prepare_session(session, template, runner.tokenizer, add_bos=runner.info.add_bos)
    return p.tokens, p.spans, p.predicted, {s.name: s for s in default_settings(memory_of(runner))}


def cold_bench(args) -> dict:
    from tmplkit.prefill import PrefillRunner
    from tmplkit.turns.cost import policy_for

    out = {}
    for label in args.models.split(","):
        path, template_path, style = _MODELS[label]()
        session = generate_session(args.tokens, seed=args.seed, style=style)
        runner = PrefillRunner(path, n_ctx=args.n_ctx, n_threads=args.threads, poll=None)
        try:
            template = load_one(template_path)
            tokens, spans, ahead, every = _prepared(session, template, runner)
            k = len(tokens.requests) - 1
            ids = tokens.requests[k]
            chosen = [a for a in args.arms.split(",") if a != "none"] if args.arms else list(REPLAYED)
            arms = {"none": (None, "none")}
            arms.update({name: (spans[every[name].delimiters][k], policy_for(every[name].policy, ahead, k, len(ids)))
                         for name in chosen})
            runner.run(ids[:256], None, "none")  # a warm-up: no arm pays for the process's first decode
            runs: dict[str, list[dict]] = {name: [] for name in arms}
            names = list(arms)
            for r in range(max(1, args.repeats)):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    sp, pol = arms[name]
                    rep = runner.run(ids, sp, pol)
                    # every decode call as bench_prefill.py records it, for scripts/prefill_calls.py
                    runs[name].append({"seconds": rep.seconds, "round": r, "checkpoints": [c.n_tokens for c in rep.checkpoints],
                                       "calls": [[c.start, c.size, c.reason, c.rule, round(c.seconds, 6)] for c in rep.decode_calls]})
                print(f"{label} round {r}: " + ", ".join(f"{n} {v[-1]['seconds']:.2f} s" for n, v in runs.items()), file=sys.stderr)
            settings = {"n_ubatch": runner.settings.n_ubatch, "n_batch": runner.settings.n_batch}
        finally:
            runner.close()
        seconds = {name: [x["seconds"] for x in v] for name, v in runs.items()}
        paired = {name: [n / x for n, x in zip(seconds["none"], seconds[name])] for name in chosen}
        out[label] = {"template": template.name, "n_tokens": len(ids), "seconds": seconds, "settings": settings, "runs": runs,
                      "none_over": {name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                                    for name, v in paired.items()}}
        print(f"\n## {label}: the last request ({len(ids)} tokens) prefilled cold, {args.repeats} rounds\n")
        print("| setting | median seconds | none / setting, paired median (min-max) | goal >= 0.98 |")
        print("|---|---:|---:|---|")
        print(f"| none | {statistics.median(seconds['none']):.2f} | 1.000 | |")
        for name in chosen:
            r = out[label]["none_over"][name]
            print(f"| {name} | {statistics.median(seconds[name]):.2f} | {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) | "
                  f"{'met' if r['median'] >= 0.98 else 'not met'} |")
    return out


def _print_section(label: str, res: dict) -> None:
    rows, bound = res["rows"], res["bound"]
    after = lambda name, key: sum(r[key] for r in rows[name][1:])  # noqa: E731
    print(f"\n## {label}: {res['template']}, {res['requests']} requests, {res['prompt_tokens']} prompt tokens sent\n")
    print("| setting | tokens recomputed (after the first) | x full-attention bound | seconds | predicted = measured |")
    print("|---|---|---|---|---|")
    b = sum(bound[1:])
    for name in REPLAYED:
        ok = all(r["recomputed"] == r["predicted"] for r in rows[name])
        print(f"| {name} | {after(name, 'recomputed')} | {after(name, 'recomputed') / max(1, b):.3f} | "
              f"{after(name, 'seconds'):.2f} | {'yes' if ok else 'NO'} |")
    print(f"| full attention (bound) | {b} | 1.000 | | |")
    aware, server = rows["divergence-aware"], rows["llama-server"]
    paired = [a["seconds"] / s["seconds"] for a, s in zip(aware[1:], server[1:]) if s["recomputed"] != a["recomputed"]]
    tok_ratio = after("divergence-aware", "recomputed") / max(1, after("llama-server", "recomputed"))
    time_ratio = after("divergence-aware", "seconds") / max(1e-9, after("llama-server", "seconds"))
    first = res["first_none_seconds"] / max(1e-9, aware[0]["seconds"])
    print(f"\ngoals: divergence-aware within 1.1x of the bound: {after('divergence-aware', 'recomputed') <= 1.1 * b} "
          f"({after('divergence-aware', 'recomputed') / max(1, b):.3f}x); at most half of llama-server's tokens: "
          f"{tok_ratio <= 0.5} ({tok_ratio:.3f}x); recompute time at most 0.6x of llama-server's: {time_ratio <= 0.6} "
          f"({time_ratio:.3f}x; median paired ratio over the {len(paired)} requests that differ: "
          f"{statistics.median(paired) if paired else float('nan'):.3f}); first request vs none (short: the cold mode times "
          f"a resumed session's first prefill): {first:.3f}x "
          f"({'met' if first >= 0.98 else 'not met'}, goal >= 0.98)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["corpus", "replay", "cold", "classes"])
    p.add_argument("--tokens", type=int, default=40000, help="the generator's target (a character estimate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", default="qwen,gemma", help="replay: which of qwen (the tiny model), hybrid (the tiny hybrid), gemma")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=3, help="cold: rounds")
    p.add_argument("--arms", help="cold: the settings to run against none (default: all of them)")
    p.add_argument("--server-delimiters", metavar="FILE", default=str(ROOT / "scripts" / "results" / "server-delimiters.json"),
                   help="corpus: llama-server's delimiter lists (a saved `tmplkit server delimiters --format json`)")
    p.add_argument("--classes", default=str(ROOT / "scripts" / "results" / "server-delimiters-family-vocab.json"),
                   help="classes: the verdicts of `tmplkit server delimiters --model family`")
    p.add_argument("--no-server-render", action="store_true",
                   help="corpus: simulate the llama-server setting on transformers' renders everywhere (default: "
                        "on the server's own renders where engine parity says they differ)")
    p.add_argument("--json", default=str(ROOT / "scripts" / "results" / "turns.json"))
    args = p.parse_args()
    for label in args.models.split(","):
        if label not in _MODELS:
            p.error(f"--models: unknown model {label!r}; choose from {', '.join(_MODELS)}")
    for arm in (args.arms or "").split(",") if args.arms else ():
        if arm not in REPLAYED and arm != "none":
            p.error(f"--arms: unknown setting {arm!r}; choose from {', '.join(REPLAYED)}")
    if args.what == "classes":  # a summary of the saved corpus table, written back beside it
        Path(args.json).write_text(json.dumps(classes_table(args), indent=1, default=str) + "\n")
        return 0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {"corpus": corpus_table, "replay": replay_bench, "cold": cold_bench}[args.what](args)
    result["run"] = {"command": "python scripts/bench_turns.py " + " ".join(sys.argv[1:]), "cpu": cpu_model(),
                     "cores": os.cpu_count(), "load_average": {"start": load, "end": os.getloadavg()[0] if load is not None else None}}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(out.read_text()) if out.is_file() else {}
    if args.what in ("replay", "cold"):  # one model at a time keeps the other's figures
        run = result.pop("run")
        data.setdefault(args.what, {}).update({label: {**res, "run": run} for label, res in result.items()})
    else:
        data["corpus"] = result
    out.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
