"""A time limit and a progress callback for studying one session.

A 100k-message session takes minutes; a user at a terminal wants to see it move, and a CI job
wants it to stop at a limit with what was found so far rather than be killed with nothing. The
requests are rendered one at a time (`iter_requests`), so the study can stop between two of them:
the requests rendered by then are studied as a shorter session, and the report says where it
stopped.

    >>> budget = Budget(timeout=30, progress=lambda stage, done, total: None)
    >>> budget.expired()
    False
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InputError

__all__ = ["Budget"]


@dataclass
class Budget:
    """`timeout`: seconds from the budget's making (None: no limit); `progress(stage, done, total)`
    is called as the study moves (stage "requests" while rendering them); `stopped` says where the
    limit was hit ("" while it was not)."""

    timeout: float | None = None
    progress: Callable[[str, int, int], None] | None = None
    started: float = field(default_factory=time.monotonic)
    stopped: str = ""
    # The part of `timeout` the requests may take: what is studied of them afterwards (tokens,
    # spans, the next renders predicted from) must fit in the rest, or the worker is stopped with
    # nothing to show.
    share: float = 1.0

    def __post_init__(self) -> None:
        t = self.timeout
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
            raise InputError(f"timeout must be a positive finite number of seconds or None, got {t!r}")
        if not 0 < self.share <= 1:
            raise InputError(f"share must be in (0, 1], got {self.share!r}")

    def expired(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.started >= self.timeout * self.share

    def tick(self, stage: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

    def take(self, items, total: int, stage: str = "requests") -> tuple:
        """`items` (an iterator) until it ends or the time is up; `stopped` set where it was cut."""
        out = []
        for item in items:
            out.append(item)
            self.tick(stage, len(out), total)
            if len(out) < total and self.expired():
                part = f"; {self.share:.0%} of it for the {stage}, the rest to study them" if self.share < 1 else ""
                self.stopped = (f"stopped at the time limit ({self.timeout:g} s{part}) after {len(out)} of {total} {stage}; "
                                "the verdict covers those")
                break
        return tuple(out)
