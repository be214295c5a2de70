"""llama.cpp for the prefill runner: one small wrapper per C handle: `Model` (the tokens layer's
`LlamaModel`, the one owner of a model, which also imports llama-cpp-python, initialises the
backend and captures its log), `Context` (and its memory), `Threadpool`, `TokenBatch`.

Everything here talks to llama-cpp-python's low-level bindings (or, for the threadpool, which
llama-cpp-python does not bind, to ggml through ctypes), as llama-cpp-python's own `_internals.py`
does. Each wrapper frees its own handle; the runner frees them in order (users before what they
use) through an ExitStack, and holds no C detail.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError
from ..server_rules import CACHE_TYPES, FLASH_ATTN, PrefillSettings
from ..tokens.llama_model import LlamaModel as Model
from ..tokens.llama_model import clear_log, ensure_backend, import_llama_cpp, log_cause

__all__ = [
    "CELL_BYTES", "SEQ", "STATE_PARTIAL", "Context", "Model", "Threadpool", "TokenBatch", "bytes_per_cell", "clear_log",
    "cpu_has_amx", "effective_repack", "ensure_backend", "import_llama_cpp", "log_cause",
]

STATE_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
SEQ = 0  # the one sequence the runner uses


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
    `pos0` and asks for logits of the last token only when `logits_last`. The C batch holds up to
    `FIRST` tokens at first and grows to the largest batch set (up to `capacity`): a huge n_batch
    costs what the prompt's batches need, not n_batch's allocation and loop.
    """

    FIRST = 8192

    def __init__(self, llama_cpp, capacity: int, seq_id: int = SEQ):
        self._lc = llama_cpp
        self.capacity = capacity
        self._seq_id = seq_id
        self.batch: Any = None  # (a llama_batch)
        self._allocate(min(capacity, self.FIRST))

    def _allocate(self, size: int) -> None:
        self.free()
        self.batch = b = self._lc.llama_batch_init(size, 0, 1)
        self._size = size
        self._token = np.ctypeslib.as_array(b.token, shape=(size,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(size,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(size,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(size,))[:] = 1
        for i in range(size):
            b.seq_id[i][0] = self._seq_id

    def set(self, tokens: np.ndarray, pos0: int, logits_last: bool) -> None:
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"a batch holds 1 to {self.capacity} tokens, got {n}")
        if n > self._size:
            self._allocate(min(self.capacity, max(n, 2 * self._size)))
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


# ---- the model and the context --------------------------------------------------------------------


class Context:
    """A `llama_context` on a model, for one sequence with one output (the last prompt token's
    logits), and its memory: decoding, rolling back, the partial state a checkpoint saves."""

    def __init__(self, llama_cpp, model: Model, settings: PrefillSettings, *, n_threads: int, name: str):
        self._lc = llama_cpp
        _check_k_cache(llama_cpp, model, settings, name)
        self.ctx = llama_cpp.llama_init_from_model(model.model, _context_params(llama_cpp, settings, n_threads))
        if not self.ctx:
            raise ModelError(f"llama.cpp cannot create a context for {name} with n_ctx={settings.n_ctx}: "
                             f"{log_cause('context creation failed')}")
        self.memory = llama_cpp.llama_get_memory(self.ctx)

    @property
    def n_ctx(self) -> int:
        return int(self._lc.llama_n_ctx(self.ctx))

    def clear(self) -> None:
        """Empty the memory."""
        self._lc.llama_memory_clear(self.memory, True)

    def remove_from(self, pos: int) -> bool:
        """Remove positions `pos`.. of the sequence from the memory; False where it cannot."""
        return bool(self._lc.llama_memory_seq_rm(self.memory, SEQ, pos, -1))

    def pos_range(self) -> tuple[int, int]:
        """The oldest and the newest position the memory holds (-1, -1 when empty)."""
        lc = self._lc
        return int(lc.llama_memory_seq_pos_min(self.memory, SEQ)), int(lc.llama_memory_seq_pos_max(self.memory, SEQ))

    def rollback(self) -> str:
        """What kind of rollback the memory supports (llama.cpp's common_context_can_seq_rm): "part",
        "full" (whole sequences only), "rs" (bounded recurrent states) or "none"."""
        lc = self._lc
        if not self.memory:
            return "none"
        if int(lc.llama_n_rs_seq(self.ctx)) > 0:
            return "rs"
        self.clear()
        # two tokens in one batch, as llama.cpp's probe; one by one where a batch holds one (n_ctx 1)
        step = 2 if int(lc.llama_n_batch(self.ctx)) >= 2 else 1
        ret = 0
        for _ in range(0, 2, step):
            toks = (ctypes.c_int32 * step)()
            ret = ret or lc.llama_decode(self.ctx, lc.llama_batch_get_one(toks, step))
        try:
            if ret != 0:
                return "none"
            return "part" if self.remove_from(1) else "full"
        finally:
            self.clear()

    def decode(self, batch: TokenBatch) -> int:
        """One llama_decode call of `batch`, waited for to the end of the computation; its return code."""
        ret = self._lc.llama_decode(self.ctx, batch.batch)
        if ret == 0:
            self._lc.llama_synchronize(self.ctx)
        return int(ret)

    def logits(self, n_vocab: int) -> np.ndarray | None:
        """A copy of the logits of the last token decoded, or None."""
        ptr = self._lc.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy() if ptr else None

    def state_size(self, flags: int = 0) -> int:
        """The bytes of the sequence's state (`STATE_PARTIAL`: its partial state alone)."""
        return int(self._lc.llama_state_seq_get_size_ext(self.ctx, SEQ, flags))

    def read_state(self) -> tuple[bytes, int]:
        """The sequence's partial state (what cannot roll back: the window's cache, a recurrent
        state), as llama-server's create_checkpoint reads it, and how many of its bytes llama.cpp wrote."""
        lc = self._lc
        size = self.state_size(STATE_PARTIAL)
        buf = (ctypes.c_uint8 * size)()
        got = int(lc.llama_state_seq_get_data_ext(self.ctx, buf, size, SEQ, STATE_PARTIAL))
        return bytes(buf), got

    def write_state(self, data: bytes) -> int:
        """Restore a partial state read by `read_state`; the bytes llama.cpp read."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return int(self._lc.llama_state_seq_set_data_ext(self.ctx, buf, len(data), SEQ, STATE_PARTIAL))

    def free(self) -> None:
        """Free the context (after its batch and tokenizer users, before its threadpool and model)."""
        if self.ctx:
            self._lc.llama_free(self.ctx)
            self.ctx = None
            self.memory = None


# llama_kv_cells (src/llama-kv-cells.h), per cell of a cache: pos and shift (int32 each), ext (x, y and
# a token: 12 bytes) and the set of sequences (a 256-bit bitset), allocated and zeroed with the cache.
CELL_BYTES = 52


def bytes_per_cell(llama_cpp, model: Model, settings: PrefillSettings) -> int:
    """The host memory a context on `model` with `settings` allocates per cell of its n_ctx-sized
    cache, at least: the cells' bookkeeping and a row of the attention mask its compute buffer is
    sized for (n_ubatch halves: f16, the smaller mask; llama.cpp reserves it for a full cache), none
    for a recurrent model, whose states do not grow with n_ctx; and, with no layer offloaded, the K
    and V of the layers that keep every position, as llama.cpp sizes them for this model and these
    cache types. Those are read from llama.cpp itself on a small probe context: what the sequence's
    state grows by with its second token, less what its partial state (a sliding window's cache, a
    recurrent state: not n_ctx-sized) grows by. The K and V count 0 where the probe cannot run."""
    if model.is_recurrent and not model.is_hybrid:
        return 0
    cells = CELL_BYTES + 2 * settings.n_ubatch
    if settings.n_gpu_layers != 0:  # the cache of an offloaded layer is the device's memory, not the host's
        return cells
    lc = llama_cpp
    try:
        ctx = Context(lc, model, replace(settings, n_ctx=256, n_batch=1, n_ubatch=1), n_threads=1, name="the probe")
    except ModelError:
        return cells
    try:
        sizes = []
        for _ in range(2):
            toks = (ctypes.c_int32 * 1)()
            if lc.llama_decode(ctx.ctx, lc.llama_batch_get_one(toks, 1)) != 0:
                return cells
            sizes.append((ctx.state_size(), 0 if settings.swa_full else ctx.state_size(STATE_PARTIAL)))
        (full1, partial1), (full2, partial2) = sizes
        return cells + max(0, (full2 - full1) - (partial2 - partial1))
    finally:
        ctx.free()
        clear_log()


# ggml's block sizes of the quantized cache types (`ggml_blck_size`); the others hold one value a block.
_CACHE_BLOCK = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "iq4_nl": 32}


def _check_k_cache(llama_cpp, model: Model, s: PrefillSettings, name: str) -> None:
    """A quantized K cache whose block does not divide the model's key head: llama.cpp refuses it
    with flash attention on or auto (llama_init_from_model's check), and with it off goes on to
    abort the process (GGML_ASSERT in ggml_view_2d, building the cache); refused here alike."""
    block = _CACHE_BLOCK.get(s.cache_type_k, 1)
    if block == 1 or s.flash_attn != "off":  # (on or auto: llama.cpp's own check says it)
        return
    head = _key_head(llama_cpp, model)
    if head and head % block:
        raise ModelError(f"llama.cpp cannot create a context for {name}: K cache type {s.cache_type_k} with block size "
                         f"{block} does not divide the model's key head of {head} (with -fa off llama.cpp would abort); "
                         "give -ctk f16, or a model whose heads it divides")


def _key_head(llama_cpp, model: Model) -> int:
    """The model's key head size: its GGUF's `ARCH.attention.key_length`, else n_embd / n_head (0
    where neither is known)."""
    def meta(key: str) -> str:
        buf = ctypes.create_string_buffer(128)
        n = llama_cpp.llama_model_meta_val_str(model.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n > 0 else ""

    arch = meta("general.architecture")
    length = meta(f"{arch}.attention.key_length") if arch else ""
    if length.isdigit():
        return int(length)
    n_head = int(llama_cpp.llama_model_n_head(model.model))
    return int(llama_cpp.llama_model_n_embd(model.model)) // n_head if n_head > 0 else 0


def _context_params(llama_cpp, s: PrefillSettings, n_threads: int):
    """llama.cpp's context parameters for the runner's settings (llama-server's, for one slot)."""
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = s.n_ctx
    cparams.n_batch = s.n_batch
    cparams.n_ubatch = min(s.n_ubatch, s.n_batch)
    cparams.n_seq_max = 1
    # one output (the last prompt token's logits), as llama-server reserves: with the default
    # (n_batch outputs) the compute buffer is sized for n_ubatch x n_vocab logits: 515 MiB
    # instead of 51 for Gemma 3 270M, 297 instead of 34 for the tiny qwen35 model.
    cparams.n_outputs_max = 1
    cparams.n_outputs_max_per_seq = 1
    cparams.n_threads = n_threads
    cparams.n_threads_batch = s.n_threads_batch or n_threads
    cparams.flash_attn_type = FLASH_ATTN[s.flash_attn]
    cparams.type_k = CACHE_TYPES[s.cache_type_k]
    cparams.type_v = CACHE_TYPES[s.cache_type_v]
    cparams.swa_full = s.swa_full
    cparams.embeddings = False
    cparams.no_perf = True
    return cparams
