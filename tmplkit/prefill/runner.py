"""A checkpointing prefill runner on llama-cpp-python's low-level API, following llama-server.

    >>> from tmplkit.prefill import PrefillRunner
    >>> with PrefillRunner("gemma-3-270m.gguf", n_ctx=32768, n_threads=2) as runner:   # doctest: +SKIP
    ...     report = runner.run(tokens, spans, policy="gated")
    ...     report.tokens_per_second, report.n_decode_calls
    ...     later = runner.resume(tokens + more_tokens, more_spans)   # reuses memory / a checkpoint

Batches: a prompt is decoded in batches of at most n_batch tokens. When the model cannot roll its
memory back to an arbitrary position (sliding-window attention with the small SWA cache, recurrent
or hybrid memory), the runner saves context checkpoints, and batches also end where the policy
says (before some user-message starts) and 4 + n_ubatch and 4 tokens before the prompt's end, so
that checkpoints exist there. Logits are requested for the last prompt token only.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import InputError, ModelError
from .checkpoints import Checkpoint, CheckpointStore
from .policies import BatchPolicy, BreakContext, get_policy
from .report import CheckpointRecord, DecodeCall, PrefillReport

_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
# ggml_type ids of the KV cache types llama.cpp accepts (ggml.h).
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
_STATE_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
_SEQ = 0


@dataclass(frozen=True)
class PrefillSettings:
    """Everything a PrefillRunner passes to llama.cpp, plus the checkpoint rules.

    `checkpoints`: None = on exactly when the model cannot roll its memory back (llama-server's
    rule); True/False force it. `swa_full`: allocate the full-size sliding-window cache, which
    can roll back and needs no checkpoints (llama-cpp-python's `Llama` default); False is
    llama-server's default. `repack`: let llama.cpp repack weights into CPU-specific buffers
    (llama-server's `--no-repack` turns it off); None = on, except on CPUs with AMX, where the
    AMX repacking of llama.cpp in llama-cpp-python 0.3.36 crashes in llama_decode (seen with
    Gemma 3 Q4_K_M, in llama-server too). `poll`: like llama-server, attach a persistent CPU
    threadpool whose idle threads busy-wait at this polling level (llama-server's `--poll`,
    default 50); None leaves ggml's per-graph default threadpool.
    """

    n_ctx: int = 32768
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = False
    repack: bool | None = None
    poll: int | None = 50
    checkpoints: bool | None = None
    max_checkpoints: int = 32
    checkpoint_min_step: int = 8192
    policy: str = "gated"

    def __post_init__(self):
        for name in ("n_ctx", "n_batch", "n_ubatch", "max_checkpoints"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.poll is not None and not 0 <= self.poll <= 100:
            raise InputError(f"poll must be between 0 and 100, got {self.poll}")
        if self.checkpoint_min_step < 0:
            raise InputError(f"checkpoint_min_step must be >= 0, got {self.checkpoint_min_step}")
        if self.flash_attn not in _FLASH_ATTN:
            raise InputError(f"flash_attn must be one of {', '.join(_FLASH_ATTN)}, got {self.flash_attn!r}")
        for name in ("cache_type_k", "cache_type_v"):
            if getattr(self, name) not in CACHE_TYPES:
                raise InputError(f"{name} must be one of {', '.join(CACHE_TYPES)}, got {getattr(self, name)!r}")
        get_policy(self.policy)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ModelInfo:
    path: str
    n_vocab: int
    n_ctx: int
    n_swa: int
    is_recurrent: bool
    is_hybrid: bool
    seq_rm: str  # "part", "full" (whole sequences only), "rs" (bounded), "none"
    can_roll_back: bool
    add_bos: bool
    chat_template: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["chat_template"] = bool(self.chat_template)
        return d


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


def _attach_threadpool(llama_cpp, ctx, n_threads: int, n_threads_batch: int, poll: int | None):
    """Attach persistent threadpools to `ctx` (llama.cpp's common_threadpools::init); returns them."""
    libs = _ggml_libs(llama_cpp) if poll is not None else None
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
    return (cpu, pool, batch)


def _free_threadpool(tp) -> None:
    if tp:
        cpu, pool, batch = tp
        cpu.ggml_threadpool_free(pool)
        if batch:
            cpu.ggml_threadpool_free(batch)


# ---- llama.cpp log capture (process-wide; llama.cpp has one log callback) -----------------------

_LOG_LINES: deque[tuple[int, str]] = deque(maxlen=40)
_LOG_CB = None
_BACKEND_READY = False


def _ensure_backend(llama_cpp) -> None:
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


def _log_cause(default: str) -> str:
    """The first error llama.cpp logged since the last clear (its own words, one line)."""
    errors = [text for level, text in _LOG_LINES if level == 4] or [text for _, text in _LOG_LINES]
    cause = errors[0] if errors else default
    head, sep, rest = cause.partition(": ")
    if sep and " " not in head:  # drop the C function name prefix
        cause = rest
    return " ".join(cause.split())[:300]


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError("llama-cpp-python is not installed; run `pip install 'tmplkit[llama]'`") from exc
    return llama_cpp


class PrefillRunner:
    """Prefill prompts on one llama.cpp model and context, with context checkpoints.

    Holds the memory of the last prompt it processed (and its checkpoints), so `resume()` can
    continue from the longest common prefix. Use as a context manager or call `close()`.
    """

    def __init__(self, model_path: str | os.PathLike, settings: PrefillSettings | None = None, **overrides):
        self.settings = replace(settings or PrefillSettings(), **overrides)
        self._llama_cpp = _import_llama_cpp()
        self._model = None
        self._ctx = None
        self._batch = None
        self.model_path = str(model_path)
        self._tokens: list[int] = []
        self._tokenizer = None
        self._run_id = 0
        self._load()
        self.store = CheckpointStore(self.settings.max_checkpoints, self.settings.checkpoint_min_step)

    # ---- set-up -------------------------------------------------------------------------------

    def _load(self) -> None:
        lc = self._llama_cpp
        s = self.settings
        path = Path(self.model_path)
        if not path.is_file():
            raise ModelError(f"model file not found: {path}")
        _ensure_backend(lc)
        _LOG_LINES.clear()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = s.n_gpu_layers
        self.repack = effective_repack(s.repack)
        mparams.use_extra_bufts = self.repack
        model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not model:
            raise ModelError(f"llama.cpp cannot load {path}: {_log_cause('not a valid GGUF model')}")
        self._model = model
        threads = s.n_threads or max(1, os.cpu_count() or 1)
        self.n_threads = threads
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = s.n_ctx
        cparams.n_batch = s.n_batch
        cparams.n_ubatch = min(s.n_ubatch, s.n_batch)
        cparams.n_seq_max = 1
        # one output (the last prompt token's logits), as llama-server reserves: with the default
        # (n_batch outputs) the compute buffer is sized for n_ubatch x n_vocab logits: 515 MiB
        # instead of 51 for Gemma 3 270M, 297 instead of 34 for the tiny qwen35 model.
        cparams.n_outputs_max = 1
        cparams.n_outputs_max_per_seq = 1
        cparams.n_threads = threads
        cparams.n_threads_batch = s.n_threads_batch or threads
        cparams.flash_attn_type = _FLASH_ATTN[s.flash_attn]
        cparams.type_k = CACHE_TYPES[s.cache_type_k]
        cparams.type_v = CACHE_TYPES[s.cache_type_v]
        cparams.swa_full = s.swa_full
        cparams.embeddings = False
        cparams.no_perf = True
        ctx = lc.llama_init_from_model(model, cparams)
        if not ctx:
            self.close()
            raise ModelError(f"llama.cpp cannot create a context for {path.name} with n_ctx={s.n_ctx}: "
                             f"{_log_cause('context creation failed')}")
        self._ctx = ctx
        self._threadpool = _attach_threadpool(lc, ctx, threads, cparams.n_threads_batch, s.poll)
        self._mem = lc.llama_get_memory(ctx)
        vocab = lc.llama_model_get_vocab(model)
        n_swa_model = int(lc.llama_model_n_swa(model))
        seq_rm = self._probe_seq_rm()
        n_swa = 0 if s.swa_full else n_swa_model
        can_roll_back = seq_rm == "part" and n_swa == 0
        tmpl = lc.llama_model_chat_template(model, None)
        self.info = ModelInfo(
            path=str(path),
            n_vocab=int(lc.llama_vocab_n_tokens(vocab)),
            n_ctx=int(lc.llama_n_ctx(ctx)),
            n_swa=n_swa,
            is_recurrent=bool(lc.llama_model_is_recurrent(model)),
            is_hybrid=bool(lc.llama_model_is_hybrid(model)),
            seq_rm=seq_rm,
            can_roll_back=can_roll_back,
            add_bos=bool(lc.llama_vocab_get_add_bos(vocab)),
            chat_template=tmpl.decode("utf-8", "replace") if tmpl else None,
        )
        self.checkpointing = (not can_roll_back) if s.checkpoints is None else bool(s.checkpoints)
        if self.checkpointing and seq_rm == "none":
            self.checkpointing = False
        self._batch = lc.llama_batch_init(s.n_batch, 0, 1)
        b = self._batch
        n = s.n_batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(n,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self._b_nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(n,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(n,))
        self._b_nseq[:] = 1
        for i in range(n):
            b.seq_id[i][0] = _SEQ

    def _probe_seq_rm(self) -> str:
        """What kind of rollback the memory supports (llama.cpp's common_context_can_seq_rm)."""
        lc = self._llama_cpp
        if not self._mem:
            return "none"
        if int(lc.llama_n_rs_seq(self._ctx)) > 0:
            return "rs"
        lc.llama_memory_clear(self._mem, True)
        toks = (ctypes.c_int32 * 2)(0, 0)
        ret = lc.llama_decode(self._ctx, lc.llama_batch_get_one(toks, 2))
        try:
            if ret != 0:
                return "none"
            if not lc.llama_memory_seq_rm(self._mem, _SEQ, 1, -1):
                return "full"
            return "part"
        finally:
            lc.llama_memory_clear(self._mem, True)

    def close(self) -> None:
        lc = self._llama_cpp
        if getattr(self, "_tokenizer", None) is not None:
            self._tokenizer.close()
            self._tokenizer = None
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
        _free_threadpool(getattr(self, "_threadpool", None))
        self._threadpool = None
        if self._model:
            lc.llama_model_free(self._model)
            self._model = None
        self.store = CheckpointStore(self.settings.max_checkpoints, self.settings.checkpoint_min_step)
        self._tokens = []

    def __enter__(self) -> "PrefillRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass

    # ---- helpers ------------------------------------------------------------------------------

    @property
    def tokens(self) -> list[int]:
        """The prompt tokens currently in memory."""
        return list(self._tokens)

    @property
    def tokenizer(self):
        """The model's vocabulary as a tmplkit tokenizer (`LlamaCppTokenizer`), sharing the loaded
        model instead of loading the file a second time; closed with the runner."""
        if self._tokenizer is None:
            if not self._model:
                raise ModelError("the runner is closed")
            from ..tokenize import LlamaCppTokenizer

            self._tokenizer = LlamaCppTokenizer.of_model(self._model, self.model_path, add_bos=False)
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Tokenize with the model's vocabulary (control tokens in the text become tokens)."""
        return self.tokenizer.tokenize(text, add_bos=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.detokenize(list(tokens))

    def logits(self) -> np.ndarray:
        """A copy of the logits of the last prompt token of the last run."""
        if not self._tokens:
            raise InputError("no prompt has been processed yet")
        ptr = self._llama_cpp.llama_get_logits_ith(self._ctx, -1)
        if not ptr:
            raise ModelError("llama.cpp returned no logits for the last token")
        return np.ctypeslib.as_array(ptr, shape=(self.info.n_vocab,)).copy()

    def _pos_range(self) -> tuple[int, int]:
        lc = self._llama_cpp
        return int(lc.llama_memory_seq_pos_min(self._mem, _SEQ)), int(lc.llama_memory_seq_pos_max(self._mem, _SEQ))

    def check_prompt(self, tokens: Sequence[int]) -> list[int]:
        """The prompt as a list of ints; InputError if it is empty, too long for n_ctx, or has foreign ids."""
        return self._check(tokens)

    def _check(self, tokens: Sequence[int]) -> list[int]:
        if self._ctx is None:
            raise ModelError("the runner is closed")
        toks = [int(t) for t in tokens]
        if not toks:
            raise InputError("the prompt is empty")
        if len(toks) > self.info.n_ctx:
            raise InputError(f"the prompt has {len(toks)} tokens, more than the context size n_ctx={self.info.n_ctx}; "
                             f"raise n_ctx or shorten the session")
        bad = next((t for t in toks if not 0 <= t < self.info.n_vocab), None)
        if bad is not None:
            raise InputError(f"token id {bad} is outside the model's vocabulary of {self.info.n_vocab}")
        return toks

    def _reset(self) -> None:
        _LOG_LINES.clear()
        self._llama_cpp.llama_memory_clear(self._mem, True)
        self._tokens = []
        self.store.clear()

    # ---- the work -----------------------------------------------------------------------------

    def run(self, tokens: Sequence[int], spans=None, policy: str | BatchPolicy | None = None,
            progress: Callable[[int, int], None] | None = None) -> PrefillReport:
        """Prefill `tokens` from an empty memory; `spans` (user starts) drive the batch policy."""
        toks = self._check(tokens)
        pol = get_policy(policy or self.settings.policy)
        t0 = time.perf_counter()
        self._reset()
        self._run_id += 1
        return self._prefill(toks, 0, spans, pol, t0, None, 0.0, progress)

    def resume(self, tokens: Sequence[int], spans=None, policy: str | BatchPolicy | None = None,
               progress: Callable[[int, int], None] | None = None) -> PrefillReport:
        """Prefill `tokens`, reusing the memory of the previous prompt as llama-server does.

        The common prefix is kept; where the memory cannot be rolled back to its end (the
        sliding window has moved on), the newest usable checkpoint is restored and everything
        after it is recomputed; with none usable, the whole prompt is.
        """
        toks = self._check(tokens)
        pol = get_policy(policy or self.settings.policy)
        lc = self._llama_cpp
        t0 = time.perf_counter()
        self._run_id += 1
        held = self._tokens
        n_past = 0
        limit = min(len(held), len(toks))
        while n_past < limit and held[n_past] == toks[n_past]:
            n_past += 1
        restored = None
        pos_next = n_past
        has_new = n_past < len(toks)
        pos_min_thold = max(0, pos_next - self.info.n_swa - (0 if has_new else 1))
        if 0 < n_past <= len(held):
            pos_min, _ = self._pos_range()
            if pos_min >= pos_min_thold:
                ck = self.store.find_restorable(pos_next, pos_min_thold) if self.checkpointing else None
                if ck is not None:
                    r0 = time.perf_counter()
                    buf = (ctypes.c_uint8 * ck.size).from_buffer_copy(ck.data)
                    got = lc.llama_state_seq_set_data_ext(self._ctx, buf, ck.size, _SEQ, _STATE_PARTIAL)
                    if got != ck.size:
                        self._reset()
                        raise ModelError(f"restoring the checkpoint at {ck.n_tokens} tokens failed "
                                         f"({got} of {ck.size} bytes read): {_log_cause('state size mismatch')}")
                    restored = CheckpointRecord(ck.n_tokens, ck.pos_min, ck.pos_max, ck.size,
                                                time.perf_counter() - r0, "restored")
                    pos_next = min(pos_next, max(ck.pos_min + 1, ck.pos_max))
                    n_past = min(pos_next, ck.n_tokens)
                else:
                    pos_next = 0
                    n_past = 0
        self.store.drop_after(pos_next)
        if n_past == len(toks) and n_past > 0:
            n_past -= 1  # at least one token is decoded, so its logits exist
        if n_past == 0:
            lc.llama_memory_clear(self._mem, True)  # (a checkpoint ending at position 0 stays, as in llama-server)
        elif not lc.llama_memory_seq_rm(self._mem, _SEQ, n_past, -1):
            self._reset()
            raise ModelError(f"llama.cpp could not remove positions {n_past}.. from memory: {_log_cause('seq_rm failed')}")
        self._tokens = toks[:n_past]
        return self._prefill(toks, n_past, spans, pol, t0, restored, time.perf_counter() - t0, progress)

    def _prefill(self, toks: list[int], start: int, spans, pol: BatchPolicy, t0: float,
                 restored: CheckpointRecord | None, restore_seconds: float,
                 progress: Callable[[int, int], None] | None) -> PrefillReport:
        lc = self._llama_cpp
        s = self.settings
        n = len(toks)
        n_batch, n_ubatch = s.n_batch, min(s.n_ubatch, s.n_batch)
        do_ckpt = self.checkpointing
        use_spans = spans if pol.uses_spans else None
        last_user = _last_user(use_spans)
        near = sorted({n - min(n_batch, off) for off in (4 + n_ubatch, 4)} - {0})
        cands = sorted({int(p) for p in pol.candidates(use_spans, n) if 0 < int(p) < n})
        arr = np.asarray(toks, dtype=np.int32)
        calls: list[DecodeCall] = []
        records: list[CheckpointRecord] = []
        n_evicted = 0
        decode_s = ckpt_s = 0.0
        pos = start
        while pos < n:
            begin = pos
            reason = rule = None
            # end of the batch: full, or the first break a rule asks for (llama-server's order:
            # the policy's break before a message start, then the near-end rule)
            end = min(begin + n_batch, n)
            pos = end
            # a checkpoint at a user start this batch begins with (saved before it is decoded)
            last = self.store.last() if do_ckpt else None
            due = do_ckpt and begin > 0 and use_spans is not None and use_spans.is_user_start(begin) and (
                last is None or begin == last_user or begin > last.n_tokens + s.checkpoint_min_step)
            if do_ckpt:
                i = bisect.bisect_right(cands, begin)
                j = bisect.bisect_right(near, begin)
                ctx = BreakContext(use_spans, last_user, last.n_tokens if last else None, s.checkpoint_min_step,
                                   begin if due else None, n_ubatch, begin, min(end, near[j]) if j < len(near) else end,
                                   n_ubatch)
                while True:
                    c = cands[i] if i < len(cands) else n
                    e = near[j] if j < len(near) else n
                    p = min(c, e)
                    if p >= end:
                        break
                    if c == p:
                        rule = pol.break_before(p, ctx)
                        if rule is not None:
                            pos, reason = p, pol.reason
                            break
                        i += 1
                    if e == p:
                        pos, reason = p, "near end"
                        break
            size = pos - begin
            if pos == n:
                reason, rule = "end", None
            elif size == n_batch and reason is None:
                reason = "full"
            elif size == n_batch:
                reason, rule = "full", None  # the batch was full anyway; the rule cost nothing
            # checkpoint before decoding the batch: the state after `begin` tokens, at a user start
            # where one is due, or near the end (the last batch always is)
            if do_ckpt and begin > 0:
                near_end = n < pos + n_ubatch
                if due or near_end:
                    pmin, pmax = self._pos_range()
                    if pmin >= 0:
                        c0 = time.perf_counter()
                        size_b = int(lc.llama_state_seq_get_size_ext(self._ctx, _SEQ, _STATE_PARTIAL))
                        buf = (ctypes.c_uint8 * size_b)()
                        got = int(lc.llama_state_seq_get_data_ext(self._ctx, buf, size_b, _SEQ, _STATE_PARTIAL))
                        if got != size_b:
                            self._reset()
                            raise ModelError(f"saving a checkpoint at {begin} tokens failed ({got} of {size_b} bytes)")
                        ck = Checkpoint(begin, pmin, pmax, bytes(buf), self._run_id)
                        dt = time.perf_counter() - c0
                        ckpt_s += dt
                        n_evicted += len(self.store.add(ck))
                        why = "near end" if near_end else ("last user message" if begin == last_user else "user start")
                        records.append(CheckpointRecord(begin, pmin, pmax, size_b, dt, why))
            # decode
            self._b_token[:size] = arr[begin:pos]
            self._b_pos[:size] = np.arange(begin, pos, dtype=np.int32)
            self._b_logits[:size] = 0
            if pos == n:
                self._b_logits[size - 1] = 1
            self._batch.n_tokens = size
            d0 = time.perf_counter()
            ret = lc.llama_decode(self._ctx, self._batch)
            if ret == 0:
                lc.llama_synchronize(self._ctx)
            dt = time.perf_counter() - d0
            if ret != 0:
                self._reset()
                raise ModelError(_decode_error(ret, begin, size, self.info.n_ctx))
            decode_s += dt
            self._tokens.extend(toks[begin:pos])
            calls.append(DecodeCall(begin, size, reason, dt, rule))
            if progress is not None:
                progress(pos, n)
        seconds = time.perf_counter() - t0
        return PrefillReport(
            model=self.model_path,
            policy=pol.name,
            checkpointing=do_ckpt,
            n_prompt=n,
            n_reused=start,
            n_processed=n - start,
            seconds=seconds,
            decode_seconds=decode_s,
            checkpoint_seconds=ckpt_s,
            decode_calls=tuple(calls),
            checkpoints=tuple(records),
            restored=restored,
            restore_seconds=restore_seconds,
            n_evicted=n_evicted,
            user_starts=tuple(_user_starts(spans)),
            settings={**self.settings.to_dict(), "policy": pol.name, "n_ctx_actual": self.info.n_ctx,
                      "n_threads": self.n_threads, "repack": self.repack, "threadpool": self._threadpool is not None,
                      "n_swa": self.info.n_swa, "seq_rm": self.info.seq_rm},
        )


def _last_user(spans) -> int:
    if spans is None:
        return -1
    pos = spans.last_user_start()
    return -1 if pos is None else int(pos)


def _user_starts(spans) -> list[int]:
    """Positions of the user spans of a span value (tmplkit Spans or any iterable of (role, pos, len))."""
    if spans is None:
        return []
    if hasattr(spans, "starts"):
        return [int(p) for p in spans.starts("user")]
    return [int(s[1]) for s in spans if s[0] == "user"]


def _decode_error(ret: int, begin: int, size: int, n_ctx: int) -> str:
    where = f"llama_decode failed on tokens {begin}..{begin + size - 1}"
    if ret == 1:
        return f"{where}: no memory slot for the batch (the KV cache is full; n_ctx={n_ctx}); raise n_ctx or lower n_batch"
    if ret == 2:
        return f"{where}: aborted"
    if ret == -1:
        return f"{where}: invalid input batch ({_log_cause('bad batch')})"
    return f"{where}: compute error {ret} ({_log_cause('compute error')})"
