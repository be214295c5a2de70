"""Imported by the workers' forkserver (`workers._PRELOAD`): a worker the forkserver forks while the
command is interrupted finds the command gone before it has read its start-up data, and
multiprocessing's child then prints the EOFError's traceback through `sys.excepthook` (a Ctrl-C
early in `audit -j 2` printed one after "tmplkit: interrupted"). Nobody is left to read it: in the
forkserver (a `python -c` process that runs multiprocessing's forkserver) that error is dropped;
every other goes to Python's own hook. Imported anywhere else, it changes nothing."""

from __future__ import annotations

import sys

__all__: list[str] = []


def _quiet_when_parent_gone(kind, value, tb) -> None:
    if issubclass(kind, EOFError):
        return
    sys.__excepthook__(kind, value, tb)


if sys.argv == ["-c"] and "multiprocessing.forkserver" in sys.modules:
    sys.excepthook = _quiet_when_parent_gone
