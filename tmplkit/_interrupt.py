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

SIGTERM (`timeout`, a service manager, `kill`) ends Python at once, skipping every `finally` and
`with`: every command runs its work inside `unwind_on_sigterm()` (`cli.main`), where SIGTERM raises
`Terminated` instead (a KeyboardInterrupt), so that its temporary folders and child processes are
removed and stopped on the way out; then, as for Ctrl-C, one line and exit 130.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # (built in: no stub)
import _thread
import os
import sys

__all__ = ["Terminated", "die_with_parent", "forget_unhandled_interrupt", "hold_interrupts", "hold_sigterm",
           "install_early_handler", "raise_lost_interrupts", "restore_default", "unwind_on_sigterm"]

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


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived inside `unwind_on_sigterm()`: handled as a Ctrl-C is (no `except Exception`
    keeps the work going; `cli.main` says `tmplkit: interrupted` and exits 130)."""


_sigterm = {"on": 0, "held": 0, "pending": False, "raised": False}


def _terminated(signum, frame) -> None:
    if _sigterm["raised"]:  # a second SIGTERM while the first unwinds: the clean-up goes on
        return
    if _sigterm["held"]:
        _sigterm["pending"] = True
        return
    _sigterm["raised"] = True
    raise Terminated


class unwind_on_sigterm:
    """Inside the block, SIGTERM raises `Terminated` in the main thread, once (a second one while the
    first unwinds is ignored), so that the `finally` and `with` clauses on its way out run (temporary
    folders removed, child processes stopped). Where this is not the main thread, or SIGTERM's
    handler is not the default (someone chose one), nothing changes."""

    def __enter__(self) -> unwind_on_sigterm:
        self._old = None
        try:
            if _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL:
                _sigterm.update(on=1, held=0, pending=False, raised=False)
                self._old = _signal.signal(_signal.SIGTERM, _terminated)
        except ValueError:  # not the main thread
            pass
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self._old is not None:
            _signal.signal(_signal.SIGTERM, self._old)
            _sigterm["on"] = 0


class hold_sigterm:
    """Inside the block, a SIGTERM for `unwind_on_sigterm` waits until the block ends (a child process
    being started: `Terminated` raised inside `subprocess.Popen` would leave it running, unknown)."""

    def __enter__(self) -> hold_sigterm:
        _sigterm["held"] += 1
        return self

    def __exit__(self, kind, exc, tb) -> None:
        _sigterm["held"] -= 1
        if not _sigterm["held"] and _sigterm["pending"] and _sigterm["on"] and not _sigterm["raised"]:
            _sigterm["pending"] = False
            _sigterm["raised"] = True
            raise Terminated


class hold_interrupts:
    """Inside the block Ctrl-C (SIGINT) and SIGTERM are noted, and each one's own handler runs when the
    block ends: several files renamed into place, which must all be or none. SIGTERM's default ends
    the process then (after the block, not in it); `unwind_on_sigterm`'s raises `Terminated`. Where
    this is not the main thread, or a handler was not set from Python, that signal is not held."""

    _SIGNALS = (_signal.SIGTERM, _signal.SIGINT)  # (a pending SIGTERM first: the process ends, as asked)

    def __enter__(self) -> hold_interrupts:
        self._old: dict = {}
        self._pending: set = set()
        for signum in self._SIGNALS:
            try:
                old = _signal.getsignal(signum)
                if old is not None and old != _signal.SIG_IGN:
                    self._old[signum] = _signal.signal(signum, self._note)
            except ValueError:  # not the main thread
                break
        return self

    def _note(self, signum, frame) -> None:
        self._pending.add(signum)

    def __exit__(self, kind, exc, tb) -> None:
        for signum, old in self._old.items():
            _signal.signal(signum, old)
        for signum in self._SIGNALS:
            old = self._old.get(signum)
            if signum not in self._pending:
                continue
            if callable(old):
                old(signum, None)  # (Python's own SIGINT handler raises KeyboardInterrupt here)
            elif old == _signal.SIG_DFL:
                os.kill(os.getpid(), signum)


class raise_lost_interrupts:
    """Inside the block, a Ctrl-C (or `Terminated`) that lands in a callback Python calls from its
    own machinery, where an exception cannot be raised (importlib's module-lock weakref callback,
    while a command imports its layers), is raised again in the main thread. Python would print it
    as "Exception ignored in ... Traceback ... KeyboardInterrupt" and go on as if no key was pressed."""

    def __enter__(self) -> raise_lost_interrupts:
        self._old = sys.unraisablehook
        sys.unraisablehook = self._hook
        return self

    def _hook(self, unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            self._old(unraisable)
            return
        signum = _signal.SIGINT
        if issubclass(unraisable.exc_type, Terminated):
            _sigterm["raised"] = False  # (`_terminated` ignores a SIGTERM once it has raised)
            signum = _signal.SIGTERM
        try:
            # From another thread: the signal's handler runs in the main thread at its next step,
            # which would be this hook's own if it were signalled from here (and lost again).
            _thread.start_new_thread(_thread.interrupt_main, (signum,))
        except KeyboardInterrupt:  # (another Ctrl-C meanwhile: the one to be raised is already on its way)
            pass
        except RuntimeError:  # (no new thread while Python shuts down: the process is ending anyway)
            pass

    def __exit__(self, kind, exc, tb) -> None:
        sys.unraisablehook = self._old


def forget_unhandled_interrupt() -> None:
    """Clear CPython's note that a Ctrl-C went unhandled, once the command has handled it. CPython
    notes it where code run through its C API (`PyRun_String` and the like) is interrupted, and
    the note stays when the exception is then caught: at its exit the process killed itself with
    SIGINT (status -2, after the command's one line) instead of exiting 130. Best effort: the
    note is a C global of CPython 3.11 (elsewhere, nothing is done)."""
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, ValueError, AttributeError, OSError):
        pass


def die_with_parent() -> None:
    """Have this process (a child of tmplkit's own) killed when its parent ends, even in the middle
    of a long call: Linux's parent-death signal, asked through the C library; elsewhere nothing
    (best effort: the caller also checks that its parent is still there)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(_signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - best effort
        pass


install_early_handler()
