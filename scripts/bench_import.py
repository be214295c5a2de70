#!/usr/bin/env python
"""What `import tmplkit` and `tmplkit --version` cost: this tree against a git revision, alternately.

    python scripts/bench_import.py --against 9b0fe4f --rounds 15 --json scripts/results/import-time.json

Each round starts fresh Python processes for both trees, in alternating order: `python -X importtime
-c "import tmplkit"` (the cumulative microseconds Python reports for the package, and how many
tmplkit modules and whether numpy and jinja2 were loaded) and `python -m tmplkit --version` (wall
seconds of the whole process). Medians per tree and the paired ratios this/REV with their spread;
the CPU model and the load average are recorded (a loaded machine moves absolute times, the ratios
much less).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model, emit_results, loadavg, revision_tree  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
_PROBE = ("import sys, tmplkit; print(len([m for m in sys.modules if m.startswith('tmplkit')]), "
          "'numpy' in sys.modules, 'jinja2' in sys.modules)")


def import_time(tree: Path) -> dict:
    """One fresh process importing tmplkit from `tree`: cumulative µs, tmplkit modules, numpy, jinja2."""
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", _PROBE], capture_output=True, text=True,
                         env=env, cwd=tree, check=True)
    line = next(x for x in reversed(run.stderr.splitlines()) if re.search(r"\|\s*tmplkit$", x))
    n, numpy, jinja2 = run.stdout.split()
    return {"us": int(line.split("|")[1]), "modules": int(n), "numpy": numpy == "True", "jinja2": jinja2 == "True"}


def version_time(tree: Path) -> float:
    """Wall seconds of `python -m tmplkit --version` from `tree`."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tmplkit", "--version"], capture_output=True, check=True,
                   env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd=tree)
    return time.perf_counter() - t0


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def measure(trees: dict[str, Path], rounds: int) -> dict:
    seen: dict = {name: {"import_us": [], "version_s": [], "modules": None, "numpy": None, "jinja2": None} for name in trees}
    names = list(trees)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:  # who goes first alternates
            got = import_time(trees[name])
            seen[name]["import_us"].append(got["us"])
            seen[name].update(modules=got["modules"], numpy=got["numpy"], jinja2=got["jinja2"])
            seen[name]["version_s"].append(version_time(trees[name]))
    this, rev = names
    out: dict = {}
    for name in names:
        s = seen[name]
        out[name] = {"import_ms": _spread([u / 1000 for u in s["import_us"]]), "version_s": _spread(s["version_s"]),
                     "tmplkit_modules": s["modules"], "numpy": s["numpy"], "jinja2": s["jinja2"]}
    out["ratio_import"] = _spread([a / b for a, b in zip(seen[this]["import_us"], seen[rev]["import_us"])])
    out["ratio_version"] = _spread([a / b for a, b in zip(seen[this]["version_s"], seen[rev]["version_s"])])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", metavar="REV", required=True, help="the git revision to compare with")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, revision_tree(ROOT, args.against, Path(tmp) / "rev") as rev:
        result = {"against": args.against, "rounds": args.rounds, "cpu": cpu_model(), "loadavg_before": loadavg(),
                  **measure({"this": ROOT, args.against: rev}, args.rounds), "loadavg_after": loadavg()}
    emit_results(result, args.json, indent=1)


if __name__ == "__main__":
    main()
