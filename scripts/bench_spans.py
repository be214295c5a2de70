#!/usr/bin/env python3
"""Benchmark: split a 131,072-token agent prompt into message spans.

The prompt is a real render (Qwen3.5-4B template from the pinned llama.cpp corpus) of a long
coding-agent session, tokenized with the real qwen35 vocab through llama.cpp. It is split with the
full delimiter set (system, user, assistant, tool, next tool response) as token ids derived in
context. Reports the median time of `SpanDetector.split` (list input, as a server holds tokens, and
numpy input) and of the pure-Python reference loop, measured in the same run, and their ratio.

    python scripts/bench_spans.py --json bench_spans.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tmplkit.sources import corpus  # noqa: E402
from tmplkit.tokens.delimiter_ids import token_delimiters  # noqa: E402
from tmplkit.tokens.spans import SpanDetector, split_reference  # noqa: E402
from tmplkit.tokens.tokenizers import load_tokenizer  # noqa: E402

TEMPLATE = "Qwen3.5-4B"
VOCAB = "qwen35"
TOOLS = [{"type": "function", "function": {
    "name": "run", "description": "Run a shell command in the repository.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]


def session(rounds: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = "def return self value items limit assert error path config token span user tool test".split()
    msgs: list[dict] = [{"role": "system", "content": "You are a coding agent working in a Python repository."},
                        {"role": "user", "content": "Resume: make the test suite pass."}]
    for r in range(rounds):
        calls = [{"type": "function", "function": {"name": "run", "arguments": {"cmd": f"pytest -q tests/test_m{r % 40}.py"}}}
                 for _ in range(1 + (rng.random() < 0.3))]
        msgs.append({"role": "assistant", "content": f"Checking module {r % 40}.", "tool_calls": calls})
        for _ in calls:
            lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(rng.randint(3, 25))]
            msgs.append({"role": "tool", "content": "\n".join(lines)})
        if rng.random() < 0.04:
            msgs.append({"role": "assistant", "content": "Progress: more cases pass."})
            msgs.append({"role": "user", "content": f"Keep going, round {r}."})
    msgs.append({"role": "assistant", "content": "Done."})
    return msgs


def render(messages: list[dict]) -> str:
    from tmplkit.sandbox import Limits
    from tmplkit.sandbox import render as render_template
    from tmplkit.sources import load_one

    template = load_one(corpus.templates_dir() / f"{TEMPLATE}.jinja")
    return render_template(template, messages, tools=TOOLS, limits=Limits(seconds=120, max_output_chars=None))


def delimiter_set(tok, probe: str):
    """Token delimiters as tmplkit derives them: analyze(), then ids read off the probe render."""
    from tmplkit.analysis import analyze
    from tmplkit.sources import load_one

    analysis = analyze(load_one(corpus.templates_dir() / f"{TEMPLATE}.jinja"))
    return token_delimiters(analysis, tok), "analyze"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=131072, help="prompt length in tokens (default 131072)")
    ap.add_argument("--repeats", type=int, default=31, help="timed runs of SpanDetector.split (default 31)")
    ap.add_argument("--ref-repeats", type=int, default=5, help="timed runs of the reference loop (default 5)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args(argv)

    tok = load_tokenizer(f"vocab:{VOCAB}")
    probe = render(session(4, seed=1))
    td, source = delimiter_set(tok, probe)
    if not td.passed:
        print("warning: token delimiters did not pass their check: " + "; ".join(td.problems), file=sys.stderr)

    rounds = max(8, args.tokens // 150)
    while True:
        rendered = render(session(rounds))
        ids = tok.tokenize(rendered)
        if len(ids) >= args.tokens:
            break
        rounds = int(rounds * args.tokens / len(ids) * 1.05) + 1
    ids = ids[:args.tokens]
    arr = np.asarray(ids, dtype=np.int64)
    pairs = [(d.role, d.ids) for d in td.delimiters]

    det = SpanDetector(td)
    fast = det.split(ids)
    ref = split_reference(ids, pairs)
    if list(fast) != ref:
        print("error: SpanDetector.split and the reference loop disagree", file=sys.stderr)
        return 1

    t_detector_init = median_time(lambda: SpanDetector(td), 11)
    t_list = median_time(lambda: det.split(ids), args.repeats)
    t_array = median_time(lambda: det.split(arr), args.repeats)
    t_ref = median_time(lambda: split_reference(ids, pairs), args.ref_repeats)
    counts = {r: len(fast.starts(r)) for r in ("system", "user", "assistant", "tool")}
    result = {
        "benchmark": "span split, 131k-token agent prompt" if args.tokens == 131072 else f"span split, {args.tokens}-token agent prompt",
        "template": TEMPLATE,
        "tokenizer": tok.name,
        "delimiters_from": source,
        "delimiters": [{"role": d.role, "ids": list(d.ids), "text": d.token_text} for d in td.delimiters],
        "n_tokens": len(ids),
        "n_spans": len(fast),
        "spans_by_role": counts,
        "repeats": {"split": args.repeats, "reference": args.ref_repeats},
        "median_ms": {
            "split_list": round(t_list * 1e3, 3),
            "split_ndarray": round(t_array * 1e3, 3),
            "reference": round(t_ref * 1e3, 3),
            "detector_init": round(t_detector_init * 1e3, 3),
        },
        "speedup_vs_reference": {"list": round(t_ref / t_list, 1), "ndarray": round(t_ref / t_array, 1)},
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    print(f"{result['n_tokens']} tokens, {result['n_spans']} spans {counts}, delimiters from {source}")
    print(f"SpanDetector.split   list input : {t_list * 1e3:8.3f} ms median of {args.repeats}")
    print(f"SpanDetector.split   ndarray    : {t_array * 1e3:8.3f} ms median of {args.repeats}")
    print(f"reference loop                 : {t_ref * 1e3:8.3f} ms median of {args.ref_repeats}")
    print(f"speedup vs reference           : {t_ref / t_list:8.1f}x (list), {t_ref / t_array:.1f}x (ndarray)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
