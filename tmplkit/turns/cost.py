"""What each request of a session costs: tokens recomputed, under four settings.

- "full attention": a model that rolls its memory back anywhere recomputes from the divergence
  (the lower bound; the physical limit of any checkpoint placement);
- "llama-server": a checkpointing model (sliding window or recurrent) with llama-server's own
  delimiter list for the template (a specialized handler's hard-coded list, none, or the
  autoparser's user and assistant starts: `server_rules.server_delimiter_list`; each tokenized on its
  own, split the server's way) and its gate (`ServerGated`);
- "tmplkit": the same with tmplkit's delimiters (every role, derived from the template) and the
  `gated` policy;
- "divergence-aware": tmplkit's delimiters and the `divergence-aware` policy, which also puts
  checkpoints where the template's next render will diverge.

Each is `ServerSimulation` run over the session's requests: resume with the request's tokens,
then the generated turn. The result is a prediction a replay on a model must reproduce.

    >>> cost = session_cost(requests, tokens, spans)                              # doctest: +SKIP
    >>> cost.total("full attention") <= cost.total("tmplkit")                      # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ..errors import InputError
from ..server_rules import DivergenceAware, EveryUserStart, Gated, NoBreaks, PrefillSettings, ServerGated
from ..session.requests import common_prefix
from ..tokens.tokenizers import common_byte_prefix, utf8
from .divergence import tokenize_texts
from .simulation import MemoryModel, ServerSimulation, SimulatedRequest

__all__ = ["SETTINGS", "CHOSEN", "CostSetting", "check_settings", "SessionCost", "session_cost", "default_settings", "policy_for",
           "predicted_divergences"]


@dataclass(frozen=True)
class CostSetting:
    """One way of serving the session: a memory model, a delimiter set ("tmplkit"/"server") and a policy."""

    name: str
    memory: MemoryModel
    delimiters: str
    policy: object = field(compare=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "memory": self.memory.to_dict(), "delimiters": self.delimiters,
                "policy": getattr(self.policy, "name", str(self.policy))}


SETTINGS = ("full attention", "llama-server", "tmplkit", "divergence-aware")
# What a caller chooses among (`session_cost(names=)`, `tmplkit turns --settings`, replay's
# settings): "full attention" is the lower bound, simulated whatever the choice.
CHOSEN = SETTINGS[1:]
# Two more a replay can run (issue 25213's reference points): no batch ends at all, and the
# regression's rule (llama-server 73618f2 ends a batch before every user start it knows).
BASELINES = ("none", "every-user-start")


def check_settings(names: Collection[str] | None, known: Sequence[str] = CHOSEN, what: str = "setting") -> tuple[str, ...] | None:
    """`names` (None: all) as a tuple, each one of `known`; an InputError names the others."""
    if names is None:
        return None
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(f"unknown {what} {', '.join(bad)}; give some of {', '.join(known)}")
    if not names:
        raise InputError(f"no {what} given (an empty list); give some of {', '.join(known)}")
    return names


def default_settings(memory: MemoryModel) -> tuple[CostSetting, ...]:
    """The four settings of the module doc, for a checkpointing `memory`."""
    return (CostSetting("full attention", MemoryModel("full"), "tmplkit", Gated()),
            CostSetting("llama-server", memory, "server", ServerGated()),
            CostSetting("tmplkit", memory, "tmplkit", Gated()),
            CostSetting("divergence-aware", memory, "tmplkit", DivergenceAware()))


def baseline_settings(memory: MemoryModel) -> tuple[CostSetting, ...]:
    """`BASELINES` as settings: `none` ends no batch (checkpoints only where batches end anyway);
    `every-user-start` ends one before each of the server's user starts, as 73618f2 does."""
    return (CostSetting("none", memory, "tmplkit", NoBreaks()),
            CostSetting("every-user-start", memory, "server", EveryUserStart()))


@dataclass(frozen=True)
class SessionCost:
    """Per setting, per request: what the simulated server reused and recomputed."""

    settings: tuple[CostSetting, ...]
    requests: dict = field(repr=False)  # setting name -> tuple[SimulatedRequest, ...]
    n_tokens: tuple[int, ...] = ()      # prompt tokens of each request

    def recomputed(self, name: str) -> tuple[int, ...]:
        return tuple(r.n_recomputed for r in self.requests[name])

    def total(self, name: str, first: bool = True) -> int:
        """Tokens recomputed over the session (`first=False`: over the requests after the first)."""
        per = self.recomputed(name)
        return sum(per if first else per[1:])

    def share(self, name: str) -> float:
        """The share of the prompt tokens sent after the first request that was recomputed."""
        return self.total(name, first=False) / max(1, sum(self.n_tokens[1:]))

    def to_dict(self) -> dict:
        return {"settings": [s.to_dict() for s in self.settings], "n_tokens": list(self.n_tokens),
                "totals": {s.name: self.total(s.name) for s in self.settings},
                "after_first": {s.name: self.total(s.name, first=False) for s in self.settings},
                "requests": {s.name: [r.to_dict() for r in self.requests[s.name]] for s in self.settings}}


