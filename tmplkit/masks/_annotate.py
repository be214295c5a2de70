"""A copy of a template with `{% generation %}...{% endgeneration %}` around what the model learns,
so that transformers' `return_assistant_tokens_mask` returns tmplkit's mask (`annotate_template`).

How the tags are placed, template-independent: every place in the source where a tag can go
without changing the render (before and after each tag, after a newline or `>` inside text, at
each top-level `+` / `~` of an output expression, which splits `{{ a + b }}` into `{{ a }}{{ b }}`)
gets a trace mark; one render of each check conversation with all marks shows where in the text
each place is reached. A place reached exactly at every masked turn's start (and one at every
end) is a candidate; each pair is written with the tags, and the first pair for which the render
is byte-identical (tmplkit's and transformers') and transformers' generation indices equal
tmplkit's mask on every check conversation wins. Each inserted tag copies the whitespace control
of its neighbours (`{%-` before `{%-`, `+%}` after `}}` ...), so trim_blocks / lstrip_blocks
treat the text around it as they did.

Where no pair proves, `annotate_template` raises an `AnnotationError` that says why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import TmplkitError
from ..session import Conversation, ServerConversation, for_server, generate_session, load_conversation
from ..sources import ChatTemplate
from ._mask import TextMask, text_mask

__all__ = ["AnnotationError", "Annotated", "annotate_template", "check_conversations", "transformers_mask"]

_MARK = re.compile("\ue000(\\d+)\ue001")
_MAX_PAIRS = 80
_PLAIN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
          {"role": "assistant", "content": "Goodbye."}]
_CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}
_TOOLS = [{"type": "function", "function": {"name": "ls", "description": "List files.",
                                             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
_REASONED = {"messages": [{"role": "user", "content": "What is 2+2?"},
                          {"role": "assistant", "reasoning_content": "Add them.", "content": "4"},
                          {"role": "user", "content": "List the files."},
                          {"role": "assistant", "reasoning_content": "Use the tool.", "content": "", "tool_calls": [_CALL]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                          {"role": "assistant", "reasoning_content": "One file.", "content": "a.txt"}], "tools": _TOOLS}
_CHECKS = [_PLAIN, _PLAIN[1:], _REASONED]


class AnnotationError(TmplkitError, ValueError):
    """The generation tags cannot be placed so that transformers' mask provably equals tmplkit's."""


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


@dataclass(frozen=True)
class _Tag:
    start: int
    end: int
    kind: str  # "{{", "{%" or "{#"
    left: str  # "-", "+" or ""
    right: str


@dataclass(frozen=True)
class _Place:
    """Where a tag can go: [start, end) of the source it replaces (empty, or the operator a split
    output expression loses) and the text around the tag (`}}` ... `{{ ` for a split)."""

    start: int
    end: int
    left: str
    right: str
    before: str = ""
    after: str = ""

    def tag(self, name: str) -> str:
        return f"{self.before}{{%{self.left} {name} {self.right}%}}{self.after}"


# ---- the source's tags and the places between them -------------------------------------------------


def _tags(src: str) -> list[_Tag]:
    """Every `{{ }}`, `{% %}` and `{# #}` of `src` (strings inside a tag skipped)."""
    out: list[_Tag] = []
    i, n = 0, len(src)
    while True:
        i = src.find("{", i)
        if i < 0 or i + 1 >= n:
            return out
        kind = src[i:i + 2]
        if kind not in ("{{", "{%", "{#"):
            i += 1
            continue
        close = {"{{": "}}", "{%": "%}", "{#": "#}"}[kind]
        j = _tag_end(src, i + 2, close, kind == "{#")
        if j < 0:
            return out
        left = src[i + 2] if src[i + 2] in "-+" else ""
        right = src[j - 3] if src[j - 3] in "-+" else ""
        out.append(_Tag(i, j, kind, left, right))
        i = j


def _tag_end(src: str, i: int, close: str, comment: bool) -> int:
    quote = None
    while i < len(src) - 1:
        c = src[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"" and not comment:
            quote = c
        elif src.startswith(close, i):
            return i + 2
        i += 1
    return -1


def _places(src: str, tags: Sequence[_Tag]) -> list[_Place]:
    """Where a tag can go without changing the render (see the module doc)."""
    starts = {t.start: t for t in tags}
    ends = {t.end: t for t in tags}
    positions = set(starts) | set(ends)
    prev = 0
    for t in [*tags, _Tag(len(src), len(src), "", "", "")]:
        text = src[prev:t.start]
        for m in re.finditer(r"[\n>]", text):  # inside text, at a line or markup end
            if text[m.end():].isspace() or not text[m.end():] or text[:m.end()].isspace():
                continue  # in whitespace a neighbour's `-` or lstrip_blocks takes off (or a tag is next anyway)
            positions.add(prev + m.end())
        prev = t.end
    out = [_place_at(p, starts.get(p), ends.get(p)) for p in sorted(positions)]
    for t in tags:
        if t.kind == "{{":
            out.extend(_splits(src, t))
    return out


def _place_at(p: int, nxt: _Tag | None, prev: _Tag | None) -> _Place:
    """A tag at `p` that strips what its neighbours strip and no more."""
    if nxt is not None:
        left = "-" if nxt.left == "-" else ("+" if nxt.kind == "{{" else "")
    else:
        left = "" if prev is not None else "+"
    if prev is not None:
        right = "-" if prev.right == "-" else ("+" if prev.kind == "{{" else "")
    else:
        right = "" if nxt is not None else "+"
    return _Place(p, p, left, right)


def _splits(src: str, t: _Tag) -> list[_Place]:
    """The top-level `+` / `~` of an output expression, where it can be split in two."""
    inner = src[t.start + 2 + bool(t.left):t.end - 2 - bool(t.right)]
    if re.search(r"\bif\b", inner):
        return []  # `a + b if c else d` is no concatenation of outputs
    out, depth, quote, k = [], 0, None, 0
    base = t.start + 2 + bool(t.left)
    while k < len(inner):
        c = inner[k]
        if quote:
            if c == "\\":
                k += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in "+~" and depth == 0:
            out.append(_Place(base + k, base + k + 1, "", "", before=" }}", after="{{ "))
        k += 1
    return out


# ---- tracing -----------------------------------------------------------------------------------------


def _with(src: str, edits: Sequence[tuple[_Place, str]]) -> str:
    for place, text in sorted(edits, key=lambda e: (e[0].start, e[0].end), reverse=True):
        src = src[:place.start] + text + src[place.end:]
    return src


def _trace(server: ServerConversation, places: Sequence[_Place]) -> tuple[str, dict[int, list[int]]]:
    """The render of the conversation with every place marked, the marks taken out, and where in
    it each place was reached."""
    # (a mark's `{% if %}` takes the place's left whitespace control, its `{% endif %}` the right one)
    edits = [(p, f"{p.before}{{%{p.left} if true %}}\ue000{i}\ue001{{% endif {p.right}%}}{p.after}")
             for i, p in enumerate(places)]
    traced = _rendered(server, _with(server.template.text, edits))
    fires: dict[int, list[int]] = {}
    removed = 0
    for m in _MARK.finditer(traced):
        fires.setdefault(int(m.group(1)), []).append(m.start() - removed)
        removed += len(m.group(0))
    return _MARK.sub("", traced), fires


def _rendered(server: ServerConversation, text: str) -> str:
    """The render of `server`'s conversation, its messages as prepared for the original template
    (tool-call arguments as the template reads them: the marks must not change what is given)."""
    return replace(server, template=replace(server.template, text=text)).render(add_generation_prompt=False)


# ---- the check ---------------------------------------------------------------------------------------


def transformers_mask(text: str, server: ServerConversation) -> tuple[str, list[tuple[int, int]]]:
    """transformers' own render of `server`'s conversation with `text` as the template, and the
    character ranges of its generation blocks (`return_assistant_tokens_mask`)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    variables = {k: v for k, v in server.variables.items() if k not in ("messages", "tools")}
    result: Any = render_jinja_template(
        conversations=[[dict(m) for m in server.messages]], tools=list(server.tools) if server.tools else None,
        chat_template=text, return_assistant_tokens_mask=True, add_generation_prompt=False, **variables)
    rendered, indices = result
    return rendered[0], [(int(a), int(b)) for a, b in indices[0]]


