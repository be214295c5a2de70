"""Analysis in worker processes, with a wall-clock and a memory limit per template.

A chat template is code from whoever published the model. The Jinja sandbox stops it from
reaching Python internals, and sandbox.py's `Limits` stop most loops and output bombs from inside
the render, but one process cannot stop everything from inside: a single C-level call that runs
for minutes or allocates gigabytes never comes back to a check. So an audit analyzes each template
in a process of its own:

- the worker gets `RLIMIT_AS` = its start-up footprint + `memory_mb` (an allocation past it raises
  MemoryError there, or kills the worker) and dies with the auditing process (PR_SET_PDEATHSIG);
- the parent kills it with SIGKILL when `timeout` seconds have passed;
- whatever happens to it (a hang, a MemoryError, a segfault, `os._exit`) becomes an `Analysis`
  with status `timeout`, `memory`, `unsafe` or `error` and a one-line reason, and the run goes on.

Workers are forked from a `forkserver` (spawned where that is not available) with tmplkit
already imported (about 10 ms each). A worker analyzes up to `max_tasks_per_worker` templates
and is replaced at once after a crash, a kill, or a template that exhausted its memory; the
sandbox keeps templates from changing anything shared (tests/test_hostile.py checks), and
`max_tasks_per_worker=1` gives every template a fresh process. Results come back in the input
order whatever `jobs` is.

A script that calls this needs the usual multiprocessing guard, `if __name__ == "__main__":`.

>>> from tmplkit.sources import ChatTemplate
>>> [a.status for a in analyze_isolated([ChatTemplate("{{ x.__class__ }}", "t", "-")], target=scan_only)]
['pass']
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from .analysis import Analysis, failed_analysis, failure_reason, status_of
from .compile_cache import cached_by_text
from .errors import InputError
from .sandbox import hint, hint_place, hints_for
from .sources import ChatTemplate
from .static_scan import scan

__all__ = [
    "DEFAULT_MAX_TASKS", "DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT", "add_scan_warnings", "analysis_from_exception",
    "analyze_isolated", "scan_only",
]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024

# Reported strings are bounded: a hostile template can raise an exception with a 10 MB message.
_MAX_MESSAGE = 2000
_EXIT_MEMORY = 75  # the worker ran out of memory so completely it could not even report it
_KILL_GRACE = 5.0
_STARTUP_GRACE = 30.0
DEFAULT_MAX_TASKS = 32
# The forkserver imports these once; every worker is forked from it with them loaded. `__main__`
# (multiprocessing's default) is kept so that a script's main module is imported once, in the
# server, and not again in every worker.
_PRELOAD = ["__main__", "tmplkit.analysis", "tmplkit.sandbox", "tmplkit.static_scan", "tmplkit.isolate", "jinja2.sandbox"]

Progress = Callable[[int, int, Analysis], None]


# --- mapping failures to Analysis -----------------------------------------------------------------


def _one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return text


def analysis_from_exception(template, exc: BaseException, seconds: float = 0.0) -> Analysis:
    """The Analysis for an analysis that raised `exc`: status from the exception, a one-line reason."""
    return _failed(template, status_of(exc), failure_reason(template, exc), seconds)


def _failed(template, status: str, reason: str, seconds: float, warnings=()) -> Analysis:
    return failed_analysis(template, status, (_one_line(reason),), seconds=seconds, warnings=warnings)


def _finish(analysis: Analysis, scan_warnings) -> Analysis:
    """Add the scan warnings (once) and bound every reported string."""
    warnings = list(analysis.warnings)
    for w in scan_warnings:
        if w not in warnings:
            warnings.append(w)
    return dataclasses.replace(
        analysis,
        errors=tuple(_one_line(e) for e in analysis.errors),
        warnings=tuple(_one_line(w) for w in warnings),
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
    from .analysis import analyze

    return analyze(template)


# --- the worker -----------------------------------------------------------------------------------


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - best effort
        pass


def _release_forkserver() -> None:
    """Close this worker's copy of the forkserver's 'alive' pipe.

    The forkserver hands every child the write end of that pipe and lives while any copy is
    open; a worker busy with a hanging template would then keep the forkserver alive after the
    audit dies, and the forkserver would keep the worker alive (the worker's parent-death signal
    is tied to the forkserver). Without our copy, the forkserver exits with the audit, and the
    parent-death signal then stops the worker.
    """
    try:
        from multiprocessing import forkserver

        fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
        if fd is not None:
            os.close(fd)
            forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    except (ImportError, AttributeError, OSError):  # pragma: no cover - spawn context, other Pythons
        pass


def _address_space() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _limit_memory(memory_mb: int | None) -> None:
    if not memory_mb:
        return
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    base = _address_space() or 0
    limit = base + int(memory_mb) * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _analyze_in_worker(conn, index: int, template, target) -> None:
    try:
        warnings = cached_by_text(scan, template.text)  # kept between runs, like the compiled template
    except Exception as exc:  # the scan parses only; still, never let it stop the analysis
        warnings = [f"scan failed: {type(exc).__name__}"]
    conn.send(("scan", index, warnings))
    start = time.perf_counter()
    analysis: Analysis | None = None
    failure: BaseException | None = None
    try:
        analysis = target(template)
        if not isinstance(analysis, Analysis):
            raise TypeError(f"the analysis returned {type(analysis).__name__}, not an Analysis")
    except BaseException as exc:  # noqa: BLE001 - everything becomes a verdict
        failure = exc
    elapsed = time.perf_counter() - start
    if failure is not None or analysis is None:
        try:
            analysis = analysis_from_exception(template, failure or RuntimeError("no result"), elapsed)
        except MemoryError:
            os._exit(_EXIT_MEMORY)
        failure = None  # drops the traceback and whatever huge values its frames held
    try:
        conn.send(("result", index, _finish(analysis, warnings)))
    except MemoryError:
        os._exit(_EXIT_MEMORY)
    except Exception as exc:  # e.g. a value that does not pickle
        reason = f"the analysis result could not be sent back: {exc}"
        conn.send(("result", index, _failed(template, "error", reason, elapsed, warnings)))


def _worker(conn, target, memory_mb, place: str = "library") -> None:
    """A worker: analyze (index, template) tasks until told to stop (None) or the pipe closes.

    `place`: where the parent's user is, so that limit messages name what they can change there.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _release_forkserver()
    _set_parent_death_signal()
    _limit_memory(memory_mb)
    with hints_for(place):
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                return
            if task is None:
                return
            _analyze_in_worker(conn, task[0], task[1], target)


