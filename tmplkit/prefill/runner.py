"""A checkpointing prefill runner on llama-cpp-python's low-level API, following llama-server.

    >>> from tmplkit.prefill import PrefillRunner
    >>> with PrefillRunner("gemma-3-270m.gguf", n_ctx=32768, n_threads=2) as runner:   # doctest: +SKIP
    ...     report = runner.run(tokens, spans, policy="gated")
    ...     report.tokens_per_second, report.n_decode_calls
    ...     runner.decode_generated(answer_tokens)                   # the model's reply, as llama-server decodes it
    ...     later = runner.resume(tokens + more_tokens, more_spans)   # reuses memory / a checkpoint

Batches: a prompt is decoded in batches of at most n_batch tokens. When the model cannot roll its
memory back to an arbitrary position (sliding-window attention with the small SWA cache, recurrent
or hybrid memory), the runner saves context checkpoints, and batches also end where the policy
says (before some user-message starts) and 4 + n_ubatch and 4 tokens before the prompt's end, so
that checkpoints exist there. Logits are requested for the last prompt token only.

Where batches end and when a checkpoint is saved is `server_rules.BatchSchedule`'s decision (with
the rule in `checkpoint_due`), and what a resumed prompt reuses is `server_rules.plan_resume`'s;
llama.cpp's set-up and the batch are in `_llama`; this module decodes, saves and restores
checkpoints, and reports.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import InputError, ModelError
from ..server_rules import (
    BatchPolicy,
    BatchSchedule,
    Checkpoint,
    CheckpointStore,
    PlannedBatch,
    PrefillSettings,
    get_policy,
    plan_resume,
    user_starts,
)
from ..tokens.tokenizers import LlamaCppTokenizer, fewest_tokens, utf8
from ._llama import (
    SEQ,
    Context,
    Model,
    Threadpool,
    TokenBatch,
    bytes_per_cell,
    clear_log,
    effective_repack,
    ensure_backend,
    import_llama_cpp,
    log_cause,
)
from .report import CheckpointRecord, DecodeCall, GenerationReport, PrefillReport

__all__ = ["ModelInfo", "PrefillRunner"]


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


class PrefillRunner:
    """Prefill prompts on one llama.cpp model and context, with context checkpoints.

    Holds the memory of the last prompt it processed (and its checkpoints), so `resume()` can
    continue from the longest common prefix. Use as a context manager or call `close()`.
    """

    def __init__(self, model_path: str | os.PathLike, settings: PrefillSettings | None = None, **overrides):
        s = replace(settings or PrefillSettings(), **overrides)
        # llama.cpp cuts the batch to the context and the ubatch to the batch (llama_context's
        # constructor): the settings hold, and the reports show, the sizes used
        self.settings = replace(s, n_batch=min(s.n_batch, s.n_ctx), n_ubatch=min(s.n_ubatch, s.n_batch, s.n_ctx))
        self._llama_cpp = import_llama_cpp()
        self._handles = contextlib.ExitStack()  # frees the llama.cpp handles, users before what they use
        self._model: Model | None = None
        self._ctx: Context | None = None
        self._batch: TokenBatch | None = None
        self._threadpool: Threadpool | None = None
        self.model_path = str(model_path)
        self._tokens: list[int] = []
        self._tokenizer: LlamaCppTokenizer | None = None
        self._run_id = 0
        self.store = CheckpointStore(self.settings.max_checkpoints, self.settings.checkpoint_min_step)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # ---- set-up -------------------------------------------------------------------------------

    def _load(self) -> None:
        """Load the model, create its context, attach a threadpool and make the batch, each handle
        freed by `close()` in the reverse order: batch, context, threadpool, model."""
        path = Path(self.model_path)
        if not path.is_file():
            raise ModelError(f"model file not found: {path}")
        lc, s = self._llama_cpp, self.settings
        ensure_backend(lc)
        clear_log()
        self.repack = effective_repack(s.repack)
        self._model = model = Model(lc, path, n_gpu_layers=s.n_gpu_layers, repack=self.repack)
        self._handles.callback(model.free)
        _check_memory(s, bytes_per_cell(lc, model, s))  # before the context allocates its cache
        self.n_threads = s.n_threads or max(1, os.cpu_count() or 1)
        self._ctx = ctx = Context(lc, model, s, n_threads=self.n_threads, name=path.name)
        self._threadpool = Threadpool.attach(lc, ctx.ctx, self.n_threads, s.n_threads_batch or self.n_threads, s.poll)
        if self._threadpool is not None:
            self._handles.callback(self._threadpool.free)  # after the context it is attached to
        self._handles.callback(ctx.free)
        self.info = self._describe(path, model, ctx)
        self.checkpointing = (not self.info.can_roll_back) if s.checkpoints is None else bool(s.checkpoints)
        if self.checkpointing and self.info.seq_rm == "none":
            self.checkpointing = False
        self._batch = batch = TokenBatch(lc, s.n_batch, SEQ)
        self._handles.callback(batch.free)

    def _describe(self, path: Path, model: Model, ctx: Context) -> ModelInfo:
        seq_rm = ctx.rollback()
        n_swa = 0 if self.settings.swa_full else model.n_swa
        return ModelInfo(path=str(path), n_vocab=model.n_vocab, n_ctx=ctx.n_ctx, n_swa=n_swa, is_recurrent=model.is_recurrent,
                         is_hybrid=model.is_hybrid, seq_rm=seq_rm, can_roll_back=seq_rm == "part" and n_swa == 0,
                         add_bos=model.add_bos, chat_template=model.chat_template())

    def close(self) -> None:
        """Free everything, users before what they use: tokenizer, batch, context, threadpool, model."""
        handles = getattr(self, "_handles", None)
        if handles is not None:
            handles.close()  # (closing twice frees nothing twice)
        self._tokenizer = self._batch = self._ctx = self._threadpool = self._model = None
        self.store = CheckpointStore(self.settings.max_checkpoints, self.settings.checkpoint_min_step)
        self._tokens = []

    def __enter__(self) -> PrefillRunner:
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
        """The tokens currently in memory (the last prompt, and any decoded after it)."""
        return list(self._tokens)

    @property
    def tokenizer(self):
        """The model's vocabulary as a tmplkit tokenizer (`LlamaCppTokenizer`), sharing the loaded
        model instead of loading the file a second time; closed with the runner."""
        if self._tokenizer is None:
            if self._model is None:
                raise ModelError("the runner is closed")
            self._tokenizer = tok = LlamaCppTokenizer.of_model(self._model.model, self.model_path, add_bos=False)
            self._handles.callback(tok.close)  # first of all: it reads the model's vocabulary
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Tokenize with the model's vocabulary (control tokens in the text become tokens)."""
        return self.tokenizer.tokenize(text, add_bos=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.detokenize(list(tokens))

    def logits(self) -> np.ndarray:
        """A copy of the logits of the last token decoded (the last prompt token after a prefill)."""
        if not self._tokens:
            raise InputError("no prompt has been processed yet")
        logits = self._context.logits(self.info.n_vocab)
        if logits is None:
            raise ModelError("llama.cpp returned no logits for the last token")
        return logits

    @property
    def _context(self) -> Context:
        if self._ctx is None:
            raise ModelError("the runner is closed")
        return self._ctx

    def check_text(self, text: str, what: str = "the prompt") -> None:
        """InputError where `text` cannot fit n_ctx however it tokenizes (`fewest_tokens`): asked
        before tokenizing a render, which for a text of tens of millions of tokens takes minutes."""
        least = fewest_tokens(self.tokenizer, text)
        n_ctx = min(self.settings.n_ctx, self.info.n_ctx)
        if least > n_ctx:
            raise InputError(f"{what} has at least {least} tokens (its {len(utf8(text))} bytes, at most "
                             f"{self.tokenizer.max_token_bytes()} to a token), more than the context size n_ctx={n_ctx}; "
                             f"raise n_ctx (-c) to at least {least} or shorten the session")

    def check_prompt(self, tokens: Sequence[int]) -> list[int]:
        """The prompt as a list of ints; InputError if it is empty, too long for n_ctx, or has foreign ids."""
        return self._check(tokens)

    def _check(self, tokens: Sequence[int], n_held: int = 0, what: str = "the prompt") -> list[int]:
        """`tokens` as ints, checked to be non-empty, within the vocabulary, and to fit n_ctx after
        `n_held` tokens already in memory."""
        if self._ctx is None:
            raise ModelError("the runner is closed")
        toks = _ids(tokens, what)
        if not toks:
            raise InputError(f"{what} is empty")
        n_ctx = min(self.settings.n_ctx, self.info.n_ctx)  # the size asked: llama.cpp pads the context, not the batch
        if n_held + len(toks) > n_ctx:
            has = f"{what} has {len(toks)} tokens" + (f" after {n_held} in memory" if n_held else "")
            raise InputError(f"{has}, more than the context size n_ctx={n_ctx}; "
                             f"raise n_ctx (-c) to at least {n_held + len(toks)} or shorten the session")
        bad = next((t for t in toks if not 0 <= t < self.info.n_vocab), None)
        if bad is not None:
            raise InputError(f"token id {bad} is outside the model's vocabulary of {self.info.n_vocab}")
        return toks

    def _reset(self) -> None:
        clear_log()
        self._context.clear()
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
        t0 = time.perf_counter()
        self._run_id += 1
        n_past, restored = self._keep_prefix(toks)
        self._tokens = toks[:n_past]
        return self._prefill(toks, n_past, spans, pol, t0, restored, time.perf_counter() - t0, progress)

    def _keep_prefix(self, toks: list[int]) -> tuple[int, CheckpointRecord | None]:
        """Cut the memory back to what `toks` can reuse, as the resume plan says (llama-server's
        prompt-cache rule, `server_rules.plan_resume`); returns the tokens kept and the checkpoint
        restored, if any."""
        ctx = self._context
        plan = plan_resume(self._tokens, toks, pos_min=ctx.pos_range()[0], n_swa=self.info.n_swa,
                           store=self.store if self.checkpointing else None)
        restored = self._restore_checkpoint(plan.restore) if plan.restore is not None else None
        self.store.drop_after(plan.pos_next)
        n_past = plan.n_past
        if n_past == 0:
            ctx.clear()  # (a checkpoint ending at position 0 stays, as in llama-server)
        elif not ctx.remove_from(n_past):
            self._reset()
            raise ModelError(f"llama.cpp could not remove positions {n_past}.. from memory: {log_cause('seq_rm failed')}")
        return n_past, restored

    def _prefill(self, toks: list[int], start: int, spans, pol: BatchPolicy, t0: float,
                 restored: CheckpointRecord | None, restore_seconds: float,
                 progress: Callable[[int, int], None] | None) -> PrefillReport:
        """Decode toks[start:] batch by batch as the schedule says, saving the checkpoints it asks for."""
        s = self.settings
        n = len(toks)
        schedule = BatchSchedule(pol, spans, n, n_batch=s.n_batch, n_ubatch=min(s.n_ubatch, s.n_batch),
                                 min_step=s.checkpoint_min_step, checkpointing=self.checkpointing)
        arr = np.asarray(toks, dtype=np.int32)
        calls: list[DecodeCall] = []
        records: list[CheckpointRecord] = []
        n_evicted = 0
        pos = start
        while pos < n:
            last = self.store.last() if self.checkpointing else None
            batch = schedule.next_batch(pos, last.n_tokens if last else None)
            if batch.checkpoint is not None:
                saved = self._save_checkpoint(batch)
                if saved is not None:
                    records.append(saved[0])
                    n_evicted += saved[1]
            seconds = self._decode(arr[batch.begin:batch.end], batch.begin, logits_last=batch.end == n)
            self._tokens.extend(toks[batch.begin:batch.end])
            calls.append(DecodeCall(batch.begin, batch.size, batch.reason, seconds, batch.rule))
            pos = batch.end
            if progress is not None:
                progress(pos, n)
        return PrefillReport(
            model=self.model_path, policy=pol.name, checkpointing=self.checkpointing, n_prompt=n, n_reused=start,
            n_processed=n - start, seconds=time.perf_counter() - t0, decode_seconds=sum(c.seconds for c in calls),
            checkpoint_seconds=sum(r.seconds for r in records), decode_calls=tuple(calls), checkpoints=tuple(records),
            restored=restored, restore_seconds=restore_seconds, n_evicted=n_evicted,
            user_starts=tuple(user_starts(spans)), settings=self._report_settings(pol))

    def _report_settings(self, pol: BatchPolicy) -> dict:
        return {**self.settings.to_dict(), "policy": pol.name, "n_ctx_actual": self.info.n_ctx,
                "n_threads": self.n_threads, "repack": self.repack, "threadpool": self._threadpool is not None,
                "n_swa": self.info.n_swa, "seq_rm": self.info.seq_rm}

    def _decode(self, tokens: np.ndarray, pos0: int, logits_last: bool) -> float:
        """One llama_decode call of `tokens` at positions pos0...; its seconds (to the end of the
        computation). A failure resets the runner and raises ModelError."""
        assert self._batch is not None, "the runner is closed"
        self._batch.set(tokens, pos0, logits_last)
        d0 = time.perf_counter()
        ret = self._context.decode(self._batch)
        dt = time.perf_counter() - d0
        if ret != 0:
            self._reset()
            raise ModelError(_decode_error(ret, pos0, len(tokens), self.info.n_ctx))
        return dt

    def _save_checkpoint(self, batch: PlannedBatch) -> tuple[CheckpointRecord, int] | None:
        """Save the state after batch.begin tokens (before the batch is decoded), as llama-server's
        create_checkpoint; returns its record and how many checkpoints it evicted, or None when
        the memory holds nothing yet."""
        assert batch.checkpoint is not None, "called only for a batch that asks for a checkpoint"
        pmin, pmax = self._context.pos_range()
        if pmin < 0:
            return None
        c0 = time.perf_counter()
        data, got = self._context.read_state()
        if got != len(data):
            self._reset()
            raise ModelError(f"saving a checkpoint at {batch.begin} tokens failed ({got} of {len(data)} bytes)")
        evicted = self.store.add(Checkpoint(batch.begin, pmin, pmax, data, self._run_id))
        return CheckpointRecord(batch.begin, pmin, pmax, len(data), time.perf_counter() - c0, batch.checkpoint), len(evicted)

    def _restore_checkpoint(self, ck: Checkpoint) -> CheckpointRecord:
        r0 = time.perf_counter()
        got = self._context.write_state(ck.data)
        if got != ck.size:
            self._reset()
            raise ModelError(f"restoring the checkpoint at {ck.n_tokens} tokens failed "
                             f"({got} of {ck.size} bytes read): {log_cause('state size mismatch')}")
        return CheckpointRecord(ck.n_tokens, ck.pos_min, ck.pos_max, ck.size, time.perf_counter() - r0, "restored")

    def decode_generated(self, tokens: Sequence[int]) -> GenerationReport:
        """Decode tokens the model generated after the prompt, teacher-forced, as llama-server does.

        One llama_decode call per token, each with its logits (no sampling: the given tokens are
        decoded as if sampled), and no checkpoint. Afterwards `tokens` (the property) is the prompt
        followed by these tokens, so a later `resume()` reuses them as a common prefix, and the
        memory and checkpoints hold what llama-server's slot would.

        What llama-server does after a prompt (tools/server/server-context.cpp, llama.cpp as
        vendored in llama-cpp-python 0.3.36): checkpoints are created only while a prompt is
        processed (`create_checkpoint` is called from the prompt loop alone), before a batch is
        decoded; so the last one is the near-end checkpoint 4 tokens before the prompt's end, and
        none is taken at the prompt's end itself. Then the slot samples from the last prompt
        token's logits, and each later step decodes the one token it sampled
        (`handle_last_sampled_token`, logits on); no checkpoint is taken while generating
        (speculative decoding keeps its own draft checkpoint, `spec_ckpt`, outside the slot's
        list, never restored by a later request). The token that ends the generation (end of
        turn, a stop string, n_predict reached) is sampled but never decoded: the slot is released
        first. So, to mirror llama-server, pass the generated tokens without that last one.

            >>> runner.run(prompt.tokens, prompt.spans, "gated")        # doctest: +SKIP
            >>> runner.decode_generated(reply[:-1]).n_decode_calls      # doctest: +SKIP
            57
        """
        toks = self._check(tokens, n_held=len(self._tokens), what="the generated turn") if len(tokens) else []
        if not self._tokens:
            raise InputError("no prompt has been processed yet; call run() or resume() first")
        t0 = time.perf_counter()
        calls: list[DecodeCall] = []
        arr = np.asarray(toks, dtype=np.int32)
        for i, tok in enumerate(toks):
            pos = len(self._tokens)
            calls.append(DecodeCall(pos, 1, "generated", self._decode(arr[i:i + 1], pos, logits_last=True)))
            self._tokens.append(tok)
        return GenerationReport(model=self.model_path, n_prompt=len(self._tokens) - len(toks), n_generated=len(toks),
                                seconds=time.perf_counter() - t0, decode_seconds=sum(c.seconds for c in calls),
                                decode_calls=tuple(calls))


def _ids(tokens: Sequence[int], what: str) -> list[int]:
    """`tokens` as a list of ints; InputError for any that is no integer (`int` read 7.5 as 7 and
    "7" as 7, and a word raised a ValueError from inside)."""
    if isinstance(tokens, (str, bytes)):
        raise InputError(f"{what} is a {type(tokens).__name__}, not token ids; tokenize it first (runner.tokenize)")
    try:
        if not isinstance(tokens, (list, tuple, np.ndarray)):
            tokens = list(tokens)  # (an array.array, a generator, a range)
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as exc:  # (no iterable; ragged: lists inside the list)
        raise InputError(f"{what} is not a list of token ids ({exc})") from None
    if arr.ndim != 1:
        raise InputError(f"{what} is not a flat list of token ids (an array of {arr.ndim} dimensions)")
    if arr.dtype.kind == "b" or (arr.dtype.kind in "iu" and not isinstance(tokens, np.ndarray)
                                 and any(t is True or t is False for t in tokens)):
        # (numpy and isinstance read True as 1: a list of flags, a mask given for the ids)
        raise InputError(f"{what} holds a boolean, which is no token id; give integer ids the model's vocabulary made")
    if arr.size and arr.dtype.kind not in "iu":
        bad = next((t for t in tokens if not isinstance(t, (int, np.integer))), None)
        if bad is None:  # (ints past int64: the vocabulary check refuses them)
            return [int(t) for t in tokens]
        raise InputError(f"{what} holds {bad!r}, which is no token id; give integer ids the model's vocabulary made")
    return arr.tolist()


def _check_memory(settings: PrefillSettings, per_cell: int) -> None:
    """Refuse a context that cannot fit this machine's memory (`per_cell` bytes, `_llama.bytes_per_cell`,
    a cell of the n_ctx cells, padded to 256 as llama.cpp pads them), before llama.cpp allocates it."""
    total = machine_memory()
    n_cells = -(-settings.n_ctx // 256) * 256
    if total is None or not per_cell or n_cells * per_cell <= total:
        return
    most = total // per_cell // 256 * 256
    raise InputError(f"n_ctx={settings.n_ctx} needs about {n_cells * per_cell / 2**30:.1f} GiB for the context's cache and "
                     f"attention mask ({per_cell} bytes a token), more than this machine's {total / 2**30:.1f} GiB of "
                     f"memory; give n_ctx (-c) of at most {most}"
                     + (f" or a smaller n_ubatch (-ub, {settings.n_ubatch} now)" if 4 * settings.n_ubatch >= per_cell else ""))


def machine_memory() -> int | None:
    """Bytes of this machine's memory: its physical memory, or less where a control group limits this
    process (cgroup v2 memory.max, v1 memory.limit_in_bytes); None where neither can be read."""
    try:
        found = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    except (ValueError, OSError, AttributeError):
        found = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            found.append(int(Path(path).read_text().strip()))  # ("max": no limit)
    return min(found) if found else None


def _decode_error(ret: int, begin: int, size: int, n_ctx: int) -> str:
    where = f"llama_decode failed on tokens {begin}..{begin + size - 1}"
    if ret == 1:
        return f"{where}: no memory slot for the batch (the KV cache is full; n_ctx={n_ctx}); raise n_ctx or lower n_batch"
    if ret == 2:
        return f"{where}: aborted"
    if ret == -1:
        return f"{where}: invalid input batch ({log_cause('bad batch')})"
    return f"{where}: compute error {ret} ({log_cause('compute error')})"
