"""Training masks: which characters and tokens of a rendered conversation the model learns.

A trainer renders the whole conversation once (no generation prompt) and learns, in each assistant
turn, what the model would generate there: the session layer's generated turn (`session.requests`:
what follows the generation prompt of the request that asks for the turn, up to and including the
end of turn the model must emit), found again in the render of the whole conversation.

Where the render holds the turn exactly as generated (nearly every template) the mask is that text
(rule "exact"). Where the history writes the turn otherwise (reasoning a template drops once a user
message follows, a forced-open `<think>` the history does not print) the mask is what the history
keeps of it: the generated text with the part the render lacks cut out (rule "history"); a turn the
history drops entirely masks nothing ("dropped"). Markup the render writes right after the turn,
before the next message starts (gpt-oss's `<|end|>` / `<|return|>`, the model's own end of
generation), belongs to the turn, unless the render writes it only because a tool result follows
(the R1 distills' `<｜tool▁outputs▁begin｜>`). Whitespace the render writes after the turn's last
token (the `\n` after `<|im_end|>`) is the template's, not the model's: the model stops at its end
of turn, the server keeps nothing after it, and the mask ends there. The role header and the
generation prompt's text are never masked.

Per-token role labels come from the template's proven delimiters (`analysis.delimiters`, split as
llama-server splits, less a delimiter an answer quotes inside its masked turn, which is the
answer's): the role of the span each token starts in (reasoning markup belongs to its
assistant turn; "" before the first span). Tokens are masked as transformers masks them: a token
that overlaps masked text is masked.

    >>> m = assistant_mask(template, tokenizer, conversation)             # doctest: +SKIP
    >>> [tokenizer.detokenize([t]) for t, on in zip(m.input_ids, m.mask) if on]  # doctest: +SKIP
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache

from ..analysis import Analysis, analyze
from ..delimiters import TextSpan, split_text
from ..errors import RenderError, TmplkitError
from ..markup import TAG, UNIT, lcs, unit_start
from ..markup import lcp as common_prefix
from ..sandbox import PINNED_NOW
from ..session import Conversation, ServerConversation, content_text, for_server, load_conversation, read_once_per_template
from ..session.requests import NEEDLE, TurnEndings, clock_at, iter_requests, locate_turn, request_points, written_always
from ..sources.templates import ChatTemplate
from ..tokens.delimiter_ids import token_delimiters
from ..tokens.tokenizers import Tokenizer
from ._dropped import left_out
from ._onepass import message_starts, one_render_turns, trusted

__all__ = ["MASK_SCHEMA_VERSION", "AssistantMask", "MaskError", "MaskedTurn", "TextMask", "assistant_mask",
           "assistant_masks", "markup_only_turns", "text_mask", "text_masks", "tokenize_mask"]

MASK_SCHEMA_VERSION = 1
_LEADING_MARKUP = re.compile(r"(?:" + UNIT.pattern + r"|\s)*")


class MaskError(TmplkitError, ValueError):
    """A mask cannot be derived: the template's boundaries are not proven, or it renders no
    conversation that ends with one of the turns (`exit_code` 2), or the tokenizer does not split
    its render at the proven delimiters (1, as `tmplkit spans`)."""

    def __init__(self, message: str, *, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class MaskedTurn:
    """One assistant turn: `messages` (first, end) message indices; [start, end) the masked
    characters of the render; `rule` how they were found ("exact", "history" or "dropped", see the
    module doc; "unasked": an assistant turn before the first user message, which no request asks
    for, not masked); `token_start`/`token_end` the masked tokens (-1 without a tokenizer)."""

    messages: tuple[int, int]
    start: int
    end: int
    rule: str
    token_start: int = -1
    token_end: int = -1

    def to_dict(self) -> dict:
        out = {"messages": list(self.messages), "start": self.start, "end": self.end, "rule": self.rule}
        if self.token_start >= 0:
            out |= {"token_start": self.token_start, "token_end": self.token_end}
        return out


@dataclass(frozen=True)
class TextMask:
    """The render of a conversation (`text`), its role spans from the proven delimiters, the
    masked turns, and the messages the render leaves out (`left_out`: message indices, other
    roles than the assistant's; `masks._dropped`)."""

    template: str
    text: str = field(repr=False)
    spans: tuple[TextSpan, ...] = field(repr=False)
    turns: tuple[MaskedTurn, ...]
    left_out: tuple[int, ...] = ()

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """The masked [start, end) character ranges, in order (empty turns left out)."""
        return tuple((t.start, t.end) for t in self.turns if t.end > t.start)

    def masked_text(self) -> list[str]:
        """The text of each masked range."""
        return [self.text[a:b] for a, b in self.ranges]

    def char_mask(self) -> list[bool]:
        out = [False] * len(self.text)
        for a, b in self.ranges:
            out[a:b] = [True] * (b - a)
        return out

    def to_dict(self) -> dict:
        return {"schema_version": MASK_SCHEMA_VERSION, "template": self.template, "text": self.text,
                "n_chars": len(self.text), "turns": [t.to_dict() for t in self.turns],
                "spans": [s.to_dict() for s in self.spans], "left_out": list(self.left_out)}


@dataclass(frozen=True)
class AssistantMask:
    """A `TextMask` tokenized: `input_ids`, `offsets` (each token's [start, end) characters), `mask`
    (True where the model learns the token) and `labels` (each token's role, "" before the first
    span)."""

    text_mask: TextMask = field(repr=False)
    tokenizer: str
    input_ids: tuple[int, ...] = field(repr=False)
    offsets: tuple[tuple[int, int], ...] = field(repr=False)
    mask: tuple[bool, ...] = field(repr=False)
    labels: tuple[str, ...] = field(repr=False)

    @property
    def text(self) -> str:
        return self.text_mask.text

    @property
    def turns(self) -> tuple[MaskedTurn, ...]:
        return self.text_mask.turns

    def to_dict(self) -> dict:
        return {"schema_version": MASK_SCHEMA_VERSION, "template": self.text_mask.template,
                "tokenizer": self.tokenizer, "n_tokens": len(self.input_ids), "n_masked": sum(self.mask),
                "input_ids": list(self.input_ids), "assistant_masks": [int(m) for m in self.mask],
                "labels": list(self.labels), "offsets": [list(o) for o in self.offsets],
                "turns": [t.to_dict() for t in self.turns], "left_out": list(self.text_mask.left_out), "text": self.text}


# ---- the library calls ----------------------------------------------------------------------------


def text_mask(template: ChatTemplate, conversation, *, kwargs: Mapping | None = None,
              analysis: Analysis | None = None) -> TextMask:
    """The masked characters of `conversation` rendered with `template` (see the module doc).

    `conversation`: a `Conversation` or anything `load_conversation` takes; `kwargs`: extra template
    variables (e.g. `{"enable_thinking": False}`); `analysis`: `analyze(template)` when not given."""
    analysis = _proven(template, analysis)
    server = for_server(template, _conversation(conversation), kwargs, inputs="transformers")  # as a trainer renders
    text = server.render(add_generation_prompt=False)
    spans = tuple(split_text(text, analysis.delimiters))
    headers = tuple(d.text for d in analysis.delimiters if d.role == "assistant" and d.text.strip())
    openers = tuple(d.text for d in analysis.delimiters if d.role not in _TURN_ROLES)
    turns = _learning(server, text, tuple(_turns(server, text, spans, headers, openers)))
    _refuse_taking_in(server, text, spans, turns)
    turns = tuple(sorted(turns + _unasked(server.messages, spans), key=lambda t: t.messages))
    return TextMask(template.name, text, _message_spans(spans, turns), turns, left_out(server, text))


def _unasked(messages: Sequence[dict], spans: Sequence[TextSpan]) -> tuple[MaskedTurn, ...]:
    """The assistant turns before the first user message (a greeting): no request asks for them, so
    nothing is learned there (`session.requests.request_points`), said as turns of rule "unasked",
    empty, where their first message starts (transformers' generation tags mask them: never silently)."""
    roles = [m.get("role") for m in messages]
    first_user = roles.index("user") if "user" in roles else len(roles)
    starts = message_starts(spans, list(messages))
    out, i = [], 0
    while i < first_user:
        if roles[i] != "assistant":
            i += 1
            continue
        j = i
        while j < first_user and roles[j] == "assistant":
            j += 1
        at = starts[i] if starts is not None else 0
        out.append(MaskedTurn((i, j), at, at, "unasked"))
        i = j
    return tuple(out)


def text_masks(template: ChatTemplate, conversations: Iterable, *, kwargs: Mapping | None = None) -> tuple[TextMask, ...]:
    """`text_mask` of each conversation (the template analysed once)."""
    analysis = _proven(template, None)
    return tuple(text_mask(template, c, kwargs=kwargs, analysis=analysis) for c in conversations)


def assistant_mask(template: ChatTemplate, tokenizer: Tokenizer, conversation, *, kwargs: Mapping | None = None,
                   analysis: Analysis | None = None) -> AssistantMask:
    """The render of `conversation` as token ids, with each token's role and whether the model
    learns it.

        >>> m = assistant_mask(load_one("chatml.jinja"), load_tokenizer("vocab:qwen35"), "chat.json")  # doctest: +SKIP
        >>> len(m.input_ids) == len(m.mask) == len(m.labels)                                       # doctest: +SKIP
        True
    """
    analysis = _proven(template, analysis)
    masked = text_mask(template, conversation, kwargs=kwargs, analysis=analysis)
    _tokenizer_proven(template, analysis, tokenizer)
    return tokenize_mask(masked, tokenizer)


def assistant_masks(template: ChatTemplate, tokenizer: Tokenizer, conversations: Iterable, *,
                    kwargs: Mapping | None = None) -> tuple[AssistantMask, ...]:
    """`assistant_mask` of each conversation (the template analysed, the tokenizer checked, once): a
    data loader's call."""
    analysis = _proven(template, None)
    masked = tuple(text_mask(template, c, kwargs=kwargs, analysis=analysis) for c in conversations)
    _tokenizer_proven(template, analysis, tokenizer)
    return tuple(tokenize_mask(m, tokenizer) for m in masked)


def tokenize_mask(masked: TextMask, tokenizer: Tokenizer) -> AssistantMask:
    """`masked` over the tokens of its text (a token is masked where it overlaps masked text)."""
    ids, offsets = tokenizer.tokenize_with_offsets(masked.text)
    ends = [e for _, e in offsets]
    mask = [False] * len(ids)
    turns = []
    for t in masked.turns:
        a = b = bisect_left(ends, t.start + 1)  # the first token that ends after the turn starts
        while b < len(ids) and offsets[b][0] < t.end:
            b += 1
        if t.end > t.start:
            mask[a:b] = [True] * (b - a)
        turns.append(MaskedTurn(t.messages, t.start, t.end, t.rule, a, b))
    labels = _labels(masked.spans, offsets)
    tm = TextMask(masked.template, masked.text, masked.spans, tuple(turns), masked.left_out)
    return AssistantMask(tm, getattr(tokenizer, "name", ""), tuple(ids), tuple(map(tuple, offsets)),  # type: ignore[arg-type]
                         tuple(mask), labels)


# ---- finding the turns ------------------------------------------------------------------------------


def _conversation(conversation) -> Conversation | ServerConversation:
    if isinstance(conversation, (Conversation, ServerConversation)):
        return conversation
    return load_conversation(conversation)


@lru_cache(maxsize=32)
def _analysis_of(template: ChatTemplate) -> Analysis:
    return analyze(template)


def _proven(template: ChatTemplate, analysis: Analysis | None) -> Analysis:
    """The template's analysis, refused unless its round trip proved the delimiters."""
    if analysis is None:
        try:
            analysis = _analysis_of(template)
        except TypeError:  # a template that cannot be hashed is analysed each time
            analysis = analyze(template)
    if analysis.status != "pass":
        why = (list(analysis.errors) + ["no delimiter proved"])[0]
        raise MaskError(f"template '{template.name}': its role boundaries are not proven ({analysis.status}: {why}); "
                        "no mask is derived from unproven boundaries")
    return analysis


def _tokenizer_proven(template: ChatTemplate, analysis: Analysis, tokenizer: Tokenizer) -> None:
    """A MaskError (exit code 1) unless `tokenizer`'s ids split the template's proven probe render
    where its text splits (`tmplkit spans`' check): a tokenizer that cannot spell the render (a
    lowercasing BERT vocabulary) gives tokens whose labels and mask no model was trained on."""
    why = _why_unproven(analysis, tokenizer)
    if why:
        raise MaskError(f"template '{template.name}': its delimiters are {why}; the token mask cannot be trusted "
                        "(give the model's own tokenizer; `tmplkit audit` says why)", exit_code=1)


# (analysis, tokenizer, why_unproven) of the last few checks, by identity: a data loader that calls
# `assistant_mask` once per example checks its tokenizer once, not on every call (a probe render tokenized)
_CHECKED: deque[tuple[Analysis, Tokenizer, str]] = deque(maxlen=4)


def _why_unproven(analysis: Analysis, tokenizer: Tokenizer) -> str:
    for checked, tok, why in _CHECKED:
        if checked is analysis and tok is tokenizer:
            return why
    why = token_delimiters(analysis, tokenizer).why_unproven()
    _CHECKED.append((analysis, tokenizer, why))
    return why


_TURN_ROLES = ("assistant", "reasoning", "reasoning_end")


def _message_spans(spans: Sequence[TextSpan], turns: Sequence[MaskedTurn]) -> tuple[TextSpan, ...]:
    """`spans` less those of other roles that a masked turn's text holds (an answer that quotes
    `<|im_start|>user\n`): the answer's own text, labelled the assistant's."""
    inside = sorted((t.start, t.end) for t in turns if t.end > t.start)
    kept: list[TextSpan] = []
    k = 0
    for s in spans:  # (both in the order of the text: one walk)
        while k < len(inside) and inside[k][1] <= s.start:
            k += 1
        # (a quote may open the answer: `<|user|>` alone, where nothing ends the turn)
        if s.role not in _TURN_ROLES and k < len(inside) and inside[k][0] <= s.start < inside[k][1]:
            if kept:
                kept[-1] = TextSpan(kept[-1].role, kept[-1].start, s.end)
            continue
        kept.append(s)
    return tuple(kept)


def _turns(server: ServerConversation, text: str, spans: Sequence[TextSpan], headers: Sequence[str],
           openers: Sequence[str]):
    """The masked turns of `text`, the render of the whole of `server`'s conversation; `headers`:
    the assistant's proven delimiters; `openers`: the other roles'."""
    starts = [s.start for s in spans]
    others = [s.start for s in spans if s.role not in ("assistant", "reasoning", "reasoning_end")]
    if not any(end > n for n, end in request_points(server.messages)):
        return
    opening = _opening(text, spans)
    endings = TurnEndings(server)
    longest = max(map(len, headers), default=0)
    located = _fast_turns(server, text, spans, endings)
    before_user: dict = {}  # (kind of turn, next role, markup) -> whether it is the turn's (one render a kind)
    own_ends: dict = {}  # (kind of turn, markup the next delimiter cuts) -> whether it is the turn's end
    for turn, start, end, rule in located if located is not None else _located_turns(server, text, others, starts):
        moved = _with_end_markup(text, end, starts, opening)
        if moved > end:
            following = server.messages[turn[1]].get("role") if turn[1] < len(server.messages) else None
            key = (bool(server.messages[turn[1] - 1].get("tool_calls")), following, text[end:moved])
            if key not in before_user:
                before_user[key] = _written_before_user(server, text, turn, end, moved)
            end = moved if before_user[key] else end
        k = bisect_left(others, end) - 1
        # The next message's proven delimiter is not the turn's, where what a request adds after
        # the previous one's text shares its opening (`<|START_OF_TURN_TOKEN|>` before the user's
        # or the system's header): the turn ends inside it. One the answer quotes, with more of the
        # turn after it, is the turn's (the mask is of what the model wrote), and so is one a turn
        # found as generated holds whole at its end (an answer that ends with `<|user|>\n` where no
        # end of turn follows it); a history form may run over the next one whole (CodeLlama 70b's
        # turn, its generated `Source: assistant\nDestination: ` cut, up to `Source: user\n\n `).
        if k >= 0 and others[k] > start and (_ends_inside(text, others[k], end, openers) if rule == "exact" else
                                             any(d.startswith(text[others[k]:end]) for d in openers)) \
                and not _own_end(server, text, turn, others[k], end, own_ends):
            end = others[k]
        end = start + len(text[start:end].rstrip())  # whitespace after the end of turn is the template's
        if end == len(text.rstrip()):
            end = _before_results_closed(text, start, end, server.messages, turn, endings)
            end = _before_trailing_header(text, start, end, starts, headers)
            end = start + len(_without_end_of_text(server, text, start, end))
            # (what every render ends with is cut first: the next message's opening may come before it)
            upto = len(text) - len(_written_always(server, server.messages[turn[1] - 1], text))
            end = _before_next_opening(text[:upto], start, min(end, start + len(text[start:upto].rstrip())),
                                       openers, headers)
        if 0 < end - start < longest and _rest_of_header(text, start, end, headers):
            # The turn lies inside its header as the history writes it: an empty answer that the
            # template writes as a bare `<seed:bos>assistant` (Seed-OSS; the generation prompt adds
            # `\n`) was found after `<seed:bos>`, its mask the header's `assistant`. The model wrote nothing.
            start = end
        # (a history form that is only whitespace keeps nothing of the turn: it is dropped)
        yield MaskedTurn(turn, start, end, "dropped" if end <= start and rule == "history" else rule)


def _before_results_closed(text: str, start: int, end: int, messages: Sequence[dict], turn: tuple[int, int],
                           endings: TurnEndings) -> int:
    """Where the last turn, text[start:end], ends less the markup that closes tool results before
    it, which the template writes at the render's end only (`TurnEndings.after_results`), where its
    own end marker is written before that."""
    if turn[0] == 0 or messages[turn[0] - 1].get("role") != "tool":
        return end
    ending = endings.after_results(messages[turn[1] - 1])
    kept = text[start:end].rstrip()
    own = kept[:len(kept) - len(ending)].rstrip()
    return start + len(own) if ending and kept.endswith(ending) and _ends_with_unit(own) else end


def _written_before_user(server: ServerConversation, text: str, turn: tuple[int, int], end: int, moved: int) -> bool:
    """Whether the markup text[end:moved] after a turn is the turn's end as the template writes it
    whatever follows: where the next message is not a user message, a render with a user message
    there instead writes it too. (DeepSeek R1's distills write `<｜tool▁outputs▁begin｜>` after a call
    turn's end of sentence only because a tool result follows: the results' opening, not the
    model's.) One the template writes whatever follows (gpt-oss's `<|end|>`) is the turn's."""
    messages = server.messages
    if turn[1] >= len(messages) or messages[turn[1]].get("role") == "user":
        return True
    try:
        other = server.render(list(messages[:turn[1]]) + [{"role": "user", "content": "Hello."}],
                              add_generation_prompt=False, clock=clock_at(PINNED_NOW))
    except TmplkitError:
        return True
    return not other.startswith(text[:end]) or other.startswith(text[end:moved], end)


def _own_end(server: ServerConversation, text: str, turn: tuple[int, int], at: int, end: int, seen: dict) -> bool:
    """Whether text[at:end], the markup a turn would lose to the next message's delimiter that begins
    with it, is the turn's own end of turn: the render, ending with an assistant message, ends with
    it too (EXAONE's `[|endofturn|]`, proven as the start of `[|endofturn|]\n[|user|]`: every turn but
    the last lost the end marker the model writes), or a render that ends with the turn writes it
    after the turn (Apertus closes its calls with `<|tools_suffix|>`, which its tool results' proven
    delimiter begins with: a call turn lost it wherever a result followed; read once per kind of turn
    and markup, kept in `seen`). Command R's `<|START_OF_TURN_TOKEN|>` opens the next header, and
    neither render ends with it."""
    cut = text[at:end].strip()
    if not cut or UNIT.sub("", cut).strip():
        return False
    messages = server.messages
    if messages and messages[-1].get("role") == "assistant" and text.rstrip().endswith(cut):
        return True
    key = (bool(messages[turn[1] - 1].get("tool_calls")), cut)
    if key not in seen:
        seen[key] = _written_when_last(server, text, turn[1], at, cut)
    return seen[key]


def _written_when_last(server: ServerConversation, text: str, end: int, at: int, cut: str) -> bool:
    """Whether the render of messages[:end] (ending with a turn) writes `cut` right after text[:at]."""
    if end >= len(server.messages):
        return False
    try:
        upto = server.render(list(server.messages[:end]), add_generation_prompt=False, clock=clock_at(PINNED_NOW))
    except TmplkitError:
        return False
    return upto.startswith(text[:at]) and upto[at:].strip() == cut


def _rest_of_header(text: str, start: int, end: int, headers: Sequence[str]) -> bool:
    """Whether text[start:end] ends a header's beginning that starts before it (`assistant` after
    `<seed:bos>`). (A turn that starts where a header would, Phi-3's `<|end|>` before its
    `<|end|>\n<|assistant|>\n`, is the turn's own end.)"""
    return any(h[:k].strip() and text.startswith(h[:k], end - k)
               for h in headers for k in range(end - start + 1, min(len(h), end) + 1))


def _ends_inside(text: str, at: int, end: int, openers: Sequence[str]) -> bool:
    """Whether the delimiter written at `at` runs on past `end`: the turn ends inside it."""
    return any(at + len(d) > end and text.startswith(d, at) for d in openers)


def _fast_turns(server: ServerConversation, text: str, spans: Sequence[TextSpan], endings: TurnEndings):
    """The turns found without proving each request where that is safe: from the whole render alone
    (`_onepass`, where the template is trusted with it), else `_prefix_turns`; None: prove each."""
    if trusted(server, lambda conversation: _one_pass_agrees(server, conversation)):
        located = one_render_turns(server, text, spans, _unrendered(text, spans), endings)
        if located is not None:
            return located
    return _prefix_turns(server, text, endings)


def _one_pass_agrees(server: ServerConversation, conversation) -> bool | None:
    """Whether the one-render path finds on `conversation` (rendered as `server` is) the turns the
    proving path finds (None: the template refuses it, or either path does not apply)."""
    probe = for_server(server.template, conversation, server.kwargs, inputs=server.inputs)  # (as the mask renders)
    try:
        text = probe.render(add_generation_prompt=False)
        spans = split_text(text, _proven(server.template, None).delimiters)
        located = one_render_turns(probe, text, spans, _unrendered(text, spans))
        if located is None:
            return None
        others = [s.start for s in spans if s.role not in ("assistant", "reasoning", "reasoning_end")]
        return located == list(_located_turns(probe, text, others, [s.start for s in spans]))
    except TmplkitError:
        return None


def _unrendered(text: str, spans: Sequence[TextSpan]):
    """The one-render path's way to find a turn the history writes otherwise than generated, as
    the proving path finds it from a request (`_locate_unrendered`)."""
    others = [s.start for s in spans if s.role not in ("assistant", "reasoning", "reasoning_end")]
    return lambda req: _locate_unrendered(text, req, others)


def _located_turns(server: ServerConversation, text: str, others: Sequence[int], starts: Sequence[int] = ()):
    """(turn, start, end, rule) of each generated turn, found from the session's requests (`iter_requests`) with `locate_turn`;
    `starts`: where every span starts."""
    # Every request rendered at the time the whole render is, so a template that prints the date
    # writes the same date in both.
    for req in iter_requests(server, server.template, interval=timedelta(0)):
        if req.rule == "unrendered":
            raise MaskError(f"template '{server.template.name}' renders no conversation that ends with the assistant "
                            f"turn of messages {req.turn[0]}..{req.turn[1] - 1}; what the model generates there is unknown")
        if req.turn[1] > req.turn[0]:  # (a turn, empty or not: one its template writes nothing for is judged, not left out)
            yield (req.turn, *_locate(server, text, req, others, starts))


def _prefix_turns(server: ServerConversation, text: str,
                  endings: TurnEndings | None = None) -> list[tuple[tuple[int, int], int, int, str]] | None:
    """`_located_turns` where every request is a prefix of the render up to its turn's end, and that
    one of the whole render (nearly every template): each turn is what the latter adds after the
    former, less what the newest turn ends with only for being the newest, exactly where the whole
    render holds it. Two renders a request (`iter_requests`' third, the request without its
    generation prompt, only finds the prompt, which the prefix case does not use); None where a
    request is not such a prefix (the requests then say where each turn lies)."""
    messages = list(server.messages)
    clock = clock_at(PINNED_NOW)  # the time of the whole render (the sandbox's pinned time)
    endings = TurnEndings(server) if endings is None else endings
    out = []
    for n, end in request_points(messages):
        if end <= n:
            continue
        try:
            request = server.render(messages[:n], add_generation_prompt=True, clock=clock)
            full = text if end == len(messages) else server.render(messages[:end], add_generation_prompt=False, clock=clock)
        except TmplkitError:
            return None
        if not (full.startswith(request) and text.startswith(full)):
            return None
        generated = endings.strip(messages[end - 1], full[len(request):], messages[n - 1] if n else None)
        out.append(((n, end), len(request), len(request) + len(generated), "exact"))
    return out


def _locate(server: ServerConversation, text: str, req, others: Sequence[int],
            starts: Sequence[int] = ()) -> tuple[int, int, str]:
    """Where `req`'s generated turn lies in `text`: (start, end, rule); `others`: where the spans
    of other roles than the assistant's start; `starts`: where every span starts."""
    start = _start(text, req, others)
    return _turn_at(text, _start_by_needle(server, text, req, others) if start is None else start, req, others,
                    starts=starts)


def _start(text: str, req, others: Sequence[int]) -> int | None:
    """Where `req`'s turn starts in `text` where the request's history is the render's (None: the
    history before the turn is written otherwise once more messages follow; `_start_by_needle`)."""
    history = len(req.text) - len(req.generation_prompt)  # where the request's own history ends
    if text.startswith(req.text) or common_prefix(text, req.text) >= history:
        return _start_after(text, history, req.generation_prompt, others)
    return None


def _start_after(text: str, history: int, prompt: str, others: Sequence[int]) -> int:
    """Where the turn starts after a request's history that `text` holds up to `history`: after the
    generation prompt, or where the history writes the turn's opening otherwise (a forced-open
    `<think>` it does not print, reasoning inside the empty block the prompt closed) after the
    prompt as the history writes it."""
    if text.startswith(prompt, history):
        return history + len(prompt)
    return locate_turn(text, "", prompt, len(text), others, header=history)


def _locate_unrendered(text: str, asked, others: Sequence[int]) -> tuple[int, int, str] | None:
    """`_locate` of the request the whole render implies for a turn (`_onepass.Asked`: the render up
    to the turn's span, then the generation prompt), without building that request's text: its
    history is the render's. None where only the beginning of a history form is there (the turn
    asked for alone may be generated otherwise than the request would have it: Kimi K2 Thinking
    keeps reasoning there that it drops alone): the proving path reads that turn."""
    return _turn_at(text, _start_after(text, asked.at, asked.generation_prompt, others), asked, others, whole=True)


def _turn_at(text: str, start: int, req, others: Sequence[int], whole: bool = False, starts: Sequence[int] = ()):
    """(start, end, rule) of `req`'s generated turn written from `start` in `text` (see the module
    doc); `whole`: None where only the beginning of a history form is there; `starts`: where every
    span starts (none of which a stretch put in holds)."""
    generated = req.generated
    if text.startswith(generated, start):
        return start, start + len(generated), "exact"
    first, last = req.turn
    k = bisect_left(others, start + 1)
    end = _aligned_end(text, start, generated, max(1, last - first), whole,
                       stop=None if whole else others[k] if k < len(others) else len(text), starts=starts)
    partial = end is None  # (whole: only the beginning of a history form is there)
    end = start if end is None else end
    if end > start and _inside_unit(text, end):
        end = start  # what matches ends inside a markup unit (`<｜` of `<｜tool▁calls▁begin｜>`): no history form
    if end == start:
        # The history closes what the prompt opened before the turn's text (`<think></think>` where
        # the prompt ends with `<think>\n`): markup the model writes first, then the turn as generated.
        m = _LEADING_MARKUP.match(text, start)
        if m and m.end() > start and text.startswith(generated, m.end()):
            markup = m.group(0).strip()
            if markup and req.generation_prompt.rstrip().endswith(markup):
                # The markup closes nothing the model opened: the prompt ends with it (`<think></think>`
                # against the history's `</think>`), it is the history's header.
                return m.end(), m.end() + len(generated), "exact"
            end = m.end() + len(generated)
    if end == start:
        # The history writes a block of its own first (the tool calls before a second header and
        # the message's content): the turn is the last copy of its generated text before the next
        # message, as the request that asks for it ends.
        # (a copy that runs into the next message's delimiter counts: Gemma 4's tool-call turn ends
        # with the `<|tool_response>` that opens the result)
        k = bisect_left(others, start + 1)
        at = text.rfind(generated, start, others[k] + len(generated) if k < len(others) else len(text))
        if at >= 0:
            return at, at + len(generated), "exact"
    if partial and end == start:
        return None
    return start, end, "history" if end > start else "dropped"


def _learning(server: ServerConversation, text: str, turns: tuple[MaskedTurn, ...]) -> tuple[MaskedTurn, ...]:
    """`turns`, refused in one line where a turn found as generated ("exact") masks nothing but markup
    (an end of turn) though its assistant message has content that the render does not hold (a
    template that prints only list parts, BAAI Emu3, given a string): such a mask would teach the
    model to end the turn at once, silently."""
    for k, t in enumerate(turns):
        if not _learns_nothing(text, t) or t.rule != "exact":
            continue
        # (held where the turn is written, up to the next turn: a user message that quotes the
        # answer, "Reply with yes", holds it elsewhere)
        where = text[t.start:turns[k + 1].start if k + 1 < len(turns) else len(text)]
        for i in range(*t.messages):
            m = server.messages[i]
            body = content_text(m.get("content"))
            if m.get("role") == "assistant" and _not_held(body, where):
                raise MaskError(f"template '{server.template.name}': the assistant turn of messages {t.messages[0]}.."
                                f"{t.messages[1] - 1} would mask nothing: where the turn is written the render holds none of its content "
                                f"{body.strip()[:40]!r}; {_how_to_give(body)}")
    _refuse_unwritten_calls(server, turns)
    return turns


def _how_to_give(body: str) -> str:
    """The hint of `_learning`'s refusal: a content that holds markup may be cut at it by the template
    (one that keeps what follows a `</think>`), else given in a form the template does not read."""
    markup = TAG.findall(body)
    if markup:
        return (f"the content holds markup ({markup[-1]!r}) that the template may cut it at; leave the markup out of "
                "the content, or give the content as the template reads it (a string or a list of text parts)")
    return "give the content as the template reads it (a string or a list of text parts)"


def _refuse_taking_in(server: ServerConversation, text: str, spans: Sequence[TextSpan], turns: Sequence[MaskedTurn]) -> None:
    """A MaskError where a turn found as generated runs on into another role's message, past its
    start and into its content: the template writes the conversation otherwise than the model
    generates its turns (a guard model's template quotes the whole chat inside one user prompt,
    `USER: ...` and `ASSISTANT: ...`, and the model's own turn is its verdict): the mask would teach
    the user's words. (An end marker the next delimiter begins with, EXAONE's `[|endofturn|]`, is
    the turn's own.) Judged where the render has one span per message, in order (`message_starts`)."""
    starts = message_starts(spans, list(server.messages))
    if starts is None:
        return
    for t in turns:
        for i in range(bisect_left(starts, t.start), bisect_left(starts, t.end)):  # (the starts are in order)
            at, role = starts[i], server.messages[i].get("role")
            if role == "assistant" or t.messages[0] <= i < t.messages[1]:
                continue
            body = content_text(server.messages[i].get("content")).strip()
            if body and t.start <= text.find(body, at) < t.end:
                raise MaskError(f"template '{server.template.name}': the assistant turn of messages {t.messages[0]}.."
                                f"{t.messages[1] - 1} would mask message {i} ({role}) too: the template writes the "
                                "conversation otherwise than the model generates its turns (a guard template quotes "
                                "the chat inside one prompt); no mask of this template teaches its turns")


def markup_only_turns(masked: TextMask, messages: Sequence[dict]) -> tuple[MaskedTurn, ...]:
    """The turns of `masked` (a mask of the conversation of `messages`) that learn their end marker
    alone although their messages have tool calls, or content the mask does not hold: the template
    writes neither where the turn is (a tool-call turn on a template without tool support masks
    `</s>`), so the model learns to end the turn at once. The mask is what the template renders
    (transformers' tags give the same); a caller says so."""
    out = []
    for t in masked.turns:
        if t.end <= t.start or not _learns_nothing(masked.text, t):
            continue
        held = masked.text[t.start:t.end]
        turn = [m for m in messages[t.messages[0]:t.messages[1]] if m.get("role") == "assistant"]
        if any(m.get("tool_calls") or _not_held(content_text(m.get("content")), held) for m in turn):
            out.append(t)
    return tuple(out)


def _not_held(body: str, held: str) -> bool:
    return bool(body.strip()) and body.strip() not in held


def _learns_nothing(text: str, t: MaskedTurn) -> bool:
    """Whether turn `t` masks nothing, or tags alone (`<|end|>`: the end of a turn whose text the
    render does not hold; a bracketed word, `[read_file(path=a.py)]`, may be a call the turn writes)."""
    return not TAG.sub("", text[t.start:t.end]).strip()


def _refuse_unwritten_calls(server: ServerConversation, turns: Sequence[MaskedTurn]) -> None:
    """A MaskError where a turn with tool calls masks nothing and the template writes it alike
    without them (a template without tool support, whose history runs the calls' turn on into the
    answer after the results it skips): the mask would drop the turn silently. (One that writes the
    turn's end, `</s>`, masks that: what the template renders for it.)"""
    messages = server.messages
    for t in turns:
        if t.end > t.start:  # (most turns: nothing to look at)
            continue
        turn = list(messages[t.messages[0]:t.messages[1]])
        if not any(m.get("tool_calls") for m in turn):
            continue
        ask = {"role": "user", "content": "Hello."}
        bare = [{k: v for k, v in m.items() if k != "tool_calls"} for m in turn]
        try:
            same = server.render([ask, *turn], add_generation_prompt=False) == \
                server.render([ask, *bare], add_generation_prompt=False)
        except TmplkitError:
            continue  # (a template that needs calls or content there writes them)
        if not same:
            continue
        if _written_when_followed(server, ask, turn, bare, messages[t.messages[1]:t.messages[1] + 1]):
            raise MaskError(f"template '{server.template.name}': the assistant turn of messages {t.messages[0]}.."
                            f"{t.messages[1] - 1} would mask nothing: the template writes its tool calls only once "
                            "another message follows (as the newest message it writes none of them), so what the "
                            "model generates there is unknown; mask the conversation with another template of the "
                            "model, or leave the turn's tool_calls out")
        raise MaskError(f"template '{server.template.name}': the assistant turn of messages {t.messages[0]}.."
                        f"{t.messages[1] - 1} would mask nothing: it has tool calls the template does not write "
                        "(it renders the turn alike without them); use a template with tool support, or leave the "
                        "turn's tool_calls out")


def _written_when_followed(server: ServerConversation, ask: dict, turn: list, bare: list, following: Sequence[dict]) -> bool:
    """Whether the template writes the calls of `turn` (`bare`: without them) once the message
    `following` it comes after (Nemotron Nano 9B v2 Japanese writes a call turn only then)."""
    if not following:
        return False
    try:
        return server.render([ask, *turn, *following], add_generation_prompt=False) != \
            server.render([ask, *bare, *following], add_generation_prompt=False)
    except TmplkitError:
        return False


def _inside_unit(text: str, at: int) -> bool:
    """Whether `at` falls inside a markup unit of `text` (`<｜` of `<｜tool▁calls▁begin｜>`)."""
    opening = text.rfind("<", max(at - 64, 0), at)
    return opening >= 0 and any(m.start() < at < m.end() for m in UNIT.finditer(text, opening, at + 64))


def _aligned_end(text: str, start: int, generated: str, messages: int = 1, whole: bool = False,
                 stop: int | None = None, starts: Sequence[int] = ()) -> int | None:
    """The end of the turn's history form at `start`: the generated text with a stretch cut out for
    each of its `messages` (their dropped reasoning: a run of assistant messages drops one each); the
    longest such form that `text` holds there, else, before `stop` (the next message), the generated
    text with a stretch put in where the two part (Apriel writes a call's "id" once the call is
    followed; a stretch holds no span's start, `starts`), else the end of what it holds of its
    beginning (`whole`: None then)."""
    a = common_prefix(generated, text[start:start + len(generated)])
    end = _cut_form(text, start + a, generated, a, min(messages, _MAX_CUTS))
    if end is None and stop is not None and generated[:a].strip() and generated[a:].strip():
        end = _put_in_form(text, start + a, generated, a, stop, _MAX_PUT_IN, starts)
    if end is None and stop is not None:
        end = _cut_then_put_in(text, start + a, generated, a, stop, starts)
    if end is None:
        return None if whole and a < len(generated) else start + a
    return end


# At most this many stretches cut from one turn (a run that long is rare; a longer one is not found).
_MAX_CUTS = 4


def _cut_form(text: str, at: int, generated: str, a: int, cuts: int) -> int | None:
    """Where `generated[a:]`, with up to `cuts` stretches cut out (each where the text goes on with
    a later part of it), ends in `text` at `at`; None where no such form is there."""
    if a >= len(generated):
        return at
    if at >= len(text) or cuts == 0:
        return None
    first = text[at]
    b = generated.find(first, a + 1)
    while b >= 0:
        rest = generated[b:]
        # (the history drops the whitespace after the markup that closes the cut too: `</think>\n`)
        unit = UNIT.match(rest)
        forms = (rest, rest[:unit.end()] + rest[unit.end():].lstrip()) if unit else (rest,)
        for form in forms:
            if text.startswith(form, at):
                return at + len(form)
        # The rest goes on as far as the text does, then another stretch is cut (the next message's).
        k = common_prefix(rest, text[at:at + len(rest)])
        if k and (end := _cut_form(text, at + k, generated, b + k, cuts - 1)) is not None:
            return end
        b = generated.find(first, b + 1)
    return None


def _cut_then_put_in(text: str, at: int, generated: str, a: int, stop: int, starts: Sequence[int]) -> int | None:
    """Where `generated[a:]`, with one stretch cut out where it starts (reasoning the history drops)
    and then stretches put in (`_put_in_form`), ends in `text` at `at`; None where no such form is
    there. (Apriel 1.6 drops a call turn's reasoning and writes the call's "id" once it is followed.)"""
    if at >= len(text):
        return None
    b = generated.find(text[at], a + 1)
    for _ in range(_MAX_CUT_STARTS):
        if b < 0:
            break
        k = common_prefix(generated[b:b + stop - at], text[at:stop])
        if k >= _PUT_IN_PROBE and generated[b:b + k].strip():
            end = _put_in_form(text, at + k, generated, b + k, stop, _MAX_PUT_IN, starts)
            if end is not None:
                return end
        b = generated.find(text[at], b + 1)
    return None


_MAX_CUT_STARTS = 256  # places a cut may end at, tried in order (a long turn's every character is not)


def _put_in_form(text: str, at: int, generated: str, a: int, stop: int, stretches: int,
                 starts: Sequence[int] = ()) -> int | None:
    """Where `generated[a:]`, with up to `stretches` stretches put in before `stop` (one per call
    of a turn of parallel calls: Apriel writes each call's "id" once the call is followed), ends in
    `text` at `at`; None where no such form is there. A stretch holds none of `starts` (a span's
    start, whatever its role: the next turn's header after results the template does not write)."""
    while a < len(generated):
        if stretches == 0:
            return None
        # the text goes on with the generated text after the stretch: found by the part up to the
        # next place the two may part again
        probe = generated[a:a + _PUT_IN_PROBE]
        j = bisect_right(starts, at)
        found = text.find(probe, at + 1, min(stop, starts[j] + len(probe)) if j < len(starts) else stop)
        if found < 0:
            return None
        k = common_prefix(generated[a:], text[found:stop])
        at, a, stretches = found + k, a + k, stretches - 1
    return at


_PUT_IN_PROBE = 12  # characters of the generated text that must follow a stretch put in
# Stretches put in a turn (one per call of a turn of parallel calls): every search is bounded by
# the next message, so a turn of many calls costs no more than its text.
_MAX_PUT_IN = 64


def _start_by_needle(server: ServerConversation, text: str, req, others: Sequence[int]) -> int:
    """Where the turn starts when the history before it is written otherwise once more messages
    follow (a system prompt moved into the last user message, gpt-oss-20b's analysis of an
    earlier turn dropped): its last message's content is replaced by a needle in the whole render; the
    renders part where that content begins, and the turn starts where the text before it stops
    matching the generated text's opening, not before the turn's header (`turn_header`: where the
    request's history ends, if the render writes a header there). Where the template prints no
    content for the turn, it starts after that header, or at the copy of the turn whose context
    agrees."""
    last = req.turn[1] - 1
    msgs = list(server.messages)
    content = msgs[last].get("content")
    msgs[last] = {**msgs[last], "content": NEEDLE}
    try:
        needled = server.render(msgs, add_generation_prompt=False)
    except RenderError as exc:
        raise MaskError(f"template '{server.template.name}': the assistant turn of messages {req.turn[0]}.."
                        f"{last} cannot be located in the render ({exc})") from exc
    printed = needled != text or not req.generated
    at = common_prefix(text, needled) if printed else len(text)
    history = req.text[:len(req.text) - len(req.generation_prompt)]
    header = locate_turn(text, history, req.generation_prompt, at, others)
    if header >= 0:
        return header
    if not printed:
        return _start_by_context(server, text, req)
    content = content if isinstance(content, str) else ""
    opening = req.generated[:max(req.generated.rfind(content), 0)] if content else ""  # (after its reasoning)
    # (the history may drop the whitespace after the markup that ends the opening: `</think>\n`)
    start = at - (lcs(opening, text[:at]) or lcs(opening.rstrip(), text[:at]))
    return at if _ends_with_header(text, start, at, req.generation_prompt) else start


def _ends_with_header(text: str, start: int, at: int, prompt: str) -> bool:
    """Whether text[start:at] (what matched the generated opening) lies inside the header as the
    generation prompt begins it: the history keeps none of the opening (its reasoning dropped),
    and a `\n` it shares with the opening is the header's."""
    return any(text.startswith(prompt[:k], at - k) and at - k <= start and not prompt[:k].isspace()
               for k in range(len(prompt), 0, -1))


def _start_by_context(server: ServerConversation, text: str, req) -> int:
    """Where the turn starts when the template prints no content for it (a tool-call turn whose
    text it drops), so a needle shows nothing: in the render of the conversation up to the turn's
    end the turn is the last copy of its generated text; in the whole render it is the copy whose
    preceding text agrees longest with what precedes it there."""
    upto = server.render(list(server.messages)[:req.turn[1]], add_generation_prompt=False)
    i = upto.rfind(req.generated)
    if i < 0:
        raise MaskError(f"template '{server.template.name}': the assistant turn of messages {req.turn[0]}.."
                        f"{req.turn[1] - 1} cannot be located in the render")
    best, score = -1, -1
    at = text.find(req.generated)
    while at >= 0:
        k = lcs(upto[:i], text[:at])
        if k > score:
            best, score = at, k
        at = text.find(req.generated, at + 1)
    return best if best >= 0 else len(text)


def _with_end_markup(text: str, end: int, starts: Sequence[int], opening: frozenset = frozenset()) -> int:
    """`end` moved over markup the render writes after the turn before the next span starts (the
    model's end of generation as the history writes it: gpt-oss's `<|end|>`, Apriel 1.6's `\n<|end|>`
    after a `\n`), up to markup in `opening`, what the render writes before its first message (a
    `<s>` each user turn opens with is the next message's) or whitespace; not over markup after
    whitespace at the end of the render (Phi-3.5's `\n</s>`: the model stopped before it)."""
    k = bisect_left(starts, end)
    stop = starts[k] if k < len(starts) else len(text)
    rest = text[end:stop]
    if not rest or UNIT.sub("", rest).strip() or (rest[0].isspace() and k >= len(starts)):
        return end
    lead = len(rest) - len(rest.lstrip())
    at = 0
    for unit in UNIT.finditer(rest):
        # (after a turn whose end is followed by whitespace, markup after more whitespace is the
        # template's, as at the end of the render; right after the turn, every unit is the turn's)
        if unit.group(0) in opening or (lead and at and unit.start() > at):
            break
        at = unit.end()
    return end + at


def _opening(text: str, spans: Sequence[TextSpan]) -> frozenset:
    """The markup units the render writes before its first span (`<s>`): a message's opening, which
    no turn ends with."""
    head = text[:spans[0].start] if spans else ""
    m = _LEADING_MARKUP.match(head)
    return frozenset(u.group(0) for u in UNIT.finditer(m.group(0) if m else ""))


def _before_trailing_header(text: str, start: int, end: int, starts: Sequence[int], headers: Sequence[str]) -> int:
    """`end`, moved before the assistant header a render ends with whatever add_generation_prompt
    says (Command R7B's): the next turn's opening, not this turn's (the last header in that
    markup-only span; what precedes it there, an end of turn the header's delimiter holds, stays)."""
    if not starts or starts[-1] <= start or UNIT.sub("", text[starts[-1]:]).strip():
        return end
    tail = text[starts[-1]:]
    at = max((tail.rfind(h.strip()) for h in headers), default=-1)
    return start + len(text[start:starts[-1] + at].rstrip()) if at >= 0 else end


def _before_next_opening(text: str, start: int, end: int, openers: Sequence[str], headers: Sequence[str]) -> int:
    """`end`, moved before the beginning of a next message's delimiter that the render ends with
    after the turn's own end marker (header-ahead's ` <step> Source: `: a turn followed by a message
    ends before `Source: user\n\n `, the next one's; the last one before its `Source: `). The longest
    such beginning that leaves the turn ending with its marker: a delimiter proven with the end
    marker before it (`<step> Source: assistant\n\n `) ends the render with more than the opening."""
    for k in sorted({n for d in (*openers, *headers) for n in range(1, len(d))
                     if d[:n].strip() and text.endswith(d[:n])}, reverse=True):
        turn = text[start:len(text) - k].rstrip()
        if start + len(turn) < end and _ends_with_unit(turn):
            return start + len(turn)
    return end


def _written_always(server: ServerConversation, last: dict, text: str) -> str:
    """What `text`, the whole render, ends with after its last turn (whose last message is `last`)
    that no turn is: a generation prompt the template writes whatever `add_generation_prompt` says,
    the next turn's (`written_always`: CodeLlama 70b's `Source: assistant\nDestination: user\n\n `).
    "" where none."""
    ending = written_always(server, last)
    return ending if text.endswith(ending) else ""


_END_OF_TEXT = re.compile(r"(?:\s+(?:" + UNIT.pattern + r"))+$")


def _without_end_of_text(server: ServerConversation, text: str, start: int, end: int) -> str:
    """The last turn, text[start:end], less the markup the render ends with after whitespace once
    the turn's own end marker is written (Phi-3.5's `<|end|>\n</s>`: the template's end of text,
    which a turn with a message after it does not have; the model stopped at `<|end|>`). Only the
    markup the template writes there alone (`_end_of_text`): a turn whose content ends with markup
    (`</b>` then ChatML's `\n<|im_end|>`) has the same shape, and its end marker is its own."""
    turn = text[start:end]
    m = _END_OF_TEXT.search(turn)
    if not m or not _ends_with_unit(turn[:m.start()]):
        return turn
    ending = _end_of_text(server)
    if not ending or not turn.endswith(ending):
        return turn
    kept = turn[:len(turn) - len(ending)].rstrip()
    return kept if _ends_with_unit(kept) else turn


_END_OF_TEXTS: dict = {}  # `read_once_per_template`'s cache of `_end_of_text`


def _end_of_text(server: ServerConversation) -> str:
    """The markup `server`'s template writes after the newest turn only ("" none), read once per
    template, message preparation and variables (`read_once_per_template`): what a two-message
    chat's render ends with past the render of it with one more message (cut back to the start of
    the markup unit the two part inside: `</s>` and `<|user|>` share their `<`). A template that
    renders neither: ""."""
    def read() -> str:
        chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
        try:
            last, more = (for_server(server.template, load_conversation(c), server.kwargs, inputs=server.inputs)
                          .render(add_generation_prompt=False, clock=clock_at(PINNED_NOW))
                          for c in (chat, chat + [{"role": "user", "content": "Again."}]))
        except TmplkitError:
            return ""
        return last[unit_start(last, common_prefix(last, more)):].strip()

    return read_once_per_template(_END_OF_TEXTS, server, read)


def _ends_with_unit(text: str) -> bool:
    return any(m.end() == len(text) for m in UNIT.finditer(text))


def _labels(spans: Sequence[TextSpan], offsets: Sequence[tuple[int, int]]) -> tuple[str, ...]:
    """Each token's role: that of the span its first character lies in (reasoning spans belong to
    the assistant turn they are part of; "" before the first span)."""
    starts = [s.start for s in spans]
    roles = []
    role = ""
    for s in spans:  # a reasoning span takes the role of the turn it lies in
        role = role if s.role in ("reasoning", "reasoning_end") else s.role
        roles.append(role)
    out = []
    for a, _ in offsets:
        k = bisect_left(starts, a + 1) - 1
        out.append(roles[k] if k >= 0 else "")
    return tuple(out)
