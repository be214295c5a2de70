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
   "newest-turn"). A needle render (the turn's content replaced by a needle) shows where the
   turn's own content begins. The turn's header is the place before it that opens as the
   generation prompt does (its first markup unit) and whose preceding text agrees longest with
   the request's history (`turn_header`): the history's end stays the text right before the turn
   even where the template rewrites earlier history once the turn exists (gpt-oss-20b drops an
   earlier turn's analysis). The generated text is what the turn writes after the generation
   prompt as the turn writes it (`after_prompt`): where the turn writes the prompt otherwise (an
   empty reasoning block the prompt closed, which the history prints with the turn's reasoning
   in it), the part they share is the header and the turn's text starts after the rest of the
   prompt there, or after the whitespace the prompt ends with where the header writes it again
   (header-ahead's `assistant\\n\\n ` against the prompt `assistant\\nDestination: user\\n\\n `).
   So the turn holds what the template writes before its content: Gemma 4's tool calls,
   gpt-oss-20b's analysis message before its answer. With no such header (an empty generation
   prompt) the markup the history ends with and the turn writes otherwise plays the prompt's
   part; failing that, the turn starts where the text before the needle stops matching the
   generation prompt's opening. Where the template prints no content for the turn (the needle
   changes nothing: a tool-call turn whose text it drops) and no header is found, the turn is
   what follows the render's last copy of the generation prompt (or of its longest part up to a
   markup boundary), or, without one, the previous message's content and what the request
   writes after it.

The turn ends where that turn ends, not where the render does: what a template writes after the
newest message only because it is the newest (a next assistant header it prints whatever
`add_generation_prompt` says, gpt-oss's `<|return|>` where a followed turn has `<|end|>`) is no
part of what the model generates (`turn_ending`): the model stops at its end of generation, which
the server does not keep.

    >>> reqs = session_requests(session, template)                       # doctest: +SKIP
    >>> reqs[0].text.endswith(reqs[0].generation_prompt), reqs[0].held.startswith(reqs[0].text)  # doctest: +SKIP
    (True, True)

Each request is rendered at its own time (`start + k * interval`), so a template that prints the
time or date shows it as a clock would.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..errors import InputError, RenderError, TmplkitError
from ..markup import BOUNDARY, MARKUP_END, UNIT, back_to_boundary, lcs, unit_prefix, unit_start
from ..markup import lcp as common_prefix  # strings and token lists alike
from ..sandbox import PINNED_NOW
from ..sources.templates import ChatTemplate
from ._render import for_server
from ._turn_alone import LONG_HISTORY, MIN_HISTORY, EarlierCopies, context_of, path_trust, read_once_per_template, since_user

__all__ = ["NEEDLE", "FollowUpPlan", "Request", "ShortFollowUps", "TurnEndings", "after_prompt", "common_prefix", "follow_up_renders",
           "follow_ups", "iter_next_renders", "iter_requests", "locate_turn", "long_history_turns", "may_splice", "newest_only", "next_renders",
           "request_points", "session_requests", "short_follow_ups", "spliced_follow_ups", "turn_ending", "turn_header",
           "written_always"]

# The content that marks where a message's own text lies in a render (the turns study's generated
# turn, the masks' turn in a whole render): invisible separators around a word no template writes.
NEEDLE = "\u2063needle\u2063"
_NEXT = "\u2063next\u2063"
_HELLO = "Hello."  # the probe's user message before the turn (`written_always`, `_newest_only`)


def clock_at(t: datetime) -> Callable[[], datetime]:
    """A clock that always reads `t` (a request's time, for `strftime_now`)."""
    return lambda: t


DEFAULT_INTERVAL = timedelta(seconds=90)


@dataclass(frozen=True)
class Request:
    """One request of a session.

    `n_messages`: messages[:n_messages] are rendered; `turn`: the (start, end) message indices of
    the assistant turn the model then generates (empty for the session's last request when it ends
    on a user or tool message); `generated`: that turn's text as the model emits it; `rule`: how
    it was derived ("prefix", "newest-turn", "unrendered" where the template renders no conversation
    ending with the turn, or "" when nothing is generated).
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
    tool results, or a system message that follows them (an instruction a client adds mid-way), not
    before the first user message (an assistant greeting there is no generated turn); its turn is
    the assistant messages that follow (turn_end == n_messages: none)."""
    roles = [m.get("role") for m in messages]
    first_user = roles.index("user") if "user" in roles else len(roles)
    out = []
    for i in range(1, len(roles) + 1):
        if roles[i - 1] not in ("user", "tool", "system") or i - 1 < first_user:
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
                  start: datetime = PINNED_NOW, interval: timedelta = DEFAULT_INTERVAL, alone: bool | None = None):
    """`session_requests` one request at a time (a caller looking for the first divergence stops early).
    `alone`: each generated turn read off two short renders where that is known to give what the
    whole render gives (`_turn_alone`; None: from the first request with a history of
    `LONG_HISTORY` messages on, where the rest of the session is long enough to pay for the
    check), True: wherever the short renders apply (the check's own runs), False: never."""
    conversation = for_server(template, session, kwargs)
    messages = list(conversation.messages)
    points = request_points(messages)
    if not points:
        raise InputError(f"{conversation.conversation.source}: no request in the session: the model speaks after a "
                         "user message or tool results; add a user message")
    endings = TurnEndings(conversation)
    times = [start + k * interval for k in range(len(points))]
    last, copies = None, None
    pending: tuple[Request, tuple[str, str]] | None = None  # (a request whose turn was asked for alone, its renders)
    for k, (n, end) in enumerate(points):
        if alone is None and n >= LONG_HISTORY:
            # (decided where the histories grow long, not before: a walk that stops at an early
            # divergence, as the switches' do, pays for no check)
            alone, last, copies = _alone_pays(conversation, template, messages, points, k, times, endings)
        if last is not None and k == len(points) - 1:
            req, rendered, served = last, (last.text, ""), False  # (read both ways already)
        else:
            # (a turn with a copy earlier in the conversation: read whole, see EarlierCopies)
            short = bool(alone) and not (copies is not None and copies.before(range(n, end), n))
            req, rendered, served = _request_read(conversation, endings, messages, k, n, end, times[k], short)
        if pending is not None:
            yield _confirmed(conversation, endings, messages, pending, req.text)
            pending = None
        if served:
            pending = (req, rendered)
        else:
            yield req
    if pending is not None:
        # (the last request, which no request follows to check it by: where the short path was
        # decided here, `_alone_pays` read it both ways and it is not served; the probes' own runs,
        # `alone=True`, compare it with its whole read themselves)
        yield pending[0]


