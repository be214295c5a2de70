"""Analysis in worker processes, with a wall-clock and a memory limit per template.

A chat template is code from whoever published the model. The Jinja sandbox stops it from
reaching Python internals, and the sandbox's `Limits` stop most loops and output bombs from inside
the render, but one process cannot stop everything from inside, so an audit analyzes each
template in a worker process of its own (`tmplkit.auditing.workers`: the limits, the kills, the pool).
This module puts the analysis on that pool:

- in the worker, the static scan runs first and its warnings come back at once (a template whose
  worker is then lost keeps them); then the target runs, and whatever it raises becomes an
  `Analysis` with status from the exception and a one-line reason;
- whatever happens to the worker (a hang, a MemoryError, a segfault, `os._exit`) becomes an
  `Analysis` with status `timeout`, `memory`, `unsafe` or `error` and a one-line reason, and the
  run goes on; a worker whose template exhausted its memory is replaced;
- every reported string is bounded (a hostile template can raise an exception with a 10 MB message).

A worker analyzes up to `max_tasks_per_worker` templates; the sandbox keeps templates from changing
anything shared (tests/test_hostile.py checks), and `max_tasks_per_worker=1` gives every template a
fresh process. Results come back in the input order whatever `jobs` is.

A script that calls this needs the usual multiprocessing guard, `if __name__ == "__main__":`.

>>> from tmplkit.sources import ChatTemplate
>>> [a.status for a in analyze_isolated([ChatTemplate("{{ x.__class__ }}", "t", "-")], target=scan_only)]
['pass']
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence

from ..analysis import Analysis, analyze, failed_analysis, failure_reason, one_line, status_of
from ..sandbox import hint, hint_place, hints_for
from ..sandbox.compile_cache import cached_by_text
from ..sandbox.static_scan import scan
from ..sources.templates import require_template
from .workers import EXIT_MEMORY, Lost, check_options, run_in_workers

__all__ = [
    "DEFAULT_MAX_TASKS", "DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT", "add_scan_warnings", "analysis_from_exception",
    "analysis_of", "analyze_isolated", "scan_only",
]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_MAX_TASKS = 32

Progress = Callable[[int, int, Analysis], None]


# --- mapping failures to Analysis -----------------------------------------------------------------


def analysis_from_exception(template, exc: BaseException, seconds: float = 0.0) -> Analysis:
    """The Analysis for an analysis that raised `exc`: status from the exception, a one-line reason."""
    return _failed(template, status_of(exc), failure_reason(template, exc), seconds)


def _failed(template, status: str, reason: str, seconds: float, warnings=()) -> Analysis:
    return failed_analysis(template, status, (one_line(reason),), seconds=seconds, warnings=warnings)


def _finish(analysis: Analysis, scan_warnings) -> Analysis:
    """Add the scan warnings (once) and bound every reported string."""
    warnings = list(analysis.warnings)
    for w in scan_warnings:
        if w not in warnings:
            warnings.append(w)
    return dataclasses.replace(
        analysis,
        errors=tuple(one_line(e) for e in analysis.errors),
        warnings=tuple(one_line(w) for w in warnings),
    )


def add_scan_warnings(analysis: Analysis, template_text: str) -> Analysis:
    """`analysis` with the static scan's warnings for `template_text` added (for in-process analysis;
    analyze_isolated adds them itself).

    >>> a = Analysis(name="t", source="-", status="pass")
    >>> add_scan_warnings(a, "{{ x.__class__ }}").warnings
    ("line 1: reads '__class__', a Python internal (a known sandbox escape route)",)
    """
    return _finish(analysis, cached_by_text(scan, template_text))


def scan_only(template) -> Analysis:
    """A target that renders nothing: status 'pass', warnings from the static scan only."""
    return Analysis(name=template.name, source=template.source, status="pass")


def _default_target(template) -> Analysis:
    return analyze(template)


def analysis_of(result) -> Analysis:
    """The Analysis of a target's result: the result itself, or the first of the pair a target may
    return with what else it found (see `analyze_isolated`)."""
    return result[0] if isinstance(result, tuple) else result


# --- in the worker --------------------------------------------------------------------------------


def _scan_warnings(template) -> list[str]:
    """The prelude: the static scan's warnings, kept between runs like the compiled template."""
    try:
        return cached_by_text(scan, template.text)
    except Exception as exc:  # the scan parses only; still, never let it stop the analysis
        return [f"scan failed: {type(exc).__name__}"]


