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

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import TmplkitError
from ..sandbox import PINNED_NOW
from ..session import Conversation, ServerConversation, for_server, generate_session, load_conversation
from ..sources import ChatTemplate
from ._mask import TextMask, _analysis_of, text_mask

__all__ = ["AnnotationError", "Annotated", "annotate_template", "check_conversations", "transformers_mask"]

_MARK = re.compile("\ue000(\\d+)\ue001")
_MAX_PAIRS = 80
_OWN_TAG = re.compile(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")
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
    expr: bool = False  # inside a `{% set x = ... %}` value: a mark there is an operand, no tag

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
            if text[:m.end()].isspace():
                continue  # in whitespace the previous tag's `-` takes off
            positions.add(prev + m.end())
        prev = t.end
    out = [_place_at(src, p, starts.get(p), ends.get(p)) for p in sorted(positions)]
    for t in tags:
        if t.kind == "{{" or (t.kind == "{%" and _SET_VALUE.match(src, t.start)):
            out.extend(_splits(src, t))
    return out


def _place_at(src: str, p: int, nxt: _Tag | None, prev: _Tag | None) -> _Place:
    """A tag at `p` that strips what its neighbours strip and no more: `-` where a neighbour's `-`
    strips across `p`; `+` only where lstrip_blocks would take the line's indent before it (which
    an output tag there keeps) or trim_blocks the newline after it (which the original keeps)."""
    line = src[src.rfind("\n", 0, p) + 1:p]
    if nxt is not None and nxt.left == "-":
        left = "-"
    else:
        left = "+" if line and line.isspace() and (nxt is None or nxt.kind == "{{") else ""
    if prev is not None and prev.right == "-":
        right = "-"
    else:
        kept = prev is None or prev.kind == "{{" or prev.right == "+"  # the newline after `p` is printed
        right = "+" if src.startswith("\n", p) and kept else ""
    return _Place(p, p, left, right)


_SET_VALUE = re.compile(r"\{%[-+]?\s*set\s+[\w.]+\s*=\s*")


def _splits(src: str, t: _Tag) -> list[_Place]:
    """Where an output expression can be split in two (`{{ a + b }}` into `{{ a }}{{ b }}`): at each
    top-level `+` / `~`, and inside a string literal that is a whole operand, after each `>` and
    `\\n` (`'<|im_end|>\\n'` into `'<|im_end|>'`, `'\\n'`). In a `{% set x = a ~ b %}` value (a
    template that builds its output in a string) the same places take a mark as an operand."""
    value = _SET_VALUE.match(src, t.start) if t.kind == "{%" else None
    base = value.end() if value else t.start + 2 + bool(t.left)
    inner = src[base:t.end - 2 - bool(t.right)]
    if re.search(r"\bif\b", inner):
        return []  # `a + b if c else d` is no concatenation of outputs
    out: list[_Place] = []
    depth = k = 0
    while k < len(inner):
        c = inner[k]
        if c in "'\"":
            j = _literal_end(inner, k)
            if depth == 0 and _whole_operand(inner, k, j):
                out.extend(_Place(base + x, base + x, "", "", before=f"{c} ~ " if value else f"{c} }}}}",
                                  after=f" ~ {c}" if value else f"{{{{ {c}", expr=bool(value))
                           for x in _literal_cuts(inner, k, j))
            k = j
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in "+~" and depth == 0:
            out.append(_Place(base + k, base + k + 1, "", "", before=f"{c} " if value else " }}",
                              after=f" {c}" if value else "{{ ", expr=bool(value)))
        k += 1
    return out


def _literal_end(s: str, k: int) -> int:
    """The index after the string literal that opens at `k`."""
    q, i = s[k], k + 1
    while i < len(s) and s[i] != q:
        i += 2 if s[i] == "\\" else 1
    return i + 1


def _whole_operand(s: str, a: int, b: int) -> bool:
    before, after = s[:a].rstrip(), s[b:].lstrip()
    return (not before or before[-1] in "+~") and (not after or after[0] in "+~")


def _literal_cuts(s: str, a: int, b: int) -> list[int]:
    """Cut points inside the literal s[a:b], not at its ends: after `>`, `:` and a `\\n` escape,
    before `<` (`'<|start|>assistant<|channel|>'`: the header ends inside a markup run)."""
    out, i = [], a + 1
    while i < b - 1:
        step = 2 if s[i] == "\\" else 1
        if s[i] in ">:" or s[i:i + 2] == "\\n":
            if i + step < b - 1:
                out.append(i + step)
        elif s[i] == "<" and i > a + 1:
            out.append(i)
        i += step
    return sorted(set(out))


# ---- tracing -----------------------------------------------------------------------------------------


def _with(src: str, edits: Sequence[tuple[_Place, str]]) -> str:
    for place, text in sorted(edits, key=lambda e: (e[0].start, e[0].end), reverse=True):
        src = src[:place.start] + text + src[place.end:]
    return src


def _trace(server: ServerConversation, places: Sequence[_Place], marks: Sequence[tuple[int, str]],
           keep: Sequence[int]) -> tuple[str, dict[int, list[int]]]:
    """The render of the conversation with the marks `keep` (indices into `marks`: a place and
    the loop variable whose assistant messages alone fire it, "" for every pass) in the source,
    the marks taken out, and where in the text each mark was reached."""
    at: dict[int, list[int]] = {}
    for k in keep:
        at.setdefault(marks[k][0], []).append(k)
    edits = []
    for i, ks in at.items():
        p = places[i]
        edits.append((p, _marked_place(p, [(f"\\ue000{k}\\ue001", marks[k][1]) for k in ks])))
    traced = _rendered(server, _with(server.template.text, edits))
    fires: dict[int, list[int]] = {}
    removed = 0
    for m in _MARK.finditer(traced):
        fires.setdefault(int(m.group(1)), []).append(m.start() - removed)
        removed += len(m.group(0))
    return _MARK.sub("", traced), fires


def _marked_place(p: _Place, items: Sequence[tuple[str, str]]) -> str:
    """The text that puts marks (an escaped string literal each, and the loop variable whose
    assistant messages alone print it, "" for every pass) at `p`: output tags, or in a set value
    operands (`(M1 ~ M2)`)."""
    if p.expr:
        ops = [f"('{mark}' if {guard}.role == 'assistant' else '')" if guard else f"'{mark}'" for mark, guard in items]
        return f"{p.before}({' ~ '.join(ops)}){p.after}"
    inner = "".join(f"{{% if {guard}.role == 'assistant' %}}{{{{ '{mark}' }}}}{{% endif %}}" if guard else f"{{{{ '{mark}' }}}}"
                    for mark, guard in items)
    # (the outer `{% if %}` takes the place's left whitespace control, its `{% endif %}` the right one)
    return f"{p.before}{{%{p.left} if true %}}{inner}{{% endif {p.right}%}}{p.after}"


def _harmless(server: ServerConversation, places, marks, keep: list[int], want: str) -> list[int]:
    """The marks of `keep` that leave the render as it is (halving to find those that change it:
    a split of `{{ n + 1 }}`, a mark in text a filter reads)."""
    try:
        text, _ = _trace(server, places, marks, keep)
    except TmplkitError:
        text = None
    if text == want:
        return keep
    if len(keep) <= 1:
        return []
    half = len(keep) // 2
    return _harmless(server, places, marks, keep[:half], want) + _harmless(server, places, marks, keep[half:], want)


def _loop_vars(src: str, tags: Sequence[_Tag], places: Sequence[_Place]) -> list[tuple[str, ...]]:
    """For each place, the names of the `{% for NAME in ... %}` loops around it, innermost first
    (none across a macro's body)."""
    events = []
    for t in tags:
        m = re.match(r"\{%[-+]?\s*(for|endfor|macro|endmacro)\b\s*(\w*)\s*(,|in\b)?", src[t.start:t.end])
        if m and t.kind == "{%":
            events.append((t.end, m.group(1), m.group(2) if m.group(3) == "in" else ""))
    out = []
    for p in places:
        stack: list[str] = []
        for end, what, name in events:
            if end > p.start:
                break
            if what in ("for", "macro"):
                stack.append(name if what == "for" else "#")
            elif stack:
                stack.pop()
        names = stack[stack.index("#") + 1:] if "#" in stack else stack
        out.append(tuple(n for n in reversed(names) if n and n != "#"))
    return out


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
    _pin_clock(text)
    result: Any = render_jinja_template(
        conversations=[[dict(m) for m in server.messages]], tools=list(server.tools) if server.tools else None,
        chat_template=text, return_assistant_tokens_mask=True, add_generation_prompt=False, **variables)
    rendered, indices = result
    return rendered[0], [(int(a), int(b)) for a, b in indices[0]]


def _pin_clock(text: str) -> None:
    """transformers' compiled copy of `text` (cached by its text) reads tmplkit's pinned date from
    `strftime_now`, so a template that prints today's date prints in both the date tmplkit's renders
    print (template variables cannot carry a function there)."""
    from transformers.utils import chat_template_utils

    compile_ = getattr(chat_template_utils, "_compile_jinja_template", None)
    if compile_ is not None:
        compile_(text).environment.globals["strftime_now"] = PINNED_NOW.strftime


def check_conversations() -> list[Conversation]:
    """The conversations an annotation is proved on: a plain chat, one with reasoning and tool
    calls, a short generated session of tool calls and a short agent session whose turns reason
    before their calls (where a captured body's headers or a mark's place first differ)."""
    return [load_conversation(c) for c in _CHECKS] + [generate_session(1500, seed=0, requests=2),
                                                      generate_session(6000, seed=3, style="agent")]


def _proves(text: str, cases: Sequence[tuple[ServerConversation, TextMask]], only: frozenset | None = None) -> str | None:
    """Why `text` does not prove on `cases` (None: it does); `only`: the (case, turn) pairs whose
    masks its tags must give (default: every masked turn)."""
    for c, (server, mask) in enumerate(cases):
        ours = _rendered(server, text)
        if ours != mask.text:
            return "the annotated template renders otherwise"
        try:
            theirs, indices = transformers_mask(text, server)
        except Exception as exc:  # transformers' own error on the annotated copy
            return f"transformers fails on it ({type(exc).__name__}: {exc})"
        if theirs != mask.text:
            return "transformers renders the conversation otherwise than tmplkit"
        want = [(t.start, t.end) for k, t in enumerate(mask.turns)
                if t.end > t.start and (only is None or (c, k) in only)]
        if [r for r in indices if r[1] > r[0]] != want:
            return "transformers' mask differs"
    return None


def annotate_template(template: ChatTemplate, conversations: Sequence | None = None) -> Annotated:
    """`template` with generation tags that make transformers' mask equal tmplkit's on every
    check conversation (default: `check_conversations()`); AnnotationError where none proves."""
    cases = _cases(template, conversations)
    if not any(m.ranges for _, m in cases):
        raise AnnotationError(f"template '{template.name}': no check conversation has a masked turn")
    src = template.text
    if _OWN_TAG.search(src):
        if _proves(src, cases) is None:  # its own tags already give tmplkit's mask
            return Annotated(template.name, src, len(cases), sum(b - a for _, m in cases for a, b in m.ranges))
        # Its own tags mask otherwise: each becomes a tag that renders as it did and marks nothing
        # (`{% if true %}` / `{% endif %}` with the same whitespace control), and ours are placed.
        src = _OWN_TAG.sub(lambda m: f"{{%{m.group(1)} {'endif' if m.group(2) else 'if true'} {m.group(3)}%}}", src)
        cases = [(replace(server, template=replace(server.template, text=src)), m) for server, m in cases]
    tags = _tags(src)
    places = _places(src, tags)
    marks = [(i, g) for i, guards in enumerate(_loop_vars(src, tags, places)) for g in ("", *guards)]
    starts, ends, want, fired = _coverage(places, marks, cases)
    # In order of preference: tags in place around each kind of turn, the message loop's body
    # captured, the whole render captured between marks.
    chosen, why = _in_place(src, places, marks, starts, ends, want, cases)
    text = _wrapped_all(src, chosen) if chosen is not None else None
    if text is not None and (why := _proves(text, cases) or ""):
        text = None
    text = text or _captured(src, tags, cases)
    if text is None:
        text, why = _marked(src, places, marks, fired, want, cases)
    if text is None:
        raise AnnotationError(f"template '{template.name}': generation tags cannot be proved: {why}")
    return Annotated(template.name, text, len(cases), sum(b - a for _, m in cases for a, b in m.ranges))


def _in_place(src: str, places, marks, starts, ends, want: set, cases) -> tuple[list | None, str]:
    """A (start place, end place, guard) for each kind of turn, each proved alone, together every
    masked turn; (None, why) where they do not cover every turn."""
    groups = _groups(places, marks, starts, ends)
    chosen: list[tuple[_Place, _Place, str]] = []
    covered: set = set()
    why = ""
    for turns in sorted(groups, key=len, reverse=True):
        if turns & covered:
            continue
        pair, why = _first_proved(src, [(places[marks[s][0]], places[marks[e][0]], marks[s][1]) for s, e in groups[turns]],
                                  chosen, cases, turns)
        if pair is not None:
            chosen.append(pair)
            covered |= turns
    return (chosen, "") if covered == want else (None, why)


def _groups(places, marks, starts: dict[int, frozenset], ends: dict[int, frozenset]) -> dict[frozenset, list]:
    """The (start, end) mark pairs by the turns they cover: the same turns, the same loop variable,
    the end after the start; each group's pairs in order of preference (no `+` on the start tag,
    unguarded, shortest)."""
    by_turns: dict[tuple, list[int]] = {}
    for e, turns in ends.items():
        by_turns.setdefault((turns, marks[e][1]), []).append(e)
    groups: dict[frozenset, list] = {}
    for s, turns in starts.items():
        for e in by_turns.get((turns, marks[s][1]), ()):
            a, b = places[marks[s][0]], places[marks[e][0]]
            if a.end <= b.start and not (a.expr or b.expr):  # a tag cannot go inside a set value
                groups.setdefault(turns, []).append((s, e))

    def preference(se):
        a, b = places[marks[se[0]][0]], places[marks[se[1]][0]]
        return ("+" in (a.left, a.right), bool(marks[se[0]][1]), b.start - a.start)

    for pairs in groups.values():
        pairs.sort(key=preference)
    return groups


def _first_proved(src: str, pairs, chosen, cases, turns: frozenset):
    """The first of `pairs` (start place, end place, guard) that, alone, gives exactly the masks of
    `turns`, and overlaps none of `chosen`; (None, why) where none does."""
    why = ""
    for pair in pairs[:_MAX_PAIRS]:
        if any(pair[0].start < c[1].end and c[0].start < pair[1].end for c in chosen):
            continue
        text = _wrapped_all(src, [pair])
        if not _compiles(text):
            why = "the turn's start and end lie in different blocks of the template"
            continue
        why = _proves(text, cases, turns) or ""
        if not why:
            return pair, ""
    return None, why


def _message_loops(src: str, tags: Sequence[_Tag]) -> list[tuple[_Tag, _Tag, str]]:
    """Each `{% for NAME in ... messages ... %}` with its `{% endfor %}`, and NAME."""
    out, stack = [], []
    for t in tags:
        m = re.match(r"\{%[-+]?\s*(for|endfor)\b\s*(?:(\w+)\s+in\b(.*))?", src[t.start:t.end], re.S) if t.kind == "{%" else None
        if m and m.group(1) == "for":
            stack.append((t, m.group(2) if m.group(3) and "messages" in m.group(3) else ""))
        elif m and stack:
            opener, name = stack.pop()
            if name:
                out.append((opener, t, name))
    return out


def _captured(src: str, tags: Sequence[_Tag], cases) -> str | None:
    """Where no place in the source marks each turn (its opening printed inside a tool-call loop,
    its end in the same expression as the next turn's header): the message loop's body captured
    (`{% set %}...{% endset %}`) and printed back in pieces, the assistant's generated part inside
    the tags: the header the turn's iteration starts with (the longest of those seen that it
    starts with), the turn, the whitespace after it (or a constant ending). None where no loop's
    iterations hold the turns so, or the copy does not prove."""
    for opener, closer, name in _message_loops(src, tags):
        ps = _place_at(src, opener.end, None, opener)
        pe = _place_at(src, closer.start, closer, None)
        found = _iterations(ps, pe, cases)
        if not found:
            continue
        heads = sorted({body[:k] for body, k, _ in found}, key=len, reverse=True)
        tails = {body[k2:] for body, _, k2 in found}
        blank = all(t.isspace() or not t for t in tails)
        if not (blank or len(tails) == 1):
            continue
        if any(next(h for h in heads if body.startswith(h)) != body[:k] for body, k, _ in found):
            continue  # the longest header seen is not always the turn's own
        said = _message_texts(cases)
        if any(w in h for h in (*heads, *tails) for w in said):
            continue  # a header that holds a message's text (its reasoning) is no constant of the template
        text = _with_capture(src, ps, pe, name, heads, None if blank else tails.pop())
        if _compiles(text) and _proves(text, cases) is None:
            return text
    return None


def _message_texts(cases) -> set[str]:
    """The contents and reasoning of the check conversations' messages (three characters or more)."""
    out: set[str] = set()
    for server, _ in cases:
        for m in server.messages:
            out.update(v for k in ("content", "reasoning_content", "thinking", "reasoning")
                       if isinstance(v := m.get(k), str) and len(v.strip()) >= 3)
    return out


def _iterations(ps: _Place, pe: _Place, cases) -> list[tuple[str, int, int]]:
    """For each masked turn, the output of the loop iteration that holds it, with where in that
    output the turn starts and ends; [] where a turn is not inside one iteration."""
    out = []
    for server, mask in cases:
        try:
            text, fires = _trace(server, [ps, pe], [(0, ""), (1, "")], [0, 1])
        except TmplkitError:
            return []
        if text != mask.text:
            return []
        begins, ends = fires.get(0, []), fires.get(1, [])
        for a, b in mask.ranges:
            bs = max((f for f in begins if f <= a), default=-1)
            be = min((f for f in ends if f >= b), default=-1)
            if bs < 0 or be < 0 or any(bs < f < be for f in begins):
                return []
            out.append((text[bs:be], a - bs, b - bs))
    return out


def _with_capture(src: str, ps: _Place, pe: _Place, name: str, heads: Sequence[str], tail: str | None) -> str:
    n = "-1"
    for h in reversed(heads):  # the longest header the body starts with
        n = f"{len(h)} if _tk_body.startswith({json.dumps(h, ensure_ascii=False)}) else ({n})"
    if tail is not None:
        t = json.dumps(tail, ensure_ascii=False)
        kept = f"{{%- set _tk_kept = _tk_body[_tk_n:_tk_body|length - {len(tail)}] if _tk_body.endswith({t}) else '' %}}"
    else:
        kept = "{%- set _tk_kept = _tk_body[_tk_n:].rstrip() %}"
    cut = (f"{{%- set _tk_n = {n} %}}{{%- if {name}.role == 'assistant' and _tk_n >= 0 %}}{kept}"
           "{{ _tk_body[:_tk_n] }}{% generation %}{{ _tk_kept }}{% endgeneration %}"
           "{{ _tk_body[_tk_n + _tk_kept|length:] }}")
    body = src[ps.start:pe.start]
    return (src[:ps.start] + f"{{%{ps.left} set _tk_body {ps.right}%}}" + body + f"{{%{pe.left} endset %}}"
            + cut + "{%- else %}{{ _tk_body }}{%- endif %}" + src[pe.start:])


# The marks of `_marked`, as the annotated copy spells them (Jinja unescapes string literals): private
# use characters around a name, text no conversation holds by chance (one that does renders otherwise).
_START, _END = "\\ue000tk-start\\ue001", "\\ue000tk-end\\ue001"


def _marked(src: str, places, marks, fired: Sequence[dict[int, list[int]]], want: set, cases) -> tuple[str | None, str]:
    """Where the turns' starts and ends are reached in different blocks (a tool-call turn that ends
    in the next message's iteration, a turn whose end differs by its kind): a mark at each of a set
    of places that together start every masked turn (and a set for the ends), the whole render
    captured and printed back without the marks, the part from the last start mark before each end
    mark to it inside the tags. (None, why) where no marks cover every turn or the copy does not
    prove."""
    pair, why = _chosen_marks(places, marks, fired, want, cases)
    if pair is None:
        return None, why
    at: dict[int, list[tuple[str, str]]] = {}
    for chosen, code in ((pair[1], _END), (pair[0], _START)):  # a turn's end before the next one's start
        for m in chosen:
            at.setdefault(marks[m][0], []).append((code, marks[m][1]))
    edits = [(places[i], _marked_place(places[i], items)) for i, items in at.items()]
    body = _with(src, edits)
    body = body[:-1] if body.endswith("\n") else body  # Jinja drops one newline at the template's end
    text = (f"{{% set _tk_out +%}}{body}{{%+ endset %}}"
            f"{{% for _tk_part in _tk_out.split('{_END}') %}}{{% set _tk_cut = _tk_part.split('{_START}') %}}"
            "{% if loop.last or _tk_cut|length == 1 %}{{ _tk_cut|join('') }}{% else %}{{ _tk_cut[:-1]|join('') }}"
            "{% generation %}{{ _tk_cut[-1] }}{% endgeneration %}{% endif %}{% endfor %}")
    why = _proves(text, cases) or "" if _compiles(text) else "the marked copy does not compile"
    return (None, why) if why else (text, "")


def _cover(places, marks, found: dict[int, tuple[frozenset, int]], want: set) -> list[int] | None:
    """Marks whose turns are together every masked turn (those reached between turns least often
    first, then the widest, unguarded before guarded, no `+` before one with); None where none do."""
    order = sorted(found, key=lambda m: (found[m][1], -len(found[m][0]), bool(marks[m][1]),
                                         "+" in (places[marks[m][0]].left, places[marks[m][0]].right), m))
    chosen: list[int] = []
    covered: set = set()
    for m in order:
        if found[m][0] <= covered:
            continue
        chosen.append(m)
        covered |= found[m][0]
    return chosen if covered == want else None


def _wrapped_all(src: str, pairs) -> str:
    for s, e, guard in sorted(pairs, key=lambda p: p[0].start, reverse=True):
        src = _wrapped(src, s, e, guard)
    return src


def _wrapped(src: str, s: _Place, e: _Place, guard: str) -> str:
    """`src` with the generation tags at `s` and `e`; with a `guard` (a loop variable) the part
    between is written twice: `{% if guard.role == 'assistant' %}{% generation %}PART{% endgeneration
    %}{% else %}PART{% endif %}`, for a line of the template that prints every role's turn."""
    if not guard:
        return _with(src, [(s, s.tag("generation")), (e, e.tag("endgeneration"))])
    part = src[s.end:e.start]
    return (src[:s.start] + f"{s.before}{{%{s.left} if {guard}.role == 'assistant' %}}{{% generation {s.right}%}}"
            + s.after + part + f"{e.before}{{%{e.left} endgeneration %}}{{% else {s.right}%}}{s.after}"
            + part + f"{e.before}{{%{e.left} endif {e.right}%}}{e.after}" + src[e.end:])


def _cases(template: ChatTemplate, conversations) -> list[tuple[ServerConversation, TextMask]]:
    out = []
    for c in conversations if conversations is not None else check_conversations():
        conversation = c if isinstance(c, Conversation) else load_conversation(c)
        for shaped, kwargs in [(conversation, None), *_as_analysed(template, conversation)]:
            server = for_server(template, shaped, kwargs, inputs="transformers")  # as a trainer renders
            try:
                out.append((server, text_mask(template, server)))
                break
            except TmplkitError:
                continue  # a conversation the template refuses (no tools, strict alternation) proves nothing
    if not out:
        raise AnnotationError(f"template '{template.name}' renders none of the check conversations")
    return out


def _as_analysed(template: ChatTemplate, conversation: Conversation) -> list[tuple[Conversation, dict]]:
    """`conversation` shaped as the template's analysis found it takes one (tools declared in every
    conversation, tools without the `function` wrapper, variables it reads such as Firefunction's
    `functions`): with the analysis' shape, then with the tools flattened too."""
    from ..probes import Shape, extra_variable, tools_for

    try:
        adaptations = _analysis_of(template).capabilities.get("adaptations") or []
    except TmplkitError:
        return []
    out = []
    for flat in sorted({"flat_tools" in adaptations, True}):
        shape = Shape(tools_always="tools_always" in adaptations, flat_tools=flat)
        tools = list(conversation.tools or (tools_for(shape) if shape.tools_always else None) or [])
        if flat:
            tools = [t.get("function", t) for t in tools]
        names = [a.split(":", 1)[1] for a in adaptations if a.startswith("variable:")]
        kwargs = {n: v for n in names if (v := extra_variable(n, shape)) is not None}
        out.append((replace(conversation, tools=tuple(tools) or None), kwargs))
    return out


def _coverage(places: Sequence[_Place], marks: Sequence[tuple[int, str]], cases):
    """For each mark reached only where masked turns start, the (case, turn) pairs it starts
    (likewise for ends), and every masked (case, turn)."""
    starts: dict[int, set] = {}
    ends: dict[int, set] = {}
    bad: set[int] = set()
    want: set = set()
    fired: list[dict[int, list[int]]] = []
    keep = list(range(len(marks)))
    for c, (server, mask) in enumerate(cases):
        keep = _harmless(server, places, marks, keep, mask.text)
        text, fires = _trace(server, places, marks, keep)
        if text != mask.text:
            raise AnnotationError(f"template '{server.template.name}': marking its source changes its render")
        at_s = {t.start: (c, k) for k, t in enumerate(mask.turns) if t.end > t.start}
        at_e = {t.end: (c, k) for k, t in enumerate(mask.turns) if t.end > t.start}
        want |= set(at_s.values())
        for m in set(range(len(marks))) - set(keep):
            bad.add(m)
        for m in keep:
            f = fires.get(m, [])
            for at, found in ((at_s, starts), (at_e, ends)):
                if all(x in at for x in f):
                    found.setdefault(m, set()).update(at[x] for x in f)
                else:
                    found[m] = found.get(m, set()) | {None}
        fired.append(fires)
    clean = {m: frozenset(v) for m, v in starts.items() if m not in bad and v and None not in v}
    clean_e = {m: frozenset(v) for m, v in ends.items() if m not in bad and v and None not in v}
    fired = [{m: f for m, f in fires.items() if m not in bad} for fires in fired]
    return clean, clean_e, want, fired


def _chosen_marks(places, marks, fired, want: set, cases, tries: int = 8) -> tuple[tuple[list[int], list[int]] | None, str]:
    """Start and end marks that cover every masked turn and, by where they are reached, give no
    region besides the turns: where a stray start mark and a stray end mark (a user's content and
    its end of turn) make one, the start mark is left out (or, where the turns then lack a start,
    the end mark) and the cover chosen again. (None, why) where none do."""
    found = {"start": _loose(fired, cases, want, "start"), "end": _loose(fired, cases, want, "end")}
    for _ in range(tries):
        chosen_s, chosen_e = _cover(places, marks, found["start"], want), _cover(places, marks, found["end"], want)
        if chosen_s is None or chosen_e is None:
            return None, _uncovered(found["start" if chosen_s is None else "end"], want, cases,
                                    "start" if chosen_s is None else "end")
        stray = _stray_region(chosen_s, chosen_e, fired, cases)
        if stray is None:
            return (chosen_s, chosen_e), ""
        side = "start" if _cover(places, marks, {m: v for m, v in found["start"].items() if m != stray[0]}, want) else "end"
        found[side].pop(stray[0] if side == "start" else stray[1])
    return None, "every place reached at the masked turns' starts is reached before other text that an end mark closes"


def _uncovered(found: dict[int, tuple[frozenset, int]], want: set, cases, side: str) -> str:
    """Why no marks cover the turns' starts (ends): the first turn none is reached at."""
    c, k = min(want - set().union(*(v for v, _ in found.values())))
    mask = cases[c][1]
    at = mask.turns[k].start if side == "start" else mask.turns[k].end
    return (f"no place in the source is reached at every masked turn's {side} and never inside a turn "
            f"(none at the {side} of the turn after {mask.text[max(at - 40, 0):at]!r})")


def _stray_region(chosen_s: Sequence[int], chosen_e: Sequence[int], fired, cases) -> tuple[int, int] | None:
    """The start and end mark of the first region the marks give that is no masked turn (None: none)."""
    for (_, mask), fires in zip(cases, fired):
        events = sorted([(x, 0, m) for m in chosen_e for x in fires.get(m, [])]
                        + [(x, 1, m) for m in chosen_s for x in fires.get(m, [])])
        turns = {(t.start, t.end) for t in mask.turns if t.end > t.start}
        opened: tuple[int, int] | None = None
        for x, kind, m in events:
            if kind == 1:
                opened = (x, m)
            elif opened is not None:
                if (opened[0], x) not in turns:
                    return opened[1], m
                opened = None
    return None


def _loose(fired: Sequence[dict[int, list[int]]], cases, want: set, side: str) -> dict[int, tuple[frozenset, int]]:
    """For each mark, the masked turns it starts (`side` "start") or ends under `_marked`'s rule (a
    turn is what lies between the last start mark and the next end mark), and how often it is
    reached between the turns (harmless alone, a stray region beside a stray mark of the other
    side: the proof holds it); a mark reached inside a turn or at its other end is left out."""
    out: dict[int, set] = {}
    strays: dict[int, int] = {}
    inside: set[int] = set()
    for c, ((_, mask), fires) in enumerate(zip(cases, fired)):
        turns = [(k, t.start, t.end) for k, t in enumerate(mask.turns) if t.end > t.start]
        edge = {(t[1] if side == "start" else t[2]): t[0] for t in turns}
        for m, at in fires.items():
            if any((a < x <= b) if side == "start" else (a <= x < b) for _, a, b in turns for x in at):
                inside.add(m)
                continue
            out.setdefault(m, set()).update((c, edge[x]) for x in at if x in edge)
            strays[m] = strays.get(m, 0) + sum(x not in edge for x in at)
    return {m: (frozenset(v), strays[m]) for m, v in out.items() if m not in inside and v and v <= want}


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