def _confirmed(conversation, endings: TurnEndings, messages: list, pending: tuple, following: str) -> Request:
    """A request whose turn was asked for alone, where the request after it (`following`) starts
    with what the server then holds; else the request with its turn read off the whole render. (A
    template whose history changes once the turn exists, as one that warns of a call repeated too
    often does, is seen where the next request rewrites what is held: the turn, or the rule it was
    read by, may be another in the whole render.)"""
    req, rendered = pending
    if following.startswith(req.held):
        return req
    n, end = req.turn
    return _request(conversation, endings, messages, req.index, n, end, req.time, False, rendered)


def _request(conversation, endings: TurnEndings, messages: list, k: int, n: int, end: int, when: datetime,
             alone: bool, rendered: tuple[str, str] | None = None) -> Request:
    """Request k: the render of messages[:n] at `when`, and the turn messages[n:end] generated after
    it (asked for alone where `alone` and the short renders apply). `rendered`: the request's
    render with and without the generation prompt, where made before."""
    return _request_read(conversation, endings, messages, k, n, end, when, alone, rendered)[0]


def _request_read(conversation, endings: TurnEndings, messages: list, k: int, n: int, end: int, when: datetime,
                  alone: bool, rendered: tuple[str, str] | None = None) -> tuple[Request, tuple[str, str], bool]:
    """`_request`, with the request's two renders and whether its turn was asked for alone."""
    clock = clock_at(when)  # each request at its own time

    def draw(msgs, gp, clock=clock):
        return conversation.render(msgs, add_generation_prompt=gp, clock=clock)

    # (one pass for both, where it can)
    text, bare = rendered if rendered is not None else conversation.render_with_prompt(messages[:n], clock=clock)
    gprompt = _generation_prompt(text, bare)
    # A prompt the template writes whatever `add_generation_prompt` says: the two renders are
    # alike, and the request ends with what a render writes only after its newest message (read
    # after an answer: the request is the same whatever kind of turn the model then generates).
    always = endings.always(_ASSISTANT) if text == bare else ""
    if always and text.endswith(always):
        gprompt = always
    else:
        always = ""
    generated, rule, served = "", "", False
    if end > n:
        found = _turn_asked_alone(conversation, draw, clock, messages, n, end) if alone and not always else None
        served = found is not None
        if found is not None:
            generated, rule = found
        else:
            try:
                generated, rule = _generated_turn(draw, messages[:end], text, gprompt, n)
            except RenderError:
                # The template renders the request but no conversation that ends with the turn
                # (a classifier that wants a user message last): what the model wrote is unknown,
                # the server holds the request (and that turn), and the next request is compared
                # with the request alone.
                generated, rule = "", "unrendered"
        generated = endings.strip(messages[end - 1], generated, messages[n - 1] if n else None)
        if always and generated.endswith(always):
            # (the next turn's prompt, which the model does not write: the template wrote it)
            generated = generated[:-len(always)]
    return Request(k, n, text, gprompt, generated, (n, end), rule, when), (text, bare), served


def _turn_asked_alone(conversation, draw, clock, messages: list, n: int, end: int) -> tuple[str, str] | None:
    """(generated, rule) of the turn messages[n:end] read off the short conversation that asks for
    it alone (`_turn_alone`), as `_generated_turn` reads it off the whole one; None where the
    template renders no such conversation."""
    context = context_of(messages, n)
    if context is None:
        return None
    try:
        asked, bare = conversation.render_with_prompt(context, clock=clock)
        return _generated_turn(draw, context + messages[n:end], asked, _generation_prompt(asked, bare), len(context))
    except RenderError:
        return None


def _alone_pays(conversation, template, messages: list, points: list, first: int, times: list, endings: TurnEndings):
    """(whether the generated turns from request `first` on are asked for alone, the last request
    where checking it made it, the copies to read whole: `EarlierCopies` or None): only where those
    turns' histories cost more to render whole than proving the short path, on a template trusted
    with it whose last turn, after the longest history, reads the same both ways."""
    turns = [k for k, (n, end) in enumerate(points) if end > n and k >= first]
    if sum(points[k][0] for k in turns) < MIN_HISTORY:
        return False, None, None
    trusted, with_copies = _trust("turns", conversation, template, _turns_agree)
    if not trusted:
        return False, None, None
    k = turns[-1]
    n, end = points[k]
    whole = _request(conversation, endings, messages, k, n, end, times[k], False)
    short = _request(conversation, endings, messages, k, n, end, times[k], True)
    if (short.generated, short.rule) != (whole.generated, whole.rule):
        return False, None, None
    return True, (whole if k == len(points) - 1 else None), (None if with_copies else EarlierCopies(messages))


