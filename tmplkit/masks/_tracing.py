"""Tracing a template: marks written at places of its source, one render of a check conversation,
and where in the text each mark was reached; the marks that leave the render as it is."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from ..errors import TmplkitError
from ..session import ServerConversation
from ._lexer import Place, with_edits

__all__: list[str] = []  # private to the annotation


_MARK = re.compile("\ue000(\\d+)\ue001")


def trace(server: ServerConversation, places: Sequence[Place], marks: Sequence[tuple[int, str]],
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
        edits.append((p, marked_place(p, [(f"\\ue000{k}\\ue001", marks[k][1]) for k in ks])))
    traced = rendered(server, with_edits(server.template.text, edits))
    fires: dict[int, list[int]] = {}
    removed = 0
    for m in _MARK.finditer(traced):
        fires.setdefault(int(m.group(1)), []).append(m.start() - removed)
        removed += len(m.group(0))
    return _MARK.sub("", traced), fires


def marked_place(p: Place, items: Sequence[tuple[str, str]]) -> str:
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


def harmless(server: ServerConversation, places, marks, keep: list[int], want: str) -> list[int]:
    """The marks of `keep` that leave the render as it is (halving to find those that change it:
    a split of `{{ n + 1 }}`, a mark in text a filter reads)."""
    try:
        text, _ = trace(server, places, marks, keep)
    except TmplkitError:
        text = None
    if text == want:
        return keep
    if len(keep) <= 1:
        return []
    half = len(keep) // 2
    return harmless(server, places, marks, keep[:half], want) + harmless(server, places, marks, keep[half:], want)


def rendered(server: ServerConversation, text: str) -> str:
    """The render of `server`'s conversation, its messages as prepared for the original template
    (tool-call arguments as the template reads them: the marks must not change what is given)."""
    return replace(server, template=replace(server.template, text=text)).render(add_generation_prompt=False)


