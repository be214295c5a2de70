"""The one progress line the commands write on stderr, and the terminal rules it keeps.

Shown only on a terminal (a pipe or a CI log gets none: `wanted`) and not under --quiet. Rewritten
in place (`\\r` and erase-line), at most `interval` seconds apart; where the terminal cannot move the
cursor (TERM=dumb) each step is a line of its own (`steps=True`, the audit's few templates) or
nothing is drawn (a bar over thousands of requests or tokens). `close()` ends it: the last step's
line kept (`keep=True`, the audit's `[n/n] name`) or the line erased.
"""

from __future__ import annotations

import sys
import time

from ..environment import terminal_is_dumb

__all__ = ["ProgressLine", "progress_text", "wanted"]

_ERASE = "\r\x1b[2K"


def progress_text(done: int, total: int, name: str, *, rewrite: bool) -> str:
    """'[done/total] name', with the escapes that clear the line before it when `rewrite`."""
    return (_ERASE if rewrite else "") + f"[{done}/{total}] {name[:60]}"


def wanted(quiet: bool = False) -> bool:
    """Whether a progress line is drawn at all: stderr is a terminal and the command is not quiet."""
    return not quiet and sys.stderr.isatty()


class ProgressLine:
    """A progress line on `stream` (stderr); `enabled`: drawn at all (`wanted()`). `interval`: the
    least seconds between two redraws; `steps`: on a dumb terminal a line per step (else nothing)."""

    def __init__(self, enabled: bool = True, stream=None, *, interval: float = 0.0, keep: bool = False,
                 steps: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.rewrite = not terminal_is_dumb()
        self.on = bool(enabled) and (self.rewrite or steps)
        self.interval = interval
        self.keep = keep
        self._last = 0.0
        self._shown = False

    def show(self, text: str, *, final: bool = False) -> None:
        """Draw `text` (the whole line); `final`: the last step, always drawn."""
        if not self.on:
            return
        now = time.monotonic()
        if not final and self.interval and now - self._last < self.interval:
            return
        self._last = now
        if self.rewrite:
            self.stream.write(_ERASE + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    def step(self, done: int, total: int, name: str) -> None:
        """The '[done/total] name' form of the line (the audit's, the server probe's)."""
        self.show(progress_text(done, total, name, rewrite=False), final=done == total)

    def close(self) -> None:
        """End the line: keep the last step on its own line, or erase it."""
        if self.on and self._shown and self.rewrite:
            self.stream.write("\n" if self.keep else _ERASE)
            self.stream.flush()
        self._shown = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
