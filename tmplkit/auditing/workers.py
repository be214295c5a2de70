"""Work in worker processes, one item at a time, each under a wall-clock and a memory limit.

A worker is a process of its own because one process cannot stop everything from inside: a single
C-level call that runs for minutes or allocates gigabytes never comes back to a check. So:

- the worker gets `RLIMIT_AS` = its start-up footprint + `memory_mb` (an allocation past it raises
  MemoryError there, or kills the worker) and dies with the process that runs the pool
  (PR_SET_PDEATHSIG);
- the parent kills it with SIGKILL when `timeout` seconds have passed;
- whatever happens to it (a hang, a MemoryError, a segfault, `os._exit`) becomes a `Lost` the
  caller turns into a result (`lost(item, Lost)`), and the run goes on.

The pool knows nothing of what the work is: `work(item, note)` runs in the worker and returns any
picklable result; `prelude(item)`, when given, runs first and its value (`note`) comes back at once,
so that an item whose worker is lost still has it, and the item's clock starts when it arrives.
`tmplkit.auditing.isolate` puts the analysis on it.

Workers are forked from a `forkserver` (spawned where that is not available) with tmplkit's
analysis already imported (about 10 ms each). A worker does up to `max_tasks` items and is replaced
at once after a crash, a kill, or a result that `retire(result)` says exhausted it. Results come
back in the input order whatever `jobs` is.

A script that calls this needs the usual multiprocessing guard, `if __name__ == "__main__":`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from .._interrupt import die_with_parent
from ..errors import InputError

__all__ = ["EXIT_MEMORY", "Lost", "check_options", "run_in_workers"]

EXIT_MEMORY = 75  # the worker ran out of memory so completely it could not even report it
_KILL_GRACE = 5.0
_STARTUP_GRACE = 30.0
# The forkserver (one per process) imports these once, and every worker is forked from it with them
# loaded: the analysis stack, which is what tmplkit's workers run. `__main__` (multiprocessing's
# default) is kept so that a script's main module is imported once, in the server, and not again in
# every worker.
_PRELOAD = ["__main__", "tmplkit.auditing._forkserver_quiet", "tmplkit.analysis", "tmplkit.sandbox",
            "tmplkit.sandbox.static_scan", "tmplkit.auditing.isolate",
            "tmplkit.auditing._prefix", "jinja2.sandbox"]  # _prefix: the prefix-stability check runs in the workers
# Libraries a worker imports before its memory limit where this process has them (`_preimport`).
_PREIMPORTS = ("numpy", "tokenizers", "llama_cpp")


@dataclasses.dataclass(frozen=True)
class Lost:
    """Why an item got no result from its worker.

    `kind`: "timeout" (past `limit` seconds; the worker was killed), "exit" (the worker ended with
    `exitcode`: a crash, a kill, EXIT_MEMORY), "start" (no worker could be started: `error`),
    "unsent" (the result could not be pickled in the worker: `error`), "unread" (nor unpickled
    here: `error`) or "raised" (the work, its prelude, reading the item or the worker's own setup
    raised: `error`). `seconds`: the item's time so far; `note`: what its prelude sent (None when it
    did not run).
    """

    kind: str
    seconds: float = 0.0
    note: Any = None
    exitcode: int | None = None
    error: str = ""
    limit: float | None = None


# --- the worker -----------------------------------------------------------------------------------

UNREAD_TASK = -1  # the index a worker's message has for the item it was sent but could not read


def _release_forkserver() -> None:
    """Close this worker's copy of the forkserver's 'alive' pipe.

    The forkserver hands every child the write end of that pipe and lives while any copy is
    open; a worker busy with a hanging item would then keep the forkserver alive after the pool's
    process dies, and the forkserver would keep the worker alive (the worker's parent-death signal
    is tied to the forkserver). Without our copy, the forkserver exits with that process, and the
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


