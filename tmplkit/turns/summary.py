"""One template over one session: stable or not, the first divergence and its cause, the cost.

    >>> r = study_turns(load_one("Qwen3.5-4B.jinja"), generate_session(30000, style="agent"), tokenizer=tok)  # doctest: +SKIP
    >>> r.stable, r.first.cause, r.cost.total("tmplkit")                                                  # doctest: +SKIP
    (False, 'reasoning dropped', 5120)
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime

from ..analysis.probes import THINKING_FLAGS
from ..errors import RenderError, TmplkitError, TokenizerError
from ..session import DEFAULT_INPUTS, check_inputs, for_server, inputs_note
from ..session.requests import DEFAULT_INTERVAL, clock_at, iter_requests
from ..sources.templates import ChatTemplate
from .budget import Budget
from .cost import SessionCost, check_settings, session_cost
from .divergence import Divergence, divergences
from .pipeline import prepare_session

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
    stopped: str = ""  # where a time limit cut the session short ("" : studied whole)
    inputs: str = DEFAULT_INPUTS  # whose message preparation the renders follow (session.given_messages)
    # The render limit the error is ("timeout", "memory", "size", "unsafe"; "": none): the session was
    # not studied, which says nothing of the template (not in to_dict: the error says it).
    limit: str = field(default="", compare=False)
    # Whether the error is the template's own refusal of the session (its raise_exception): the
    # session is to change, not the template (not in to_dict either).
    refused: bool = field(default=False, compare=False)

    @property
    def stable(self) -> bool | None:
        """False from the first divergence; True where the whole session extends what is held;
        None where no verdict is known: the session was not studied (`error`: the template cannot
        render it, or a limit stopped its worker), a time limit stopped the study before the
        session's end and no request up to there diverged, or the session has one request
        (`one_request`: nothing is resumed, so "stable" would say nothing, as the audit says)."""
        if self.error:
            return None
        if not all(d.stable for d in self.divergences):
            return False
        return None if self.stopped or self.one_request else True

    @property
    def one_request(self) -> bool:
        """The session has one request, studied whole: no request follows one the server held."""
        return self.n_requests < 2 and not self.stopped and not self.error

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
                "divergences": [d.to_dict() for d in self.divergences], "notes": list(self.notes), "error": self.error,
                "stopped": self.stopped, "inputs": self.inputs, "inputs_note": inputs_note(self.inputs)}


def study_turns(template: ChatTemplate, session, *, tokenizer=None, add_bos: bool = False, memory=None,
                prefill=None, kwargs=None, switches: bool = True, interval=DEFAULT_INTERVAL, timeout: float | None = None,
                progress=None, server=None, server_texts=None, inputs: str = DEFAULT_INPUTS,
                settings: Collection[str] | None = None, ahead: bool = False) -> TurnsReport:
    """Requests, divergences, thinking switches and (with a tokenizer) the cost of `session` on `template`.

    A template that cannot render the session gives a report with `error` set (a corpus table
    goes on); other problems raise. `timeout` (seconds): the requests rendered by then are
    studied, the switches are not tried, and `stopped` says so; `progress(stage, done, total)`
    is called as the requests are rendered. `server`: template name -> llama-server's delimiter
    list for the llama-server setting (`server_rules.load_server_delimiters`; None: see `prepare_session`);
    `server_texts`: each request as llama-server renders it, for that setting (`prepare_session`).
    `inputs`: "server" (messages as llama-server gives them, the default) or "transformers" (as
    `apply_chat_template` does); the report says which. `settings`: which of `cost.CHOSEN` the cost
    simulates besides the full-attention bound (default: all); without "divergence-aware" the next
    renders it predicts from are not made (a long session's study then takes 0.5-0.6 of the time).
    `ahead`: those renders made meanwhile in a forked child, on a second core (`prepare_session`).
    """
    check_inputs(inputs)
    settings = check_settings(settings)
    if getattr(template, "error", None):  # a folder's file that could not be read (sources.load_dir)
        return TurnsReport(template.name, 0, (), error=template.error or "", inputs=inputs)
    predict = settings is None or "divergence-aware" in settings
    budget = Budget(timeout, progress, share=_share(tokenizer is not None, predict))
    try:
        prepared = prepare_session(session, template, tokenizer, add_bos=add_bos, kwargs=kwargs, interval=interval,
                                   budget=budget, server=server, server_texts=server_texts, inputs=inputs, predict=predict,
                                   ahead=ahead)
    except RenderError as exc:  # (RenderLimitError too)
        return TurnsReport(template.name, 0, (), error=str(exc), inputs=inputs, limit=getattr(exc, "kind", ""),
                           refused=exc.template_raised)
    except TokenizerError as exc:  # (the session's own text is checked as it is read: the renders' text is the template's)
        return TurnsReport(template.name, 0, (), error=f"tokenizing its renders (the template writes the text): {exc}", inputs=inputs)
    conversation, reqs, tokens = prepared.conversation, prepared.requests, prepared.tokens
    divs = divergences(reqs, conversation.messages, conversation.conversation.tools, redraw=_redraw(conversation, reqs),
                       tokens=tokens, tokenizer=tokenizer, draws=conversation.draws_only)
    cost = None
    if tokens is not None and prepared.spans:
        cost = session_cost(tokens, prepared.spans, predicted=prepared.predicted, memory=memory, prefill=prefill,
                            server_tokens=prepared.server_tokens, names=settings)
    switches = switches and not budget.stopped and len(reqs) > 1  # (one request: no setting is more stable than another)
    tried = _switches(template, conversation, kwargs, interval, reqs) if switches else ()
    if switches:
        divs = _name_switches(divs, tried)
    notes = prepared.notes + ((budget.stopped,) if budget.stopped else ())
    return TurnsReport(template.name, len(reqs), divs, tried, cost, notes, stopped=budget.stopped, inputs=inputs)


def _share(tokens: bool, predict: bool) -> float:
    """The part of the time limit for rendering the requests: what follows them takes about 0.2x
    their time text only, 2.5x with a tokenizer (tokens, spans, the cost) and 3.5x with the next
    renders predicted from too (`scripts/bench_turns_stages.py` on the 90k-token session, with the
    generated turns asked for alone and the follow-ups spliced); the rest of the limit is left for
    it, with a margin."""
    return 0.2 if tokens and predict else 0.25 if tokens else 0.8


def _name_switches(divs: tuple[Divergence, ...], tried) -> tuple[Divergence, ...]:
    """Each "reasoning dropped" divergence with the switches that keep the session stable named (an
    empty reasoning block Qwen3 writes into the newest turn only has none), for a reader to act on."""
    keeps = [name for name, ok in tried if ok]
    note = f"; stable with {', '.join(keeps)}" if keeps else "; no switch the template reads keeps it"
    return tuple(replace(d, detail=d.detail + note) if d.cause == "reasoning dropped" else d for d in divs)


def _redraw(conversation, reqs):
    """request k rendered at another time (for the date check); None where the template cannot read
    the clock (`ServerConversation.reads_clock`): the render would be the request itself, which
    moves no divergence later."""
    if not conversation.reads_clock:
        return None

    def redraw(k: int, at: datetime) -> str:
        return conversation.render(conversation.messages[:reqs[k].n_messages], clock=lambda: at)

    return redraw


def _switches(template, conversation, kwargs, interval, default) -> tuple[tuple[str, bool], ...]:
    """(setting, stable) for each value of each switch that changes some request's render.

    Requests are rendered one at a time and the walk stops at the first divergence, so a switch
    that leaves the session unstable costs a few renders; one that changes nothing up to there
    is left out (it is no switch for this session). A switch that changes neither the whole
    session's render nor the last request of each kind (after a user message, after tool
    results: the generation prompt may differ by kind) is taken to change none before them
    (every request's history is part of those), and is left out without the walk: on a long chat
    the walk would otherwise render the whole session again for each value."""
    out = []
    ends = _SessionEnd(conversation, default)
    for name, values in THINKING_FLAGS + HISTORY_FLAGS:
        if not re.search(rf"\b{name}\b", template.text):  # `reasoning` is not `reasoning_content`
            continue
        for value in values:
            setting = {**dict(kwargs or {}), name: value}
            try:
                if ends.same_with(for_server(template, conversation, setting)):
                    continue
                verdict = _walk(iter_requests(conversation, template, kwargs=setting, interval=interval), default)
            except TmplkitError:
                continue
            if verdict is not None:
                out.append((f"{name}={value!r}", verdict))
    return tuple(out)


class _SessionEnd:
    """The whole session's render and the last request of each kind (by the role of its last
    message), as the default settings give them; the whole render made once, when first needed."""

    def __init__(self, conversation, default) -> None:
        msgs = list(conversation.messages)
        self.conversation, self.at = conversation, clock_at(default[-1].time)
        self.last = {msgs[r.n_messages - 1].get("role"): r for r in default}.values()
        self._whole: str | None = None

    def same_with(self, other) -> bool:
        """Whether `other` (the conversation under another setting) renders all of them alike."""
        msgs = list(other.messages)
        for r in self.last:
            if other.render(msgs[:r.n_messages], add_generation_prompt=True, clock=clock_at(r.time)) != r.text:
                return False
        if self._whole is None:
            self._whole = self.conversation.render(list(self.conversation.messages), add_generation_prompt=False, clock=self.at)
        return other.render(msgs, add_generation_prompt=False, clock=self.at) == self._whole


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
