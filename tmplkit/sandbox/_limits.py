"""The limits of a render, the clock it reads, and the state of the render in progress, which the
sandbox's hooks (`_jinja`) and the output loop (`_rendering`) check; and the hints that say how a
user raises a limit from where they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import datetime

from ..errors import InputError, RenderLimitError

__all__ = ["DEFAULT_LIMITS", "PINNED_NOW", "Limits", "hint", "hint_place", "hints_for", "system_clock"]

# The time `strftime_now` reports unless a clock is given.
PINNED_NOW = datetime(2025, 1, 1, 12, 0, 0)
system_clock: Callable[[], datetime] = datetime.now


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-render limits. `None` turns a limit off.

    `seconds`: wall-clock budget of one render (compiling included the first time).
    `max_output_chars`: cap on the rendered text, and on any single string or list the template
    builds on the way (so a template cannot blow up memory before its output is counted).
    """

    seconds: float | None = 2.0
    max_output_chars: int | None = 10_000_000

    def __post_init__(self):
        for name in ("seconds", "max_output_chars"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(f"Limits.{name} must be a number or None, got {value!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise InputError(f"Limits.seconds must be positive or None, got {self.seconds!r}")
        if self.max_output_chars is not None and not self.max_output_chars > 0:
            raise InputError(f"Limits.max_output_chars must be positive or None, got {self.max_output_chars!r}")

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "max_output_chars": self.max_output_chars}


DEFAULT_LIMITS = Limits()


# --- the state of the render in progress (read by the sandbox hooks) -------------------------------


class _State:
    __slots__ = ("deadline", "seconds", "max_chars", "clock", "name", "draws")

    def __init__(self, limits: Limits, clock: Callable[[], datetime] | None, name: str):
        self.seconds = limits.seconds
        self.deadline = None if limits.seconds is None else time.perf_counter() + limits.seconds
        self.max_chars = limits.max_output_chars
        self.clock = clock
        self.name = name
        self.draws: random.Random | None = None  # the render's random draws, made at its first (_jinja._draws)


_STATE: ContextVar[_State | None] = ContextVar("tmplkit_render_state", default=None)


# --- hints: how a user raises a limit, in the terms of where they are -------------------------------

# A library caller raises a limit with `Limits(...)` or a function's argument, a command-line user
# with a flag; the CLI runs its commands inside `hints_for("cli")`, and tmplkit.auditing.isolate carries the place
# into its workers. The per-render limits have no flag: on the command line the hint says so.
_LIBRARY_HINTS = {
    "seconds": "raise Limits(seconds=...)",
    "max_output_chars": "raise Limits(max_output_chars=...)",
    "timeout": "raise the timeout argument (seconds per template)",
    "memory_mb": "raise the memory_mb argument (MiB per worker)",
}
_HINTS = {
    "library": _LIBRARY_HINTS,
    # A session's render from Python (tmplkit.session): its functions take no `limits`, a block sets them
    "session": {**_LIBRARY_HINTS,
                "seconds": "raise it around the call: `with tmplkit.session.session_limits(seconds=...)`",
                "max_output_chars": "raise it around the call: `with tmplkit.session.session_limits(max_output_chars=...)`"},
    # A session's render from the command line (tmplkit turns, spans, mask...): no option sets it
    "cli_session": {
        "seconds": "analyze it from Python inside `with tmplkit.session.session_limits(seconds=...)` (one render's "
                   "limit is not a command-line option)",
        "max_output_chars": "analyze it from Python inside `with tmplkit.session.session_limits(max_output_chars=...)` "
                            "(the output limit is not a command-line option)",
        "timeout": "raise --timeout",
        "memory_mb": "raise --memory",
    },
    "cli": {
        "seconds": "analyze it from Python with a larger Limits(seconds=...) (one render's limit is not a command-line option)",
        "max_output_chars": "analyze it from Python with a larger Limits(max_output_chars=...) "
                            "(the output limit is not a command-line option)",
        "timeout": "raise --timeout",
        "memory_mb": "raise --memory",
    },
}
_HINT_PLACE: ContextVar[str] = ContextVar("tmplkit_hint_place", default="library")


def hint(limit: str) -> str:
    """How to raise `limit` ('seconds', 'max_output_chars', 'timeout' or 'memory_mb') from where the user is.

    >>> with hints_for("cli"):
    ...     hint("timeout")
    'raise --timeout'
    >>> hint("seconds")
    'raise Limits(seconds=...)'
    """
    return _HINTS[_HINT_PLACE.get()][limit]


def hint_place() -> str:
    """Where limit hints are worded for now: 'library' (the default), 'session' (a session's render from
    Python), 'cli' or 'cli_session' (a session's render from the command line)."""
    return _HINT_PLACE.get()


@contextlib.contextmanager
def hints_for(place: str) -> Iterator[None]:
    """Word limit hints for `place` ('library', 'session', 'cli' or 'cli_session') inside the `with` block."""
    if place not in _HINTS:
        raise ValueError(f"hint place must be one of {', '.join(_HINTS)}, not {place!r}")
    token = _HINT_PLACE.set(place)
    try:
        yield
    finally:
        _HINT_PLACE.reset(token)


def _timeout(state: _State):
    raise RenderLimitError(
        f"rendering template '{state.name}' took longer than {state.seconds:g} s; the template may loop "
        f"without end. If it is legitimately slow, {hint('seconds')}",
        kind="timeout",
    )


def _too_big(state: _State, size: int, what: str):
    raise RenderLimitError(
        f"template '{state.name}' {what} of {size} characters, over the limit of {state.max_chars}; "
        f"if the conversation is legitimately that long, {hint('max_output_chars')}",
        kind="size",
    )


def _check_time():
    state = _STATE.get()
    if state is not None and state.deadline is not None and time.perf_counter() > state.deadline:
        _timeout(state)


def _check_size(value, what: str = "built a value"):
    if isinstance(value, (str, list, tuple)):
        state = _STATE.get()
        if state is not None and state.max_chars is not None and len(value) > state.max_chars:
            _too_big(state, len(value), what)
    return value


def _check_planned(size: int, what: str):
    state = _STATE.get()
    if state is not None and state.max_chars is not None and size > state.max_chars:
        _too_big(state, size, what)


def _guard_iter(iterable):
    """Wraps the iterable of every `{% for %}`: the time budget is checked on each iteration."""
    state = _STATE.get()
    if state is None or state.deadline is None:
        yield from iterable
        return
    deadline = state.deadline
    clock = time.perf_counter
    for item in iterable:
        if clock() > deadline:
            _timeout(state)
        yield item
