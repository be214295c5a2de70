"""Replay an agent session on a model, request by request, as llama-server serves it: above both
the prefill runner (which it drives) and the turns (whose prediction it checks).

For each request: `runner.resume(request tokens, spans, policy)` (the common prefix with what is
held is reused; where the memory cannot roll back, a checkpoint is restored), then the generated
assistant turn is decoded teacher-forced (`runner.decode_generated`), so the memory and the
checkpoints hold what the server's would. Each request's tokens reused, restored checkpoint,
tokens recomputed and seconds are measured, beside the recompute `tmplkit.turns` predicts for the
same setting; they must agree token for token.

    >>> with PrefillRunner(tiny_model_path()) as runner:                              # doctest: +SKIP
    ...     rep = replay_session(runner, session, template)
    >>> rep.matches, rep.total("tmplkit")                                             # doctest: +SKIP
    (True, 11837)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__
from ..atomic import write_bytes_atomic
from ..prefill.plot import require_matplotlib
from ..sources.templates import ChatTemplate
from ..turns import MemoryModel, prepare_session
from ..turns.cost import BASELINES, CHOSEN, baseline_settings, check_settings, default_settings, policy_for, session_cost

__all__ = ["REPLAY_SCHEMA_VERSION", "REPLAYABLE", "REPLAYED", "ReplayedRequest", "SessionReplay", "replay_session", "memory_of", "plot_replay",
           "replay_png"]

# The JSON's layout (tmplkit/schemas/replay.schema.json).
REPLAY_SCHEMA_VERSION = 1

REPLAYED = CHOSEN
# What `settings` may also name: no batch ends, and the regression's rule (tmplkit.turns.cost).
REPLAYABLE = REPLAYED + BASELINES


@dataclass(frozen=True)
class ReplayedRequest:
    index: int
    n_prompt: int
    n_reused: int
    n_recomputed: int
    restored: int | None
    predicted: int | None
    seconds: float            # the prefill, restore included
    generate_seconds: float   # the teacher-forced generated turn
    n_generated: int
    checkpoints: tuple[int, ...] = ()

    @property
    def matches(self) -> bool:
        return self.predicted is None or self.predicted == self.n_recomputed

    def to_dict(self) -> dict:
        return {"index": self.index, "n_prompt": self.n_prompt, "n_reused": self.n_reused,
                "n_recomputed": self.n_recomputed, "predicted": self.predicted, "restored": self.restored,
                "seconds": self.seconds, "generate_seconds": self.generate_seconds, "n_generated": self.n_generated,
                "checkpoints": list(self.checkpoints)}


@dataclass(frozen=True)
class SessionReplay:
    """Per setting (a delimiter set and a policy), the replayed requests."""

    model: str
    template: str
    memory: dict
    requests: dict = field(repr=False)  # setting name -> tuple[ReplayedRequest, ...]
    bound: tuple[int, ...] = ()         # the full-attention recompute of each request (predicted)

    @property
    def matches(self) -> bool:
        return all(r.matches for reqs in self.requests.values() for r in reqs)

    def total(self, name: str, first: bool = False) -> int:
        reqs = self.requests[name]
        return sum(r.n_recomputed for r in (reqs if first else reqs[1:]))

    def seconds(self, name: str, first: bool = False) -> float:
        reqs = self.requests[name]
        return sum(r.seconds for r in (reqs if first else reqs[1:]))

    def mismatches(self) -> list[str]:
        return [f"{name} request {r.index}: predicted {r.predicted}, measured {r.n_recomputed}"
                for name, reqs in self.requests.items() for r in reqs if not r.matches]

    def to_dict(self) -> dict:
        return {"schema_version": REPLAY_SCHEMA_VERSION, "tmplkit_version": __version__,
                "model": self.model, "template": self.template, "memory": self.memory, "matches": self.matches,
                "totals": {n: self.total(n) for n in self.requests}, "full_attention_bound": sum(self.bound[1:]),
                "bound": list(self.bound),
                "seconds": {n: self.seconds(n) for n in self.requests},
                "requests": {n: [r.to_dict() for r in reqs] for n, reqs in self.requests.items()}}

    def to_markdown(self) -> str:
        names = list(self.requests)
        head = ["request", "prompt"] + [f"{n}: recomputed (predicted) / restored / s" for n in names]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for k in range(len(self.requests[names[0]])):
            row = [str(k), str(self.requests[names[0]][k].n_prompt)]
            for n in names:
                r = self.requests[n][k]
                mark = "" if r.matches else " MISMATCH"
                row.append(f"{r.n_recomputed} ({r.predicted}){mark} / {r.restored if r.restored is not None else '-'} / {r.seconds:.3f}")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("| after the first | " + str(sum(r.n_prompt for r in self.requests[names[0]][1:])) + " | " +
                     " | ".join(f"{self.total(n)} / {self.seconds(n):.3f} s" for n in names) + " |")
        return "\n".join(lines) + "\n"


def memory_of(runner):
    """The `MemoryModel` of a loaded runner (what the prediction needs to know of the model)."""
    info = runner.info
    if not runner.checkpointing:
        return MemoryModel("full")
    if info.n_swa > 0:
        return MemoryModel.swa(info.n_swa, min(runner.settings.n_ubatch, runner.settings.n_batch))
    return MemoryModel("recurrent")


def replay_session(runner, session, template: ChatTemplate, *, settings=REPLAYED, add_bos: bool | None = None,
                   kwargs=None, progress=None) -> SessionReplay:
    """Replay `session` rendered with `template` on `runner` once per setting, and predict each.

    `settings`: names among "llama-server", "tmplkit", "divergence-aware", "none" and
    "every-user-start" (see `tmplkit.turns.cost`);
    `add_bos`: prepend the model's BOS (default: as the model's vocabulary says).
    """
    settings = check_settings(settings, REPLAYABLE)  # (a name it does not know would replay nothing, silently)
    tok = runner.tokenizer
    bos = runner.info.add_bos if add_bos is None else add_bos
    prepared = prepare_session(session, template, tok, add_bos=bos, kwargs=kwargs, predict="divergence-aware" in settings,
                               fits=runner.check_text)
    tokens, spans, ahead = prepared.tokens, prepared.spans, prepared.predicted
    assert tokens is not None, "prepared with a tokenizer"
    # The context must hold the longest request with the turn generated after it: checked first, so
    # that a refusal names that size (checked in order, it named the first request past the limit).
    longest = max(range(len(tokens.requests)), key=lambda k: len(tokens.requests[k]) + len(tokens.generated[k]))
    runner.check_prompt(list(tokens.requests[longest]) + list(tokens.generated[longest]))
    for ids in tokens.requests:
        runner.check_prompt(ids)
    memory = memory_of(runner)
    every = default_settings(memory) + baseline_settings(memory)
    chosen = tuple(s for s in every if s.name in settings and s.delimiters in spans)
    predicted = session_cost(tokens, spans, predicted=ahead, settings=chosen + every[:1], prefill=runner.settings)
    out = {}
    for s in chosen:
        per = []
        for k, ids in enumerate(tokens.requests):
            pol = policy_for(s.policy, ahead, k, len(ids))
            rep = runner.run(ids, spans[s.delimiters][k], pol) if k == 0 else runner.resume(ids, spans[s.delimiters][k], pol)
            g0 = time.perf_counter()
            gen = tokens.generated[k]
            if gen:
                runner.decode_generated(gen)
            per.append(ReplayedRequest(k, rep.n_prompt, rep.n_reused, rep.n_processed,
                                       rep.restored.n_tokens if rep.restored is not None else None,
                                       predicted.requests[s.name][k].n_recomputed, rep.seconds,
                                       time.perf_counter() - g0, len(gen), tuple(c.n_tokens for c in rep.checkpoints)))
            if progress is not None:
                progress(s.name, k, len(tokens.requests))
        out[s.name] = tuple(per)
    return SessionReplay(runner.model_path, template.name, memory.to_dict(), out, predicted.recomputed(every[0].name))


def plot_replay(replay: SessionReplay, path) -> None:
    """Write a PNG: tokens recomputed per request, one line per setting, the full-attention bound dashed."""
    write_bytes_atomic(path, replay_png(replay))


def replay_png(replay: SessionReplay) -> bytes:
    """`plot_replay`'s PNG, as bytes (written with the command's other outputs, all or none)."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, reqs in replay.requests.items():
        ax.plot([r.index for r in reqs], [r.n_recomputed for r in reqs], marker="o", markersize=3, label=name)
    if replay.bound:
        ax.plot(range(len(replay.bound)), replay.bound, linestyle="--", color="black", label="full attention (bound)")
    ax.set_yscale("log")
    ax.set_xlabel("request")
    ax.set_ylabel("tokens recomputed")
    ax.set_title(f"{replay.template} on {Path(replay.model).name}")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
