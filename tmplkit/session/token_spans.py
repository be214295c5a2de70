"""A conversation's message spans over token ids: rendered as a server renders it, tokenized, split
with the template's delimiters as token ids (what `tmplkit spans` prints).

This belongs to the session layer: it renders a conversation (`render_conversation`) and reads it
with the tokens layer's span detector.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis import analyze
from ..tokens.delimiter_ids import TokenDelimiters, token_delimiters
from ..tokens.spans import SpanDetector, Spans
from ..tokens.tokenizers import Tokenizer
from ._conversation import Conversation, load_conversation
from ._render import render_conversation

__all__ = ["SPANS_SCHEMA_VERSION", "ConversationSpans", "conversation_spans", "format_spans_text"]

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
    spans = SpanDetector(td).split(ids)
    return ConversationSpans(getattr(template, "name", ""), getattr(tokenizer, "name", ""), len(ids), td, spans,
                             conversation.roles)


def format_spans_text(cs: ConversationSpans) -> str:
    """A header line, then one line per span: role, pos, len."""
    lines = [f"{cs.template} with {cs.tokenizer}: {cs.n_tokens} tokens, {len(cs.spans)} spans, "
             f"user starts {cs.spans.starts('user')}"]
    for s in cs.spans:
        lines.append(f"{s.role:<9} pos {s.pos:>7}  len {s.len:>6}")
    for p in cs.delimiters.problems:
        lines.append(f"problem: {p}")
    return "\n".join(lines) + "\n"
