#!/usr/bin/env python
"""The masks' fast paths against the proving path, over whole corpora: every template, each of the
check conversations and three generated sessions, the mask with its fast paths (the one-render
path, the prefix path) and without (each request proved), compared turn for turn.

    python scripts/mask_paths.py --json scripts/results/mask-paths.json             # the llama.cpp corpus
    python scripts/mask_paths.py --hub --json scripts/results/mask-paths-hub.json   # the Hub corpus's development half

tests/test_masks.py holds the same on a chosen few templates; this holds it on all of them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _held_out import compared_over_corpus  # noqa: E402  (scripts/, beside this file)
from _machine import cpu_model  # noqa: E402

from tmplkit.errors import TmplkitError  # noqa: E402
from tmplkit.masks import _mask, check_conversations, text_mask  # noqa: E402
from tmplkit.session import generate_session  # noqa: E402
from tmplkit.sources import load_one  # noqa: E402


def conversations() -> list:
    return check_conversations() + [generate_session(4000, seed=11, style="agent"), generate_session(2500, seed=5),
                                    generate_session(6000, seed=4, style="agent", requests=6)]


def compare(path: Path, convs: list) -> dict:
    """Per template: the conversations both paths mask, how many of them differ (with the first turns
    that do), and how long each path took."""
    template = load_one(str(path))
    fast_s = proving_s = 0.0
    compared, differ = 0, []
    fast_turns = _mask._fast_turns
    for i, conv in enumerate(convs):
        try:
            t0 = time.perf_counter()
            fast = text_mask(template, conv)
            t1 = time.perf_counter()
            _mask._fast_turns = lambda *a: None  # each request proved
            try:
                proved = text_mask(template, conv)
            finally:
                _mask._fast_turns = fast_turns
            t2 = time.perf_counter()
        except TmplkitError:  # a conversation the template refuses, or no mask (unproven boundaries)
            continue
        compared += 1
        fast_s, proving_s = fast_s + t1 - t0, proving_s + t2 - t1
        if fast.turns != proved.turns or fast.text != proved.text:
            differ.append({"conversation": i, "fast": [t.to_dict() for t in fast.turns if t not in proved.turns][:2],
                           "proved": [t.to_dict() for t in proved.turns if t not in fast.turns][:2]})
    return {"template": path.stem, "compared": compared, "differ": differ, "fast_s": round(fast_s, 4),
            "proving_s": round(proving_s, 4)}


def main() -> int:
    convs = conversations()
    args, rows = compared_over_corpus(__doc__, compare, convs)
    differ = [r for r in rows if r["differ"]]
    out = {"cpu": cpu_model(), "corpus": "hub (development half)" if args.hub else "llama.cpp", "templates": len(rows),
           "conversations": len(convs), "compared": sum(r["compared"] for r in rows),
           "differing": sum(len(r["differ"]) for r in rows), "fast_s": round(sum(r["fast_s"] for r in rows), 2),
           "proving_s": round(sum(r["proving_s"] for r in rows), 2), "templates_differing": differ, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"{out['templates']} templates, {out['compared']} conversations masked both ways: {out['differing']} differ; "
          f"fast paths {out['fast_s']} s, proving {out['proving_s']} s")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