def _preimport(modules) -> None:
    """Import `modules` (numpy, a tokenizer's library) before the memory limit is set: `--memory`
    bounds what the work allocates, and a library's own mapping counted against it (numpy's
    import alone maps more than a low limit) failed the work with the library's import error, or
    a tokenizer's "not installed". One that does not import is left to the work to report."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the work imports it again and says what is wrong
            pass


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


def _do_one(conn, index: int, item, work, prelude) -> None:
    note = None
    if prelude is not None:
        try:
            note = prelude(item)
        except MemoryError:
            os._exit(EXIT_MEMORY)
        except BaseException as exc:  # noqa: BLE001 - said through the pipe: the worker's own output goes nowhere
            conn.send(("raised", index, (f"{type(exc).__name__}: {exc}", 0.0)))
            return
        conn.send(("note", index, note))
    start = time.perf_counter()
    try:
        result = work(item, note)
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except BaseException as exc:  # noqa: BLE001 - the work's own failure becomes a Lost
        conn.send(("raised", index, (f"{type(exc).__name__}: {exc}", time.perf_counter() - start)))
        return
    try:
        conn.send(("result", index, result))
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except Exception as exc:  # e.g. a value that does not pickle
        conn.send(("unsent", index, (str(exc), time.perf_counter() - start)))


def _silence_output() -> None:
    """What native code prints on the worker's way down (llama.cpp's `terminate called after ...`,
    ggml's backtrace through gdb: two dozen lines) goes nowhere: the parent says in one line how the
    worker ended (`isolate._describe_exit`), and every result or error comes through the pipe."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)  # (ggml's backtrace runs gdb on the standard output)
        os.dup2(null, 2)
        os.close(null)
    except OSError:
        pass


