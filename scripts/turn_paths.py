#!/usr/bin/env python
"""The turns study's short paths against the whole renders, over whole corpora: every template and
three generated sessions, each session's requests read with each generated turn asked for alone
and each follow-up spliced after the request's history (`session._turn_alone`,
`requests.spliced_follow_ups`, as the study reads them) and from whole renders, compared request
for request.

    python scripts/turn_paths.py --json scripts/results/turn-paths.json             # the llama.cpp corpus
    python scripts/turn_paths.py --hub --json scripts/results/turn-paths-hub.json   # the Hub corpus's development half

Per template: the sessions read both ways, those that differ (must be none), how many the short
path for the generated turns served, and the sessions that would differ were the short paths taken
wherever their renders apply, without the probes, the session's last request and the copies guard
(what those keep out; the next request's check stays on). tests/test_turn_alone.py holds the same on a few.
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
from tmplkit.session import for_server, generate_session, requests  # noqa: E402
from tmplkit.session.requests import iter_requests  # noqa: E402
from tmplkit.sources import load_one  # noqa: E402


def sessions() -> list:
    # (long enough for the short path: requests after 64 messages and more)
    return [generate_session(60000, seed=11, style="agent"), generate_session(24000, seed=5),
            generate_session(30000, seed=2, style="user-turns")]


class _Served:
    """How many generated turns the short path gave (`requests._turn_asked_alone` counted)."""

    def __init__(self):
        self.count = 0
        self._turn_alone = requests._turn_asked_alone

    def __call__(self, *args):
        found = self._turn_alone(*args)
        self.count += found is not None
        return found


def _read(server, template, alone):
    """Each request as (text, generation prompt, generated turn, rule, its follow-ups' renders)."""
    reqs = tuple(iter_requests(server, template, alone=alone))
    follow = requests.next_renders(server, template, reqs, alone=alone)
    return [(r.text, r.generation_prompt, r.generated, r.rule, f) for r, f in zip(reqs, follow)]


def compare(path: Path, convs: list) -> dict:
    template = load_one(str(path))
    compared, differ, unchecked, served = 0, [], [], 0
    short_s = whole_s = 0.0
    for i, conv in enumerate(convs):
        try:
            server = for_server(template, conv)
            t0 = time.perf_counter()
            whole = _read(server, template, False)
            t1 = time.perf_counter()
            requests._turn_asked_alone = counted = _Served()
            try:
                short = _read(server, template, None)
            finally:
                requests._turn_asked_alone = counted._turn_alone
            t2 = time.perf_counter()
            forced = _read(server, template, True)
        except TmplkitError:  # a session the template refuses
            continue
        compared += 1
        whole_s, short_s = whole_s + t1 - t0, short_s + t2 - t1
        served += counted.count > 0
        first = next((k for k, (a, b) in enumerate(zip(whole, short)) if a != b), None)
        if first is not None:
            part = next(j for j in range(5) if whole[first][j] != short[first][j])
            differ.append({"session": i, "request": first, "part": ("text", "generation prompt", "generated", "rule", "follow-ups")[part],
                           "whole": str(whole[first][part])[:200], "short": str(short[first][part])[:200]})
        if forced != whole:
            unchecked.append(i)
    return {"template": path.stem, "compared": compared, "differ": differ, "unchecked_differ": unchecked,
            "served": served, "whole_s": round(whole_s, 4), "short_s": round(short_s, 4)}


def main() -> int:
    convs = sessions()
    args, rows = compared_over_corpus(__doc__, compare, convs)
    differ = [r for r in rows if r["differ"]]
    out = {"cpu": cpu_model(), "corpus": "hub (development half)" if args.hub else "llama.cpp", "templates": len(rows),
           "sessions": len(convs), "compared": sum(r["compared"] for r in rows),
           "differing": sum(len(r["differ"]) for r in rows),
           "served": sum(r["served"] for r in rows),
           "unchecked_differing": sum(len(r["unchecked_differ"]) for r in rows),
           "whole_s": round(sum(r["whole_s"] for r in rows), 2), "short_s": round(sum(r["short_s"] for r in rows), 2),
           "templates_differing": differ, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"{out['templates']} templates, {out['compared']} sessions read both ways: {out['differing']} differ "
          f"({out['served']} served by the short path; {out['unchecked_differing']} would differ unchecked); "
          f"short path {out['short_s']} s, whole renders {out['whole_s']} s")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
