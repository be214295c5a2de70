#!/usr/bin/env python
"""How much memory `tmplkit turns` holds on long sessions: the study's peak resident memory over
what the process held before it, for generated coding-agent sessions of growing length on the
corpus's Qwen3.5-4B template with the qwen35 vocabulary (the agent-90k case of
bench_turns_speed.py, longer).

    python scripts/bench_turns_memory.py --json scripts/results/turns-memory.json
    python scripts/bench_turns_memory.py --sizes 120000 --json /tmp/m.json
    python scripts/bench_turns_memory.py --ahead --json scripts/results/turns-memory-ahead.json

Each size is studied in a fresh process (the template, tokenizer and session loaded first); the
figure is that process's peak resident set (`ru_maxrss`) less its resident set just before the
study, so it counts what the study holds at its fullest. Per size: the session's messages, its
last request's tokens, the peak over before in MB, and the seconds of the study. The growth from
one size to the next says whether memory goes with the session's length or its square.
`--ahead`: the next renders made in a forked child (`study_turns(..., ahead=True)`, what `tmplkit
turns -j 2` does with one template, the default on two cores); the figure is this process's, not
the child's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from _machine import cpu_model, emit_results, loadavg  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent
# generate_session's size argument (characters of content): 120,000 is agent-90k's 89k tokens
SIZES = (120000, 240000, 400000)


def _rss_mb() -> float:
    """This process's resident set now, in MB (from /proc; the peak where /proc is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def worker(size: int, ahead: bool = False) -> dict:
    """One size, studied in this process."""
    sys.path.insert(0, str(ROOT))
    from tmplkit.session import generate_session
    from tmplkit.sources import load_one
    from tmplkit.tokens.tokenizers import load_tokenizer
    from tmplkit.turns import study_turns

    template, tok = load_one("corpus:llama.cpp", "Qwen3.5-4B"), load_tokenizer("vocab:qwen35")
    session = generate_session(size, seed=0, style="agent")
    before = _rss_mb()
    start = time.perf_counter()
    study = study_turns(template, session, tokenizer=tok, switches=True, ahead=ahead)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # (kilobytes on Linux)
    return {"size": size, "messages": len(session.messages), "requests": study.n_requests,
            "last_request_tokens": study.cost.n_tokens[-1] if study.cost is not None else None,
            "before_mb": round(before, 1), "peak_over_before_mb": round(peak - before, 1), "seconds": round(seconds, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=int, default=list(SIZES), help="generate_session sizes (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--ahead", action="store_true", help="the next renders made in a forked child (turns -j 2)")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        json.dump(worker(args.worker, args.ahead), sys.stdout)
        return 0
    rows = []
    for size in args.sizes:
        proc = subprocess.run([sys.executable, __file__, "--worker", str(size), *(["--ahead"] if args.ahead else [])],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"size {size} failed", file=sys.stderr)
            return 1
        row = json.loads(proc.stdout)
        rows.append(row)
        print(f"{row['messages']:5d} messages, {row['last_request_tokens']} tokens in the last request: "
              f"{row['peak_over_before_mb']:7.1f} MB over {row['before_mb']:.0f} MB, {row['seconds']:.1f} s", file=sys.stderr)
    res = {"ahead": args.ahead, "rows": rows, "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "loadavg_at_end": loadavg()}}
    emit_results(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