def _trust(path: str, conversation, template, agree) -> tuple[bool, bool]:
    """`_turn_alone.path_trust` of short path `path`: `agree(server, template)` on each probe
    prepared as `conversation` is (None where the template cannot render it)."""
    def on(probe) -> bool | None:
        try:
            return agree(for_server(template, probe, conversation.kwargs, inputs=conversation.inputs), template)
        except TmplkitError:
            return None

    return path_trust(path, conversation, on)


def _turns_agree(server, template) -> bool:
    """Whether every request of `server` reads the same generated turn both ways."""
    whole = [(r.generated, r.rule) for r in iter_requests(server, template, alone=False)]
    return whole == [(r.generated, r.rule) for r in iter_requests(server, template, alone=True)]


class TurnEndings:
    """What the newest turn ends with only for being the newest (`turn_ending`), read once per kind
    of turn (with tool calls or without) and cut off a generated turn: the request loop of the turns
    study and the masks' prefix path share it.

        >>> endings = TurnEndings(conversation)                                   # doctest: +SKIP
        >>> endings.strip(messages[end - 1], full[len(request):])                 # doctest: +SKIP
    """

    def __init__(self, conversation):
        self._conversation = conversation
        self._by_kind: dict[tuple[bool, bool], str] = {}  # (calls, after tool results) -> ending
        self._always: dict[bool, str] = {}

    def always(self, last: dict) -> str:
        """`written_always` for a turn whose last message is `last`, read once per kind of turn."""
        kind = bool(last.get("tool_calls"))
        if kind not in self._always:
            self._always[kind] = written_always(self._conversation, last)
        return self._always[kind]

    def strip(self, last: dict, generated: str, before: dict | None = None) -> str:
        """`generated` (a turn whose last message is `last`, after the message `before`) less the
        ending it has only for being the newest. After tool results, the ending read after a result
        comes first where there is one (Hy-Embodied closes its `<tool_responses>` at the render's end,
        after the answer that follows them: the answer's generated turn ended with it, which the
        whole render, a user message after the answer, does not hold, and its mask was empty)."""
        after_tool = before is not None and before.get("role") == "tool"
        for ending in (self._ending(last, True), self._ending(last, False)) if after_tool else (self._ending(last, False),):
            if ending and generated.endswith(ending):
                return generated[:-len(ending)]
        return generated

    def after_results(self, last: dict) -> str:
        """The ending a turn after tool results has only for being the newest, where it is not the
        one a turn after a user message has: markup that closes the results (Hy-Embodied's
        `</tool_responses>`), not the turn's end ("" where there is none)."""
        ending = self._ending(last, True)
        return ending if ending != self._ending(last, False) else ""

    def _ending(self, last: dict, after_tool: bool) -> str:
        key = (bool(last.get("tool_calls")), after_tool)
        if key not in self._by_kind:
            self._by_kind[key] = _cached_ending(self._conversation, last, after_tool)
        return self._by_kind[key]


def _cached_ending(conversation, last: dict, after_tool: bool) -> str:
    """`turn_ending`, read once per template, message preparation, variables, tools and shape of the
    turn (its keys; after a tool result, whether the session's results carry a name) for the process:
    a trainer masks thousands of conversations with one template, each of which read its probes anew
    (two short renders a kind of turn, a tenth of a 30k-token agent session's mask)."""
    tool: dict = next((m for m in conversation.messages if m.get("role") == "tool"), {})
    shape = (tuple(sorted(last)), bool(last.get("tool_calls")), after_tool, after_tool and "name" in tool)
    return read_once_per_template(_ENDINGS, conversation, lambda: turn_ending(conversation, last, after_tool=after_tool),
                                  shape, tools=True)


_ENDINGS: dict = {}  # `_cached_ending`'s cache


def turn_ending(conversation, turn: dict, *, after_tool: bool = False) -> str:
    """What the template writes after an assistant message of `turn`'s kind only when it is the
    newest message: the end of its render that a render with a user message after it does not share
    (a next assistant header printed whatever `add_generation_prompt` says; `<|return|>` where a
    followed turn has `<|end|>`). Read off two short renders, the turn's content a needle; "" where
    the template renders them alike or refuses them. `after_tool`: the turn follows a tool call's
    result (the probe asks, calls a tool and gets its result first)."""
    found = _newest_only(conversation, turn, _after_result(conversation) if after_tool else ())
    if found is None:
        return ""
    before, ending, after_content = found
    # An ending of markup, or one that starts right where the turn's content ends (a guard model's
    # instructions after the conversation), is taken; anything else is the turn written otherwise
    # (a tool-call turn whose text the template does not print; Apriel 1.5 writes a call's "id" only
    # where the call is followed, so the two part inside the call's JSON, `}]</tool_calls>...` of
    # which is the model's to write).
    # A whole turn of another role the template writes only after the newest message, after the
    # turn's own end (Command R+ tool_use's system instructions, `<|END_OF_TURN_TOKEN|>` then
    # `<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write 'Action:'...`) is taken too: the model stops at its end.
    after_end = bool(before.strip()) and not UNIT.sub("", before).strip() and UNIT.match(ending) is not None
    return ending if _markup_only(ending) or (not before.strip() and after_content) or after_end else ""


def newest_only(conversation, turn: dict) -> str:
    """`turn_ending` before it is judged: all the end of the render of a turn of `turn`'s kind as the
    newest message that a render with a user message after it does not share, whatever it holds
    (the masks prove otherwise that it is no part of the turn); "" where there is none."""
    found = _newest_only(conversation, turn)
    return found[1] if found else ""


