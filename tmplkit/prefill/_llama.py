"""llama.cpp set-up for the prefill runner: import, backend and log capture, threadpool, batch.

Everything here talks to llama-cpp-python's low-level bindings (or, for the threadpool, which
llama-cpp-python does not bind, to ggml through ctypes), one small wrapper per C object, as
llama-cpp-python's own `_internals.py` does. The runner composes them and holds no C detail.
"""

from __future__ import annotations

import ctypes
import os
from collections import deque
from pathlib import Path

import numpy as np

from ..errors import ModelError

__all__ = [
    "SEQ", "STATE_PARTIAL", "Threadpool", "TokenBatch", "clear_log", "cpu_has_amx", "effective_repack", "ensure_backend",
    "import_llama_cpp", "log_cause",
]

STATE_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
SEQ = 0  # the one sequence the runner uses


def import_llama_cpp():
    """The llama_cpp module, or a ModelError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError("llama-cpp-python is not installed; run `pip install 'tmplkit[llama]'`") from exc
    return llama_cpp


def cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


def effective_repack(repack: bool | None) -> bool:
    """Whether weights are repacked: as set, else on unless the CPU has AMX (see PrefillSettings)."""
    return (not cpu_has_amx()) if repack is None else bool(repack)


# ---- backend and log capture (process-wide: llama.cpp has one log callback) ---------------------

_LOG_LINES: deque[tuple[int, str]] = deque(maxlen=40)
_LOG_CB = None  # kept referenced: llama.cpp calls it for the life of the process
_BACKEND_READY = False


def ensure_backend(llama_cpp) -> None:
    """Initialise llama.cpp's backend once and capture its warnings and errors (echoed to stderr
    as well when TMPLKIT_LLAMA_LOG=1), so a failure can be explained in llama.cpp's own words."""
    global _LOG_CB, _BACKEND_READY
    if _BACKEND_READY:
        return
    echo = os.environ.get("TMPLKIT_LLAMA_LOG") == "1"

    @llama_cpp.llama_log_callback
    def _cb(level, text, user_data):  # pragma: no cover - called from C
        try:
            s = text.decode("utf-8", "replace") if text else ""
        except Exception:
            return
        if echo:
            os.write(2, s.encode())
        if level in (3, 4) and s.strip():  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            _LOG_LINES.append((int(level), s.strip()))

    _LOG_CB = _cb
    llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _BACKEND_READY = True


def clear_log() -> None:
    _LOG_LINES.clear()


def log_cause(default: str) -> str:
    """The first error llama.cpp logged since the last clear (its own words, one line)."""
    errors = [text for level, text in _LOG_LINES if level == 4] or [text for _, text in _LOG_LINES]
    cause = errors[0] if errors else default
    head, sep, rest = cause.partition(": ")
    if sep and " " not in head:  # drop the C function name prefix
        cause = rest
    return " ".join(cause.split())[:300]


# ---- a persistent CPU threadpool, as llama-server attaches (llama-cpp-python has no binding) -----


class _ThreadpoolParams(ctypes.Structure):
    _fields_ = [("cpumask", ctypes.c_bool * 512),  # GGML_MAX_N_THREADS
                ("n_threads", ctypes.c_int), ("prio", ctypes.c_int), ("poll", ctypes.c_uint32),
                ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


_GGML = None


def _ggml_libs(llama_cpp):
    """(libggml-base, libggml-cpu, libllama) as loaded by llama-cpp-python, or None."""
    global _GGML
    if _GGML is None:
        try:
            libdir = Path(llama_cpp.__file__).parent / "lib"
            pick = lambda stem: next(p for p in sorted(libdir.iterdir()) if p.name.split(".")[0] in (f"lib{stem}", stem))  # noqa: E731
            base, cpu = ctypes.CDLL(str(pick("ggml-base"))), ctypes.CDLL(str(pick("ggml-cpu")))
            base.ggml_threadpool_params_init.argtypes = [ctypes.POINTER(_ThreadpoolParams), ctypes.c_int]
            base.ggml_threadpool_params_init.restype = None
            cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(_ThreadpoolParams)]
            cpu.ggml_threadpool_new.restype = ctypes.c_void_p
            cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
            cpu.ggml_threadpool_free.restype = None
            lib = llama_cpp.llama_cpp._lib
            lib.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            lib.llama_attach_threadpool.restype = None
            _GGML = (base, cpu, lib)
        except Exception:
            _GGML = False
    return _GGML or None


class Threadpool:
    """Persistent ggml threadpools attached to a context (llama.cpp's common_threadpools::init):
    their idle threads busy-wait at `poll` (0-100) between graphs instead of being started anew
    for each one. A separate batch pool exists only when n_threads_batch differs from n_threads."""

    def __init__(self, cpu, pool, batch):
        self._cpu, self._pool, self._batch = cpu, pool, batch

    @classmethod
    def attach(cls, llama_cpp, ctx, n_threads: int, n_threads_batch: int, poll: int | None) -> Threadpool | None:
        """Attach new threadpools to `ctx`; None when `poll` is None or ggml's symbols are missing
        (the context then keeps ggml's per-graph default threadpool)."""
        if poll is None:
            return None
        libs = _ggml_libs(llama_cpp)
        if libs is None:
            return None
        base, cpu, lib = libs

        def params(n: int, paused: bool = False) -> _ThreadpoolParams:
            p = _ThreadpoolParams()
            base.ggml_threadpool_params_init(ctypes.byref(p), n)
            p.poll = int(poll)
            p.paused = paused
            return p

        batch = None
        if n_threads_batch != n_threads:
            batch = cpu.ggml_threadpool_new(ctypes.byref(params(n_threads_batch)))
            if not batch:
                return None
        pool = cpu.ggml_threadpool_new(ctypes.byref(params(n_threads, paused=batch is not None)))
        if not pool:
            if batch:
                cpu.ggml_threadpool_free(batch)
            return None
        lib.llama_attach_threadpool(ctx, pool, batch)
        return cls(cpu, pool, batch)

    def free(self) -> None:
        """Free the pools (after the context they were attached to)."""
        if self._pool:
            self._cpu.ggml_threadpool_free(self._pool)
            self._pool = None
        if self._batch:
            self._cpu.ggml_threadpool_free(self._batch)
            self._batch = None


# ---- the batch ------------------------------------------------------------------------------------


class TokenBatch:
    """A `llama_batch` of up to `capacity` tokens of one sequence, filled from numpy arrays.

    Filling is this wrapper's job, not the decode loop's (as in llama-cpp-python's
    `_internals.LlamaBatch`): `set(tokens, pos0, logits_last)` puts consecutive positions from
    `pos0` and asks for logits of the last token only when `logits_last`.
    """

    def __init__(self, llama_cpp, capacity: int, seq_id: int = SEQ):
        self._lc = llama_cpp
        self.capacity = capacity
        self.batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        b = self.batch
        self._token = np.ctypeslib.as_array(b.token, shape=(capacity,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(capacity,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(capacity,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(capacity,))[:] = 1
        for i in range(capacity):
            b.seq_id[i][0] = seq_id

    def set(self, tokens: np.ndarray, pos0: int, logits_last: bool) -> None:
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"a batch holds 1 to {self.capacity} tokens, got {n}")
        self._token[:n] = tokens
        self._pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self._logits[:n] = 0
        if logits_last:
            self._logits[n - 1] = 1
        self.batch.n_tokens = n

    @property
    def n_tokens(self) -> int:
        return int(self.batch.n_tokens)

    def free(self) -> None:
        if self.batch is not None:
            self._lc.llama_batch_free(self.batch)
            self.batch = None
