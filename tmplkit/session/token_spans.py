"""A conversation's message spans over token ids: rendered as a server renders it, tokenized, split
with the template's delimiters as token ids (what `tmplkit spans` prints).

This belongs to the session layer: it renders a conversation (`render_conversation`) and reads it
with the tokens layer's span detector.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from ..analysis import analyze
from ..delimiters import ROLES, text_matches, with_article
from ..tokens.delimiter_ids import TokenDelimiters, token_delimiters
from ..tokens.spans import SpanDetector, Spans
from ..tokens.tokenizers import Tokenizer
from ._conversation import Conversation, load_conversation
from ._render import render_conversation

__all__ = ["SPANS_SCHEMA_VERSION", "ConversationSpans", "conversation_spans", "format_spans_text", "misplaced_messages",
           "split_disagreements"]

# The spans JSON's layout (tmplkit/schemas/spans.schema.json): raised when a field is removed or changes meaning.
SPANS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ConversationSpans:
    """The message spans of one conversation, rendered with a template and tokenized.

    `delimiters` are the template's delimiters as token ids (checked on its probe render);
    `spans` the spans they find in the conversation's tokens.
    """

    template: str
    tokenizer: str
    n_tokens: int
    delimiters: TokenDelimiters
    spans: Spans
    roles: tuple[str, ...]
    # Where a user or tool message of this conversation lies in another role's span (`misplaced_messages`):
    # the delimiters, proven on the template's probes, do not read this conversation right.
    misplaced: tuple[str, ...] = ()
    # Where the token split of this conversation's render finds a message start its text split does
    # not, or misses one (`split_disagreements`): the ids, proven on the probes, read it otherwise.
    disagreements: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """What `tmplkit spans --format json` prints (tmplkit/schemas/spans.schema.json)."""
        return {
            "schema_version": SPANS_SCHEMA_VERSION,
            "template": self.template,
            "tokenizer": self.tokenizer,
            "n_tokens": self.n_tokens,
            "message_roles": list(self.roles),
            "user_starts": self.spans.starts("user"),
            "last_user_start": self.spans.last_user_start(),
            "spans": self.spans.to_dict()["spans"],
            "delimiters": self.delimiters.to_dict(),
            "misplaced": list(self.misplaced),
            "disagreements": list(self.disagreements),
        }


def conversation_spans(template, tokenizer: Tokenizer, conversation, *, analysis=None,
                       add_generation_prompt: bool = False) -> ConversationSpans:
    """Render `conversation` with `template` as a server does (`session.render_conversation`),
    tokenize it, and find its message spans.

    `conversation` is a `Conversation` or anything `load_conversation` takes; `analysis` is
    `analyze(template)` when not given.

    >>> cs = conversation_spans(load_one("Qwen3.5-4B.jinja"), load_tokenizer("vocab:qwen35"), "session.json")  # doctest: +SKIP
    >>> cs.spans.last_user_start()                                                                        # doctest: +SKIP
    """
    if not isinstance(conversation, Conversation):
        conversation = load_conversation(conversation)
    if analysis is None:
        analysis = analyze(template)
    td = token_delimiters(analysis, tokenizer)
    rendered = render_conversation(template, conversation, add_generation_prompt=add_generation_prompt)
    ids = tokenizer.tokenize(rendered)
    detector = SpanDetector(td)
    spans = detector.split(ids)
    misplaced = misplaced_messages(rendered, conversation.messages, analysis.delimiters,
                                   drops_tools=analysis.tool_placement == "dropped")
    return ConversationSpans(getattr(template, "name", ""), getattr(tokenizer, "name", ""), len(ids), td, spans,
                             conversation.roles, misplaced, split_disagreements(rendered, analysis.delimiters, tokenizer,
                                                                                detector, ids=_text_ids(tokenizer, ids)))


def _text_ids(tokenizer: Tokenizer, ids) -> list[int] | None:
    """A render's ids (`tokenize` of it) less what the tokenizer adds to any text (llama.cpp's BOS,
    where it was opened with one), where its offsets can be read off the ids (`offsets_of`: a long
    render is then tokenized once, not twice); None where they cannot (the text is tokenized again
    with its offsets)."""
    if getattr(tokenizer, "offsets_of", None) is None:
        return None
    added = list(tokenizer.tokenize(""))
    return list(ids[len(added):]) if list(ids[:len(added)]) == added else None


def split_disagreements(rendered: str, delimiters, tokenizer: Tokenizer, detector: SpanDetector,
                        limit: int = 3, ids: list[int] | None = None) -> tuple[str, ...]:
    """Where the token split (`detector` over `rendered`'s ids, no BOS or EOS added: the ids of its
    text, with their characters) and the text split of `rendered` by `delimiters` disagree on a
    message start: a start of one the other lacks, or of another role.

    The token delimiters are proven on the template's probe render; a conversation writes them in
    contexts the probe may not (after a BOS string the vocabulary spells as text, after content
    ending in `]`), and its contents may hold the ids of a delimiter cut back to fewer characters
    than its text. A token start counts where it lies within its role's delimiter in the text (ids
    cut back start inside it). The generation prompt at the render's end, which the ids match
    without the whitespace its text has (`prompt_start`), is no disagreement.
    Up to `limit` said, then how many more. `ids`: `rendered`'s ids without BOS, tokenized before
    (read with `offsets_of`)."""
    read_off = getattr(tokenizer, "offsets_of", None)
    ids, offsets = tokenizer.tokenize_with_offsets(rendered) if ids is None or read_off is None else read_off(rendered, ids)
    expected = [(at, at + len(d.text), d.role) for at, d in text_matches(rendered, delimiters) if d.role in ROLES]
    got = [(*offsets[s.pos], s.role) for s in detector.split(ids) if s.role in ROLES]
    out, i = [], 0
    for at, end, role in got:  # (the first token's characters: it may begin before the delimiter, a neighbour merged in)
        while i < len(expected) and expected[i][1] <= at:
            out.append(f"the token split misses the {expected[i][2]} start at character {expected[i][0]}")
            i += 1
        if i < len(expected) and expected[i][0] < max(end, at + 1):
            if expected[i][2] != role:
                out.append(f"the token split starts {with_article(role)} message at character {expected[i][0]}, where the text "
                           f"starts {with_article(expected[i][2])} one")
            i += 1
        elif not (role == "assistant" and _prompt_at_end(rendered, at, delimiters)):
            out.append(f"the token split starts {with_article(role)} message at character {at} ({rendered[at:at + 24]!r}), "
                       "where the text starts none")
    out += [f"the token split misses the {role} start at character {lo}" for lo, _, role in expected[i:]]
    return tuple(out[:limit]) + ((f"{len(out) - limit} more",) if len(out) > limit else ())


def _prompt_at_end(rendered: str, at: int, delimiters) -> bool:
    """Whether the render ends, from character `at`, with an assistant delimiter less its trailing
    whitespace: the generation prompt (`assistant:` for `assistant: `), which the ids match."""
    rest = rendered[at:].strip()
    return bool(rest) and any(d.role == "assistant" and d.text.strip().endswith(rest) for d in delimiters)


# The messages judged: a user message in another role's span (no user start where one is: no
# checkpoint, no user turn), a tool result in a user span (a user start where none is: the batch
# breaks of llama.cpp issue 25213).
_CHECKED_ROLES = ("user", "tool")
_SHORTEST = 4  # characters: a shorter content may be any text's
_REASONING = ("reasoning", "reasoning_end")  # (delimiter roles inside a message's span)


def misplaced_messages(text: str, messages, delimiters, *, drops_tools: bool = False) -> tuple[str, ...]:
    """Each user message of `messages` whose content lies in a span of another role by `delimiters`
    (the text's), and each tool result in a user span: the template writes this conversation
    otherwise than its probes (a tool result without `tool_call_id` as a user turn, a late turn in
    another form), and a span detector or a server misreads it there.

    Each content is looked for after the one before it (a render keeps the messages' order), never
    inside a delimiter or a reasoning block (a user message "assistant" is not the assistant's
    header). A place after the next message's is out of order: not judged there. Where the first
    place lies on the wrong side, the first on the message's own side after it is taken instead if
    the next messages still have as many places after it (words said before the message, in a tool
    list or a call's arguments, are not the message; the assistant echoing a tool result later is
    not the tool result). One the render does not hold as it is, or a shorter one than `_SHORTEST`,
    is not judged; neither are system messages (a template moves them: into the last user turn,
    after the tools) nor, where the template `drops_tools` (the analysis's tool placement), tool
    results: words found for them are another message's."""
    places = _Places(text, delimiters)
    skipped = ("system", "tool") if drops_tools else ("system",)
    bodies = [(i, m.get("role"), _body(m)) for i, m in enumerate(messages) if m.get("role") not in skipped]
    bodies = [b for b in bodies if len(b[2]) >= _SHORTEST]
    out, cursor = [], 0
    for k, (i, role, body) in enumerate(bodies):
        found = places.first(body, cursor)
        if found is None:  # (written otherwise: not judged, and the next is looked for from here)
            continue
        at, span = found
        following = [b for _, _, b in bodies[k + 1:k + 1 + _LOOKAHEAD]]
        if any(places.first(b, cursor, at) is not None for b in following):  # (out of order)
            continue
        if _misread(role, span):
            at, span = _own_side(places, role, body, at, following) or (at, span)
        cursor = at + len(body)
        if _misread(role, span) and span is not None:  # (_misread: a span of a role, always)
            out.append(f"message {i} ({role}) lies in {with_article(span)} span "
                       f"(character {places.start_of(at)})")
    return tuple(out)


_LOOKAHEAD = 3  # the messages after one whose places say whether a later place can be its own
_TRIES = 256  # occurrences of a message's words looked at for one on its own side


def _body(message) -> str:
    body = message.get("content")
    return body.strip() if isinstance(body, str) else ""


def _own_side(places, role, body: str, at: int, following) -> tuple[int, str | None] | None:
    """The first place of `body` after `at` on its own side (`_misread` false), where the messages
    `following` it still have as many places after that one as after `at`; else None. Looked for
    only up to where those messages lie (a place past them would leave them none)."""
    count, end = _placed(places, following, at + len(body))
    for n, (place, span) in enumerate(places.occurrences(body, at + 1, end if count else None)):
        if n >= _TRIES:
            return None
        if not _misread(role, span):
            return (place, span) if _placed(places, following, place + len(body))[0] >= count else None
    return None


def _placed(places, bodies, start: int) -> tuple[int, int]:
    """How many of `bodies` are found in order from `start` (each from where the one before ends),
    and where the last found ends."""
    count, at = 0, start
    for body in bodies:
        found = places.first(body, at)
        if found is not None:
            count, at = count + 1, found[0] + len(body)
    return count, at


def _misread(role, span: str | None) -> bool:
    """Whether a message of `role` in a span of role `span` is misread: a user message outside a
    user span, or a tool result in one. (A tool result inside the model's turn, Gemma 4's, which
    the analysis takes as the turn continued, misleads neither: no user start moves.)"""
    return role in _CHECKED_ROLES and span is not None and span != role and "user" in (role, span)


class _Places:
    """A rendered text's spans by its delimiters, for finding where a message's words lie."""

    def __init__(self, text: str, delimiters) -> None:
        self.text = text
        matches = text_matches(text, delimiters)
        self.starts = [at for at, _ in matches]
        self.ends = [at + len(d.text) for at, d in matches]  # (each delimiter's own text ends here)
        # a message's span: from its delimiter to the next one's, reasoning blocks inside it
        spans = [(at, d.role) for at, d in matches if d.role not in _REASONING]
        self.span_starts, self.span_roles = [at for at, _ in spans], [r for _, r in spans]
        self.blocks = self._blocks(matches, len(text))

    @staticmethod
    def _blocks(matches, n: int) -> list[tuple[int, int]]:
        """The reasoning blocks: from a reasoning opener to its closer, or to the next delimiter."""
        return [(at, matches[k + 1][0] if k + 1 < len(matches) else n)
                for k, (at, d) in enumerate(matches) if d.role == "reasoning"]

    def occurrences(self, body: str, start: int, end: int | None = None) -> Iterator[tuple[int, str | None]]:
        """Where `body` occurs from `start` on (ending by `end`), in order, as a message's words: not
        overlapping a delimiter's text, nor in a reasoning block; with the role of the message
        span it lies in (None before the first delimiter)."""
        at = self.text.find(body, start, end)
        while at >= 0:
            if not self._in_markup(at, at + len(body)):
                k = bisect.bisect_right(self.span_starts, at) - 1
                yield at, self.span_roles[k] if k >= 0 else None
            at = self.text.find(body, at + 1, end)

    def first(self, body: str, start: int, end: int | None = None) -> tuple[int, str | None] | None:
        """The first of `occurrences`, or None."""
        return next(self.occurrences(body, start, end), None)

    def _in_markup(self, begin: int, end: int) -> bool:
        """Whether text[begin:end] overlaps a delimiter's own text or lies in a reasoning block."""
        k = bisect.bisect_right(self.starts, end - 1) - 1  # (the last delimiter starting before its end)
        if k >= 0 and (self.starts[k] >= begin or self.ends[k] > begin):
            return True
        b = bisect.bisect_right(self.blocks, (begin, len(self.text))) - 1
        return b >= 0 and self.blocks[b][1] > begin

    def start_of(self, at: int) -> int:
        """The character where the message span holding `at` starts (its delimiter's)."""
        k = bisect.bisect_right(self.span_starts, at) - 1
        return self.span_starts[k] if k >= 0 else 0


def format_spans_text(cs: ConversationSpans) -> str:
    """A header line, then one line per span: role, pos, len."""
    lines = [f"{cs.template} with {cs.tokenizer}: {cs.n_tokens} tokens, {len(cs.spans)} spans, "
             f"user starts {cs.spans.starts('user')}"]
    for s in cs.spans:
        lines.append(f"{s.role:<9} pos {s.pos:>7}  len {s.len:>6}")
    for p in cs.delimiters.problems:
        lines.append(f"problem: {p}")
    return "\n".join(lines) + "\n"