def written_always(conversation, turn: dict) -> str:
    """A generation prompt the template writes whatever `add_generation_prompt` says, the next
    turn's, which a render ends with after an assistant message of `turn`'s kind too: what such a
    render writes only after its newest message (`newest_only`) where a render with a user message
    last ends with it, with `add_generation_prompt` and without, and the opening that render writes
    right before it where it starts at a role word (CodeLlama 70b's `Source: assistant\nDestination:
    user\n\n `: a followed turn writes `Source: ` too, before `user`). "" where none. Read off four
    short renders once per template, message preparation, variables, tools and kind of turn (the
    masks' last turn and the turns study's requests share them)."""
    return read_once_per_template(_ALWAYS, conversation, lambda: _written_always(conversation, turn),
                                  (bool(turn.get("tool_calls")),), tools=True)


def _written_always(conversation, turn: dict) -> str:
    found = _newest_only(conversation, turn)
    # (the turn's content in both renders: a template that prints none of it writes nothing "after" it,
    # and what the two renders part at may be the probe's own user message, Hy-Embodied-VLM's)
    ending = found[1] if found and found[2] else ""
    if not ending.strip():
        return ""
    ask = [{"role": "user", "content": _HELLO}]
    try:
        renders = [conversation.render(ask, add_generation_prompt=gp) for gp in (False, True)]
    except TmplkitError:
        return ""
    return _with_opening(renders[0], ending) if all(r.endswith(ending) for r in renders) else ""


_ALWAYS: dict = {}  # `written_always`'s cache
_ASSISTANT = {"role": "assistant", "content": ""}


def _with_opening(text: str, ending: str) -> str:
    """`ending`, which `text` ends with, with the opening `text` writes right before it where it
    starts at a role word: the text since the whitespace or markup before that opening (`Source: `
    before `assistant`), which a header shares with the next message's; `ending` where there is none."""
    if not ending[:1].isalpha():
        return ending
    head = text[:len(text) - len(ending)]
    word = head.rstrip(" \t")
    k = len(word)
    while k > 0 and not word[k - 1].isspace() and word[k - 1] not in BOUNDARY:
        k -= 1
    return text[k:] if 0 < k < len(word) else ending


def _after_result(conversation) -> tuple[dict, ...]:
    """A tool call and its result, shaped as the session's own (for a probe after the user's ask)."""
    call = {"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": {}}}
    return ({"role": "assistant", "content": "", "tool_calls": [call]}, _tool_result(conversation.messages, call))


def _newest_only(conversation, turn: dict, between: Sequence[dict] = ()) -> tuple[str, str, bool] | None:
    """(what the newest turn writes before its ending, from its content on where the needle is
    found; the ending; whether it was) off two short renders, `between` the probe's ask and the
    turn; None where they are alike or refused."""
    mine = {**turn, "content": NEEDLE}
    ask = {"role": "user", "content": _HELLO}
    try:
        last = conversation.render([ask, *between, mine], add_generation_prompt=False)
        followed = conversation.render([ask, *between, mine, {"role": "user", "content": _NEXT}],
                                       add_generation_prompt=False)
    except TmplkitError:
        return None
    a, b = last.rfind(NEEDLE), followed.rfind(NEEDLE)
    # (the turn's header as a user message's answer writes it: after a probe's tool result, the
    # markup read back from the turn would run over the result's text into the call's)
    head = last[:a] if a >= 0 and not between else ""
    if a >= 0 and b >= 0:
        # Compared from the turn's content on: a followed turn's history may be written otherwise
        # before it (reasoning dropped once a user message follows), which says nothing of its end.
        last, followed = last[a + len(NEEDLE):], followed[b + len(NEEDLE):]
    k = common_prefix(last, followed)
    if k >= len(last):
        return None
    k = back_to_boundary(last, k)
    opener = [u for u in UNIT.finditer(last, 0, k) if u.end() == k]
    if opener and (last[k:k + 1].isalpha() or (
            UNIT.match(last, k) and _opens_a_turn(head or _plain_head(conversation, ask), last, opener[0].start(), k))):
        # The renders part right after a shared opener, at the role that follows it
        # (`<|start_header_id|>` + `assistant` or `user`): the opener is the next turn's.
        k = opener[0].start()
    return last[:k], last[k:], a >= 0 and b >= 0


def _plain_head(conversation, ask: dict) -> str:
    """The render of an answer after the probe's user message, before the answer's content: the
    header of a turn whose content the template does not print (a tool-call turn of Command R7B's)."""
    try:
        text = conversation.render([ask, {"role": "assistant", "content": NEEDLE}], add_generation_prompt=False)
    except TmplkitError:
        return ""
    return text[:max(0, text.rfind(NEEDLE))]


def _opens_a_turn(head: str, last: str, j: int, k: int) -> bool:
    """Whether the unit last[j:k], after which the two renders part at a unit (Command R7B's
    `<|START_OF_TURN_TOKEN|>` + `<|CHATBOT_TOKEN|>` or `<|USER_TOKEN|>`), opens the next turn rather
    than ends this one: the turn's own header in `head` (the render before its content) writes it
    followed by the same unit, and the probe's user message is not followed by it, whitespace
    aside (a unit that ends every turn is written there: `<|end|><|assistant|>` keeps its `<|end|>`)."""
    role = UNIT.match(last, k)
    if role is None or not head:
        return False
    found = MARKUP_END.search(head[-1000:])  # (a header is short; the probe's system preamble may not be)
    header = found.group() if found is not None else ""
    at = header.find(last[j:k])
    ask = head.rfind(_HELLO)
    # (the header writes the unit, then its role's: whichever role's the renders part at, a system
    # turn written after the newest message, Command R+ tool_use's, or the user's)
    return (at >= 0 and UNIT.match(header, at + k - j) is not None
            and ask >= 0 and not head[ask + len(_HELLO):].lstrip().startswith(last[j:k]))


