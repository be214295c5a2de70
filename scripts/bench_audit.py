#!/usr/bin/env python3
"""Benchmark: analyze every template of the pinned llama.cpp corpus, with the round trip, cold and warm.

Each run is a pair of fresh Python processes sharing a new, empty cache folder: the cold one
compiles every template (and fills the cache with the compiled code and the static scan's
warnings), the warm one is a second audit of the same, unchanged templates that loads them
instead (tmplkit.sandbox.compile_cache). Each analyzes the 70 templates one after the other, as
`tmplkit audit --in-process` does: each template is compiled (or loaded) once, rendered by all
its probes, then scanned. Per template it times the compile, the probes and the scan, and checks
that warm and cold results are identical. The script prints medians over templates and over
runs and the warm/cold ratios as JSON (the ratios also on stderr), and writes them with --json FILE.

    python scripts/bench_audit.py --runs 3 --json bench_audit.json
    python scripts/bench_audit.py --against 9805995 --rounds 9 --json vs.json   # no slower than a commit?

`--against REV` checks out REV into a temporary git worktree and runs its bench_audit.py and this
one alternately, `--rounds` times (who goes first alternates too), each a `--runs` cold/warm
measurement; it prints both medians and the paired ratios of the cold totals (this / REV).

Goals on a 2-core machine: cold, median under 30 ms per template and all 70 under 3 s; warm, at
most a third of cold.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, emit_results, loadavg, revision_tree  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent
GOAL_MEDIAN_MS = 30.0
GOAL_TOTAL_S = 3.0
GOAL_WARM_RATIO = 1 / 3


def worker(templates_dir: Path) -> dict:
    """One run, in this (fresh) process, with the cache folder its environment names."""
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    from tmplkit.analysis import analyze
    from tmplkit.auditing.isolate import add_scan_warnings
    from tmplkit.sandbox import compile_template
    from tmplkit.sources import ChatTemplate

    import_s = time.perf_counter() - t0
    tokens = json.loads((ROOT / "fixtures/templates/corpus_tokens.json").read_text(encoding="utf-8"))
    # (the held-out names' pairs by hash: the whole corpus is timed as before, none of it named here)
    held = json.loads((ROOT / "fixtures/templates/corpus_tokens_held.json").read_text(encoding="utf-8"))
    templates = []
    for path in sorted(templates_dir.glob("*.jinja")):
        tok = tokens.get(path.stem) or held.get(hashlib.sha256(path.stem.encode()).hexdigest()[:16], {})
        templates.append(ChatTemplate(text=path.read_text(encoding="utf-8"), name=path.stem, source=str(path),
                                      bos_token=tok.get("bos_token"), eos_token=tok.get("eos_token")))
    rows = []
    start = time.perf_counter()
    for t in templates:
        a0 = time.perf_counter()
        try:
            compile_template(t)
        except Exception:  # the analysis reports it
            pass
        a1 = time.perf_counter()
        a = analyze(t)  # the compile is cached from here on, as in a real audit
        a2 = time.perf_counter()
        a = add_scan_warnings(a, t.text)  # the audit's static scan (kept between runs as well)
        a3 = time.perf_counter()
        result = {k: v for k, v in a.to_dict().items() if k != "seconds"}
        digest = hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()
        rows.append({"name": t.name, "status": a.status, "compile_s": a1 - a0, "probes_s": a2 - a1, "total_s": a2 - a0,
                     "scan_s": a3 - a2, "result_sha256": digest})
    audit = time.perf_counter() - start
    # total_s: compiling and probing, as this benchmark measured before the scan was timed too.
    return {"import_s": import_s, "total_s": sum(x["total_s"] for x in rows), "audit_s": audit, "templates": rows}


def figures(runs: list[dict]) -> dict:
    """Medians of a list of runs of one kind (cold or warm)."""
    per_run = []
    for r in runs:
        rows = r["templates"]
        per_run.append({
            "total_s": round(r["total_s"], 4),
            "audit_s": round(r["audit_s"], 4),
            "import_s": round(r["import_s"], 4),
            "median_ms": round(statistics.median(x["total_s"] for x in rows) * 1000, 3),
            "median_compile_ms": round(statistics.median(x["compile_s"] for x in rows) * 1000, 3),
            "median_probes_ms": round(statistics.median(x["probes_s"] for x in rows) * 1000, 3),
            "median_scan_ms": round(statistics.median(x["scan_s"] for x in rows) * 1000, 3),
            "max_ms": round(max(x["total_s"] for x in rows) * 1000, 3),
            "passed": sum(x["status"] == "pass" for x in rows),
        })
    return {
        "median_ms_per_template": statistics.median(p["median_ms"] for p in per_run),
        "total_s": statistics.median(p["total_s"] for p in per_run),
        "audit_s": statistics.median(p["audit_s"] for p in per_run),
        "median_compile_ms": statistics.median(p["median_compile_ms"] for p in per_run),
        "median_probes_ms": statistics.median(p["median_probes_ms"] for p in per_run),
        "median_scan_ms": statistics.median(p["median_scan_ms"] for p in per_run),
        "passed": per_run[0]["passed"],
        "per_run": per_run,
    }


def summarize(cold: list[dict], warm: list[dict]) -> dict:
    names = [x["name"] for x in cold[0]["templates"]]
    per_template = {
        n: round(statistics.median(r["templates"][i]["total_s"] for r in cold) * 1000, 3) for i, n in enumerate(names)
    }
    c, w = figures(cold), figures(warm)
    ratio = w["total_s"] / c["total_s"]
    same = all([x["result_sha256"] for x in r["templates"]] == [x["result_sha256"] for x in cold[0]["templates"]]
               for r in cold + warm)
    return {
        "benchmark": "bench_audit",
        "templates": len(names),
        "runs": len(cold),
        # The top-level figures are the cold ones (nothing compiled beforehand), as before the cache.
        **{k: v for k, v in c.items() if k != "per_run"},
        "warm": w,
        "warm_to_cold": round(ratio, 4),
        "warm_to_cold_with_scan": round(w["audit_s"] / c["audit_s"], 4),
        "same_results_warm_and_cold": same,
        "goal": {"median_ms_per_template": GOAL_MEDIAN_MS, "total_s": GOAL_TOTAL_S, "warm_to_cold": round(GOAL_WARM_RATIO, 4),
                 "met": c["median_ms_per_template"] < GOAL_MEDIAN_MS and c["total_s"] < GOAL_TOTAL_S
                 and ratio <= GOAL_WARM_RATIO and same},
        "per_run": c["per_run"],
        "slowest": dict(sorted(per_template.items(), key=lambda kv: -kv[1])[:5]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "cpu": cpu_model(),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None},
    }


def run_worker(templates_dir: Path, cache: str) -> dict:
    env = {**os.environ, "TMPLKIT_CACHE": cache}
    env.pop("TMPLKIT_NO_CACHE", None)
    proc = subprocess.run([sys.executable, __file__, "--worker", str(templates_dir)], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "worker failed")
    return json.loads(proc.stdout)


def against(rev: str, rounds: int, runs: int) -> dict:
    """This tree's bench against `rev`'s, alternately (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="bench-audit-against-") as tmp, revision_tree(ROOT, rev, Path(tmp) / "tree") as tree:
        totals: dict[str, list[float]] = {"this": [], rev: []}
        for r in range(max(1, rounds)):
            order = [("this", ROOT), (rev, tree)] if r % 2 else [(rev, tree), ("this", ROOT)]
            for label, root in order:
                out = Path(tmp) / f"{label}-{r}.json"
                subprocess.run([sys.executable, str(root / "scripts" / "bench_audit.py"), "--runs", str(runs),
                                "--json", str(out)], cwd=root, check=True, capture_output=True)
                totals[label].append(json.loads(out.read_text())["total_s"])
            print(f"round {r}: this {totals['this'][-1]:.3f} s, {rev} {totals[rev][-1]:.3f} s", file=sys.stderr)
    paired = [a / b for a, b in zip(totals["this"], totals[rev])]
    return {"against": rev, "rounds": rounds, "runs": runs, "total_s": totals,
            "median_s": {k: statistics.median(v) for k, v in totals.items()},
            "paired_this_over_rev": {"median": statistics.median(paired), "min": min(paired), "max": max(paired), "all": paired},
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                        "loadavg_at_end": loadavg()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--runs", type=int, default=3, help="cold/warm pairs of fresh processes to run (default 3)")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--against", metavar="REV", help="compare with the bench of git revision REV, alternately")
    p.add_argument("--rounds", type=int, default=5, help="with --against: alternating rounds (default 5)")
    p.add_argument("--worker", metavar="TEMPLATES", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        json.dump(worker(Path(args.worker)), sys.stdout)
        return 0
    if args.against:
        try:
            res = against(args.against, args.rounds, args.runs)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(exc if isinstance(exc, RuntimeError) else f"a bench run failed: {exc}", file=sys.stderr)
            return 1
        emit_results(res, args.json)
        return 0
    sys.path.insert(0, str(ROOT))
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        print("the llama.cpp corpus is not in the cache; run `tmplkit corpus fetch` first", file=sys.stderr)
        return 2
    templates_dir = corpus.templates_dir()  # read before the runs point TMPLKIT_CACHE elsewhere
    loadavg = os.getloadavg() if hasattr(os, "getloadavg") else None
    cold, warm = [], []
    try:
        for _ in range(max(1, args.runs)):
            with tempfile.TemporaryDirectory(prefix="bench-audit-cache-") as cache:
                cold.append(run_worker(templates_dir, cache))  # an empty cache: compiles, and fills it
                warm.append(run_worker(templates_dir, cache))  # the same templates again: loads
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    result = summarize(cold, warm)
    if loadavg is not None:
        result["machine"]["loadavg_at_start"] = [round(x, 2) for x in loadavg]
    text = json.dumps(result, indent=2)
    print(text)
    print(f"warm/cold: {result['warm_to_cold']:.3f} ({result['warm']['total_s']:.3f} s vs {result['total_s']:.3f} s "
          f"for {result['templates']} templates); with the static scan {result['warm_to_cold_with_scan']:.3f} "
          f"({result['warm']['audit_s']:.3f} s vs {result['audit_s']:.3f} s); same results: "
          f"{result['same_results_warm_and_cold']}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