# --- the parent -----------------------------------------------------------------------------------


_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(_PRELOAD)
        else:  # pragma: no cover - Windows, some sandboxes
            ctx = multiprocessing.get_context("spawn")
        _CONTEXT = ctx
    return _CONTEXT


@dataclasses.dataclass
class _Job:
    index: int
    template: ChatTemplate
    started: float
    deadline: float
    warnings: list = dataclasses.field(default_factory=list)
    result: Analysis | None = None


@dataclasses.dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    sentinel: int
    tasks: int = 0
    job: _Job | None = None


def _describe_exit(code: int | None) -> tuple[str, str]:
    if code == _EXIT_MEMORY:
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


def _check_options(jobs, timeout, memory_mb, max_tasks_per_worker, target) -> None:
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise InputError(f"jobs must be a positive whole number, got {jobs!r}")
    if timeout is not None and not timeout > 0:
        raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if memory_mb is not None and (not isinstance(memory_mb, int) or memory_mb < 16):
        raise InputError(f"memory limit must be at least 16 MiB, got {memory_mb!r}")
    if not isinstance(max_tasks_per_worker, int) or max_tasks_per_worker < 1:
        raise InputError(f"max_tasks_per_worker must be a positive whole number, got {max_tasks_per_worker!r}")
    try:
        pickle.dumps(target)
    except Exception as exc:
        raise InputError(f"the analysis target must be a module-level function (it is pickled by name): {exc}") from None


