"""Behaviour records of many templates, each derived in a sandboxed worker (as the audit does)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..auditing import default_turns_session
from ..auditing.isolate import analyze_isolated
from ..errors import InputError
from ._record import BehaviourRecord, derive_behaviour, record_of

__all__ = ["DEFAULT_TIMEOUT", "derive_records", "require_derived"]

# Seconds per template: the analysis and a whole agent session are rendered.
DEFAULT_TIMEOUT = 30.0


def derive_records(templates: Sequence, *, jobs: int | None = None, timeout: float | None = DEFAULT_TIMEOUT,
                   memory_mb: int | None = 1024, session=None, in_process: bool = False,
                   progress: Callable | None = None) -> list[BehaviourRecord]:
    """The behaviour record of each template, in input order. Each is derived in a worker process
    with `timeout` seconds and `memory_mb` MiB (`in_process`: here, under the render limits only);
    `session` is the agent session of the prefix-stability check (default: the audit's)."""
    session = session if session is not None else default_turns_session()
    if in_process:
        target = functools.partial(derive_behaviour, session=session)
        results: list = [target(t) for t in templates]
    else:
        target = functools.partial(derive_behaviour, session=session, timeout=timeout)
        # (numpy, which the prefix-stability check uses, is imported before the memory limit)
        results = analyze_isolated(list(templates), jobs=jobs, timeout=timeout, memory_mb=memory_mb,
                                   target=target, progress=progress, imports=("numpy",))
    out = []
    for template, result in zip(templates, results):
        if isinstance(result, tuple):
            out.append(record_of(template, *result))
        else:  # (the worker gave an analysis of its own: it died, or the derivation raised)
            out.append(replace(record_of(template, result, None, {}), completed=False))
    return out


def require_derived(records: Sequence[BehaviourRecord], doing: str) -> None:
    """InputError (one line) naming the records whose behaviour was not derived (a run's limit
    stopped it, or its worker died: `BehaviourRecord.derived`), and why; `doing` says what is then
    not done ("nothing was compared"). A timeout compared with a timeout is no "same behaviour"."""
    lost = [r for r in records if not r.derived]
    if lost:
        first = lost[0]
        more = f" (and {len(lost) - 1} more: {', '.join(r.name for r in lost[1:4])}{', ...' if len(lost) > 4 else ''})" \
            if len(lost) > 1 else ""
        raise InputError(f"the behaviour of '{first.name}' ({first.source}) was not derived{more}: "
                         f"{first.reason or first.verdict}; {doing}")
