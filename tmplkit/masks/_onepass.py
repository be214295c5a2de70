"""The masks' one-render path: each turn found in the whole render from the proven spans, where the
requests read off that render are known to give what the requests themselves give.

`_mask._prefix_turns` renders every request twice (the request, and the conversation up to its
turn's end) and proves each one a prefix of the whole render: a session of R requests costs about
R whole renders. Where each message starts a proven span of its own role (one span per message,
in order), the render of the messages before message m is the whole render up to that span, as
far as prefix stability holds; so request k is the whole render up to its turn's first span and
the generation prompt, and its turn ends where the next message's span starts. Two facts make that
safe, each checked:

- per template (and extra variables), once: on probe conversations of our own (a plain chat with
  and without a system message, a generated agent session with reasoning and tool calls), this
  path finds what the proving path finds, turn for turn (`trusted`, cached);
- per conversation: one span per message with the message's role, and the last request rendered
  (one render) a prefix of the whole render.

A turn is taken as the model generates it where the render writes the generation prompt at its
span, then every text of its messages, the first turn of its kind equal to the turn asked for
alone. Otherwise the history writes it otherwise (Qwen3 drops an earlier turn's reasoning once a
user message follows): it is found as the proving path finds a turn from its request (`_mask`'s
`_locate`), from the request the whole render implies and the turn asked for alone, one short
render a turn instead of two long ones a request. What a request writes from its turn's span on
is what the requests after a message of its role write (a template may write another generation
prompt after tool results than after a user message): the last request's, or one more render, of
the first such request.

Anything else returns None and the caller proves each request as before. A test holds this path
equal to the proving path on fixtures, corpus templates and generated sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..delimiters import TextSpan
from ..errors import TmplkitError
from ..sandbox import PINNED_NOW
from ..session import ServerConversation, generate_session, load_conversation, trusted_by_probes
from ..session.requests import TurnEndings, clock_at, request_points

__all__: list[str] = []  # private to the masks

Located = list[tuple[tuple[int, int], int, int, str]]

_NOT_TURN = ("reasoning", "reasoning_end")
_TRUSTED: dict = {}


def message_starts(spans: Sequence[TextSpan], messages: Sequence[dict]) -> list[int] | None:
    """Where each message's span starts, where the render has exactly one proven span per message,
    in order, with the message's role (reasoning markup aside); else None."""
    own = [s for s in spans if s.role not in _NOT_TURN]
    if len(own) != len(messages) or any(s.role != m.get("role") for s, m in zip(own, messages)):
        return None
    return [s.start for s in own]


def one_render_turns(server: ServerConversation, text: str, spans: Sequence[TextSpan],
                     locate: Callable[[Asked], tuple[int, int, str]] | None = None,
                     endings: TurnEndings | None = None) -> Located | None:
    """(turn, start, end, rule) of each generated turn, as `_located_turns` finds them, from the
    whole render `text` and its spans and one render of the last request; None where the
    conversation's shape does not allow it (see the module doc). A turn the history writes
    otherwise than the model generates it (reasoning dropped once a user message follows) is found
    by `locate` as the proving path finds it, from the request the whole render implies and the
    turn asked for alone. `endings`: the conversation's `TurnEndings`, where the caller has them."""
    messages = list(server.messages)
    starts = message_starts(spans, messages)
    if starts is None:
        return None
    points = [(n, end) for n, end in request_points(messages) if end > n]
    if not points:
        return []
    n_last = points[-1][0]
    try:
        request = server.render(messages[:n_last], add_generation_prompt=True, clock=clock_at(PINNED_NOW))
    except TmplkitError:
        return None
    if not text.startswith(request) or len(request) < starts[n_last]:
        return None
    prompts = _Prompts(server, text, starts, request[starts[n_last]:], n_last)
    endings = TurnEndings(server) if endings is None else endings
    alone = _Alone(server, endings)
    checked: dict[tuple, bool] = {}  # kind of turn -> whether its first one is written as generated
    out: Located = []
    for n, end in points:
        turn = messages[n:end]
        prompt = prompts.after(n)
        if prompt is None:
            return None
        found = _as_generated(text, starts, n, end, prompt, endings, alone, checked, messages)
        if found is None:
            own = alone.generated(turn)
            found = locate(Asked(starts[n], prompt, own, (n, end))) if locate and own is not None else None
            if found is None:
                return None
        out.append(((n, end), *found))
    return out


