"""The requests of an agent session: what the client sends, and what the server then holds.

An agent sends the whole conversation again each time the model is to speak: after a user
message, or after the results of the tool calls of the previous turn. Request k is the render of
the conversation up to that point with `add_generation_prompt=True`. The server then generates the
assistant turn, so afterwards it holds request k followed by the generated text.

The generated text is what the template prints for that assistant turn when it is the newest
message, after what the generation prompt already wrote:

1. Render the conversation including the generated turn (no generation prompt). When request k
   is a prefix of it, the generated text is the rest (rule "prefix"; nearly every template).
2. Otherwise the template writes history differently once the turn exists, or its generation
   prompt is not how it renders a turn. Then the turn is located from the render itself (rule
   "newest-turn"): render it a second time with the turn's content replaced by a needle; the two
   renders agree up to where the turn's own content begins, and the turn starts where the text
   before that point stops matching the generation prompt's opening (the longest end of the
   shared text that is a prefix of the generation prompt). The generated text is the turn after
   the part it shares with the generation prompt: the model continues from the prompt it was
   given and writes what the template would print from there.

    >>> reqs = session_requests(session, template)                       # doctest: +SKIP
    >>> reqs[0].text.endswith(reqs[0].generation_prompt), reqs[0].held.startswith(reqs[0].text)  # doctest: +SKIP
    (True, True)

Each request is rendered at its own time (`start + k * interval`), so a template that prints the
time or date shows it as a clock would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..analysis._text import lcp as common_prefix  # strings and token lists alike
from ..errors import InputError, TmplkitError
from ..sandbox import PINNED_NOW
from ..session import for_server
from ..sources import ChatTemplate

__all__ = ["Request", "session_requests", "iter_requests", "request_points", "common_prefix", "next_renders"]

_NEEDLE = "\u2063needle\u2063"


def _clock_at(t: datetime) -> Callable[[], datetime]:
    """A clock that always reads `t` (a request's time, for `strftime_now`)."""
    return lambda: t


DEFAULT_INTERVAL = timedelta(seconds=90)


@dataclass(frozen=True)
class Request:
    """One request of a session.

    `n_messages`: messages[:n_messages] are rendered; `turn`: the (start, end) message indices of
    the assistant turn the model then generates (empty for the session's last request when it ends
    on a user or tool message); `generated`: that turn's text as the model emits it; `rule`: how
    it was derived ("prefix", "newest-turn", or "" when nothing is generated).
    """

    index: int
    n_messages: int
    text: str = field(repr=False)
    generation_prompt: str = field(repr=False)
    generated: str = field(repr=False)
    turn: tuple[int, int]
    rule: str
    time: datetime

    @property
    def held(self) -> str:
        """What the server holds after this request: the request and the generated turn."""
        return self.text + self.generated

    def to_dict(self) -> dict:
        return {"index": self.index, "n_messages": self.n_messages, "n_chars": len(self.text),
                "n_generated_chars": len(self.generated), "turn": list(self.turn), "rule": self.rule,
                "generation_prompt": self.generation_prompt, "time": self.time.isoformat()}


def request_points(messages) -> list[tuple[int, int]]:
    """(n_messages, turn_end) for each request: the model speaks after a user message or a batch of
    tool results; its turn is the assistant messages that follow (turn_end == n_messages: none)."""
    roles = [m.get("role") for m in messages]
    out = []
    for i in range(1, len(roles) + 1):
        if roles[i - 1] not in ("user", "tool"):
            continue
        if i < len(roles) and roles[i] != "assistant":
            continue  # more results (or a user message) follow before the model speaks
        j = i
        while j < len(roles) and roles[j] == "assistant":
            j += 1
        out.append((i, j))
    return out


def session_requests(session, template: ChatTemplate, *, kwargs: Mapping | None = None,
                     start: datetime = PINNED_NOW, interval: timedelta = DEFAULT_INTERVAL) -> tuple[Request, ...]:
    """Every request of `session` (a `Session`, or one prepared for the server: `session.for_server`)
    with `template`.

    `kwargs`: extra template variables for every render (e.g. `{"enable_thinking": False}`).

        >>> [r.n_messages for r in session_requests(session, template)]   # doctest: +SKIP
        [2, 4, 6]
    """
    return tuple(iter_requests(session, template, kwargs=kwargs, start=start, interval=interval))


def iter_requests(session, template: ChatTemplate, *, kwargs: Mapping | None = None,
                  start: datetime = PINNED_NOW, interval: timedelta = DEFAULT_INTERVAL):
    """`session_requests` one request at a time (a caller looking for the first divergence stops early)."""
    conversation = for_server(template, session, kwargs)
    messages = list(conversation.messages)
    points = request_points(messages)
    if not points:
        raise InputError(f"{conversation.conversation.source}: no request in the session: the model speaks after a "
                         "user message or tool results; add a user message")
    for k, (n, end) in enumerate(points):
        when = start + k * interval
        clock = _clock_at(when)  # each request at its own time

        def draw(msgs, gp, clock=clock):
            return conversation.render(msgs, add_generation_prompt=gp, clock=clock)

        text = draw(messages[:n], True)
        gprompt = _generation_prompt(text, draw(messages[:n], False))
        generated, rule = "", ""
        if end > n:
            generated, rule = _generated_turn(draw, messages[:end], text, gprompt)
        yield Request(k, n, text, gprompt, generated, (n, end), rule, when)


def _generation_prompt(with_gp: str, without: str) -> str:
    """What `add_generation_prompt=True` appends (the end of the render that is new)."""
    if with_gp.startswith(without):
        return with_gp[len(without):]
    return with_gp[common_prefix(with_gp, without):]


def _generated_turn(draw, messages: list, request: str, gprompt: str) -> tuple[str, str]:
    full = draw(messages, False)
    if full.startswith(request):
        return full[len(request):], "prefix"
    # The needle render: the same history, the newest turn with other content (see the module doc).
    needle = draw(messages[:-1] + [{"role": "assistant", "content": _NEEDLE}], False)
    shared = common_prefix(full, needle)
    opening = 0
    for h in range(min(len(gprompt), shared), 0, -1):
        if full[shared - h:shared] == gprompt[:h]:
            opening = h
            break
    turn = full[shared - opening:]
    return turn[common_prefix(gprompt, turn):], "newest-turn"


def next_renders(session, template: ChatTemplate, requests: Sequence[Request], *, kwargs: Mapping | None = None) -> tuple[tuple[str, ...], ...]:
    """For each request, the renders of the requests that can follow it, known before they come:
    the generated turn's tool calls answered (when it makes any), a new user message, and, after
    tool calls, a new user message once they are answered and the model has replied.

    Where these stop matching what the server holds is where the template's next render will
    diverge; the divergence-aware policy puts its checkpoints there. The last follow-up matters
    where a template refuses a user message right after a tool call (Mistral's alternation) and
    rewrites the last user message when the next one comes (Mistral Nemo moves the system prompt
    into it): the rewrite lies in this request's new tokens, so a checkpoint for it can be saved
    only now, requests before the user speaks again. Only the template and the conversation so far
    are used, never the session's later messages.
    """
    conversation = for_server(template, session, kwargs)
    messages = list(conversation.messages)
    out: list[tuple[str, ...]] = []
    for r in requests:
        if not r.generated:
            out.append(())
            continue
        upto = messages[:r.turn[1]]
        calls = [c for m in messages[r.turn[0]:r.turn[1]] for c in (m.get("tool_calls") or ())]
        ask = {"role": "user", "content": "next request"}
        follow = [[ask]]
        if calls:
            answered = [{"role": "tool", "tool_call_id": c.get("id", ""), "name": c.get("function", c).get("name", ""),
                         "content": "result"} for c in calls]
            follow += [answered, answered + [{"role": "assistant", "content": "done"}, ask]]
        texts: list[str] = []
        for extra in follow:
            try:
                texts.append(conversation.render(upto + extra, clock=_clock_at(r.time)))
            except TmplkitError:  # a template may refuse a shape; that follow-up is then not predicted
                continue
        out.append(tuple(texts))
    return tuple(out)