class _Pool:
    """Up to `jobs` worker processes working through `templates`, each template under a deadline.

    `run()` repeats one step until every template has a result: start templates on idle (or new)
    workers, wait for a message, a worker's exit or the nearest deadline, then collect what
    finished or died and stop what ran out of time. A worker is replaced after a crash, a kill,
    `max_tasks` templates, or a template that exhausted its memory. `close()` stops every worker.
    """

    def __init__(self, templates: list[ChatTemplate], target: Callable, *, jobs: int, timeout: float | None,
                 memory_mb: int | None, max_tasks: int, progress: Progress | None):
        self._ctx = _context()
        self._target = target
        self._jobs = jobs
        self._timeout = timeout
        self._memory_mb = memory_mb
        self._max_tasks = max_tasks
        self._progress = progress
        self._hint_place = hint_place()  # the workers word limit messages as this process does
        self._pending: collections.deque[tuple[int, ChatTemplate]] = collections.deque(enumerate(templates))
        self._results: list[Analysis | None] = [None] * len(templates)
        self._done = 0
        self._workers: dict[int, _Worker] = {}  # by process sentinel

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def run(self) -> list[Analysis]:
        while self._pending or self._busy():
            self._start_jobs()
            running = self._busy()
            if running:
                self._collect(self._wait(running))
                self._stop_overdue()
        results = [a for a in self._results if a is not None]
        assert len(results) == len(self._results), "every template gets a result before the loop ends"
        return results

    def close(self) -> None:
        for w in list(self._workers.values()):
            self._retire(w, kill=w.job is not None)

    # --- the steps of run() -------------------------------------------------------------------

    def _start_jobs(self) -> None:
        while self._pending and len(self._busy()) < self._jobs:
            self._assign(*self._pending.popleft())

    def _wait(self, running: list[tuple[_Worker, _Job]]) -> list:
        """Handles that became ready: a worker's pipe (a message) or sentinel (it exited)."""
        wait_for = max(0.0, min(job.deadline for _, job in running) - time.monotonic())
        handles: list = [w.sentinel for w in self._workers.values()] + [w.conn for w, _ in running]
        return multiprocessing.connection.wait(handles, timeout=min(wait_for, 3600.0))

    def _collect(self, ready: list) -> None:
        for w in list(self._workers.values()):
            job = w.job
            if job is not None and (w.conn in ready or w.sentinel in ready):
                self._drain(w, job)
            if job is not None and job.result is not None:
                self._finish(w, job, job.result)
            elif w.sentinel in ready:  # died: idle, or in the middle of a template
                self._lost(w)

    def _stop_overdue(self) -> None:
        now = time.monotonic()
        for w, job in self._busy():
            if job.deadline > now:
                continue
            self._drain(w, job)  # a result may have arrived just in time
            if job.result is not None:
                self._finish(w, job, job.result)
                continue
            w.job = None
            self._retire(w, kill=True)
            self._record(job.index, _failed(
                job.template, "timeout",
                f"template '{job.template.name}': the analysis took longer than {self._timeout:g} s; the worker was "
                f"stopped. If the template is legitimately slow, {hint('timeout')}",
                now - job.started, job.warnings))

    # --- one worker ---------------------------------------------------------------------------

    def _busy(self) -> list[tuple[_Worker, _Job]]:
        return [(w, w.job) for w in self._workers.values() if w.job is not None]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child_conn, self._target, self._memory_mb, self._hint_place),
                                 name="tmplkit-analyze", daemon=True)
        try:
            proc.start()
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        w = _Worker(proc, parent_conn, proc.sentinel)
        self._workers[w.sentinel] = w
        return w

    def _assign(self, index: int, template: ChatTemplate) -> None:
        w = next((w for w in self._workers.values() if w.job is None), None)
        try:
            if w is None:
                w = self._spawn()
            now = time.monotonic()
            # Until the worker reports in, allow for its start-up (the first one starts the forkserver).
            deadline = now + self._timeout + _STARTUP_GRACE if self._timeout is not None else float("inf")
            w.job = _Job(index, template, now, deadline)
            w.conn.send((index, template))
        except Exception as exc:  # fork failure, no file descriptors left, a worker that died idle, ...
            if w is not None:
                self._retire(w, kill=True)
            self._record(index, _failed(
                template, "error",
                f"could not start a worker process ({type(exc).__name__}: {exc}); a script that calls "
                "tmplkit's isolated analysis needs the `if __name__ == '__main__':` guard", 0.0))

    def _drain(self, w: _Worker, job: _Job) -> None:
        """Read the worker's messages about its current job: its scan warnings, then its result."""
        try:
            while job.result is None and w.conn.poll():
                kind, index, value = w.conn.recv()
                if index != job.index:
                    continue
                if kind == "scan":
                    job.warnings = list(value)
                    if self._timeout is not None:  # the clock starts when the worker has the template
                        job.started = time.monotonic()
                        job.deadline = job.started + self._timeout
                elif kind == "result":
                    job.result = value
        except (EOFError, OSError):
            pass
        except Exception as exc:  # a result that cannot be unpickled
            job.result = _failed(job.template, "error", f"the worker's result could not be read: {exc}",
                                 time.monotonic() - job.started, job.warnings)

    def _finish(self, w: _Worker, job: _Job, result: Analysis) -> None:
        """Record the worker's result; retire the worker when it has done its share or ran out of memory."""
        w.job = None
        w.tasks += 1
        self._record(job.index, result)
        if w.tasks >= self._max_tasks or result.status == "memory":
            self._retire(w, kill=False)

    def _lost(self, w: _Worker) -> None:
        """The worker exited: retire it, and give its template (if any) a verdict from the exit code."""
        code, job = w.process.exitcode, w.job
        self._retire(w, kill=True)
        if job is not None:
            status, reason = _describe_exit(code)
            self._record(job.index, _failed(job.template, status, f"template '{job.template.name}': {reason}",
                                            time.monotonic() - job.started, job.warnings))

    def _retire(self, w: _Worker, kill: bool) -> None:
        self._workers.pop(w.sentinel, None)
        if kill:
            w.process.kill()
        else:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                w.process.kill()
        w.conn.close()
        w.process.join(_KILL_GRACE)
        if w.process.is_alive():  # pragma: no cover - a worker that ignored the stop message
            w.process.kill()
            w.process.join(_KILL_GRACE)
        w.process.close()

    def _record(self, index: int, analysis: Analysis) -> None:
        self._results[index] = analysis
        self._done += 1
        if self._progress is not None:
            self._progress(self._done, len(self._results), analysis)


