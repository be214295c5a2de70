"""One command's work on an untrusted template, in a worker process under the audit's limits.

The audit renders every template in a worker (tmplkit.auditing.isolate); the other commands that render one
(`turns`, `mask`, `annotate`, `spans`, `request`) run their work here the same way: one worker,
killed past `timeout` seconds, with `memory_mb` MiB of address space beyond its start-up
footprint, the sandbox's own per-render limits inside. A render that a Python-level check cannot
stop (one C-level call: a `wordwrap` over millions of words, a `~` that builds gigabytes) then ends
as a one-line error and exit 2, never a hang or a machine out of memory.

`run_contained(func, *args, what=..., timeout=..., **kwargs)` calls `func(*args, **kwargs)` in the
worker and returns its value; a `TmplkitError` it raises is raised here again (same class, message
and attributes); a worker that runs out of time or memory raises `RenderLimitError` (kind
"timeout" or "memory"). `func` must be importable by name, and its arguments picklable: a tokenizer
that is not (llama-cpp-python's) is passed as `TokenizerRef` and opened in the worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import signal
import threading
from collections.abc import Callable, Sequence

from ..errors import InputError, RenderError, RenderLimitError, TmplkitError
from ..sandbox import hint_place, hints_for
from .workers import EXIT_MEMORY, Lost, _context, run_in_workers

__all__ = ["DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT", "TokenizerRef", "portable_tokenizer", "run_contained", "run_contained_each"]

# The audit's limits (tmplkit.auditing.isolate.DEFAULT_TIMEOUT, DEFAULT_MEMORY_MB): seconds and MiB per template.
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
# What the contained work (token ids, masks, behaviour records) needs, imported before the memory
# limit: --memory bounds the work, not numpy's own mapping (a low one failed with numpy's error).
_IMPORTS = ("numpy",)


@dataclasses.dataclass(frozen=True)
class TokenizerRef:
    """A tokenizer to open in the worker: `load_tokenizer(spec, add_bos=add_bos)`."""

    spec: str
    add_bos: bool = False


def portable_tokenizer(tokenizer, spec, *, add_bos: bool = False):
    """`tokenizer` itself where it pickles (it is sent to the worker), else a `TokenizerRef` to
    `spec` (the worker opens it again: llama-cpp-python's vocabulary is a C handle)."""
    if tokenizer is None:
        return None
    try:
        pickle.dumps(tokenizer)
        return tokenizer
    except Exception:
        return TokenizerRef(str(spec), add_bos)


def resolve(value):
    """In the worker: a `TokenizerRef` opened (once per worker), anything else as it is."""
    if isinstance(value, TokenizerRef):
        return _open(value.spec, value.add_bos)
    return value


@functools.lru_cache(maxsize=4)
def _open(spec: str, add_bos: bool):
    from ..tokens.tokenizers import load_tokenizer  # numpy: only in a command given a tokenizer

    return load_tokenizer(spec, add_bos=add_bos)


# --- in the worker ---------------------------------------------------------------------------------


def _ready(item) -> None:
    """The prelude: the worker has the item, so its clock starts now (not at the worker's start-up)."""
    return None


def _portable_error(exc: TmplkitError) -> tuple:
    """What rebuilds `exc` here: its class (by name), message and attributes (the exceptions take
    keyword arguments, which pickling an exception does not carry)."""
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, type(None)))}
    return type(exc).__module__, type(exc).__qualname__, str(exc), attrs


def _call(item, note):
    func, args, kwargs = item
    try:
        return "ok", func(*[resolve(a) for a in args], **{k: resolve(v) for k, v in kwargs.items()})
    except TmplkitError as exc:
        return "error", _portable_error(exc)
    except RecursionError as exc:  # a template nested past Python's stack: the input's fault
        return "error", ("tmplkit.errors", "RenderError", f"the template nests too deeply to render ({exc})", {})


# --- in this process -------------------------------------------------------------------------------


class _ProgressSender:
    """The worker's `progress`: each call's arguments sent down a pipe to this process."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def __call__(self, *args) -> None:
        try:
            self._conn.send(args)
        except (OSError, ValueError):  # this process stopped listening: the work goes on
            pass


@contextlib.contextmanager
def _relayed(progress: Callable | None):
    """A `_ProgressSender` for the worker (None without `progress`), and a thread here that calls
    `progress` with what it sends, until the worker's end of the pipe closes."""
    if progress is None:
        yield None
        return

    reader, writer = _context().Pipe(duplex=False)

    def relay() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                progress(*reader.recv())

    thread = threading.Thread(target=relay, name="tmplkit-progress", daemon=True)
    thread.start()
    try:
        yield _ProgressSender(writer)
    finally:
        writer.close()  # the worker has ended: its copy is closed too, so the relay reads to the end
        thread.join(5.0)
        reader.close()


