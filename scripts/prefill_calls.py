#!/usr/bin/env python3
"""Where a prefill's time goes, call by call: a cost model fitted to a bench_prefill.py result.

    python scripts/prefill_calls.py scripts/results/prefill-quiet-16k-seed15.json [--json FILE]
    python scripts/prefill_calls.py scripts/results/turns.json --at cold.gemma      # bench_turns.py cold

Every decode call a runner variant made (`runs[variant][i]['calls']`: start, size, rule, ...,
seconds) is one sample of

    seconds = a * tokens + b * tokens * (start + tokens / 2) + c * ubatches

(weights, attention over the context so far, and a fixed cost per ubatch of n_ubatch tokens),
fitted by least squares over the calls of every variant and round together. Per variant it prints
the measured median seconds, what the model predicts for that variant's schedule, and the calls the
model explains worst, so a loss can be told apart: a schedule that costs more by the model (more
ubatches, more attention) or calls that run slower than their shape says (the machine, or a cost the
model does not know, such as a partly filled ubatch late in the prompt). Results as JSON with
--json. Reads the JSON only: nothing is run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np


def features(start: int, size: int, n_ubatch: int) -> list[float]:
    return [size, size * (start + size / 2) / 1e4, math.ceil(size / n_ubatch)]


def runner_variants(given: dict) -> dict[str, list[dict]]:
    """The variants tmplkit's runner ran (llama-server's runs have no per-call record)."""
    return {name: runs for name, runs in given["runs"].items() if runs and "calls" in runs[0]}


def fit(variants: dict[str, list[dict]], n_ubatch: int) -> np.ndarray:
    rows, seconds = [], []
    for runs in variants.values():
        for run in runs:
            for call in run["calls"]:
                rows.append(features(call[0], call[1], n_ubatch))
                seconds.append(call[-1])
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(seconds), rcond=None)
    return coef


def explain(given: dict) -> dict:
    n_ubatch = given["settings"]["n_ubatch"]
    variants = runner_variants(given)
    coef = fit(variants, n_ubatch)

    def predict(call) -> float:
        return float(np.dot(features(call[0], call[1], n_ubatch), coef))

    out: dict = {"model": {"per_token_s": coef[0], "per_token_context_1e4_s": coef[1], "per_ubatch_s": coef[2]},
                 "variants": {}}
    for name, runs in variants.items():
        measured = statistics.median(r["seconds"] for r in runs)
        predicted = statistics.median(sum(predict(c) for c in r["calls"]) for r in runs)
        # a call's residual, as its median over rounds (the same schedule every round)
        by_call: dict[tuple[int, int], list[float]] = {}
        for r in runs:
            for c in r["calls"]:
                by_call.setdefault((c[0], c[1]), []).append(c[-1] - predict(c))
        worst = sorted(((statistics.median(v), k) for k, v in by_call.items()), reverse=True)[:3]
        out["variants"][name] = {"measured_s": round(measured, 3), "predicted_s": round(predicted, 3),
                                 "calls": len(runs[0]["calls"]),
                                 "slowest_for_their_shape": [{"start": k[0], "size": k[1], "extra_s": round(e, 3)} for e, k in worst]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("result", help="a JSON written by scripts/bench_prefill.py (--session/--prompt runs)")
    p.add_argument("--json", metavar="FILE", help="also write the explanation to FILE")
    p.add_argument("--at", metavar="KEY.KEY", help="where the runs are in the JSON instead of 'given' "
                                                  "(bench_turns.py cold: cold.gemma)")
    args = p.parse_args(argv)
    try:
        data = json.loads(Path(args.result).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"{args.result}: cannot read it as JSON ({exc}); give a JSON written by bench_prefill.py or bench_turns.py",
              file=sys.stderr)
        return 2
    given = data if args.at else data.get("given")
    for key in (args.at or "").split(".") if args.at else ():
        given = given.get(key) if isinstance(given, dict) else None
    if not given or "runs" not in given:
        print(f"{args.result}: no 'given' section with runs; give a result of bench_prefill.py --session or --prompt",
              file=sys.stderr)
        return 2
    res = explain(given)
    base = res["variants"].get("none")
    print(f"model: {res['model']['per_token_s'] * 1e3:.3f} ms/token, {res['model']['per_token_context_1e4_s'] * 1e3:.3f} ms per "
          f"token x 10k context, {res['model']['per_ubatch_s'] * 1e3:.1f} ms per ubatch")
    print("| variant | calls | measured s | predicted s | measured / none | predicted / none | slowest calls for their shape (start/size: extra s) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, v in res["variants"].items():
        ratio_m = v["measured_s"] / base["measured_s"] if base else float("nan")
        ratio_p = v["predicted_s"] / base["predicted_s"] if base else float("nan")
        worst = ", ".join(f"{w['start']}/{w['size']}: {w['extra_s']:+.2f}" for w in v["slowest_for_their_shape"])
        print(f"| {name} | {v['calls']} | {v['measured_s']:.2f} | {v['predicted_s']:.2f} | {ratio_m:.3f} | {ratio_p:.3f} | {worst} |")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
