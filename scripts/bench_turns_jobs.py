#!/usr/bin/env python
"""`tmplkit turns` over several templates: one worker at a time against the machine's cores (`-j`).

    python scripts/bench_turns_jobs.py --rounds 3 --json scripts/results/turns-jobs.json

Eight templates of the llama.cpp corpus (all in the Hub development half), a generated 20k-token
agent session (seed 0), the qwen35 vocabulary; each round runs the whole command with `-j 1` and
with `-j N` (N: the machine's cores), in alternating order. Per variant the wall seconds per round
and their median; the paired ratio jN/j1 with its spread; and whether both wrote the same report
(they must: each template is studied alone in its worker either way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, emit_results, loadavg  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ("Qwen3.5-4B", "google-gemma-4-31B-it", "mistralai-Mistral-Nemo-Instruct-2407", "deepseek-ai-DeepSeek-V3.1",
             "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "microsoft-Phi-3.5-mini-instruct", "Qwen-Qwen3-0.6B",
             "meta-llama-Llama-3.2-3B-Instruct")


def template_paths() -> list[str]:
    corpus = subprocess.run([sys.executable, "-m", "tmplkit", "corpus", "path"], capture_output=True, text=True, check=True)
    return [str(Path(corpus.stdout.strip()) / "templates" / f"{n}.jinja") for n in TEMPLATES]


def run(jobs: int, session: Path, sources: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tmplkit", "turns", *sources, "--session", str(session),
                           "--tokenizer", "vocab:qwen35", "--format", "json", "-j", str(jobs)],
                          capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"-j {jobs}: " + (proc.stderr.strip().splitlines() or ["failed"])[-1])
    return seconds, proc.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    seen: dict = {1: [], cores: []}
    outputs: dict = {}
    sources = template_paths()
    with tempfile.TemporaryDirectory(prefix="bench-turns-jobs-") as tmp:
        session = Path(tmp) / "session.json"
        subprocess.run([sys.executable, "-m", "tmplkit", "session", "generate", "--tokens", "20000", "--seed", "0",
                        "-o", str(session)], check=True, cwd=ROOT)
        for r in range(max(1, args.rounds)):
            for jobs in ((1, cores) if r % 2 == 0 else (cores, 1)):
                seconds, out = run(jobs, session, sources)
                seen[jobs].append(seconds)
                outputs[jobs] = json.loads(out)["reports"]
            print(f"round {r}: -j 1 {seen[1][-1]:.2f} s, -j {cores} {seen[cores][-1]:.2f} s", file=sys.stderr)
    paired = [b / a for a, b in zip(seen[1], seen[cores])]
    res = {"templates": list(TEMPLATES), "session_tokens": 20000, "rounds": args.rounds, "cores": cores,
           "seconds": {f"-j {k}": v for k, v in seen.items()},
           "median_s": {f"-j {k}": statistics.median(v) for k, v in seen.items()},
           "paired_jN_over_j1": {"median": statistics.median(paired), "min": min(paired), "max": max(paired)},
           "same_reports": outputs[1] == outputs[cores],
           "machine": {"cpu": cpu_model(), "cpus": cores, "loadavg_at_end": loadavg()}}
    emit_results(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