def _rebuilt(module: str, qualname: str, message: str, attrs: dict) -> TmplkitError:
    import importlib

    try:
        cls = getattr(importlib.import_module(module), qualname)
        if not (isinstance(cls, type) and issubclass(cls, TmplkitError)):
            raise TypeError(qualname)
        exc = cls.__new__(cls)
        Exception.__init__(exc, message)
        exc.__dict__.update(attrs)
        return exc
    except Exception:
        return RenderError(message)


def _lost(what: str, memory_mb: int | None, advice: str, memory_advice: str = ""):
    def lost(item, gone: Lost):
        if gone.kind == "timeout":
            return "lost", RenderLimitError(f"{what}: took longer than {gone.limit:g} s; the worker was stopped (the "
                                            f"template may loop without end or render for long in one call){advice}",
                                            kind="timeout")
        if gone.kind == "exit" and (gone.exitcode == EXIT_MEMORY or gone.exitcode == -signal.SIGKILL):
            return "lost", RenderLimitError(f"{what}: ran out of memory (over {memory_mb} MiB); the worker was stopped "
                                            f"(the template may build a huge value){memory_advice}", kind="memory")
        if gone.kind == "exit" and gone.exitcode == -signal.SIGABRT and memory_mb:
            # native code (a tokenizer's allocator, libstdc++) aborts where an allocation fails, and llama.cpp
            # on a check of its own (a damaged vocabulary): the limit is not always the cause
            return "lost", RenderError(f"{what}: the worker aborted (SIGABRT) in native code: out of memory (over "
                                       f"{memory_mb} MiB) where an allocation failed{memory_advice}, or a check of its "
                                       "own on damaged input (a tokenizer file it cannot read)")
        if gone.kind == "exit":
            return "lost", RenderError(f"{what}: the worker ended without a result (exit code {gone.exitcode})")
        if gone.kind == "start":
            return "lost", InputError(f"{what}: could not start a worker process ({gone.error})")
        return "lost", RenderError(f"{what}: failed in its worker: {gone.error}")

    return lost


def run_contained(func: Callable, *args, what: str, timeout: float | None = DEFAULT_TIMEOUT,
                  memory_mb: int | None = DEFAULT_MEMORY_MB, advice: str = "", memory_advice: str = "",
                  progress: Callable | None = None, **kwargs):
    """`func(*args, **kwargs)` in a worker process under `timeout` seconds and `memory_mb` MiB; its
    value, or its `TmplkitError` raised here. `what` names the work in an error ("mask of
    'chatml'"); `advice` ends a time-limit message ("; if it is legitimately slow, raise --timeout"),
    `memory_advice` a memory-limit one.
    `progress`: called here with what `func`'s own `progress` keyword is called with there."""
    _check_pickles(args, kwargs)
    with _relayed(progress) as sender:
        if sender is not None:
            kwargs["progress"] = sender
        (result,) = run_in_workers([(func, args, kwargs)], _call, lost=_lost(what, memory_mb, advice, memory_advice), prelude=_ready,
                                   jobs=1, timeout=timeout, memory_mb=memory_mb, max_tasks=1, imports=_IMPORTS,
                                   setup=functools.partial(hints_for, hint_place()))
    kind, value = result
    if kind == "ok":
        return value
    if kind == "error":
        raise _rebuilt(*value)
    raise value


def run_contained_each(calls: Sequence[tuple[Callable, tuple, dict, str]], *, jobs: int, timeout: float | None = DEFAULT_TIMEOUT,
                       memory_mb: int | None = DEFAULT_MEMORY_MB, advice: str = "", memory_advice: str = "",
                       progress: Callable | None = None) -> list:
    """Each `(func, args, kwargs, what)` as `run_contained` runs one (a worker of its own, the same
    limits), up to `jobs` at once: per call, its value or the `TmplkitError` it ended with, returned
    (one call's failure is its own, the others go on). `progress(done, total)`: called here as calls end."""
    items = [(func, args, kwargs) for func, args, kwargs, _ in calls]
    for _, args, kwargs in items:
        _check_pickles(args, kwargs)
    whats = {id(item): what for item, (*_, what) in zip(items, calls)}

    def lost(item, gone: Lost):
        return _lost(whats[id(item)], memory_mb, advice, memory_advice)(item, gone)

    done = (lambda n, total, _result: progress(n, total)) if progress is not None else None
    results = run_in_workers(items, _call, lost=lost, prelude=_ready, jobs=jobs, timeout=timeout, memory_mb=memory_mb,
                             max_tasks=1, setup=functools.partial(hints_for, hint_place()), progress=done, imports=_IMPORTS)
    # (a worker lost past its limits comes back as its error already: `lost`)
    return [_rebuilt(*value) if kind == "error" else value for kind, value in results]


def _check_pickles(args, kwargs) -> None:
    for value in (*args, *kwargs.values()):
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise TypeError(f"run_contained: an argument does not pickle ({type(value).__name__}: {exc})") from None
