"""llama-server's prompt cache as a pure simulation over token positions.

`PrefillRunner.resume` and `PrefillRunner._prefill` decide, request by request, how much of the
held memory is reused, which checkpoint is restored, where batches end and where checkpoints are
saved. This module makes the same decisions without a model, so the recompute of a session can be
predicted for any template, delimiter set and policy, and checked against a replay.

No rule is repeated here: where batches end and which start with a checkpoint is the runner's
own `BatchSchedule`, the checkpoint store (`CheckpointStore.add/find_restorable/drop_after`) is
the runner's too, and so is the choice of the prefix to keep (`plan_resume`); all of them are
`tmplkit.server_rules`.

The only thing about the model it needs is `MemoryModel`: whether the memory can roll back, and
which positions it still holds after n tokens (the sliding-window cache keeps the last
`swa_cells` positions; a recurrent state only the newest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError
from ..markup import lcp as common_prefix
from ..server_rules import BatchSchedule, Checkpoint, CheckpointStore, PlannedBatch, check_field_types, get_policy, plan_resume

# The largest sliding window: llama.cpp counts positions in int32.
_MAX_WINDOW = 2**31 - 1

__all__ = ["MemoryModel", "SimulatedRequest", "ServerSimulation", "plan_batches"]


@dataclass(frozen=True)
class MemoryModel:
    """What the simulation needs to know of a model's memory.

    `kind`: "full" (attention over the whole context; rolls back anywhere), "swa" (a sliding
    window of `n_swa` positions in a cache of `swa_cells` cells) or "recurrent".
    """

    kind: str = "full"
    n_swa: int = 0
    swa_cells: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        # (a kind it does not know would be simulated as full attention, silently)
        if self.kind not in ("full", "swa", "recurrent"):
            raise InputError(f"unknown memory kind {self.kind!r}; give full, swa or recurrent")
        if self.kind == "swa" and not 0 < self.n_swa <= self.swa_cells:
            raise InputError(f"a sliding window needs 0 < n_swa <= swa_cells, got n_swa={self.n_swa}, "
                             f"swa_cells={self.swa_cells}; MemoryModel.swa(n_swa) sizes the cells as llama.cpp does")

    @property
    def checkpointing(self) -> bool:
        return self.kind != "full"

    def pos_min(self, n_tokens: int) -> int:
        """The oldest position held after `n_tokens` tokens (-1: none)."""
        if n_tokens <= 0:
            return -1
        if self.kind == "swa":
            return max(0, n_tokens - self.swa_cells)
        if self.kind == "recurrent":
            return n_tokens - 1
        return 0

    @classmethod
    def swa(cls, n_swa: int, n_ubatch: int = 512) -> MemoryModel:
        """llama.cpp's small SWA cache: n_swa + n_ubatch cells, padded to 256 (llama-kv-cache-iswa.cpp)."""
        return cls("swa", n_swa, -(-(n_swa + n_ubatch) // 256) * 256)

    @classmethod
    def parse(cls, spec: str, n_ubatch: int = 512) -> MemoryModel:
        """"swa:N" (a sliding window of N), "recurrent" or "full"; InputError otherwise."""
        kind, _, arg = spec.partition(":")
        if kind == "swa" and arg.isascii() and arg.isdigit() and arg.strip("0"):
            if len(arg.lstrip("0")) > 10 or int(arg.lstrip("0")) > _MAX_WINDOW:  # (a long digit string is not converted at all)
                raise InputError(f"memory model {spec[:24]!r}{'...' if len(spec) > 24 else ''}: a window of more than "
                                 f"{_MAX_WINDOW} positions, more than llama.cpp holds; give swa:N with a model's window")
            return cls.swa(int(arg.lstrip("0")), n_ubatch)
        if kind in ("recurrent", "full") and not arg:
            return cls(kind)
        if kind == "swa" and arg.isascii() and arg.isdigit():
            raise InputError(f"memory model {spec!r}: a window of 0 positions holds nothing; give swa:N with the "
                             "model's window (e.g. swa:512, Gemma 3)")
        raise InputError(f"unknown memory model {spec!r}; give swa:N (e.g. swa:512, Gemma 3), recurrent or full")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "n_swa": self.n_swa, "swa_cells": self.swa_cells}


def plan_batches(n: int, start: int, spans, policy, settings, store: CheckpointStore | None, run_id: int = 0,
                 memory: MemoryModel | None = None) -> list[PlannedBatch]:
    """The batches `PrefillRunner._prefill` decodes for a prompt of `n` tokens from `start`, from the
    same `BatchSchedule`; `store` (None: no checkpoints) receives the checkpoints saved on the way,
    as the runner adds them, with pos_min/pos_max from `memory`.
    """
    pol = get_policy(policy)
    memory = memory or MemoryModel()
    sched = BatchSchedule(pol, spans, n, n_batch=settings.n_batch, n_ubatch=min(settings.n_ubatch, settings.n_batch),
                          min_step=settings.checkpoint_min_step, checkpointing=store is not None)
    out, pos = [], start
    while pos < n:
        last = store.last() if store is not None else None
        batch = sched.next_batch(pos, last.n_tokens if last else None)
        if store is not None and batch.checkpoint is not None and batch.begin > 0:
            store.add(Checkpoint(batch.begin, memory.pos_min(batch.begin), batch.begin - 1, b"", run_id))
        out.append(batch)
        pos = batch.end
    return out


@dataclass(frozen=True)
class SimulatedRequest:
    """One request as the server processes it: reused, restored from, recomputed.

    `back`: how far before the divergence the server resumes (tokens it held and computes again);
    `full_reprocess`: it held a prefix of the prompt but could use neither its memory nor a
    checkpoint, and processes the whole prompt again; `batch_starts`: where each batch began.
    """

    n_prompt: int
    n_reused: int
    n_recomputed: int
    restored: int | None  # n_tokens of the restored checkpoint
    n_common: int         # the common prefix of the prompt and the held tokens
    checkpoints: tuple[int, ...] = ()
    full_reprocess: bool = False
    batch_starts: tuple[int, ...] = ()

    @property
    def back(self) -> int:
        return max(0, min(self.n_common, self.n_prompt) - self.n_reused)

    def to_dict(self) -> dict:
        return {"n_prompt": self.n_prompt, "n_reused": self.n_reused, "n_recomputed": self.n_recomputed,
                "restored": self.restored, "n_common": self.n_common, "back": self.back,
                "full_reprocess": self.full_reprocess, "checkpoints": list(self.checkpoints),
                "batch_starts": list(self.batch_starts)}


class ServerSimulation:
    """A slot's memory and checkpoints across requests, as `PrefillRunner.resume` keeps them.

        >>> sim = ServerSimulation(MemoryModel.swa(512), PrefillSettings())       # doctest: +SKIP
        >>> sim.resume(tokens, spans, "gated").n_recomputed                        # doctest: +SKIP
    """

    def __init__(self, memory: MemoryModel, settings):
        self.memory = memory
        self.settings = settings
        self.store = CheckpointStore(settings.max_checkpoints, settings.checkpoint_min_step) if memory.checkpointing else None
        # what the slot holds, in parts: a prompt's ids, then each turn generated after it (kept as
        # given, not joined: a long session's simulation copied its whole history twice a request)
        self._held: tuple[Sequence[int], ...] = ()
        self.run_id = 0

    @property
    def held(self) -> list[int]:
        """The ids the slot holds."""
        return [t for part in self._held for t in part]

    def resume(self, tokens, spans=None, policy="gated", *, n_common: int | None = None) -> SimulatedRequest:
        """Prefill `tokens` after what the slot holds: the resume plan the runner follows too.
        `n_common`: the common prefix of what it holds and `tokens`, where the caller knows it."""
        toks = tokens if isinstance(tokens, tuple) else tuple(tokens)
        n_held = sum(len(part) for part in self._held)
        self.run_id += 1
        if n_common is None:
            n_common = common_prefix(self.held, list(toks))
        # (given `n_common`, plan_resume reads what is held for its length only)
        plan = plan_resume(range(n_held), toks, pos_min=self.memory.pos_min(n_held), n_swa=self.memory.n_swa, store=self.store,
                           n_common=n_common)
        if self.store is not None:
            self.store.drop_after(plan.pos_next)
        n_past = plan.n_past
        batches = plan_batches(len(toks), n_past, spans, policy, self.settings, self.store, self.run_id, self.memory)
        self._held = (toks,)
        new = tuple(b.begin for b in batches if b.checkpoint is not None and b.begin > 0)
        restored = plan.restore.n_tokens if plan.restore is not None else None
        return SimulatedRequest(len(toks), n_past, len(toks) - n_past, restored, plan.n_common, new, plan.reset,
                                tuple(b.begin for b in batches))

    def generate(self, tokens) -> None:
        """The generated turn, decoded after the prompt (no checkpoints are saved while generating)."""
        self._held += (tokens if isinstance(tokens, tuple) else tuple(tokens),)