class _Prompts:
    """What each request writes from its turn's span on (its generation prompt, and any markup of
    the message before that the span starts with), by the role of the message it follows: the last
    request's, and for a request that follows another role (DeepSeek V3.1 writes no prompt after tool
    results, `<｜Assistant｜><think></think>` after a user message) the first such request's, read off
    one render of it where it agrees with the whole render up to the span."""

    def __init__(self, server: ServerConversation, text: str, starts: list, last: str, n_last: int):
        self._server, self._text, self._starts = server, text, starts
        self._messages = list(server.messages)
        self._by_role: dict = {self._messages[n_last - 1].get("role"): last}

    def after(self, n: int) -> str | None:
        role = self._messages[n - 1].get("role")
        if role not in self._by_role:
            at = self._starts[n]
            try:
                request = self._server.render(self._messages[:n], add_generation_prompt=True, clock=clock_at(PINNED_NOW))
            except TmplkitError:
                return None
            if len(request) < at or not self._text.startswith(request[:at]):
                return None
            self._by_role[role] = request[at:]
        return self._by_role[role]


@dataclass(frozen=True)
class Asked:
    """The request for a turn as the whole render implies it (the render up to `at`, where the turn's
    span starts, then the generation prompt) and the turn as the model generates it asked for alone:
    what the proving path's `_locate` reads of a request."""

    at: int
    generation_prompt: str
    generated: str
    turn: tuple[int, int]


def _as_generated(text: str, starts, n: int, end: int, prompt: str, endings, alone, checked: dict, messages):
    """(start, end, "exact") of the turn of messages n..end-1 where the whole render writes it as the
    model generates it (the generation prompt at its span, every text of the turn after it, and the
    first turn of its kind equal to the turn asked for alone); None where not."""
    start = starts[n] + len(prompt)
    stop = starts[end] if end < len(messages) else len(text)
    if not text.startswith(prompt, starts[n]) or stop < start:
        return None
    generated = endings.strip(messages[end - 1], text[start:stop], messages[n - 1] if n else None)
    if not _holds_its_text(generated, messages[n:end]):
        return None  # the history leaves out or rewrites some of the turn (reasoning dropped)
    kind = _kind(messages[n:end], messages[end] if end < len(messages) else None)
    if kind not in checked:
        checked[kind] = generated == alone.generated(messages[n:end])
    return (start, start + len(generated), "exact") if checked[kind] else None


_TEXT_KEYS = ("content", "reasoning_content", "thinking", "reasoning")


def _holds_its_text(generated: str, turn: Sequence[dict]) -> bool:
    """Whether `generated` holds every text of the turn's messages (content and reasoning) as given."""
    return all(v in generated for m in turn for k in _TEXT_KEYS if isinstance(v := m.get(k), str))


def _kind(turn: Sequence[dict], after: dict | None) -> tuple:
    """A turn's shape: each message's role, the keys it fills, its tool calls; the next message's role."""
    return (tuple((m.get("role"), tuple(sorted(k for k, v in m.items() if v not in (None, "", [], {}))),
                   len(m.get("tool_calls") or ())) for m in turn), after.get("role") if after else None)


class _Alone:
    """What the model generates for a turn asked for alone: the turn's messages after one user
    message, rendered as the newest (the render less the request's, less the newest-only ending).
    A short render a turn, against which the turn as the whole render holds it is checked: a
    history that writes a turn otherwise (reasoning dropped once a user message follows) differs."""

    _ASK = {"role": "user", "content": "Hello."}

    def __init__(self, server: ServerConversation, endings: TurnEndings):
        self._server, self._endings = server, endings
        self._request: str | None = None
        self._clock = clock_at(PINNED_NOW)

    def generated(self, turn: Sequence[dict]) -> str | None:
        try:
            if self._request is None:
                self._request = self._server.render([self._ASK], add_generation_prompt=True, clock=self._clock)
            full = self._server.render([self._ASK, *turn], add_generation_prompt=False, clock=self._clock)
        except TmplkitError:
            return None
        if not full.startswith(self._request):
            return None
        return self._endings.strip(turn[-1], full[len(self._request):])


def probe_conversations() -> list:
    """The conversations the one-render path is held against the proving path on, per template."""
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]
    return [load_conversation([{"role": "system", "content": "Be brief."}] + plain), load_conversation(plain),
            generate_session(1500, seed=0, requests=2), generate_session(3000, seed=3, style="agent")]


def trusted(server: ServerConversation, agree: Callable[[object], bool | None]) -> bool:
    """Whether the one-render path may serve `server`'s template (with its extra variables):
    `agree(conversation)` says, for each probe conversation, whether the one-render path found what
    the proving path finds (`session.trusted_by_probes`, read once per template, message
    preparation and variables)."""
    return trusted_by_probes(_TRUSTED, server, agree, probe_conversations)
