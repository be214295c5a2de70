#!/usr/bin/env python
"""Run a Python script or module with llama_cpp imported before anything else (numpy, tmplkit).

    python scripts/llama_first.py -m pytest -q -m model tests/test_tinymodel.py
    python scripts/llama_first.py scripts/bench_prefill.py --n-gpu-layers 99 ...

`scripts/gpu_check.sh` runs the tests and benchmarks this way where its load check found that the
runner loads a model offloaded only when llama_cpp was imported first (docs/prefill.md, GPU).
"""

from __future__ import annotations

import runpy
import sys

import llama_cpp  # noqa: F401  (first: its libraries load before numpy's and the rest)


def main() -> None:
    args = sys.argv[1:]
    if not args or (args[0] == "-m" and len(args) < 2):
        sys.exit("usage: llama_first.py SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
