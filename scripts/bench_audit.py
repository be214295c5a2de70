#!/usr/bin/env python3
"""Benchmark: analyze every template of the pinned llama.cpp corpus, with the round trip.

Each run is a fresh Python process (nothing compiled or cached beforehand), that analyzes the 70
templates one after the other, as `tmplkit audit --in-process` does: each template is compiled
once and rendered by all its probes. Per template it times the compile and the whole analysis.
The script prints medians over templates and over runs as JSON, and writes them with --json FILE.

    python scripts/bench_audit.py --runs 3 --json bench_audit.json

Goal on a 2-core machine: median under 30 ms per template and all 70 under 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_MEDIAN_MS = 30.0
GOAL_TOTAL_S = 3.0


def worker() -> dict:
    """One run, in this (fresh) process."""
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    from tmplkit import corpus
    from tmplkit.analysis import analyze
    from tmplkit.sandbox import compile_template
    from tmplkit.sources import ChatTemplate

    import_s = time.perf_counter() - t0
    tokens = json.loads((ROOT / "fixtures/templates/corpus_tokens.json").read_text(encoding="utf-8"))
    templates = []
    for path in sorted(corpus.templates_dir().glob("*.jinja")):
        tok = tokens.get(path.stem, {})
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
        rows.append({"name": t.name, "status": a.status, "compile_s": a1 - a0, "probes_s": a2 - a1, "total_s": a2 - a0})
    total = time.perf_counter() - start
    return {"import_s": import_s, "total_s": total, "templates": rows}


def summarize(runs: list[dict]) -> dict:
    per_run = []
    for r in runs:
        rows = r["templates"]
        per_run.append({
            "total_s": round(r["total_s"], 4),
            "import_s": round(r["import_s"], 4),
            "median_ms": round(statistics.median(x["total_s"] for x in rows) * 1000, 3),
            "median_compile_ms": round(statistics.median(x["compile_s"] for x in rows) * 1000, 3),
            "median_probes_ms": round(statistics.median(x["probes_s"] for x in rows) * 1000, 3),
            "max_ms": round(max(x["total_s"] for x in rows) * 1000, 3),
            "passed": sum(x["status"] == "pass" for x in rows),
        })
    names = [x["name"] for x in runs[0]["templates"]]
    per_template = {
        n: round(statistics.median(r["templates"][i]["total_s"] for r in runs) * 1000, 3) for i, n in enumerate(names)
    }
    median_ms = statistics.median(p["median_ms"] for p in per_run)
    total_s = statistics.median(p["total_s"] for p in per_run)
    return {
        "benchmark": "bench_audit",
        "templates": len(names),
        "runs": len(runs),
        "median_ms_per_template": median_ms,
        "total_s": total_s,
        "median_compile_ms": statistics.median(p["median_compile_ms"] for p in per_run),
        "median_probes_ms": statistics.median(p["median_probes_ms"] for p in per_run),
        "passed": per_run[0]["passed"],
        "goal": {"median_ms_per_template": GOAL_MEDIAN_MS, "total_s": GOAL_TOTAL_S,
                 "met": median_ms < GOAL_MEDIAN_MS and total_s < GOAL_TOTAL_S},
        "per_run": per_run,
        "slowest": dict(sorted(per_template.items(), key=lambda kv: -kv[1])[:5]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg_at_start": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="fresh processes to run (default 3)")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        json.dump(worker(), sys.stdout)
        return 0
    sys.path.insert(0, str(ROOT))
    from tmplkit import corpus

    if not corpus.is_fetched():
        print("the llama.cpp corpus is not in the cache; run `tmplkit corpus fetch` first", file=sys.stderr)
        return 2
    loadavg = os.getloadavg() if hasattr(os, "getloadavg") else None
    runs = []
    for _ in range(max(1, args.runs)):
        proc = subprocess.run([sys.executable, __file__, "--worker"], capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "worker failed", file=sys.stderr)
            return 1
        runs.append(json.loads(proc.stdout))
    result = summarize(runs)
    if loadavg is not None:
        result["machine"]["loadavg_at_start"] = [round(x, 2) for x in loadavg]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
