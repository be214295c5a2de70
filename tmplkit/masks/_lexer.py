"""The template's source as tags and places: where a generation tag or a trace mark can go
without changing the render (before and after each tag, after a newline or `>` inside text, at each
top-level `+` / `~` of an output expression, inside string literals), the loops around each place,
and the message loops. Pure text: nothing here renders."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import RenderError
from ..sandbox import compile_template
from ..sources.templates import ChatTemplate

__all__: list[str] = []  # private to the annotation


OWN_TAG = re.compile(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")


@dataclass(frozen=True)
class Tag:
    start: int
    end: int
    kind: str  # "{{", "{%" or "{#"
    left: str  # "-", "+" or ""
    right: str


@dataclass(frozen=True)
class Place:
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


def lex_tags(src: str) -> list[Tag]:
    """Every `{{ }}`, `{% %}` and `{# #}` of `src` (strings inside a tag skipped)."""
    out: list[Tag] = []
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
        out.append(Tag(i, j, kind, left, right))
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


def tag_places(src: str, tags: Sequence[Tag]) -> list[Place]:
    """Where a tag can go without changing the render (see the module doc)."""
    starts = {t.start: t for t in tags}
    ends = {t.end: t for t in tags}
    positions = set(starts) | set(ends)
    prev = 0
    for t in [*tags, Tag(len(src), len(src), "", "", "")]:
        text = src[prev:t.start]
        for m in re.finditer(r"[\n>]", text):  # inside text, at a line or markup end
            if text[:m.end()].isspace():
                continue  # in whitespace the previous tag's `-` takes off
            positions.add(prev + m.end())
        prev = t.end
    out = [place_at(src, p, starts.get(p), ends.get(p)) for p in sorted(positions)]
    for t in tags:
        if t.kind == "{{" or (t.kind == "{%" and _SET_VALUE.match(src, t.start)):
            out.extend(_splits(src, t))
    return out


def place_at(src: str, p: int, nxt: Tag | None, prev: Tag | None) -> Place:
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
    return Place(p, p, left, right)


_SET_VALUE = re.compile(r"\{%[-+]?\s*set\s+[\w.]+\s*=\s*")


def _splits(src: str, t: Tag) -> list[Place]:
    """Where an output expression can be split in two (`{{ a + b }}` into `{{ a }}{{ b }}`): at each
    top-level `+` / `~`, and inside a string literal that is a whole operand, after each `>` and
    `\\n` (`'<|im_end|>\\n'` into `'<|im_end|>'`, `'\\n'`). In a `{% set x = a ~ b %}` value (a
    template that builds its output in a string) the same places take a mark as an operand."""
    value = _SET_VALUE.match(src, t.start) if t.kind == "{%" else None
    base = value.end() if value else t.start + 2 + bool(t.left)
    inner = src[base:t.end - 2 - bool(t.right)]
    if re.search(r"\bif\b", inner):
        return []  # `a + b if c else d` is no concatenation of outputs
    out: list[Place] = []
    depth = k = 0
    while k < len(inner):
        c = inner[k]
        if c in "'\"":
            j = _literal_end(inner, k)
            if depth == 0 and _whole_operand(inner, k, j):
                out.extend(Place(base + x, base + x, "", "", before=f"{c} ~ " if value else f"{c} }}}}",
                                  after=f" ~ {c}" if value else f"{{{{ {c}", expr=bool(value))
                           for x in _literal_cuts(inner, k, j))
            k = j
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in "+~" and depth == 0:
            out.append(Place(base + k, base + k + 1, "", "", before=f"{c} " if value else " }}",
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


def with_edits(src: str, edits: Sequence[tuple[Place, str]]) -> str:
    for place, text in sorted(edits, key=lambda e: (e[0].start, e[0].end), reverse=True):
        src = src[:place.start] + text + src[place.end:]
    return src


def loop_vars(src: str, tags: Sequence[Tag], places: Sequence[Place]) -> list[tuple[str, ...]]:
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


def message_loops(src: str, tags: Sequence[Tag]) -> list[tuple[Tag, Tag, str]]:
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


def compiles(text: str) -> bool:
    """Whether `text` compiles in the sandbox's environment (its `{% generation %}` tag is
    transformers'); the compiled copy is cached for the renders that prove it."""
    try:
        compile_template(ChatTemplate(text=text, name="annotated", source="-"))
    except RenderError:
        return False
    return True