def _worker(conn, work, prelude, memory_mb, setup, imports=()) -> None:
    """A worker: do (index, item) tasks until told to stop (None) or the pipe closes. `setup()`, when
    given, is a context the worker works in (the caller's hint wording, say); where it raises, every
    task is answered with that error (this process's own output goes nowhere). `imports`: modules
    loaded before the memory limit (`_preimport`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _release_forkserver()
    die_with_parent()
    _silence_output()
    _preimport(imports)
    _limit_memory(memory_mb)
    with contextlib.ExitStack() as stack:
        try:
            if setup is not None:
                stack.enter_context(setup())
        except Exception as exc:  # said for each task, not a silent exit
            failed = (f"the worker could not start: {type(exc).__name__}: {exc}", 0.0)
            _serve(conn, lambda index, item: conn.send(("raised", index, failed)))
            return
        _serve(conn, lambda index, item: _do_one(conn, index, item, work, prelude))


def _serve(conn, handle) -> None:
    """Read tasks and `handle(index, item)` each, until told to stop (None) or the pipe closes."""
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # an item that does not unpickle here: said, not a silent exit
            conn.send(("raised", UNREAD_TASK, (f"the worker could not read its item: {type(exc).__name__}: {exc}", 0.0)))
            continue
        if task is None:
            return
        handle(task[0], task[1])


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


def _start(proc, ctx) -> None:
    """Start a worker so that it begins with Ctrl-C ignored: a Ctrl-C early in an audit reaches
    the whole process group, and a worker (or the forkserver) still importing tmplkit would print
    a KeyboardInterrupt traceback each. An ignored SIGINT is inherited across exec, and Python
    then installs no KeyboardInterrupt handler; the forkserver's children get the disposition it
    started with. Only the start is covered: the parent still sees a Ctrl-C at any other time."""
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        with _sigint_ignored():
            forkserver.ensure_running()
        proc.start()
    else:  # pragma: no cover - spawn: the child is this process's own
        with _sigint_ignored():
            proc.start()


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored meanwhile (in the main thread, the only one that may set handlers), and held
    back rather than lost: it is also blocked, so a Ctrl-C that comes meanwhile is delivered here
    when the block ends (a KeyboardInterrupt), while the child started meanwhile inherits both the
    ignored disposition and the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = hasattr(signal, "pthread_sigmask")
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _main_not_rerun():
    """Hide a `__main__.__file__` that names no file from multiprocessing while a worker starts.

    forkserver and spawn children run the parent's main file again (multiprocessing.spawn's
    preparation data); a script read from standard input (`python - < script.py`) has the file
    '<stdin>', and every worker would die on its FileNotFoundError. The workers need nothing of
    `__main__` (what they run is tmplkit's), so without the file they simply do not import it.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    hide = main is not None and path is not None and getattr(main, "__spec__", None) is None and not os.path.isfile(path)
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = path


@dataclasses.dataclass
class _Job:
    index: int
    item: Any
    started: float
    deadline: float
    note: Any = None
    result: Any = None
    done: bool = False


@dataclasses.dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    sentinel: int
    tasks: int = 0
    job: _Job | None = None


# A worker's memory in MiB: below the floor Python cannot start its work; past the ceiling (a
# petabyte, past any machine) the address-space limit a worker sets would overflow.
MIN_MEMORY_MB, MAX_MEMORY_MB = 16, 1 << 30


def check_memory(memory_mb) -> None:
    """A one-line InputError for a worker memory no worker can be given (None: no limit)."""
    if memory_mb is not None and (not isinstance(memory_mb, int) or not MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB):
        raise InputError(f"memory limit must be at least {MIN_MEMORY_MB} MiB and at most {MAX_MEMORY_MB}, got {memory_mb!r}")


def check_options(jobs, timeout, memory_mb, max_tasks_per_worker, work) -> None:
    """One-line InputErrors for options no pool can run with, before any work."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise InputError(f"jobs must be a positive whole number, got {jobs!r}")
    if timeout is not None and not timeout > 0:
        raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
    check_memory(memory_mb)
    if not isinstance(max_tasks_per_worker, int) or max_tasks_per_worker < 1:
        raise InputError(f"max_tasks_per_worker must be a positive whole number, got {max_tasks_per_worker!r}")
    try:
        pickle.dumps(work)
    except Exception as exc:
        raise InputError(f"the analysis target must be a module-level function (it is pickled by name): {exc}") from None


class _Pool:
    """Up to `jobs` worker processes working through `items`, each item under a deadline.

    `run()` repeats one step until every item has a result: start items on idle (or new) workers,
    wait for a message, a worker's exit or the nearest deadline, then collect what finished or
    died and stop what ran out of time. `close()` stops every worker.
    """

    def __init__(self, items: Sequence, work: Callable, *, lost: Callable, prelude: Callable | None,
                 retire: Callable | None, setup: Callable | None, jobs: int, timeout: float | None,
                 memory_mb: int | None, max_tasks: int, progress: Callable | None, imports: tuple[str, ...] = ()):
        self._ctx = _context()
        self._args = (work, prelude, memory_mb, setup, imports)  # what each worker process is started with
        self._lost = lost
        self._retire_after = retire
        self._jobs = jobs
        self._timeout = timeout
        self._max_tasks = max_tasks
        self._progress = progress
        self._pending: collections.deque[tuple[int, Any]] = collections.deque(enumerate(items))
        self._results: list = [None] * len(items)
        self._recorded = [False] * len(items)
        self._done = 0
        self._workers: dict[int, _Worker] = {}  # by process sentinel

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def run(self) -> list:
        while self._pending or self._busy():
            self._start_jobs()
            running = self._busy()
            if running:
                self._collect(self._wait(running))
                self._stop_overdue()
        assert all(self._recorded), "every item gets a result before the loop ends"
        return list(self._results)

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
            if job is not None and job.done:
                self._finish(w, job)
            elif w.sentinel in ready:  # died: idle, or in the middle of an item
                self._lost_worker(w)

    def _stop_overdue(self) -> None:
        now = time.monotonic()
        for w, job in self._busy():
            if job.deadline > now:
                continue
            self._drain(w, job)  # a result may have arrived just in time
            if job.done:
                self._finish(w, job)
                continue
            w.job = None
            self._retire(w, kill=True)
            self._record(job.index, self._lost(job.item, Lost("timeout", now - job.started, job.note, limit=self._timeout)))

    # --- one worker ---------------------------------------------------------------------------

    def _busy(self) -> list[tuple[_Worker, _Job]]:
        return [(w, w.job) for w in self._workers.values() if w.job is not None]

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child_conn, *self._args), name="tmplkit-analyze", daemon=True)
        try:
            with _main_not_rerun():
                _start(proc, self._ctx)
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        w = _Worker(proc, parent_conn, proc.sentinel)
        self._workers[w.sentinel] = w
        return w

    def _assign(self, index: int, item) -> None:
        w = next((w for w in self._workers.values() if w.job is None), None)
        try:
            if w is None:
                w = self._spawn()
            now = time.monotonic()
            # Until the worker reports in, allow for its start-up (the first one starts the forkserver).
            deadline = now + self._timeout + _STARTUP_GRACE if self._timeout is not None else float("inf")
            w.job = _Job(index, item, now, deadline)
            w.conn.send((index, item))
        except Exception as exc:  # fork failure, no file descriptors left, a worker that died idle, ...
            if w is not None:
                w.job = None
                self._retire(w, kill=True)
            self._record(index, self._lost(item, Lost("start", error=f"{type(exc).__name__}: {exc}")))

    def _drain(self, w: _Worker, job: _Job) -> None:
        """Read the worker's messages about its current job: its prelude's note, then its result."""
        try:
            while not job.done and w.conn.poll():
                kind, index, value = w.conn.recv()
                if index != job.index and index != UNREAD_TASK:
                    continue
                if kind == "note":
                    job.note = value
                    if self._timeout is not None:  # the clock starts when the worker has the item
                        job.started = time.monotonic()
                        job.deadline = job.started + self._timeout
                elif kind == "result":
                    job.result, job.done = value, True
                else:  # "unsent", "raised": the worker says why there is no result
                    error, seconds = value
                    job.result, job.done = self._lost(job.item, Lost(kind, seconds, job.note, error=error)), True
        except (EOFError, OSError):
            pass
        except Exception as exc:  # a result that cannot be unpickled
            job.result = self._lost(job.item, Lost("unread", time.monotonic() - job.started, job.note, error=str(exc)))
            job.done = True

    def _finish(self, w: _Worker, job: _Job) -> None:
        """Record the worker's result; retire the worker when it has done its share or is exhausted."""
        w.job = None
        w.tasks += 1
        self._record(job.index, job.result)
        if w.tasks >= self._max_tasks or (self._retire_after is not None and self._retire_after(job.result)):
            self._retire(w, kill=False)

    def _lost_worker(self, w: _Worker) -> None:
        """The worker exited: retire it, and give its item (if any) a result from the exit code."""
        code, job = w.process.exitcode, w.job
        self._retire(w, kill=True)
        if job is not None:
            self._record(job.index, self._lost(job.item, Lost("exit", time.monotonic() - job.started, job.note, exitcode=code)))

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

    def _record(self, index: int, result) -> None:
        self._results[index] = result
        self._recorded[index] = True
        self._done += 1
        if self._progress is not None:
            self._progress(self._done, len(self._results), result)


def run_in_workers(items: Sequence, work: Callable, *, lost: Callable, prelude: Callable | None = None,
                   retire: Callable | None = None, setup: Callable | None = None, jobs: int = 1,
                   timeout: float | None = None, memory_mb: int | None = None, max_tasks: int = 32,
                   progress: Callable | None = None, imports: Sequence[str] = ()) -> list:
    """`work(item, note)` for every item in worker processes (see the module doc); the results in
    the input order. `work`, `prelude` and `setup` are pickled by name (module-level functions, or
    `functools.partial` of them); `lost(item, Lost)`, `retire(result)` and `progress(done, total,
    result)` run here. `imports`: libraries the work needs, imported before the memory limit (with
    those of a tokenizer this process has loaded: `_preimport`)."""
    check_memory(memory_mb)  # (every pool: the contained commands' too, not only the audit's)
    items = list(items)
    if not items:
        return []
    imports = tuple(dict.fromkeys([*imports, *(m for m in _PREIMPORTS if m in sys.modules)]))
    with _Pool(items, work, lost=lost, prelude=prelude, retire=retire, setup=setup, jobs=jobs, timeout=timeout,
               memory_mb=memory_mb, max_tasks=max_tasks, progress=progress, imports=imports) as pool:
        return pool.run()