def _markup_only(text: str) -> bool:
    """Whether `text` holds nothing but markup units, role words and whitespace."""
    rest = UNIT.sub(" ", text).split()
    return all(w.lower().strip(":|") in ("assistant", "model", "bot", "chatbot", "") for w in rest)


def _generation_prompt(with_gp: str, without: str) -> str:
    """What `add_generation_prompt=True` appends (the end of the render that is new), from the start
    of the markup unit the two renders part inside (Phi-3.5's `<|assistant|>` against the `</s>` it
    writes without a prompt share their `<`: the prompt read `|assistant|>`)."""
    if with_gp.startswith(without):
        return with_gp[len(without):]
    return with_gp[unit_start(with_gp, common_prefix(with_gp, without)):]


def _generated_turn(draw, messages: list, request: str, gprompt: str, first: int | None = None) -> tuple[str, str]:
    """(generated, rule) of the turn that ends `messages`, asked for by `request` (its generation
    prompt `gprompt`); `first`: the index of the turn's first message (a turn may be a run of
    assistant messages), the last message where not given."""
    full = draw(messages, False)
    if full.startswith(request):
        return full[len(request):], "prefix"
    needle, printed = _needle_render(draw, messages, full, len(messages) - 1 if first is None else first)
    shared = common_prefix(full, needle) if printed else len(full)
    history = request[:len(request) - len(gprompt)] if request.endswith(gprompt) else request
    at = locate_turn(full, history, gprompt, shared)
    if at >= 0:
        return full[at:], "newest-turn"
    if not printed:
        # The template prints no content for this turn (a tool-call turn whose text it drops): the
        # turn is what follows the last copy of its header the render writes (the generation
        # prompt, or its longest part up to a markup boundary: a `<think>` opener it does not print).
        for k in range(len(gprompt), 0, -1):
            if gprompt[k - 1] in BOUNDARY and gprompt[:k].strip() and gprompt[:k] in full:
                return full[full.rfind(gprompt[:k]) + k:], "newest-turn"
        # No header (an empty generation prompt): the turn follows the previous message as the
        # request ends it (its content, then what the request writes after it).
        before = messages[-2].get("content") if len(messages) > 1 else None
        if isinstance(before, str) and before and before in request:
            anchor = request[request.rfind(before):]
            if anchor in full:
                return full[full.rfind(anchor) + len(anchor):], "newest-turn"
    opening = 0
    for h in range(min(len(gprompt), shared), 0, -1):
        if full[shared - h:shared] == gprompt[:h]:
            opening = h
            break
    turn = full[shared - opening:]
    return turn[back_to_boundary(turn, common_prefix(gprompt, turn)):], "newest-turn"


def _needle_render(draw, messages: list, full: str, first: int) -> tuple[str, bool]:
    """The needle render (see the module doc): the same history, the turn's first message with
    other content (every key of it as the client sent it, its content a needle), and whether the
    template prints that content. The turn starts at its first message: of a run of two answers,
    the needle in the second found the second alone, and the first answer was learned nowhere. Where
    the first prints no content (a tool-call message whose text the template drops) the needle goes
    in the last, as for a turn of one message."""
    for i in dict.fromkeys((first, len(messages) - 1)):
        needle = draw(messages[:i] + [{**messages[i], "content": NEEDLE}] + messages[i + 1:], False)
        if needle != full:
            return needle, True
    return full, False


def locate_turn(full: str, history: str, gprompt: str, limit: int, stops: Sequence[int] = (), *,
                header: int | None = None) -> int:
    """Where the model's own text starts in `full` (a render that holds the turn the model generated
    after `history` + `gprompt`), or -1 where no header says: the one way a turn is located in a
    render, for the turns study (the render that ends with the turn) and the masks (the whole
    conversation's render). `header`: where the turn's header is already known to start (the render
    agrees with the request up to the history's end); else it is found: after the turn's header
    (`turn_header`) and the generation prompt as the turn writes it (`after_prompt`); with an empty
    generation prompt, after the markup the history ends with where the turn writes it otherwise:
    later, after reasoning the history's own header closed (Command R7B's `<|END_THINKING|>` ends
    the user turn; the history prints the reasoning inside), or not at all (DeepSeek R1-Distill
    leaves out `<｜tool▁outputs▁end｜>` before a turn's next calls). `limit`: where the turn's
    content begins (or the render's end); `stops`: where other messages' spans start, which the
    prompt's end is not looked for past."""
    prompt = gprompt
    if header is not None:
        k = bisect_left(stops, header + 1)
        return after_prompt(full, header, prompt, min(limit, stops[k]) if k < len(stops) else limit)
    header = turn_header(full, history, gprompt, limit)
    if header < 0:
        if gprompt.strip():
            return -1
        end = unit_prefix(full, common_prefix(full, history))
        if end >= min(len(history), limit):
            return -1
        if not _markup_only(history[end:]):
            return _history_end(full, history, end, limit)
        header, prompt = end, history[end:]
    k = bisect_left(stops, header + 1)
    return after_prompt(full, header, prompt, min(limit, stops[k]) if k < len(stops) else limit)


def _history_end(full: str, history: str, start: int, limit: int) -> int:
    """Where the request's history ends in `full`, between `start` (where the two part) and `limit`:
    after the copy of the history's last characters whose preceding text agrees longest with the
    history (Mistral v0.3 writes the system prompt into the last user message only, so once the
    turn follows it is gone: the turn still starts right after `[/INST]`); -1 where none is found."""
    key = history[-8:]
    best, score = -1, 0
    at = full.find(key, start, limit)
    while at >= 0:
        k = lcs(full[:at + len(key)], history)
        if k >= score:
            best, score = at + len(key), k
        at = full.find(key, at + 1, limit)
    return best


