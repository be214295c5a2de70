"""What a prefill did: every decode call, every checkpoint, totals; and comparisons of policies."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .._version import __version__

# Writing results: tmplkit.atomic is the one writer (atomic, one-line InputError on failure);
# these names stay importable from here for the prefill code and scripts.
from ..atomic import check_writable as check_writable  # re-exported
from ..atomic import write_json as write_json  # re-exported
from ..atomic import write_output

# The JSON's layout (tmplkit/schemas/prefill.schema.json): raised when a field is removed or changes meaning.
PREFILL_SCHEMA_VERSION = 1
# Why a batch ended ("generated": one token of the model's reply, see GenerationReport).
REASONS = ("full", "user start", "near end", "end")


@dataclass(frozen=True)
class DecodeCall:
    """One llama_decode call: tokens [start, start + size); `rule` says which policy rule ended it early."""

    start: int
    size: int
    reason: str
    seconds: float
    rule: str | None = None

    def to_dict(self) -> dict:
        return {"start": self.start, "size": self.size, "reason": self.reason, "rule": self.rule,
                "seconds": round(self.seconds, 6)}


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint taken before decoding the batch starting at `n_tokens` (or one restored)."""

    n_tokens: int
    pos_min: int
    pos_max: int
    bytes: int
    seconds: float
    why: str = ""

    def to_dict(self) -> dict:
        return {"n_tokens": self.n_tokens, "pos_min": self.pos_min, "pos_max": self.pos_max, "bytes": self.bytes,
                "seconds": round(self.seconds, 6), "why": self.why}


@dataclass(frozen=True)
class PrefillReport:
    """The result of `PrefillRunner.run()` / `.resume()`.

    `n_reused` prompt tokens came from memory (or a restored checkpoint), `n_processed` were
    decoded; `seconds` covers everything from the call to the last token's logits, including
    restoring and saving checkpoints, and `tokens_per_second` is n_processed / seconds.
    """

    model: str
    policy: str
    checkpointing: bool
    n_prompt: int
    n_reused: int
    n_processed: int
    seconds: float
    decode_seconds: float
    checkpoint_seconds: float
    decode_calls: tuple[DecodeCall, ...] = ()
    checkpoints: tuple[CheckpointRecord, ...] = ()
    restored: CheckpointRecord | None = None
    restore_seconds: float = 0.0
    n_evicted: int = 0
    user_starts: tuple[int, ...] = ()
    settings: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.n_processed / self.seconds if self.seconds > 0 else 0.0

    @property
    def n_decode_calls(self) -> int:
        return len(self.decode_calls)

    def breaks(self) -> dict[str, int]:
        """Decode calls by the reason they ended."""
        out = {r: 0 for r in REASONS}
        for c in self.decode_calls:
            out[c.reason] = out.get(c.reason, 0) + 1
        return out

    def rules(self) -> dict[str, int]:
        """Early breaks by the policy rule that caused them."""
        out: dict[str, int] = {}
        for c in self.decode_calls:
            if c.rule:
                out[c.rule] = out.get(c.rule, 0) + 1
        return out

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "policy": self.policy,
            "checkpointing": self.checkpointing,
            "n_prompt": self.n_prompt,
            "n_reused": self.n_reused,
            "n_processed": self.n_processed,
            "seconds": round(self.seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "checkpoint_seconds": round(self.checkpoint_seconds, 6),
            "restore_seconds": round(self.restore_seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "n_decode_calls": self.n_decode_calls,
            "breaks": self.breaks(),
            "rules": self.rules(),
            "n_checkpoints": len(self.checkpoints),
            "checkpoint_bytes": sum(c.bytes for c in self.checkpoints),
            "n_evicted": self.n_evicted,
            "n_user_starts": len(self.user_starts),
            "restored": self.restored.to_dict() if self.restored else None,
            "decode_calls": [c.to_dict() for c in self.decode_calls],
            "checkpoints": [c.to_dict() for c in self.checkpoints],
            "user_starts": list(self.user_starts),
            "settings": dict(self.settings),
        }


@dataclass(frozen=True)
class GenerationReport:
    """The result of `PrefillRunner.decode_generated()`: the model's generated tokens decoded one
    per llama_decode call after a prompt of `n_prompt` tokens (reason "generated" in each call)."""

    model: str
    n_prompt: int
    n_generated: int
    seconds: float
    decode_seconds: float
    decode_calls: tuple[DecodeCall, ...] = ()

    @property
    def n_decode_calls(self) -> int:
        return len(self.decode_calls)

    @property
    def tokens_per_second(self) -> float:
        return self.n_generated / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"model": self.model, "n_prompt": self.n_prompt, "n_generated": self.n_generated,
                "seconds": round(self.seconds, 6), "decode_seconds": round(self.decode_seconds, 6),
                "tokens_per_second": round(self.tokens_per_second, 3), "n_decode_calls": self.n_decode_calls,
                "decode_calls": [c.to_dict() for c in self.decode_calls]}