def check_conversations() -> list[Conversation]:
    """The conversations an annotation is proved on: a plain chat, one with reasoning and tool
    calls, and a short generated agent session."""
    return [load_conversation(c) for c in _CHECKS] + [generate_session(1500, seed=0, requests=2)]


def _proves(text: str, cases: Sequence[tuple[ServerConversation, TextMask]]) -> str | None:
    """Why `text` does not prove on `cases` (None: it does)."""
    for server, mask in cases:
        ours = _rendered(server, text)
        if ours != mask.text:
            return "the annotated template renders otherwise"
        try:
            theirs, indices = transformers_mask(text, server)
        except Exception as exc:  # transformers' own error on the annotated copy
            return f"transformers fails on it ({type(exc).__name__}: {exc})"
        if theirs != mask.text:
            return "transformers renders the conversation otherwise than tmplkit"
        if [r for r in indices if r[1] > r[0]] != list(mask.ranges):
            return "transformers' mask differs"
    return None


def annotate_template(template: ChatTemplate, conversations: Sequence | None = None) -> Annotated:
    """`template` with generation tags that make transformers' mask equal tmplkit's on every
    check conversation (default: `check_conversations()`); AnnotationError where none proves."""
    if "generation" in template.text and re.search(r"\{%-?\+?\s*generation\s", template.text):
        raise AnnotationError(f"template '{template.name}' already has generation tags")
    cases = _cases(template, conversations)
    if not any(m.ranges for _, m in cases):
        raise AnnotationError(f"template '{template.name}': no check conversation has a masked turn")
    tags = _tags(template.text)
    places = _places(template.text, tags)
    starts, ends = _candidates(places, cases)
    why = "no place in the source is reached exactly where each masked turn starts" if not starts else \
        "no place in the source is reached exactly where each masked turn ends"
    tried = 0
    for s, e in sorted(((s, e) for s in starts for e in ends if places[s].end <= places[e].start),
                       key=lambda se: (places[se[0]].left == "+", places[se[1]].start - places[se[0]].start)):
        if tried >= _MAX_PAIRS:
            break
        tried += 1
        text = _with(template.text, [(places[s], places[s].tag("generation")), (places[e], places[e].tag("endgeneration"))])
        if not _compiles(text):
            why = "the turn's start and end lie in different blocks of the template"
            continue
        why = _proves(text, cases) or ""
        if not why:
            return Annotated(template.name, text, len(cases), sum(b - a for _, m in cases for a, b in m.ranges))
    raise AnnotationError(f"template '{template.name}': generation tags cannot be proved: {why}")


