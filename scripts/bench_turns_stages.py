#!/usr/bin/env python
"""Where the turns study's time goes: its stages timed one by one in one process, against the requests
rendered alone, on the agent-90k session of bench_turns_speed.py (Qwen3.5-4B, the qwen35 vocabulary).

    python scripts/bench_turns_stages.py --json scripts/results/turns-stages.json

One run (the ratios to "alone" are measured in the same process, minutes apart at most). The floor it
prints is the least any study with tokens does: each request rendered whole once ("alone") and the
last request's ids read from llama.cpp once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, loadavg  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


FLOOR = "the last request tokenized whole, once"  # (the row of the least a study with tokens reads from llama.cpp)


def stages(session_file: Path) -> dict:
    from tmplkit.sandbox import PINNED_NOW
    from tmplkit.session import for_server, load_session
    from tmplkit.session import requests as rq
    from tmplkit.sources import load_one
    from tmplkit.tokens.tokenizers import load_tokenizer
    from tmplkit.turns import cost as cs
    from tmplkit.turns import divergence as dv
    from tmplkit.turns import pipeline as pl
    from tmplkit.turns import summary as sm

    t, tok = load_one("corpus:llama.cpp", "Qwen3.5-4B"), load_tokenizer("vocab:qwen35")
    conv = for_server(t, load_session(session_file))
    msgs = list(conv.messages)
    seconds: dict = {}

    def timed(name, f, *a, **k):
        t0 = time.perf_counter()
        out = f(*a, **k)
        seconds[name] = time.perf_counter() - t0
        return out

    def alone():
        for k, (n, _) in enumerate(rq.request_points(msgs)):
            conv.render(msgs[:n], add_generation_prompt=True, clock=rq.clock_at(PINNED_NOW + k * rq.DEFAULT_INTERVAL))

    timed("alone", alone)
    reqs = timed("requests (renders)", lambda: tuple(rq.iter_requests(conv, t)))
    tokens = timed("tokenize the requests", dv.tokenize_requests, reqs, tok)
    spans = timed("spans", pl.request_spans, t, tok, reqs, tokens, [])
    nxt = timed("next renders", rq.next_renders, conv, t, reqs)
    pred = timed("tokenize the next renders", cs.predicted_divergences, tokens, nxt, tok, texts=[r.text for r in reqs])
    timed("divergences", dv.divergences, reqs, conv.messages, conv.conversation.tools, redraw=sm._redraw(conv, reqs),
          tokens=tokens, tokenizer=tok)
    timed("cost", cs.session_cost, tokens, spans, predicted=pred)
    timed("switches", sm._switches, t, conv, None, rq.DEFAULT_INTERVAL, reqs)
    study = sum(seconds.values()) - seconds["alone"]
    # The least a study with tokens does: every request rendered whole once (what "alone" times) and
    # every id of the last request read from llama.cpp once (no cache: `tokenize` keeps nothing).
    timed(FLOOR, tok.tokenize, reqs[-1].text, add_bos=False)
    floor = seconds["alone"] + seconds[FLOOR]
    return {"seconds": seconds, "over_alone": {k: v / seconds["alone"] for k, v in seconds.items()},
            "study_over_alone": study / seconds["alone"], "floor_over_alone": floor / seconds["alone"],
            # what a study within 2x alone would have left for the spans, the next renders and the rest
            "left_within_2x_s": 2 * seconds["alone"] - floor,
            "beyond_floor_now_s": study - seconds["requests (renders)"] - seconds["tokenize the requests"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = p.parse_args()
    import bench_turns_speed

    with tempfile.TemporaryDirectory(prefix="bench-turns-stages-") as tmp:
        bench_turns_speed.write_sessions(Path(tmp))
        res = stages(Path(tmp) / "agent.json")
    res["machine"] = {"cpu": cpu_model(), "cpus": os.cpu_count(), "loadavg_at_end": loadavg()}
    for k, v in res["seconds"].items():
        print(f"{k:40s} {v:6.2f} s  {res['over_alone'][k]:5.2f}x alone")
    print(f"study, all stages: {res['study_over_alone']:.2f}x alone")
    print(f"floor (alone, then {FLOOR}): {res['floor_over_alone']:.2f}x alone; within 2x leaves "
          f"{res['left_within_2x_s']:.2f} s for the stages after the requests' renders and tokens, "
          f"now {res['beyond_floor_now_s']:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
