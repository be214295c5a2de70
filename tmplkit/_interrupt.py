"""Ctrl-C while the `tmplkit` command is still starting: one line and exit 130, as later.

Importing tmplkit takes a moment (numpy, jinja2, the analysis); a Ctrl-C then would end Python with
a KeyboardInterrupt traceback and the signal's own status, before `cli.main` could catch it. When
this process is the command (`tmplkit ...` or `python -m tmplkit ...`), a handler is installed
first thing, and `cli.main` puts Python's own back once it is in charge (and this one again once
its work is done, for the interpreter's shutdown). A library import changes nothing.

The handler is installed when this module is imported: the package root's first line, before any
other import, so the window left is the interpreter's own start-up (its `site` and `runpy`). This
module imports nothing that start-up has not loaded already: `_signal` (built in, loaded before
`site`), `sys`, and `os` (which `site` imports).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (built in: no stub)
import os
import sys

__all__ = ["install_early_handler", "restore_default"]

EXIT_INTERRUPTED = 130


def _is_command() -> bool:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0 in ("tmplkit", "tmplkit.exe"):
        return True
    orig = list(getattr(sys, "orig_argv", ()))
    return "-m" in orig and orig[orig.index("-m") + 1:][:1] in (["tmplkit"], ["tmplkit.cli"])


def _interrupted(signum, frame) -> None:
    try:
        os.write(2, b"tmplkit: interrupted\n")
    finally:
        os._exit(EXIT_INTERRUPTED)


def install_early_handler() -> None:
    """Exit 130 with one line on Ctrl-C from now on, when this process is the tmplkit command."""
    if _is_command() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        try:
            _signal.signal(_signal.SIGINT, _interrupted)
        except ValueError:  # not the main thread
            pass


def restore_default() -> None:
    """Python's own Ctrl-C (KeyboardInterrupt) again, where `install_early_handler` replaced it."""
    if _signal.getsignal(_signal.SIGINT) is _interrupted:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)


install_early_handler()