def _cases(template: ChatTemplate, conversations) -> list[tuple[ServerConversation, TextMask]]:
    out = []
    for c in conversations if conversations is not None else check_conversations():
        server = for_server(template, c if isinstance(c, Conversation) else load_conversation(c))
        try:
            out.append((server, text_mask(template, server)))
        except TmplkitError:
            continue  # a conversation the template refuses (no tools, strict alternation) proves nothing
    if not out:
        raise AnnotationError(f"template '{template.name}' renders none of the check conversations")
    return out


def _candidates(places: Sequence[_Place], cases) -> tuple[list[int], list[int]]:
    """The places reached exactly at every masked turn's start, and those at every end."""
    starts: set[int] | None = None
    ends: set[int] | None = None
    for server, mask in cases:
        text, fires = _trace(server, places)
        if text != mask.text:
            raise AnnotationError(f"template '{server.template.name}': marking its source changes its render")
        n_turns = len(mask.turns)
        want_s = {a for a, _ in mask.ranges}
        want_e = {b for _, b in mask.ranges}
        s = {i for i, f in fires.items() if len(f) <= n_turns and want_s <= set(f)}
        e = {i for i, f in fires.items() if len(f) <= n_turns and want_e <= set(f)}
        starts = s if starts is None else starts & s
        ends = e if ends is None else ends & e
    return sorted(starts or ()), sorted(ends or ())


def _compiles(text: str) -> bool:
    import jinja2
    import jinja2.ext

    class _Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Output([])

    try:
        jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]).parse(text)
    except jinja2.TemplateSyntaxError:
        return False
    return True
