"""What the benchmark scripts record about the machine they ran on (timings differ 2-3x between machines),
and how they hand their results over (printed, and as JSON where `--json FILE` asks)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


@contextlib.contextmanager
def revision_tree(root: Path, rev: str, where: Path):
    """A checkout of git revision `rev` of the repository at `root`, as a worktree at `where`,
    removed afterwards (the `--against REV` of the benchmarks); RuntimeError if git cannot check
    it out."""
    made = subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "-q", str(where), rev],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise RuntimeError(f"--against {rev}: git cannot check it out ({(made.stderr.strip().splitlines() or ['no reason given'])[-1]}); "
                           "give a commit of this repository")
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(where)], check=False)


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def emit_results(results: dict, path: str | None, *, indent: int = 2) -> None:
    """Print `results` as JSON, and write them to `path` too where one is given."""
    text = json.dumps(results, indent=indent)
    print(text)
    if path:
        Path(path).write_text(text + "\n", encoding="utf-8")
