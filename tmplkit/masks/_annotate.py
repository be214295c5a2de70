"""A copy of a template with `{% generation %}...{% endgeneration %}` around what the model learns,
so that transformers' `return_assistant_tokens_mask` returns tmplkit's mask (`annotate_template`).

How the tags are placed, template-independent: every place in the source where a tag can go
without changing the render (before and after each tag, after a newline or `>` inside text, at
each top-level `+` / `~` of an output expression, which splits `{{ a + b }}` into `{{ a }}{{ b }}`,
and inside its string literals after `>`, `:` or a `\\n` and before `<`)
gets a trace mark; one render of each check conversation with all marks shows where in the text
each place is reached. A place reached exactly at every masked turn's start (and one at every
end) is a candidate; each pair is written with the tags, and the first pair for which the render
is byte-identical (tmplkit's and transformers') and transformers' generation indices equal
tmplkit's mask on every check conversation wins. Each inserted tag copies the whitespace control
of its neighbours (`{%-` before `{%-`, `+%}` after `}}` ...), so trim_blocks / lstrip_blocks
treat the text around it as they did.

Where the turns' start or end is printed where no tag can mark it alone (an opening newline
written inside the tool-call loop), the message loop's body is captured (`{% set %}...{% endset
%}`) and printed back in three pieces, the generated part inside the tags (`_captured`). Where a
turn starts in one block and ends in another (an end of turn the next message's iteration prints,
a render built in one string), the whole render is captured with a mark at places reached at the
turns' starts and another at places reached at their ends (in a `{% set x = a ~ b %}` value the
mark is an operand), and printed back with the part from the last start mark before each end mark
inside the tags (`_marked`). A template whose own tags already give tmplkit's mask is returned as
it is; one whose tags mask otherwise has them neutralised and gets new ones. A check conversation
the template refuses is given again as its analysis found it takes one (`_as_analysed`). Where
nothing proves, `annotate_template` raises an `AnnotationError` that says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..sources.templates import ChatTemplate
from ._lexer import OWN_TAG, lex_tags, loop_vars, tag_places
from ._placement import captured, coverage, in_place, marked, wrapped_all
from ._proof import AnnotationError, check_cases, proves

__all__ = ["Annotated", "annotate_template"]


@dataclass(frozen=True)
class Annotated:
    """The annotated template's text and what proved it: the conversations checked and the masked
    characters compared on each."""

    template: str
    text: str
    checked: int
    masked_chars: int

    def to_dict(self) -> dict:
        return {"template": self.template, "checked": self.checked, "masked_chars": self.masked_chars}


def annotate_template(template: ChatTemplate, conversations: Sequence | None = None) -> Annotated:
    """`template` with generation tags that make transformers' mask equal tmplkit's on every
    check conversation (default: `check_conversations()`); AnnotationError where none proves."""
    cases = check_cases(template, conversations)
    if not any(m.ranges for _, m in cases):
        raise AnnotationError(f"template '{template.name}': no check conversation has a masked turn")
    src = template.text
    if OWN_TAG.search(src):
        if proves(src, cases) is None:  # its own tags already give tmplkit's mask
            return Annotated(template.name, src, len(cases), sum(b - a for _, m in cases for a, b in m.ranges))
        # Its own tags mask otherwise: each becomes a tag that renders as it did and marks nothing
        # (`{% if true %}` / `{% endif %}` with the same whitespace control), and ours are placed.
        src = OWN_TAG.sub(lambda m: f"{{%{m.group(1)} {'endif' if m.group(2) else 'if true'} {m.group(3)}%}}", src)
        cases = [(replace(server, template=replace(server.template, text=src)), m) for server, m in cases]
    tags = lex_tags(src)
    places = tag_places(src, tags)
    marks = [(i, g) for i, guards in enumerate(loop_vars(src, tags, places)) for g in ("", *guards)]
    starts, ends, want, fired = coverage(places, marks, cases)
    # In order of preference: tags in place around each kind of turn, the message loop's body
    # captured, the whole render captured between marks.
    chosen, why = in_place(src, places, marks, starts, ends, want, cases)
    text = wrapped_all(src, chosen) if chosen is not None else None
    if text is not None and (why := proves(text, cases) or ""):
        text = None
    text = text or captured(src, tags, cases)
    if text is None:
        text, why = marked(src, places, marks, fired, want, cases)
    if text is None:
        raise AnnotationError(f"template '{template.name}': generation tags cannot be proved: {why}")
    return Annotated(template.name, text, len(cases), sum(b - a for _, m in cases for a, b in m.ranges))