def _analyze(template, warnings, target):
    """The work: `target(template)` with its failures made verdicts and the scan warnings added."""
    start = time.perf_counter()
    try:
        result = target(template)
        if not isinstance(analysis_of(result), Analysis):
            raise TypeError(f"the analysis returned {type(result).__name__}, not an Analysis")
    except BaseException as exc:  # noqa: BLE001 - everything becomes a verdict
        # (a MemoryError while making the verdict ends the worker: it reports the exit)
        return _finish(analysis_from_exception(template, exc, time.perf_counter() - start), warnings)
    finished = _finish(analysis_of(result), warnings)
    return (finished, *result[1:]) if isinstance(result, tuple) else finished


# --- in this process ------------------------------------------------------------------------------


def _describe_exit(code: int | None) -> tuple[str, str]:
    if code == EXIT_MEMORY:
        return "memory", ("ran out of memory (the worker could not even report it); if the template legitimately "
                          f"needs more, {hint('memory_mb')}")
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGKILL:
            return "memory", f"the worker was killed by {name}, most likely by the system for using too much memory"
        return "error", f"the worker crashed ({name})"
    return "error", f"the worker exited with code {code} without a result"


def _lost(template, lost: Lost) -> Analysis:
    """The verdict for a template whose worker gave no result (`workers.Lost`)."""
    warnings = list(lost.note or ())
    if lost.kind == "timeout":
        return _failed(template, "timeout",
                       f"template '{template.name}': the analysis took longer than {lost.limit:g} s; the worker was "
                       f"stopped. If the template is legitimately slow, {hint('timeout')}", lost.seconds, warnings)
    if lost.kind == "exit":
        status, reason = _describe_exit(lost.exitcode)
        return _failed(template, status, f"template '{template.name}': {reason}", lost.seconds, warnings)
    if lost.kind == "start":
        return _failed(template, "error", f"could not start a worker process ({lost.error}); a script that calls "
                       "tmplkit's isolated analysis needs the `if __name__ == '__main__':` guard", 0.0)
    if lost.kind == "unread":
        return _failed(template, "error", f"the worker's result could not be read: {lost.error}", lost.seconds, warnings)
    what = "could not be sent back" if lost.kind == "unsent" else "failed in its worker"
    return _failed(template, "error", f"the analysis result {what}: {lost.error}", lost.seconds, warnings)


def _exhausted(result) -> bool:
    """A worker whose template ran out of memory is replaced."""
    return analysis_of(result).status == "memory"


def analyze_isolated(
    templates: Iterable,
    jobs: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    progress: Progress | None = None,
    *,
    target: Callable | None = None,
    max_tasks_per_worker: int = DEFAULT_MAX_TASKS,
    imports: Sequence[str] = (),
) -> list:
    """Analyze each ChatTemplate in a worker process; results in the input order.

    `jobs`: workers at once (default: os.cpu_count()). `timeout`: wall-clock seconds per template
    (None: no limit). `memory_mb`: MiB a worker may allocate beyond its start-up footprint (None:
    no limit). `progress(done, total, analysis)` is called in this process as each one ends.
    `target(template) -> Analysis` replaces `tmplkit.analyze`; it must be importable by name (a
    module-level function, or a `functools.partial` of one). A target may also return a tuple
    whose first item is the Analysis and the rest what else it found in the same worker (the
    audit's prefix-stability check): the results are then such tuples, except for a template whose
    target raised or whose worker was lost, which gets its failed Analysis alone. A worker analyzes
    up to `max_tasks_per_worker` templates (1: a fresh process for every template) and is
    replaced at once after a crash, a kill, or a template that ran out of memory. `imports`:
    libraries a target needs, imported before the memory limit (`workers.run_in_workers`).

        >>> from tmplkit import load                                         # doctest: +SKIP
        >>> for a in analyze_isolated(load("corpus:llama.cpp"), jobs=2):   # doctest: +SKIP
        ...     print(a.name, a.status)
    """
    templates = [require_template(t) for t in templates]  # (here: a worker would report it as the template's error)
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    target = target or _default_target
    work = functools.partial(_analyze, target=target)
    check_options(jobs, timeout, memory_mb, max_tasks_per_worker, work)
    report = (lambda done, total, result: progress(done, total, analysis_of(result))) if progress is not None else None
    # the workers word limit messages as this process does (`sandbox.hints_for`)
    return run_in_workers(templates, work, lost=_lost, prelude=_scan_warnings, retire=_exhausted,
                          setup=functools.partial(hints_for, hint_place()), jobs=jobs, timeout=timeout,
                          memory_mb=memory_mb, max_tasks=max_tasks_per_worker, progress=report, imports=imports)