# How much of the request's history must precede a header for it to be the turn's (a cheap filter
# before the full comparison).
_TAIL = 64


def turn_header(full: str, history: str, gprompt: str, limit: int) -> int:
    """Where the newest turn's header starts in `full` (the render that ends with the turn), or -1:
    of the places before `limit` (where the turn's content begins) that open as the generation
    prompt does (its first markup unit, `<|start|>` of `<|start|>assistant`), the one whose preceding
    text agrees longest with the request's `history`. The turn then starts there even where it
    writes something before its content (tool calls Gemma 4 prints before the text, gpt-oss-20b's
    analysis message before the final one) and where the history before it is written otherwise
    once the turn exists (gpt-oss-20b drops an earlier turn's analysis): the history's end is still
    the text right before the turn."""
    lead = _prompt_lead(gprompt)
    if not lead:
        return -1
    # Of every form's best place, the one whose text agrees longest with it: a form's last characters
    # may also end an earlier message (a footer a tool result shares with an answer before it), where
    # the form that is the history's own agrees with all of it.
    best, score = -1, 0
    for before in _history_forms(history):
        at, k = _best_header(full, before, lead, limit, gprompt[:_leading_space(gprompt)])
        if k > score:
            best, score = at, k
        if k == len(before):  # (all of the history agrees: no shorter form can agree longer)
            break
    if best < 0 and history != history.rstrip():
        # The history ends with whitespace that the render with the turn writes otherwise (SvalTek's
        # `<|im_end|>\n\n` before the generation prompt, `<|im_end|>\n` before the turn): the header
        # is the place whose text agrees with the history less that whitespace.
        best = _best_header(full, history.rstrip(), lead, limit, loose=True)[0]
    if best < 0:
        best = _header_after_opener(full, history, lead, limit)
    return best


def _header_after_opener(full: str, history: str, lead: str, limit: int) -> int:
    """Where the turn's header starts when the history writes a markup unit before it that the
    generation prompt leaves out (Motif 2 opens every message with `<|startofturn|>`, its prompt is
    `<|assistant|>\n` alone: no header was found, and the turn lost the reasoning its history
    keeps): the place whose text, less the one unit before it, agrees with the history, that unit
    being one the history writes too. -1 where there is none."""
    tail = _history_tail(history)
    best, score = -1, 0
    at = full.find(lead, 0, limit)
    while at >= 0:
        opener = [u for u in UNIT.finditer(full, max(0, at - 2 * _TAIL), at) if u.end() == at]
        place = opener[0].start() if opener else -1
        # (the cheap filters first: a long session has a header for every turn)
        if place >= 0 and full.endswith(tail, 0, place) and opener[0].group(0) in history \
                and (k := lcs(full[:place], history)) > score:
            best, score = place, k
        at = full.find(lead, at + 1, limit)
    return best


def _history_forms(history: str) -> list[str]:
    """The request's history, then the history with its closing markup left out one unit at a
    time (at most three): a template may close a message only while it is the newest (Bielik 11B
    v3 leaves out a tool result's `<|im_end|>` once a turn follows it), so the turn's header then
    follows the message's text."""
    forms = [history] if history[-_TAIL:].strip() else []
    bare = history
    for _ in range(3):
        bare = bare.rstrip()
        tail = bare[-2 * _TAIL:]
        last = [m for m in UNIT.finditer(tail) if m.end() == len(tail)]
        if not last:
            break
        bare = bare[:len(bare) - len(last[0].group(0))]
        if bare[-_TAIL:].strip():
            forms.append(bare)
    return forms


def _best_header(full: str, history: str, lead: str, limit: int, space: str = "", *,
                 loose: bool = False) -> tuple[int, int]:
    """Of the places before `limit` that open with `lead`, or with `space` (the whitespace the
    generation prompt opens with) and then `lead`, the one whose preceding text agrees longest with
    `history`, and how long that is ((-1, 0): none ends with the history's last characters). (Apriel
    1.6's prompt opens `\\n<|begin_assistant|>`: the history ends before the line break, and no header was
    found, so the turn lost the reasoning its history keeps.) `loose`: the text before a place is
    compared less the whitespace it ends with."""
    tail = _history_tail(history)
    best, score = -1, 0
    at = full.find(lead, 0, limit)
    while at >= 0:
        for place in (at, at - len(space)) if space and full.endswith(space, 0, at) else (at,):
            end = _before_space(full, place) if loose else place
            if full.endswith(tail, 0, end):
                k = lcs(full[:end], history)
                if k >= score:
                    best, score = place, k
        at = full.find(lead, at + 1, limit)
    return best, score


