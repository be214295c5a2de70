"""Rendering probes and collecting what they show: where each message's content landed, the text
between neighbouring messages, and what the template renders after a message that comes last.

The Prober is the analysis's only mutable state: the evidence it collects grows with every probe
rendered, and the findings modules read delimiters off it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import RenderError, RenderLimitError
from ..sandbox import Limits, render
from ._text import Note, agree, back_to_boundary, canon, keep_contained, lcp, template_message
from .probes import EXTRA_VARIABLES, Needles, Probe, ProbeBuilder, extra_variable, variable_strings

__all__ = ["Attempt", "Prober", "Seen"]

_UNDEFINED = re.compile(r"'(\w+)' is undefined")


class Seen:
    """Where each message's content landed in one render.

    A quote the template wraps around the content (`"` of a JSON-encoded tool result) belongs to the
    content, so a delimiter ends before it.
    """

    def __init__(self, text: str, probe: Probe):
        self.text = text
        self.probe = probe
        self.pos: list[list[int]] = []
        self.bounds: list[tuple[int, int] | None] = []
        for needles in probe.needles:
            positions: list[int] = []
            lo: int | None = None
            hi: int | None = None
            for needle in needles:
                p = text.find(needle)
                positions.append(p)
                if p < 0:
                    continue
                a, b = p, p + len(needle)
                if 0 < a and b < len(text) and text[a - 1] == '"' and text[b] == '"':
                    a, b = a - 1, b + 1
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
            self.pos.append(positions)
            self.bounds.append(None if lo is None or hi is None else (lo, hi))  # set together

    def kind(self, i: int) -> str:
        return "call" if self.probe.tool_call_flags[i] else self.probe.roles[i]

    def found(self, i: int) -> bool:
        return self.bounds[i] is not None

    def between(self, i: int, j: int) -> str | None:
        bi, bj = self.bounds[i], self.bounds[j]
        if bi is None or bj is None:
            return None
        a, b = bi[1], bj[0]
        return canon(self.text[a:b]) if a <= b else None

    def head(self, i: int) -> str:
        b = self.bounds[i]
        return canon(self.text[: b[0]]) if b else ""

    def tail(self, i: int) -> str | None:
        b = self.bounds[i]
        return canon(self.text[b[1]:]) if b else None


class Attempt(NamedTuple):
    """One probe render: the text (None when the template failed), the probe, the builder it was
    built with (adapted with any extra variable the template needed), and the failure."""

    text: str | None
    probe: Probe
    builder: ProbeBuilder
    error: RenderError | None


class Prober:
    """Renders probes of one template and collects the evidence delimiters are cut from."""

    def __init__(self, template, limits: Limits | None):
        self.template = template
        self.limits = limits
        self.needles = Needles(template.text)
        self.varying = re.compile("|".join(re.escape(v) for v in (*variable_strings(), self.needles.prefix)))
        # kind -> what the template renders after a message of that kind when it comes last
        self.tails: dict[str, str] = {}
        # (previous kind, kind) -> the texts between their contents, in plain renders ...
        self.segs: dict[tuple[str, str], list[str]] = {}
        # ... and in renders with a thinking switch set
        self.switched_segs: dict[tuple[str, str], list[str]] = {}

    # -- rendering -----------------------------------------------------------------------------------

    def render(self, probe: Probe, clock=None) -> str:
        return render(self.template, probe.conversation(), limits=self.limits, clock=clock, **probe.kwargs)

    def attempt(self, builder: ProbeBuilder, spec: str, **kw) -> Attempt:
        """Render a probe; where the template reads a known extra variable that is undefined, supply
        it and retry. A render limit is not a failure of this probe: it ends the analysis."""
        tried: set[str] = set()
        while True:
            probe = builder.build(spec, **kw)
            try:
                return Attempt(self.render(probe), probe, builder, None)
            except RenderLimitError:
                raise
            except RenderError as exc:
                m = _UNDEFINED.search(template_message(exc))
                name = m.group(1) if m else None
                if name in EXTRA_VARIABLES and name not in tried and name not in dict(builder.shape.extra):
                    tried.add(name)
                    builder = builder.with_shape(builder.shape.with_extra(name, extra_variable(name, builder.shape)))
                    continue
                return Attempt(None, probe, builder, exc)

    def seen(self, text: str, probe: Probe, *, collect: bool = True, switched: bool = False) -> Seen:
        """Locate the contents of a render and record the text between each pair of neighbours."""
        s = Seen(text, probe)
        if collect:
            into = self.switched_segs if switched else self.segs
            for i in range(1, len(probe.roles)):
                seg = s.between(i - 1, i)
                if seg is not None:
                    into.setdefault((s.kind(i - 1), s.kind(i)), []).append(seg)
        return s

    def note_tail(self, s: Seen, i: int) -> None:
        tail = s.tail(i)
        if tail is not None:
            self.tails.setdefault(s.kind(i), tail)

    # -- cutting delimiters --------------------------------------------------------------------------

    def clean(self, text: str | None) -> str:
        """Cut a delimiter candidate before any varying text, and drop its leading whitespace.

        A delimiter ends before the first text that changes from one real conversation to the next:
        a tool's name, a tool-call id or index, today's date, tools being declared or not. Where the
        text after the turn opener varies (Kimi K2 names the tool there:
        `<|im_system|>kq_lookup<|im_middle|>`), the delimiter is the opener alone; longest-first
        splitting still gives a system turn (`<|im_system|>system<|im_middle|>`) its own role, though
        a tool named `system` would read as one, and the tools declaration before the first message
        (`<|im_system|>tool_declare`) reads as a tool span (text before the first message is not
        checked). Leading whitespace is dropped: a newline between turns ends the previous turn.
        Trailing whitespace is kept: it is what the template emits right before the content
        (ChatML's `\\n`, Llama 3's `\\n\\n`), so a match ends exactly where the content begins.
        """
        if not text:
            return ""
        m = self.varying.search(text)
        return (text[: m.start()] if m else text).lstrip()

    def after_varying(self, text: str) -> str:
        """`text` after the last text in it that varies from one conversation to the next (a tool
        name, a call id): what a previous message's content ends with, its closer, comes after it."""
        ends = [m.end() for m in self.varying.finditer(text)]
        return text[ends[-1]:] if ends else text

    def closer_end(self, seg: str, prev: str, opener: str | None) -> int:
        """Where the previous message's closer ends in `seg`.

        The closer is what the template renders after that message's content when it comes last
        (ChatML's `<|im_end|>\\n`, Llama 3's `<|eot_id|>`); it is no part of the next start. Where it
        is only partly there, it is cut at a markup boundary (after a `>`, `]` or whitespace), and
        it never holds the markup that opens every turn (`<|start_header_id|>`).
        """
        tails = sorted((t for t in self.tails.values() if t.strip()), key=len, reverse=True)
        closer = self.tails.get(prev)
        if closer and seg.startswith(closer):
            k = len(closer)
        else:
            # The closer may carry an ending the template adds only when the message comes last; a
            # closer of another role that the segment starts with whole is then the better guess.
            k = next((len(t) for t in tails if seg.startswith(t)), -1)
            if k < 0:
                k = back_to_boundary(seg, lcp(seg, closer or ""))
        # A closer of another role may follow (a tool call's own ending, then the assistant's).
        k += next((len(t) for t in tails if seg.startswith(t, k)), 0)
        # A closer never holds a turn opener: the next turn starts at the first one.
        if opener:
            j = seg.find(opener, 0, k)
            if j >= 0:
                k = j
        return k

    def start_in(self, seg: str | None, prev: str, opener: str | None) -> str:
        """The start delimiter inside `seg`, the text between a `prev` message and the next one."""
        return self.clean(seg[self.closer_end(seg, prev, opener):]) if seg is not None else ""

    def starts(self, prev: str, kind: str, opener: str | None) -> list[str]:
        """The start of a `kind` message after a `prev` one in each context it was seen in."""
        return [self.start_in(seg, prev, opener) for seg in self.segs.get((prev, kind), ())]

    def role_start(self, prev: str, kind: str, what: str, opener: str | None) -> tuple[str, Note | None]:
        """The start of a `kind` message after a `prev` one, agreed over every context it was seen in
        and cut to what the renders with a thinking switch set contain at the same place."""
        start, note = agree(self.starts(prev, kind, opener), what)
        return keep_contained(start, self.switched_segs.get((prev, kind), ())), note
