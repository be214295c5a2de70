"""From a session to what the prefill runner takes: prompt tokens and their message spans.

The pipeline stages, in order: render the session as a server does (`session.for_server`), tokenize
with the model's vocabulary, derive the template's role delimiters (tmplkit's analysis) as token
ids checked in context, and split the tokens into spans.

    >>> tok = LlamaCppTokenizer(model_path)                                    # doctest: +SKIP
    >>> prompt = build_prompt(session, load_one("Qwen3.5-4B.jinja"), tok)      # doctest: +SKIP
    >>> runner.run(prompt.tokens, prompt.spans)                                # doctest: +SKIP

The spans llama-server finds with its own two delimiters, to compare against, are
`server_rules.server_spans()`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..delimiters import Delimiter, sort_delimiters, split_text
from ..errors import AnalysisError
from ..session import Session, for_server
from ..sources.templates import ChatTemplate
from ..tokens.delimiter_ids import TokenDelimiters, text_delimiters, tokenize_delimiters
from ..tokens.spans import SpanDetector, Spans


@dataclass(frozen=True)
class Prompt:
    tokens: tuple[int, ...]
    spans: Spans
    text: str = field(repr=False)
    template: str
    delimiters: TokenDelimiters = field(repr=False)
    derived_by: str = "analysis"
    # (token position, role) of each user start that opens a message of another role: a system
    # message (or tool result) the template renders as a user turn of its own. The engine counts
    # it as a user start; a checkpoint policy may not want to.
    as_user: tuple[tuple[int, str], ...] = ()

    def role_counts(self) -> dict[str, int]:
        """Spans by role, as the engine sees them (a system message rendered as a user turn counts as 'user')."""
        out: dict[str, int] = {}
        for s in self.spans:
            out[s.role] = out.get(s.role, 0) + 1
        return out

    def as_user_counts(self) -> dict[str, int]:
        """How many of the user starts open a message of another role, by that role."""
        out: dict[str, int] = {}
        for _, role in self.as_user:
            out[role] = out.get(role, 0) + 1
        return out

    def user_message_starts(self) -> list[int]:
        """The user starts that open a user message (those in `as_user` left out)."""
        other = {pos for pos, _ in self.as_user}
        return [p for p in self.spans.starts("user") if p not in other]

    def to_dict(self) -> dict:
        return {
            "n_tokens": len(self.tokens),
            "template": self.template,
            "spans_by_role": self.role_counts(),
            "user_starts_of_other_roles": self.as_user_counts(),
            "delimiters_derived_by": self.derived_by,
            "delimiters": self.delimiters.to_dict() if hasattr(self.delimiters, "to_dict") else None,
        }


def build_prompt(session: Session, template: ChatTemplate, tokenizer, *, add_bos: bool = False,
                 add_generation_prompt: bool = True, delimiters: Sequence[Delimiter] | None = None,
                 fits=None) -> Prompt:
    """Render, tokenize, and split `session` into message spans with tmplkit's delimiters.

    `tokenizer` is a tmplkit Tokenizer of the model's vocabulary (e.g. LlamaCppTokenizer(model));
    `add_bos` prepends the BOS token when the rendered text does not already start with it.
    `delimiters`: the template's text delimiters when already derived (`text_delimiters(template)[0]`),
    so that building many prompts of one template analyzes it once. `fits(text)`: called with the
    render before it is tokenized (a runner's `check_text`).
    """
    conversation = for_server(template, session)  # as a server renders it (tmplkit.session.render_conversation)
    text = conversation.render(add_generation_prompt=add_generation_prompt)
    delims, how = text_delimiters(template) if delimiters is None else (sort_delimiters(delimiters), "given")
    if fits is not None:
        fits(text)
    tokens = tokenizer.tokenize(text, add_bos=False)
    if add_bos:
        bos = tokenizer.tokenize("", add_bos=True)
        if bos and tokens[:len(bos)] != bos:
            tokens = bos + tokens
    # The delimiters' token ids are read off this very render (checked: the token split must
    # find exactly the message starts the text split finds).
    tdelims = tokenize_delimiters(delims, text, tokenizer, template=template.name)
    if not tdelims.passed:
        raise AnalysisError(f"template '{template.name}': delimiters do not split the tokens as the text: "
                            f"{'; '.join(tdelims.problems)}")
    spans = SpanDetector(tdelims).split(tokens)
    as_user = user_starts_of_other_roles(text, delims, conversation.messages, spans)
    return Prompt(tuple(tokens), spans, text, template.name, tdelims, how, as_user)


def user_starts_of_other_roles(text: str, delimiters: Sequence[Delimiter], messages, spans: Spans) -> tuple[tuple[int, str], ...]:
    """(token position, role) of each user span that holds the content of another role's message
    and of no user message: a turn the template renders as a user turn (system `as_user`).

    Contents are found in message order; the text spans are the token spans (build_prompt checked
    that both splits find the same starts)."""
    tspans = split_text(text, delimiters)
    if [s.role for s in tspans] != list(spans.roles):
        return ()
    starts = [s.start for s in tspans]
    held: dict[int, list[str]] = {}
    pos = 0
    for m in messages:
        content = m.get("content")
        at = text.find(content, pos) if isinstance(content, str) and content.strip() else -1
        if at < 0:
            continue
        pos = at + len(content)
        k = bisect.bisect_right(starts, at) - 1
        if k >= 0:
            held.setdefault(k, []).append(m["role"])
    return tuple((spans[k].pos, roles[0]) for k, roles in sorted(held.items())
                 if tspans[k].role == "user" and "user" not in roles)
