"""One template over one session: stable or not, the first divergence and its cause, the cost.

    >>> r = study_turns(load_one("Qwen3.5-4B.jinja"), generate_session(30000, style="agent"), tokenizer=tok)  # doctest: +SKIP
    >>> r.stable, r.first.cause, r.cost.total("tmplkit")                                                  # doctest: +SKIP
    (False, 'reasoning dropped', 5120)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from ..errors import RenderError, TmplkitError
from ..probes import THINKING_FLAGS
from ..sources import ChatTemplate
from .cost import SessionCost, session_cost
from .divergence import Divergence, divergences
from .pipeline import prepare_session
from .requests import DEFAULT_INTERVAL, iter_requests

__all__ = ["TurnsReport", "study_turns", "HISTORY_FLAGS"]

# Switches some templates read to keep or clear the reasoning of earlier turns (besides the
# thinking switches the analysis finds); tried when their name appears in the template.
HISTORY_FLAGS: tuple[tuple[str, tuple], ...] = (
    ("preserve_thinking", (True, False)),
    ("clear_thinking", (False, True)),
    ("keep_reasoning", (True, False)),
    ("truncate_history_thinking", (False, True)),
)


@dataclass(frozen=True)
class TurnsReport:
    """`switches`: (setting, stable) for each value of each thinking switch the template reads."""

    template: str
    n_requests: int
    divergences: tuple[Divergence, ...] = field(repr=False)
    switches: tuple[tuple[str, bool], ...] = ()
    cost: SessionCost | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    error: str = ""

    @property
    def stable(self) -> bool:
        return not self.error and all(d.stable for d in self.divergences)

    @property
    def first(self) -> Divergence | None:
        return next((d for d in self.divergences if not d.stable), None)

    @property
    def stable_with(self) -> tuple[str, ...]:
        return tuple(name for name, ok in self.switches if ok)

    def causes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.divergences:
            if not d.stable:
                out[d.cause] = out.get(d.cause, 0) + 1
        return out

    def to_dict(self) -> dict:
        first = self.first
        return {"template": self.template, "stable": self.stable, "n_requests": self.n_requests,
                "first_divergence": first.to_dict() if first else None, "causes": self.causes(),
                "switches": [{"setting": n, "stable": ok} for n, ok in self.switches],
                "stable_with": list(self.stable_with), "cost": self.cost.to_dict() if self.cost else None,
                "divergences": [d.to_dict() for d in self.divergences], "notes": list(self.notes), "error": self.error}


def study_turns(template: ChatTemplate, session, *, tokenizer=None, add_bos: bool = False, memory=None,
                prefill=None, kwargs=None, switches: bool = True, interval=DEFAULT_INTERVAL) -> TurnsReport:
    """Requests, divergences, thinking switches and (with a tokenizer) the cost of `session` on `template`.

    A template that cannot render the session gives a report with `error` set (a corpus table
    goes on); other problems raise.
    """
    if getattr(template, "error", None):  # a folder's file that could not be read (sources.load_dir)
        return TurnsReport(template.name, 0, (), error=template.error or "")
    try:
        prepared = prepare_session(session, template, tokenizer, add_bos=add_bos, kwargs=kwargs, interval=interval)
    except RenderError as exc:  # (RenderLimitError too)
        return TurnsReport(template.name, 0, (), error=str(exc))
    conversation, reqs, tokens = prepared.conversation, prepared.requests, prepared.tokens
    divs = divergences(reqs, conversation.messages, conversation.conversation.tools, redraw=_redraw(conversation, reqs),
                       tokens=tokens, tokenizer=tokenizer)
    cost = None
    if tokens is not None and prepared.spans:
        cost = session_cost(tokens, prepared.spans, predicted=prepared.predicted, memory=memory, prefill=prefill)
    tried = _switches(template, conversation, kwargs, interval, reqs) if switches else ()
    return TurnsReport(template.name, len(reqs), divs, tried, cost, prepared.notes)


def _redraw(conversation, reqs):
    """request k rendered at another time (for the date check)."""

    def redraw(k: int, at: datetime) -> str:
        return conversation.render(conversation.messages[:reqs[k].n_messages], clock=lambda: at)

    return redraw


def _switches(template, conversation, kwargs, interval, default) -> tuple[tuple[str, bool], ...]:
    """(setting, stable) for each value of each switch that changes some request's render.

    Requests are rendered one at a time and the walk stops at the first divergence, so a switch
    that leaves the session unstable costs a few renders; one that changes nothing up to there
    is left out (it is no switch for this session)."""
    out = []
    for name, values in THINKING_FLAGS + HISTORY_FLAGS:
        if not re.search(rf"\b{name}\b", template.text):  # `reasoning` is not `reasoning_content`
            continue
        for value in values:
            try:
                verdict = _walk(iter_requests(conversation, template, kwargs={**dict(kwargs or {}), name: value},
                                              interval=interval), default)
            except TmplkitError:
                continue
            if verdict is not None:
                out.append((f"{name}={value!r}", verdict))
    return tuple(out)


def _walk(requests, default) -> bool | None:
    """Stable (True) or not (False) for requests that differ from `default` somewhere; None when
    they do not differ up to where the walk ends."""
    changed, prev = False, None
    for r in requests:
        changed = changed or (r.text, r.generated) != (default[r.index].text, default[r.index].generated)
        if prev is not None and not r.text.startswith(prev.held):
            return False if changed else None
        prev = r
    return True if changed else None