def session_cost(tokens, spans: dict, *, predicted=None, settings: tuple[CostSetting, ...] | None = None,
                 memory: MemoryModel | None = None, prefill: PrefillSettings | None = None,
                 server_tokens=None, names: Collection[str] | None = None) -> SessionCost:
    """Simulate every setting over the session.

    `tokens`: `TokenizedRequests`; `spans`: delimiter set name ("tmplkit", "server") -> one Spans
    per request (a set may be missing: its settings are skipped); `predicted`: per request, the
    token positions where its next renders diverge from what is held (`predicted_divergences`),
    for the divergence-aware policy (without them it predicts from the spans); `memory`: the
    checkpointing model's memory (default: Gemma 3's sliding window of 512); `prefill`: the
    server's batch and checkpoint settings (llama-server's defaults); `server_tokens`: the
    requests as llama-server renders them, for the settings with its delimiters (default `tokens`);
    `names`: which of `CHOSEN` to simulate besides the full-attention bound (default: all).
    """
    memory = memory or MemoryModel.swa(512)
    prefill = prefill or PrefillSettings()
    settings = settings or default_settings(memory)
    settings = tuple(s for s in settings if s.delimiters in spans and (names is None or s.name in names or s.name == SETTINGS[0]))
    out = {}
    for s in settings:
        sim = ServerSimulation(s.memory, prefill)
        per: list[SimulatedRequest] = []
        toks = server_tokens if s.delimiters == "server" and server_tokens is not None else tokens
        for k, ids in enumerate(toks.requests):
            per.append(sim.resume(ids, spans[s.delimiters][k], policy_for(s.policy, predicted, k, len(ids)),
                                  n_common=toks.common(k) if k else None))  # (the slot holds toks.held(k - 1))
            sim.generate(toks.generated[k])
        out[s.name] = tuple(per)
    return SessionCost(settings, out, tuple(len(t) for t in tokens.requests))


def policy_for(policy, predicted, k: int, n_prompt: int):
    """The policy for request k: the divergence-aware one gets that request's predicted divergences."""
    if isinstance(policy, DivergenceAware) and predicted is not None:
        return DivergenceAware.for_prompt(predicted[k], n_prompt)
    return policy


def predicted_divergences(tokens, next_texts, tokenizer, *, add_bos: bool = False,
                          texts: Sequence[str] | None = None) -> tuple[tuple[int, ...], ...]:
    """Per request, the token positions where each of its next renders (`next_texts`: per request,
    an iterable read once, as `requests.iter_next_renders` gives them) stops matching the tokens
    held after it (positions at the held end are left out: nothing diverges).
    `texts`: the requests' texts, whose ids the next renders share their beginnings with. Where the
    tokenizer can stop early (`tokenize_until`: llama.cpp's BPE vocabularies), a render is tokenized
    only from a control token before where it diverges to the next one after; else whole, from its
    nearest text tokenized before (each next render with the one before it)."""
    out = []
    pool: list = []  # the next renders of the requests before, which these resemble most
    until = getattr(tokenizer, "tokenize_until", None) if texts is not None else None
    bos = tuple(tokenizer.tokenize("", add_bos=True)) if add_bos else ()
    for k, renders in enumerate(next_texts):
        held = tokens.held(k)
        base = (texts[k], tokens.requests[k]) if texts is not None else None
        early = _EarlyStop(held, base[0], base[1], tokens.generated[k], tokenizer, until, bos) if until and base else None
        found = [early.position(text) if early is not None else None for text in renders]
        rest = [text for text, p in zip(renders, found) if p is None]  # (tokenized whole)
        pos = {p for p in found if p is not None}
        pos |= {common_prefix(held, ids) for ids in tokenize_texts(rest, tokenizer, add_bos=add_bos, base=base, pool=pool)}
        out.append(tuple(sorted(p for p in pos if p < len(held))))
    return tuple(out)


class _EarlyStop:
    """Where a next render's ids stop matching `held` (request k's ids, then the generated turn's),
    read off the render's ids up to there only (`tokenize_until`).

    The held ids spell the held bytes (the request's text, then the generated ids' pieces), so the
    first id that differs is at or before the one that holds the first byte that differs: the ids
    from the control token before that byte to the next control token after it are the only new
    ones to read; up to that control token they are the request's own."""

    def __init__(self, held, text: str, request_ids, generated_ids, tokenizer, until, bos: tuple) -> None:
        self.held, self.until, self.bos = held, until, bos
        self.data = utf8(text)
        # the request's ids without the BOS `tokenize_texts` prepended (the text does not spell it)
        self.off = len(bos) if bos and tuple(request_ids[:len(bos)]) == bos and not self.data.startswith(
            b"".join(tokenizer.piece_bytes(i) for i in bos)) else 0
        self.base = (self.data, tuple(request_ids[self.off:]))
        self.held_bytes = self.data + b"".join(tokenizer.piece_bytes(i) for i in generated_ids)

    def position(self, render: str) -> int | None:
        """The token position, or None where the tokenizer cannot stop early here (then the render
        is tokenized whole)."""
        data = utf8(render)
        got = self.until(render, self.base, common_byte_prefix(data, self.held_bytes))
        if got is None:
            return None
        cut, new = got
        n = len(self.bos)
        first = self.base[1][:n] if cut >= n else self.base[1][:cut] + new[:n - cut]
        off = len(self.bos) if self.bos and first != self.bos else 0
        if off != self.off or cut < 1:
            return None  # (a BOS taken otherwise than for the request: compare whole)
        head = off + cut
        return head + common_prefix(self.held[head:head + len(new)], new)
