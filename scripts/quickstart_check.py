"""The Quick start's first command (`make audit`) timed on a fresh clone of HEAD, from nothing: no
virtual environment, an empty corpus cache and no pip cache, so every wheel and the pinned corpus
are downloaded. Fails (exit 1) when the command fails or takes longer than the limit.

    python scripts/quickstart_check.py [--limit 120] [--json quickstart.json] [--keep]

The time is split into the set-up (`make setup-core`: venv, Python-only install, corpus fetch) and
the audit itself (`make audit` once set up); the JSON has both, their sum, the audit's closing line
and the machine's CPU model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _timed(cmd: list[str], cwd: Path, env: dict, log) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - start, done.returncode


def _audit_summary(lines: list[str]) -> str | None:
    """The audit's summary in one line: how many templates, the analysis row's counts and the
    verdict (`--format summary`: `tmplkit audit: N templates`, `analysis and text round trip  N
    checked: ...`, `-> ok`); None where the log has no summary (the audit did not finish)."""
    head = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("tmplkit audit: ")), None)
    if head is None:
        return None
    row = next((ln.split("checked:", 1)[1].strip() for ln in lines if "analysis and text round trip" in ln and "checked:" in ln), "")
    verdict = next((ln.strip() for ln in reversed(lines) if ln.startswith("-> ")), "")
    return " ".join(part for part in (f"{head}:", row, verdict) if part)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=120.0, help="seconds the whole command may take (default 120)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = ap.parse_args(argv)

    where = Path(tempfile.mkdtemp(prefix="tmplkit-quickstart-"))
    clone, cache = where / "tmplkit", where / "cache"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env |= {"TMPLKIT_CACHE": str(cache), "PIP_NO_CACHE_DIR": "1"}
    log_path = where / "quickstart.log"
    with log_path.open("w") as log:
        setup_s, rc = _timed(["make", "setup-core"], clone, env, log)
        audit_s, rc2 = _timed(["make", "audit"], clone, env, log) if rc == 0 else (0.0, rc)
    closing = _audit_summary(log_path.read_text(errors="replace").splitlines())
    total = setup_s + audit_s
    result = {
        "command": "make audit", "commit": commit, "cpu": cpu_model(), "cores": os.cpu_count(),
        "setup_s": round(setup_s, 1), "audit_s": round(audit_s, 1), "total_s": round(total, 1),
        "limit_s": args.limit, "rc": rc2, "audit_summary": closing,
        "passed": rc2 == 0 and total <= args.limit,
    }
    text = json.dumps(result, indent=2) + "\n"
    sys.stdout.write(text)
    if args.json:
        args.json.write_text(text)
    if not result["passed"]:
        print(f"quickstart-check: {'failed (exit ' + str(rc2) + ')' if rc2 else f'took {total:.0f} s, over {args.limit:g} s'}; "
              f"log: {log_path}", file=sys.stderr)
    if args.keep or not result["passed"]:
        print(f"clone kept at {where}", file=sys.stderr)
    else:
        shutil.rmtree(where, ignore_errors=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