@dataclass(frozen=True)
class PolicyResult:
    """All repeats of one policy on one prompt; the figures are medians over the repeats."""

    policy: str
    reports: tuple[PrefillReport, ...]

    @property
    def first(self) -> PrefillReport:
        return self.reports[0]

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(r.tokens_per_second for r in self.reports)

    @property
    def seconds(self) -> float:
        return statistics.median(r.seconds for r in self.reports)

    def to_dict(self) -> dict:
        first = self.first
        return {
            "policy": self.policy,
            "repeats": len(self.reports),
            "median_tokens_per_second": round(self.tokens_per_second, 3),
            "median_seconds": round(self.seconds, 6),
            "all_tokens_per_second": [round(r.tokens_per_second, 3) for r in self.reports],
            "n_decode_calls": first.n_decode_calls,
            "breaks": first.breaks(),
            "rules": first.rules(),
            "n_checkpoints": len(first.checkpoints),
            "report": first.to_dict(),
        }


@dataclass(frozen=True)
class Comparison:
    """Several policies run on the same prompt, interleaved, in one process."""

    model: str
    session: str
    template: str
    n_prompt: int
    settings: dict
    results: tuple[PolicyResult, ...]
    delimiters: tuple[dict, ...] = ()

    def result(self, policy: str) -> PolicyResult:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(policy)

    def to_dict(self) -> dict:
        return {
            "schema_version": PREFILL_SCHEMA_VERSION,
            "tmplkit_version": __version__,
            "model": self.model,
            "session": self.session,
            "template": self.template,
            "n_prompt": self.n_prompt,
            "settings": dict(self.settings),
            "delimiters": list(self.delimiters),
            "results": [r.to_dict() for r in self.results],
        }

    def to_markdown(self) -> str:
        return markdown_summary(self)


def _checkpoints(settings: dict, taken: bool) -> str:
    """The checkpoints of a run in words: their shape only where they are taken (it says nothing else)."""
    if not taken:
        return "off"
    return f"on (max {settings.get('max_checkpoints')}, min step {settings.get('checkpoint_min_step')})"


def markdown_summary(comp: Comparison) -> str:
    """Policies side by side: one column per policy."""
    res = list(comp.results)
    base = next((r for r in res if r.policy == "none"), None)
    head = ["", *[f"`{r.policy}`" for r in res]]
    rows: list[list[str]] = []

    def row(name, fn):
        rows.append([name, *[fn(r) for r in res]])

    row("decode calls", lambda r: str(r.first.n_decode_calls))
    for reason in ("user start", "near end"):
        row(f"  ended at {reason}", lambda r, reason=reason: str(r.first.breaks().get(reason, 0)))
    row("  early-break rules", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r.first.rules().items())) or "-")
    row("checkpoints", lambda r: str(len(r.first.checkpoints)))
    row("checkpoint positions", lambda r: ", ".join(str(c.n_tokens) for c in r.first.checkpoints) or "-")
    row("checkpoint MiB (total)", lambda r: f"{sum(c.bytes for c in r.first.checkpoints) / 2**20:.1f}")
    row("tokens/s (median)", lambda r: f"{r.tokens_per_second:.1f}")
    if base is not None:
        row("vs `none`", lambda r: f"{r.tokens_per_second / base.tokens_per_second:.3f}")
    row("seconds (median)", lambda r: f"{r.seconds:.2f}")
    row("repeats", lambda r: str(len(r.reports)))
    s = comp.settings
    lines = [
        f"prefill of {comp.n_prompt} tokens: model `{Path(comp.model).name}`, session `{Path(comp.session).name}`, "
        f"template `{comp.template}`",
        f"n_ctx {s.get('n_ctx')}, n_batch {s.get('n_batch')}, n_ubatch {s.get('n_ubatch')}, threads {s.get('n_threads')}, "
        f"gpu layers {s.get('n_gpu_layers')}, checkpoints {_checkpoints(s, bool(res and res[0].first.checkpointing))}; "
        f"user starts in the prompt: {len(res[0].first.user_starts) if res else 0}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * len(res)) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


write_atomic = write_output