def analyze_isolated(
    templates: Iterable,
    jobs: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    progress: Progress | None = None,
    *,
    target: Callable | None = None,
    max_tasks_per_worker: int = DEFAULT_MAX_TASKS,
) -> list[Analysis]:
    """Analyze each ChatTemplate in a worker process; results in the input order.

    `jobs`: workers at once (default: os.cpu_count()). `timeout`: wall-clock seconds per template
    (None: no limit). `memory_mb`: MiB a worker may allocate beyond its start-up footprint (None:
    no limit). `progress(done, total, analysis)` is called in this process as each one ends.
    `target(template) -> Analysis` replaces `tmplkit.analyze.analyze`; it must be importable by
    name (a module-level function). A worker analyzes up to `max_tasks_per_worker` templates
    (1: a fresh process for every template) and is replaced at once after a crash, a kill, or a
    template that ran out of memory.

        >>> from tmplkit import load                                         # doctest: +SKIP
        >>> for a in analyze_isolated(load("corpus:llama.cpp"), jobs=2):   # doctest: +SKIP
        ...     print(a.name, a.status)
    """
    templates = list(templates)
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    target = target or _default_target
    _check_options(jobs, timeout, memory_mb, max_tasks_per_worker, target)
    if not templates:
        return []
    with _Pool(templates, target, jobs=jobs, timeout=timeout, memory_mb=memory_mb,
               max_tasks=max_tasks_per_worker, progress=progress) as pool:
        return pool.run()