def _history_tail(history: str) -> str:
    """The end of the request's history that the text before a header must end with (a cheap filter
    before the full comparison): `_TAIL` characters, or half of a history shorter than twice that
    (its start may be written otherwise once more messages follow, a system prompt the template
    hoists ahead of it: DeepSeek R1's)."""
    return history[-min(_TAIL, max(len(history) // 2, 1)):]


def _leading_space(text: str) -> int:
    """How many whitespace characters `text` opens with."""
    return len(text) - len(text.lstrip())


def _before_space(text: str, at: int) -> int:
    """Where the whitespace that text[:at] ends with begins."""
    while at > 0 and text[at - 1].isspace():
        at -= 1
    return at


def _prompt_lead(gprompt: str) -> str:
    """The generation prompt's opening that every form of the turn's header shares: its first
    markup unit, or its text up to the first markup boundary ("" for a prompt of whitespace)."""
    text = gprompt.lstrip()
    m = UNIT.match(text)
    if m:
        return m.group(0)
    k = next((i + 1 for i, c in enumerate(text) if c in BOUNDARY), len(text))
    return text[:k].strip()


def after_prompt(full: str, header: int, gprompt: str, limit: int) -> int:
    """Where the model's own text starts in the turn that begins at `header` in `full`: after the
    generation prompt as the turn writes it. Where the turn writes the prompt otherwise, the part
    they share is the header; the rest of the prompt (its markup from some unit on: the `<channel|>`
    of Gemma 4's empty `<|channel>thought\\n<channel|>`, the `</think>` of DeepSeek V3.2's
    `<think></think>`), where the turn writes it before `limit` with text after it, ends the
    header there (reasoning the prompt closed, which the history prints inside the block); where it
    does not, the turn's text starts after the shared part and the whitespace and markup the prompt
    ends with, where the header writes them again there (`_prompt_ending_repeated`). (Whitespace the
    history writes after that, `</think>\\n` before the content, is the model's to write, as a prefix
    would have it.)"""
    h = header
    space = _leading_space(gprompt)
    if space and not full.startswith(gprompt[:space], h):
        gprompt = gprompt[space:]  # (a header written without the whitespace the prompt opens with)
    k = common_prefix(gprompt, full[h:h + len(gprompt)])
    if k == len(gprompt):
        return h + k
    k = back_to_boundary(gprompt, k)
    rest = gprompt[k:]
    for m in UNIT.finditer(rest):
        for tail in dict.fromkeys((rest[m.start():], rest[m.start():].rstrip())):
            at = full.find(tail, h + k, limit)
            if at >= 0 and full[at + len(tail):].strip():
                return at + len(tail)
    return h + k + _prompt_ending_repeated(full, h, h + k, gprompt)


# The whitespace and markup units a text ends with.
_TRAILING = re.compile(r"(?:" + UNIT.pattern + r"|\s)+$")


def _prompt_ending_repeated(full: str, header: int, at: int, gprompt: str) -> int:
    """How far the whitespace and markup that the generation prompt ends with runs on past `at` in
    `full`, where the turn's header (from `header`), written otherwise than the prompt, stops sharing
    it: where the header's own run of them (from the end of its text) is the prompt's whole run and
    more, that run is the prompt's ending, which the history repeats, not the model's text
    (header-ahead's `assistant\\n\\n ` against the prompt `assistant\\nDestination: user\\n\\n `: the
    `\\n ` after the shared `assistant\\n`); 0 where the two runs differ (a `\\n` the history writes
    before tool calls after a prompt that ends with `<think>\\n`)."""
    ending = _TRAILING.search(gprompt)
    if ending is None:
        return 0
    own = _TRAILING.search(full, header, at)
    start = own.start() if own else at
    run = ending.group(0)
    return start + len(run) - at if start + len(run) > at and full.startswith(run, start) else 0


def _tool_result(messages, call: dict) -> dict:
    """A result for `call`, shaped like the session's own tool messages (a `name` only where the
    client sends one): a predicted follow-up adds no key the client would not send."""
    shape = next((m for m in messages if m.get("role") == "tool"), {"tool_call_id": ""})
    out = {"role": "tool", "tool_call_id": call.get("id", "")}
    if "name" in shape:
        out["name"] = call.get("function", call).get("name", "")
    return {**out, "content": "result"}


def next_renders(session, template: ChatTemplate, requests: Sequence[Request], *, kwargs: Mapping | None = None,
                 alone: bool | None = None) -> tuple[tuple[str, ...], ...]:
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

    `alone`: as `iter_requests`'s, for the follow-ups read off renders of the messages since the
    newest user message (`spliced_follow_ups`) in a long session.
    """
    return tuple(iter_next_renders(session, template, requests, kwargs=kwargs, alone=alone))


def iter_next_renders(session, template: ChatTemplate, requests: Sequence[Request], *, kwargs: Mapping | None = None,
                      alone: bool | None = None):
    """`next_renders` one request's at a time: a caller that reads each request's and lets them go
    holds one request's renders, not the session's (several times the session's requests' text)."""
    conversation = for_server(template, session, kwargs)
    plan = FollowUpPlan.of(conversation, template, requests, alone)
    for r in requests:
        yield plan.renders(r)


@dataclass(frozen=True)
class ShortFollowUps:
    """What `spliced_follow_ups` renders of a request, before it reads the follow-ups off the
    request's text: the request asked for from its newest user message on (`asked`, after the
    leading system messages), and each follow-up the same way (None where the template refuses it)."""

    asked: str
    texts: tuple[str | None, ...]


class FollowUpPlan:
    """Which requests' follow-ups are read off short renders (`spliced_follow_ups`, where the probes
    trust it on this template and the session's last such request agrees) and which are rendered
    whole; `renders(r)` gives them either way."""

    def __init__(self, conversation, spliced: frozenset[int], copies: EarlierCopies | None) -> None:
        self.conversation, self.messages = conversation, list(conversation.messages)
        self._spliced, self._copies = spliced, copies

    @classmethod
    def of(cls, conversation, template, requests: Sequence[Request], alone: bool | None = None) -> FollowUpPlan:
        """The plan for `requests` of `conversation` (a `ServerConversation`); `alone` as `next_renders`'."""
        messages = list(conversation.messages)
        late = [k for k in long_history_turns([r.turn for r in requests]) if requests[k].generated]  # (positions)
        indices = frozenset(requests[k].index for k in late)
        if alone is not None or not late:
            return cls(conversation, indices if alone else frozenset(), None)
        if not may_splice(conversation, template, [requests[k].n_messages for k in late]):
            return cls(conversation, frozenset(), None)
        with_copies = _trust("follow-ups", conversation, template, _follow_ups_agree)[1]  # (kept: may_splice read it)
        last = requests[late[-1]]
        if spliced_follow_ups(conversation, messages, last) not in (None, follow_up_renders(conversation, messages, last.turn, last.time)):
            return cls(conversation, frozenset(), None)
        return cls(conversation, indices, None if with_copies else EarlierCopies(messages))

    def splices(self, r: Request) -> bool:
        """Whether `r`'s follow-ups are read off short renders."""
        return bool(r.generated) and r.index in self._spliced and not (
            self._copies is not None and _copied(self._copies, self.messages, r))

    def renders(self, r: Request) -> tuple[str, ...]:
        """`follow_up_renders` of `r`, spliced where the plan says (a forked child's short renders
        are spliced the same way: `turns.ahead`)."""
        if not r.generated:
            return ()
        if self.splices(r):
            texts = spliced_follow_ups(self.conversation, self.messages, r)
            if texts is not None:
                return texts
        return follow_up_renders(self.conversation, self.messages, r.turn, r.time)


def long_history_turns(turns: Sequence[tuple[int, int]]) -> list[int]:
    """The indices of the requests, given by the turns they generate (message index ranges), that
    generate a turn after a history of `LONG_HISTORY` messages or more: those whose follow-ups may
    be spliced (`FollowUpPlan`)."""
    return [k for k, (n, end) in enumerate(turns) if end > n and n >= LONG_HISTORY]


def may_splice(conversation, template, n_messages: Sequence[int]) -> bool:
    """Whether requests with histories of `n_messages` messages (those of `LONG_HISTORY` or more)
    are many enough to splice their follow-ups, and the probes trust splicing on `template`:
    what `FollowUpPlan.of` asks before it checks the session's own last request."""
    return sum(n_messages) >= MIN_HISTORY and _trust("follow-ups", conversation, template, _follow_ups_agree)[0]


def short_follow_ups(conversation, messages: list, turn: tuple[int, int], when: datetime) -> ShortFollowUps | None:
    """The short renders `spliced_follow_ups` reads the follow-ups of the request that generates
    `turn` off (its history is messages[:turn[0]]), at time `when`; None where the request's own is
    refused or it has no user message."""
    found = since_user(messages, turn[0])
    if found is None:
        return None
    lead, u = found
    clock = clock_at(when)
    since = lead + messages[u:turn[1]]
    try:
        asked = conversation.render(since[:len(lead) + turn[0] - u], add_generation_prompt=True, clock=clock)
    except TmplkitError:
        return None
    texts: list[str | None] = []
    for extra in follow_ups(messages, turn):
        try:
            texts.append(conversation.render(since + extra, clock=clock))
        except TmplkitError:
            texts.append(None)
    return ShortFollowUps(asked, tuple(texts))


def spliced_follow_ups(conversation, messages: list, request: Request, short: ShortFollowUps | None = None) -> tuple[str, ...] | None:
    """`follow_up_renders` of `request`, each read off a render of the leading system messages and
    the messages since the newest user message (`short_follow_ups`; `short` where made already),
    after the part of the request's own text that the render of those messages does not end like
    (the history before that user message); a follow-up that render refuses, or that does not start
    as the request's does, is rendered whole. None where the request's own short render is refused."""
    if short is None:
        short = short_follow_ups(conversation, messages, request.turn, request.time)
        if short is None:
            return None
    shared = lcs(request.text, short.asked)
    before, head = request.text[:len(request.text) - shared], short.asked[:len(short.asked) - shared]
    texts: list[str] = []
    for extra, text in zip(follow_ups(messages, request.turn), short.texts):
        if text is not None and text.startswith(head):
            texts.append(before + text[len(head):])
            continue
        try:  # (as `follow_up_renders` renders it)
            texts.append(conversation.render(messages[:request.turn[1]] + extra, clock=clock_at(request.time)))
        except TmplkitError:
            continue
    return tuple(texts)


def _copied(copies: EarlierCopies, messages: list, request: Request) -> bool:
    """Whether a message spliced for `request` (from its newest user message on, the follow-ups'
    own) has a copy in the history the splice keeps as it was (see EarlierCopies)."""
    found = since_user(messages, request.n_messages)
    if found is None:
        return False
    u = found[1]
    return copies.before(range(u, request.turn[1]), u, [m for extra in follow_ups(messages, request.turn) for m in extra])


def _follow_ups_agree(server, template) -> bool | None:
    """Whether every request of `server` has the same follow-ups spliced as rendered whole (None
    where none is spliced)."""
    reqs = tuple(iter_requests(server, template, alone=False))
    messages = list(server.messages)
    pairs = [(spliced_follow_ups(server, messages, r), follow_up_renders(server, messages, r.turn, r.time))
             for r in reqs if r.generated]
    return all(s is None or s == w for s, w in pairs) if any(s is not None for s, _ in pairs) else None


def follow_ups(messages: list, turn: tuple[int, int]) -> list[list[dict]]:
    """The messages each follow-up of the turn messages[turn[0]:turn[1]] adds (`next_renders`)."""
    calls = [c for m in messages[turn[0]:turn[1]] for c in (m.get("tool_calls") or ())]
    ask = {"role": "user", "content": "next request"}
    follow = [[ask]]
    if calls:
        answered = [_tool_result(messages, c) for c in calls]
        follow += [answered, answered + [{"role": "assistant", "content": "done"}, ask]]
    return follow


def follow_up_renders(conversation, messages: list, turn: tuple[int, int], when: datetime) -> tuple[str, ...]:
    """`next_renders` of one request: its generated turn `turn` (message indices), at time `when`."""
    upto = messages[:turn[1]]
    texts: list[str] = []
    for extra in follow_ups(messages, turn):
        try:
            texts.append(conversation.render(upto + extra, clock=clock_at(when)))
        except TmplkitError:  # a template may refuse a shape; that follow-up is then not predicted
            continue
    return tuple(texts)
