"""Differential analysis: derive each role's start delimiter from probe renders, and prove it.

`analyze(template)` renders small probe conversations (tmplkit.probes) that differ by one message,
finds each message's content by its needle, and reads the role delimiters off the text between
contents, in every context a role was seen in. A long mixed conversation is then rendered and
split with the derived delimiters; the Analysis carries that round-trip verdict.
"""

from __future__ import annotations

import bisect
import re
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from .delimiters import Delimiter, sort_delimiters
from .errors import InputError, RenderError, RenderLimitError
from .probes import (
    CALL_ID_FORMAT,
    CHAT_SHAPES,
    EXTRA_VARIABLES,
    THINKING_FLAGS,
    TOOL_NAME,
    TOOL_SHAPES,
    Needles,
    Probe,
    ProbeBuilder,
    extra_variable,
    variable_strings,
)
from .sandbox import Limits, compile_template, render
from .spans import split_text


# Where a template puts tool responses.
TOOL_PLACEMENTS = ("own_role", "inside_user", "inside_assistant", "dropped", "rejected", "unknown")
# Analysis.status values. The last three come from the isolation limits.
STATUSES = ("pass", "fail", "unsupported", "error", "timeout", "memory", "unsafe")


@dataclass(frozen=True)
class RoundTrip:
    """The verdict of rendering the mixed conversation and splitting it with the derived delimiters.

    `expected_roles` are the roles of the messages the template renders as turns of their own,
    in order; `actual_roles` the roles of the spans found. `messages`/`rendered` are kept for the
    token-level round trip and are not part of to_dict().
    """

    passed: bool
    expected_roles: tuple[str, ...]
    actual_roles: tuple[str, ...]
    problems: tuple[str, ...] = ()
    messages: tuple = field(default=(), repr=False, compare=False)
    render_kwargs: dict = field(default_factory=dict, repr=False, compare=False)
    rendered: str = field(default="", repr=False, compare=False)

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "expected_roles": list(self.expected_roles),
            "actual_roles": list(self.actual_roles),
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Analysis:
    name: str
    source: str
    status: str
    user_start: str | None = None
    assistant_start: str | None = None
    system_start: str | None = None
    tool_response_start: str | None = None
    # Where consecutive tool responses share one turn: the delimiter that starts each further one.
    tool_response_next: str | None = None
    generation_prompt: str | None = None
    tool_placement: str = "unknown"
    capabilities: dict = field(default_factory=dict)
    delimiters: tuple[Delimiter, ...] = ()
    round_trip: RoundTrip | None = None
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "status": self.status,
            "user_start": self.user_start,
            "assistant_start": self.assistant_start,
            "system_start": self.system_start,
            "tool_response_start": self.tool_response_start,
            "tool_response_next": self.tool_response_next,
            "generation_prompt": self.generation_prompt,
            "tool_placement": self.tool_placement,
            "capabilities": dict(self.capabilities),
            "delimiters": [d.to_dict() for d in self.delimiters],
            "round_trip": self.round_trip.to_dict() if self.round_trip else None,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 6),
        }


# --- how a delimiter is cut out of a render -----------------------------------------------------
#
# A role's start delimiter is the text the template emits between the end of the previous turn and
# the first character of a message's content:
#   - the previous message's closer is not part of it: that is what the template renders after that
#     message's content when it comes last (ChatML's `<|im_end|>\n`, Llama 3's `<|eot_id|>`); where the
#     closer is only partly there, it is cut at a markup boundary (after a `>`, `]` or whitespace),
#     and it never holds the markup that opens every turn (`<|start_header_id|>`). Where the text
#     after a call varies before the call's closer (Apriel 1.5 prints the call's id only when a
#     response follows), a response's start is what that text shares with the text after another
#     response, once the response's own closer is cut off: calls and responses may end alike
#     (`\n<|end|>\n`), and that ending is the previous turn's, not the next one's;
#   - leading whitespace is dropped: a newline between turns ends the previous turn;
#   - trailing whitespace is kept: it is what the template emits right before the content (ChatML's
#     `\n`, Llama 3's `\n\n`), so a match ends exactly where the content begins; a quote the template
#     wraps around the content (`"` of a JSON-encoded tool result) belongs to the content;
#   - it ends before the first text that changes from one real conversation to the next: a tool's
#     name, a tool-call id or index, today's date, tools being declared or not. Where a role follows
#     the same previous role in several places, the delimiter is what all of them share: their
#     common prefix, else their common suffix (a block some turns only get, like Mistral's tool list
#     before the last user message, or a closer rendered only before a next turn, is left out);
#   - reasoning is message content: the contexts include turns whose reasoning the template keeps
#     (tool calls after the last user message, as in an agent session in progress), so the empty
#     `<think></think>` many templates print for earlier turns is no part of the assistant start
#     (GLM 4.6: `<|assistant|>\n<think>`); and a thinking switch (enable_thinking, thinking, ...) is
#     set per request, so the round trip is rendered with each of its values too, and a delimiter
#     is cut to what all of them contain at that place (DeepSeek V4: `<｜Assistant｜>`, which opens
#     `</think>` or `<think>`); the verdict covers every such render;
#   - a system delimiter ends at its first line of prose: a default system prompt the template
#     writes before the given one is system content, not markup, and so is its heading (Solar's
#     `## Provider System Prompt`, Command R's `# Safety Preamble`): the delimiter ends at the turn's
#     markup. A heading the template writes right before the given prompt, and only when there is
#     one, is kept (gpt-oss's `# Instructions\n\n`, the same for every system prompt);
#   - the BOS token is part of a delimiter only where the template repeats it at each turn
#     (ByteDance Seed's `<seed:bos>user\n`); a BOS printed once at the start belongs to no span;
#   - a delimiter must be able to mark a turn: it holds a markup unit or a word (`, ` between list
#     items does not). Where a role has none of its own, the previous message's closer that always
#     precedes it is taken from its first markup unit: Mistral's answers start at `[/INST]`
#     (capabilities['assistant_start'] == 'user_closer'), Apertus' tool results at
#     `<|tools_suffix|>[` (capabilities['tool_response_start'] == 'call_closer'); responses grouped
#     with nothing between them share one span, and an answer that follows tool responses without
#     an opener continues their span (capabilities['assistant_after_tool'] == 'continues');
#   - responses grouped in one JSON list are told apart by what opens each further item, up to its
#     first varying value (Command R7B's `,\n    {\n        "tool_call_id": "`): the `,` is printed
#     only when an item follows, so it starts the next item, and a JSON-encoded content holds no raw
#     newline, so the delimiter cannot match inside one;
#   - where the text after the turn opener varies (Kimi K2 names the tool there:
#     `<|im_system|>kq_lookup<|im_middle|>`), the delimiter is the opener alone; longest-first
#     splitting still gives a system turn (`<|im_system|>system<|im_middle|>`) its own role, though a
#     tool named `system` would read as one, and the tools declaration before the first message
#     (`<|im_system|>tool_declare`) reads as a tool span (text before the first message is not checked).
#
# None of this rests on the BOS/EOS tokens: a bare .jinja renders them empty (or gets "" where the
# template needs them), and the delimiters are the same as with the real tokens.
#
# The generation prompt is cut like a delimiter: a closer the last user turn gets only when a turn
# follows, and the whitespace that ends it, are the user turn's (Apriel 1.6's `\n` before
# `<|begin_assistant|>`).

_UNDEFINED = re.compile(r"'(\w+)' is undefined")
# A second clock: text that differs between renders at two dates is no fixed marker.
_OTHER_NOW = datetime(2031, 11, 23, 17, 45, 0)
# Markup units: special tokens and tags such as <|im_start|>, <｜User｜>, <start_of_turn>, [INST].
_UNIT = re.compile(r"<\|[^<>|\s]*\|>|<｜[^<>｜]*｜>|〈\|[^〈〉]*\|〉|<[^<>\s]+>|\[[^\[\]\s]+\]")
# Markup (units and bare role words such as `system`) ending a text: `<|im_system|>system<|im_middle|>`.
_MARKUP_END = re.compile(r"(?:" + _UNIT.pattern + r"|[A-Za-z_]+(?=<|\[|〈)|\s)+$")
# A closer that is only partly rendered is cut after one of these.
_BOUNDARY = frozenset(">]}\n \t")


def _other_clock() -> datetime:
    return _OTHER_NOW


def _lcp(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on slices: fast on long renders)."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _lcs(a: str, b: str) -> int:
    """Length of the longest common suffix."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def _unit_prefix(s: str, k: int) -> int:
    """`k`, moved back so that s[:k] does not end inside a markup unit such as `<|im_start|>`."""
    if k >= len(s):
        return k
    opening = max(s.rfind("<", 0, k), s.rfind("[", 0, k))
    if opening >= 0 and s.find(">" if s[opening] == "<" else "]", opening, k) < 0:
        return opening
    return k


def _unit_suffix(s: str, j: int) -> int:
    """`j`, moved forward so that s[j:] does not start inside a markup unit."""
    if j <= 0:
        return 0
    closings = [i for i in (s.find(">", j), s.find("]", j)) if i >= 0]
    if not closings:
        return j
    close = min(closings)
    if s.rfind("<" if s[close] == ">" else "[", j, close) < 0:
        return close + 1
    return j


def _distinctive(d: str | None) -> bool:
    """Whether `d` can mark a turn: it holds a markup unit or a word, not just punctuation (`, `)."""
    return bool(d) and (bool(_UNIT.search(d)) or sum(c.isalnum() for c in d) >= 2)


def _from_first_unit(text: str) -> str:
    m = _UNIT.search(text)
    return text[m.start():] if m else ""


def _template_message(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    return getattr(exc, "template_message", None) or str(exc)


def _status_of(err) -> str:
    """'unsupported' when the template itself refused (raise_exception), 'error' when it broke."""
    return "unsupported" if getattr(err, "template_raised", False) else "error"


_CALL_ID = re.compile(CALL_ID_FORMAT.replace("{:02d}", r"\d\d"))
_CANON_ID = CALL_ID_FORMAT.format(0)


def _canon(text: str) -> str:
    """Every tool-call id replaced by one of the same length, so texts that differ only by id compare equal."""
    return _CALL_ID.sub(_CANON_ID, text)


class _Seen:
    """Where each message's content landed in one render (quotes wrapped around a needle included)."""

    def __init__(self, text: str, probe: Probe):
        self.text = text
        self.probe = probe
        self.pos: list[list[int]] = []
        self.bounds: list[tuple[int, int] | None] = []
        for needles in probe.needles:
            positions, lo, hi = [], None, None
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
            self.bounds.append(None if lo is None else (lo, hi))

    def kind(self, i: int) -> str:
        return "call" if self.probe.tool_call_flags[i] else self.probe.roles[i]

    def found(self, i: int) -> bool:
        return self.bounds[i] is not None

    def between(self, i: int, j: int) -> str | None:
        if self.bounds[i] is None or self.bounds[j] is None:
            return None
        a, b = self.bounds[i][1], self.bounds[j][0]
        return _canon(self.text[a:b]) if a <= b else None

    def head(self, i: int) -> str:
        return _canon(self.text[: self.bounds[i][0]]) if self.bounds[i] else ""

    def tail(self, i: int) -> str | None:
        return _canon(self.text[self.bounds[i][1]:]) if self.bounds[i] else None


class _Analyzer:
    def __init__(self, template, limits: Limits | None):
        self.t = template
        self.limits = limits
        self.needles = Needles(template.text)
        self._varying = re.compile("|".join(re.escape(v) for v in (*variable_strings(), self.needles.prefix)))
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.caps: dict = {}
        self.builder = ProbeBuilder(self.needles)
        self.tool_builder: ProbeBuilder | None = None
        self.tails: dict[str, str] = {}  # kind -> what the template renders after it when it comes last
        self.segs: dict[tuple[str, str], list[str]] = {}  # (previous kind, kind) -> texts between contents
        self.switched_segs: dict[tuple[str, str], list[str]] = {}  # the same, in renders with a thinking switch set
        self.opener: str | None = None  # the markup that opens every turn (<|im_start|>, <|start_header_id|>, ...)
        self.bos_like: str = ""  # what the template prints once at the very start (the BOS token)
        self._disagreed: set[str] = set()  # delimiters already warned about in agree()

    # -- rendering probes --------------------------------------------------------------------------

    def _render(self, probe: Probe, clock=None) -> str:
        return render(self.t, probe.messages, limits=self.limits, clock=clock, **probe.kwargs)

    def attempt(self, builder: ProbeBuilder, spec: str, **kw):
        """Render a probe; where the template reads a known extra variable that is undefined, supply it
        and retry. Returns (text or None, probe, builder (possibly adapted), error or None)."""
        tried: set[str] = set()
        while True:
            probe = builder.build(spec, **kw)
            try:
                return self._render(probe), probe, builder, None
            except RenderLimitError:
                raise
            except RenderError as exc:
                m = _UNDEFINED.search(_template_message(exc))
                name = m.group(1) if m else None
                if name in EXTRA_VARIABLES and name not in tried and name not in dict(builder.shape.extra):
                    tried.add(name)
                    builder = builder.with_shape(builder.shape.with_extra(name, extra_variable(name, builder.shape)))
                    continue
                return None, probe, builder, exc

    def seen(self, text: str, probe: Probe, *, collect: bool = True, into: dict | None = None) -> _Seen:
        """Locate the contents of a render and record the text between each pair of neighbours."""
        s = _Seen(text, probe)
        if collect:
            into = self.segs if into is None else into
            for i in range(1, len(probe.roles)):
                seg = s.between(i - 1, i)
                if seg is not None:
                    into.setdefault((s.kind(i - 1), s.kind(i)), []).append(seg)
        return s

    def note_tail(self, s: _Seen, i: int) -> None:
        tail = s.tail(i)
        if tail is not None:
            self.tails.setdefault(s.kind(i), tail)

    # -- cutting delimiters ------------------------------------------------------------------------

    def clean(self, text: str | None) -> str:
        """Cut a delimiter candidate before any varying text, and drop its leading whitespace."""
        if not text:
            return ""
        m = self._varying.search(text)
        return (text[: m.start()] if m else text).lstrip()

    def closer_end(self, seg: str, prev: str) -> int:
        """Where the previous message's closer ends in `seg`."""
        tails = sorted((t for t in self.tails.values() if t.strip()), key=len, reverse=True)
        closer = self.tails.get(prev)
        if closer and seg.startswith(closer):
            k = len(closer)
        else:
            # The closer may carry an ending the template adds only when the message comes last; a
            # closer of another role that the segment starts with whole is then the better guess.
            k = next((len(t) for t in tails if seg.startswith(t)), -1)
            if k < 0:
                k = _lcp(seg, closer or "")
                while k > 0 and seg[k - 1] not in _BOUNDARY:
                    k -= 1
        # A closer of another role may follow (a tool call's own ending, then the assistant's).
        k += next((len(t) for t in tails if seg.startswith(t, k)), 0)
        # A closer never holds a turn opener: the next turn starts at the first one.
        if self.opener:
            j = seg.find(self.opener, 0, k)
            if j >= 0:
                k = j
        return k

    def start_in(self, seg: str | None, prev: str) -> str:
        """The start delimiter inside `seg`, the text between a `prev` message and the next one."""
        return self.clean(seg[self.closer_end(seg, prev):]) if seg is not None else ""

    def agree(self, candidates: list[str], what: str) -> str:
        """A role's delimiter from its candidates in every context it was seen in: their common
        prefix (text that varies at the end, like a call index, is no marker), else their common
        suffix (a block the template puts before some turns only, like Mistral's tool list before
        the last user message, is not part of the delimiter)."""
        candidates = list(dict.fromkeys(c for c in candidates if c))
        if len(candidates) <= 1:
            return candidates[0] if candidates else ""
        first = candidates[0]
        k = _unit_prefix(first, min(_lcp(first, c) for c in candidates[1:]))
        if first[:k].strip():
            return first[:k]
        j = _unit_suffix(first, len(first) - min(_lcs(first, c) for c in candidates[1:]))
        if first[j:].strip():
            return first[j:]
        if what not in self._disagreed:
            self._disagreed.add(what)
            self.warnings.append(f"{what} differs between contexts ({first!r}, {candidates[1]!r}); kept the first")
        return first

    def role_start(self, prev: str, kind: str, what: str) -> str:
        start = self.agree([self.start_in(seg, prev) for seg in self.segs.get((prev, kind), ())], what)
        return self.switch_proof(start, self.switched_segs.get((prev, kind), ()))

    @staticmethod
    def switch_proof(start: str, segs) -> str:
        """`start` cut to what renders with a thinking switch set still hold at the same place: the
        closers there may differ (GLM 4.6 appends `/nothink` to user messages), so each such text
        only shortens the delimiter to its longest prefix (at a markup boundary) that it contains."""
        for seg in segs:
            if start in seg:
                continue
            lo, hi = 0, len(start)
            while lo < hi:  # start[:k] in seg holds for every k up to some point
                mid = (lo + hi + 1) // 2
                if start[:mid] in seg:
                    lo = mid
                else:
                    hi = mid - 1
            k = _unit_prefix(start, lo)
            if start[:k].strip():
                start = start[:k]
        return start

    # -- the analysis ------------------------------------------------------------------------------

    def run(self) -> Analysis:
        try:
            compile_template(self.t)
        except RenderError as exc:
            return self._done("error", errors=[str(exc)])

        # 1. Basic chat: one user message, in the first shape the template accepts.
        first_error = None
        for shape in CHAT_SHAPES:
            text, probe, builder, err = self.attempt(self.builder.with_shape(shape), "U1")
            if text is not None and _Seen(text, probe).found(0):
                break
            first_error = first_error or err
        else:
            if first_error is None:
                return self._done("unsupported", errors=["the template does not render the content of a user message"])
            return self._done(_status_of(first_error),
                              errors=[f"cannot render a one-message chat: {_template_message(first_error)}"])
        self.builder = builder
        one = self.seen(text, probe)
        self.note_tail(one, 0)
        pre_user0 = one.head(0)

        # 2. User and assistant turns, and the generation prompt.
        text, probe, self.builder, err = self.attempt(self.builder, "U1 A1 U2")
        if text is None:
            return self._done(_status_of(err),
                              errors=[f"cannot render a user/assistant/user chat: {_template_message(err)}"])
        chat = self.seen(text, probe)
        if not all(chat.found(i) for i in range(3)):
            return self._done("unsupported", errors=["the template drops the content of user or assistant messages"])
        if chat.between(0, 1) is None or chat.between(1, 2) is None:
            return self._done("unsupported", errors=["the template does not render messages in their order"])
        text, probe, self.builder, err = self.attempt(self.builder, "U1 A1")
        if text is not None:
            self.note_tail(self.seen(text, probe, collect=False), 1)
        if "assistant" not in self.tails:
            # The template wants the conversation to end elsewhere: take as the assistant's closer
            # the part of the user's closer that the assistant-to-user text starts with.
            seg = chat.between(1, 2)
            self.tails["assistant"] = seg[: _lcp(seg, self.tails["user"])]
        text, probe, self.builder, err = self.attempt(self.builder, "U1", add_generation_prompt=True)
        self.gp_text = text
        between_turns = chat.between(0, 1) + chat.between(1, 2)
        self.bos_like = self._find_bos(pre_user0, between_turns)
        self.opener = self._find_opener(pre_user0, between_turns)
        generation_prompt = None
        if text is not None:
            k = _lcp(text, one.text)
            if k < len(one.text):  # the render without it ends differently (an EOS): cut at a boundary
                while k > 0 and text[k - 1] not in _BOUNDARY:
                    k -= 1
            # Cut like a delimiter: a closer the user turn gets only before a next turn, and the
            # whitespace that ends it, belong to the user turn (Apriel 1.6's `\n` before `<|begin_assistant|>`).
            added = text[k:]
            generation_prompt = added[self.closer_end(added, "user"):].lstrip()
        self.pre_user0 = pre_user0
        self._chat_delimiters()
        self.chat_builder = self.builder

        # 3. System messages.
        system_start, system_mode = self._system(pre_user0)

        # 4. Tools, tool calls and tool responses.
        tool = self._tools()

        # 5. Thinking switches that change the render.
        self.caps["thinking_flags"] = self._thinking_flags()

        # 6. The round-trip conversation; its contexts refine the delimiters. It is rendered once more
        # for each value of each thinking switch that changes it: a switch is set per request, so
        # the delimiters must hold either way (DeepSeek V4 opens answers with `</think>`, or with
        # `<think>` when thinking).
        rt_probe, rt_text, rt_error = self._round_trip_render(system_mode, tool)
        variants: list[tuple[str, str]] = []  # (the switch as `name=value`, the render)
        if rt_text is not None:
            variants = self._switched_renders(rt_probe, rt_text)
            renders = [self.seen(rt_text, rt_probe)] + [self.seen(v, rt_probe, into=self.switched_segs) for _, v in variants]
            if system_mode == "own_turn" and "system" in rt_probe.roles:
                i = rt_probe.roles.index("system")
                for rt in (r for r in renders if r.found(i)):
                    other = self._system_candidate(rt.head(i), pre_user0)
                    k = _lcp(system_start, other)
                    if other and system_start[:k].strip():
                        system_start = system_start[:k]
            self._chat_delimiters()
            if tool.get("placement") not in (None, "rejected", "dropped"):
                self._tool_delimiters(tool)
        self.caps["system"] = system_mode
        self.caps["system_supported"] = system_mode != "rejected"
        self.caps["tools_supported"] = bool(self.caps.get("tools")) or self.caps.get("tool_calls") not in (None, "rejected")

        # 7. Delimiters.
        assistant = self._merge_assistant(tool)
        delimiters = []
        if self.user_start:
            delimiters.append(Delimiter("user", self.user_start))
        delimiters += [Delimiter("assistant", d) for d in assistant]
        if system_mode == "own_turn" and system_start:
            delimiters.append(Delimiter("system", system_start))
        for key in ("start", "next"):
            if tool.get(key):
                delimiters.append(Delimiter("tool", tool[key]))
        delimiters = sort_delimiters(delimiters)

        # 8. The verdict.
        if rt_text is None:
            round_trip = RoundTrip(False, (), (), (f"the round-trip conversation does not render: {_template_message(rt_error)}",),
                                   messages=tuple(rt_probe.messages), render_kwargs=dict(rt_probe.kwargs))
        else:
            modes = self._modes(rt_probe, system_mode, tool)
            round_trip = _verdict(rt_text, rt_probe, delimiters, modes)
            base = round_trip.problems
            for switch, text in variants:
                other = _verdict(text, rt_probe, delimiters, modes)
                if not other.passed:  # reported once more only where it differs from the plain render
                    round_trip = replace(round_trip, passed=False, problems=round_trip.problems + tuple(
                        f"with {switch}: {p}" for p in other.problems if p not in base))
        return self._done(
            "pass" if round_trip.passed else "fail",
            user_start=self.user_start or None,
            assistant_start=self.assistant_start or None,
            system_start=system_start if system_mode == "own_turn" and system_start else None,
            tool_response_start=tool.get("start") or None,
            tool_response_next=tool.get("next") or None,
            generation_prompt=generation_prompt,
            tool_placement=tool.get("placement", "unknown"),
            delimiters=delimiters,
            round_trip=round_trip,
        )

    def _find_bos(self, pre_user0: str, between_turns: str) -> str:
        """The BOS token when given and printed first; else a markup unit the template prints first,
        never between turns, and right before another unit (a template may set its own BOS)."""
        bos = self.t.bos_token
        if bos and pre_user0.startswith(bos):
            return bos
        m = _UNIT.match(pre_user0)
        if m and m.group(0) not in between_turns and _UNIT.match(pre_user0, m.end()):
            return m.group(0)  # followed right away by the first turn's own markup
        return ""

    def _find_opener(self, pre_user0: str, between_turns: str) -> str | None:
        """The markup unit that opens every turn: one of the first units of the conversation (after
        the BOS) that also appears between later turns."""
        text = pre_user0[len(self.bos_like):]
        pos = 0
        for _ in range(3):
            while pos < len(text) and text[pos].isspace():
                pos += 1
            m = _UNIT.match(text, pos)
            if not m:
                return None
            if m.group(0) in between_turns:
                return m.group(0)
            pos = m.end()
        return None

    def _chat_delimiters(self) -> None:
        user = self.role_start("assistant", "user", "the user start")
        if user and not self.pre_user0.endswith(user):
            # A closer the template renders only before a following turn (Hy3's eos) is not part of
            # the user start: keep the part that also starts the first user turn.
            j = _unit_suffix(user, len(user) - _lcs(user, self.pre_user0))
            if user[j:].strip():
                user = user[j:].lstrip()
        assistant = self.role_start("user", "assistant", "the assistant start")
        self.caps["assistant_start"] = "own"
        if not _distinctive(assistant):
            # No opener of its own: the user turn's closer always precedes the answer.
            seg = (self.segs.get(("user", "assistant")) or [""])[0]
            assistant = _from_first_unit(self.clean(seg))
            if assistant:
                self.caps["assistant_start"] = "user_closer"
        if not _distinctive(user):
            user = ""
        self.user_start, self.assistant_start = user, assistant
        self.errors = [e for e in self.errors if not e.startswith(("user turns have", "assistant turns have"))]
        if not user:
            self.errors.append("user turns have no start delimiter: nothing but the previous turn's end comes before a user message")
        if not assistant:
            self.errors.append("assistant turns have no start delimiter: nothing separates an answer from the user message before it")

    # -- system ------------------------------------------------------------------------------------

    def _system_candidate(self, pre_system: str, pre_user0: str) -> str:
        """The system delimiter in the text before the system content, cut at its first line of prose.

        It starts at the last turn opener when there is one (a markup unit that opens every turn, or
        the start that user and assistant delimiters share); else where that text first differs
        from the text before a first user message; else at the markup (units and role words) that
        ends it; else (the system content goes into a default system turn) at the first markup unit
        after the BOS."""
        bos = self.bos_like if pre_system.startswith(self.bos_like) else ""
        shared = ""
        if self.user_start and self.assistant_start:
            shared = self.user_start[: _unit_prefix(self.user_start, _lcp(self.user_start, self.assistant_start))]
        opener = next((o for o in (self.opener, shared) if o and len(o.strip()) >= 2 and o in pre_system[len(bos):]), None)
        if opener:
            start = pre_system.rfind(opener)
        else:
            start = _lcp(pre_system, pre_user0)
            if start < len(pre_system):
                while start > len(bos) and pre_system[start - 1] not in _BOUNDARY:
                    start -= 1
            if not pre_system[start:].strip():
                end = start = len(pre_system.rstrip())
                while start > len(bos):
                    m = _MARKUP_END.search(pre_system, len(bos), start)
                    if not m or m.start() == start:
                        break
                    start = m.start()
                if start == end:
                    m = _UNIT.match(pre_system, len(bos))
                    start = m.start() if m else start
        candidate = self.clean(pre_system[max(start, len(bos)):])
        m = re.search(r"\n\s*", candidate)
        if m and m.end() < len(candidate) and candidate[m.end()] not in "<[":
            # Prose follows the first line: a default system prompt. Text after the turn's markup on
            # that line, other than a role word, is its heading (Solar's `## Provider System Prompt`).
            units = list(_UNIT.finditer(candidate, 0, m.start()))
            cut = units[-1].end() if units else 0
            if cut and not re.fullmatch(r"\s*(?:[A-Za-z_]+:?)?\s*", candidate[cut:m.start()]):
                candidate = candidate[:cut]
            else:
                candidate = candidate[: m.end()]
        return candidate

    def _system(self, pre_user0: str) -> tuple[str, str]:
        text, probe, builder, err = self.attempt(self.builder, "S1 U1")
        if text is None:
            self.warnings.append(f"system messages are rejected by the template: {_template_message(err)}")
            return "", "rejected"
        self.builder = builder
        seen = self.seen(text, probe)
        if not seen.found(0):
            return "", "dropped"
        chat_delims = [Delimiter("user", self.user_start or ""), Delimiter("assistant", self.assistant_start or "")]
        at = seen.bounds[0][0]
        inside = next((s for s in split_text(text, chat_delims) if s.start <= at < s.end), None)
        if inside is not None:
            return "", "inside_user" if inside.role == "user" else "inside_assistant"
        candidate = self._system_candidate(seen.head(0), pre_user0)
        if candidate:
            # Text that depends on today's date is no fixed marker.
            try:
                other = _Seen(self._render(probe, clock=_other_clock), probe)
                if other.found(0):
                    candidate = candidate[: _lcp(candidate, self._system_candidate(other.head(0), pre_user0))]
            except RenderError:
                pass
        candidate = candidate if candidate.strip() else ""
        return candidate, ("own_turn" if candidate else "preamble")

    # -- tools -------------------------------------------------------------------------------------

    def _tools(self) -> dict:
        tool: dict = {}
        first_error = None
        for delta in TOOL_SHAPES:
            builder = self.builder.with_shape(replace(self.builder.shape, **delta))
            text, probe, builder, err = self.attempt(builder, "U1 C1(G1) T1")
            if text is not None:
                break
            first_error = first_error or err
        else:
            self.warnings.append(f"tool calls are rejected by the template: {_template_message(first_error)}")
            self.caps.update(tools=self._declares_tools(self.builder), tool_calls="rejected")
            tool["placement"] = "rejected"
            return tool
        if not builder.shape.tool_calls:
            self.warnings.append(f"tool calls are rejected by the template ({_template_message(first_error)}); "
                                 "tool responses were probed after plain assistant messages")
        f = _Seen(text, probe)
        if f.pos[1][0] >= 0 and f.pos[2][0] >= 0 and f.pos[1][0] > f.pos[2][0]:
            # The template moves the text of a tool-calling message after the responses (into the
            # answer); probe such messages with calls only.
            builder = builder.with_shape(replace(builder.shape, call_content=False))
            text, probe, builder, err = self.attempt(builder, "U1 C1(G1) T1")
            if text is None:  # pragma: no cover - the same conversation rendered a moment ago
                builder = builder.with_shape(replace(builder.shape, call_content=True))
                text, probe, builder, err = self.attempt(builder, "U1 C1(G1) T1")
        self.tool_builder = builder
        self.caps["tools"] = self._declares_tools(builder)
        self.caps["adaptations"] = builder.shape.describe()
        f = self.seen(text, probe)
        self.note_tail(f, 2)
        if not f.found(2):
            tool["placement"] = "dropped"
            self.caps["tool_calls"] = "parallel" if builder.shape.parallel_calls else "single"
            return tool
        text0, probe0, _, _ = self.attempt(builder, "U1 C1(G1)")
        if text0 is not None:
            self.note_tail(self.seen(text0, probe0, collect=False), 1)
        if "call" not in self.tails:
            seg = f.between(1, 2) or ""
            self.tails["call"] = seg[: _lcp(seg, self.tails["assistant"])]

        # Consecutive tool responses: parallel calls, else two responses to one call.
        tool["calls"] = "C1(G1) T1"
        self.caps["tool_calls"] = "single"
        # Three responses, so that text numbering them (a call index) shows as varying.
        for spec, kind in (("U1 C1(G1,G2,G4) T1 T2 T4", "parallel"), ("U1 C1(G1) T1 T2 T4", "single")):
            text, probe, _, err = self.attempt(builder, spec)
            if text is None:
                if kind == "parallel":
                    self.warnings.append(f"parallel tool calls are rejected by the template: {_template_message(err)}")
                continue
            g = self.seen(text, probe)
            if g.found(2) and g.found(3) and g.found(4):
                self.caps["tool_calls"] = kind
                tool["calls"] = " ".join(spec.split()[1:])
                self.tails["tool"] = g.tail(4)
                break
        if not builder.shape.tool_calls:
            self.caps["tool_calls"] = "rejected"
        self._tool_delimiters(tool)
        return tool

    def _declares_tools(self, builder: ProbeBuilder) -> bool:
        if not builder.shape.tools_list:
            return False
        text, _, _, _ = self.attempt(builder, "U1", tools=True)
        return text is not None and TOOL_NAME in text

    def _tool_delimiters(self, tool: dict) -> None:
        start = self.role_start("call", "tool", "the tool response start")
        after_call, after_tool = self.segs.get(("call", "tool")), self.segs.get(("tool", "tool"))
        if after_call and after_tool:
            # What a response starts with after a call and after another response alike; used when
            # the text after the call gave nothing that starts with markup (the call's ending varies).
            # The response's closer is cut off first: calls and responses often end alike (Apriel's
            # `\n<|end|>\n`), and what both end with is no part of the next response's start.
            a, b = after_call[0], after_tool[0]
            b = b[self.closer_end(b, "tool"):]
            common = self.clean(a[_unit_suffix(a, len(a) - _lcs(a, b)):])
            if _distinctive(common) and (not _distinctive(start) or (
                    not _UNIT.match(start) and _UNIT.match(common) and not (start.endswith(common) or common.endswith(start)))):
                start = common
        self.caps["tool_response_start"] = "own"
        if not _distinctive(start) and after_call:
            # No opener of its own: the call's closer always precedes the responses.
            start = _from_first_unit(self.clean(after_call[0]))
            if start:
                self.caps["tool_response_start"] = "call_closer"
        tool["start"] = start
        self.errors = [e for e in self.errors if not e.startswith(("tool responses", "consecutive tool"))]
        if not start:
            self.errors.append("tool responses have no start delimiter: nothing separates a tool response from the tool call before it")
        # Where the response goes.
        seg = (self.segs.get(("call", "tool")) or [""])[0]
        closer = self.tails.get("assistant", "").strip()
        if start and self.user_start and start.startswith(self.user_start):
            placement = "inside_user"
            if start == self.user_start:
                self.errors.append("tool responses render exactly like user messages: no delimiter tells them apart")
        elif start and self.assistant_start and start.startswith(self.assistant_start):
            placement = "inside_assistant"
        elif start and self.opener and self.opener in start:
            placement = "own_role"  # a turn of its own, opened like every other turn
        elif closer and closer not in seg:
            placement = "inside_assistant"  # the assistant's turn is still open when the response comes
        else:
            placement = "own_role"
        tool["placement"] = placement
        # Each further response of a group.
        tool["next"] = ""
        pairs = self.segs.get(("tool", "tool"))
        if pairs:
            nxt = self.role_start("tool", "tool", "the next tool response start")
            if nxt.endswith(start) and _UNIT.match(nxt) and not _UNIT.match(start):
                # The call's ending took the responses' opener (a template that prints it after a
                # final call as a hint): the first response opens like the others.
                start = tool["start"] = nxt
            if start and (nxt == start or nxt.endswith(start)):
                self.caps["tool_responses_grouped"] = False
            else:
                self.caps["tool_responses_grouped"] = True
                # Responses grouped with nothing that marks each (a list `[a, b]`) share one span.
                tool["next"] = nxt if _distinctive(nxt) else ""
            self.caps["tool_responses_separated"] = bool(tool["next"]) or not self.caps["tool_responses_grouped"]
        # An answer after tool responses: a turn of its own, or the tool turn continued.
        after = self.segs.get(("tool", "assistant"))
        if after:
            rest = self.role_start("tool", "assistant", "the assistant start after tool responses")
            rest = rest if _distinctive(rest) else ""
            self.caps["assistant_after_tool"] = "own_turn" if rest else "continues"
            tool["after"] = rest

    def _merge_assistant(self, tool: dict) -> list[str]:
        """Assistant delimiters: one shared prefix of all variants (plain answer, tool call, answer
        after tool responses) when it tells assistant turns apart from every other role's delimiter,
        else each variant the plain one does not already cover."""
        main = self.assistant_start
        variants = [main]
        if tool.get("placement") not in (None, "rejected"):
            if self.caps.get("assistant_start") == "user_closer":
                # The answer's start is the user's closer: keep it in front of the call too.
                call = self.agree([self.clean(seg) for seg in self.segs.get(("user", "call"), ())], "the tool-call assistant start")
            else:
                call = self.role_start("user", "call", "the tool-call assistant start")
            variants.append(call)
            after = tool.get("after")
            if after and not (main and main in after):
                variants.append(after)
        variants = [v for v in dict.fromkeys(variants) if v]
        if len(variants) <= 1:
            return variants
        others = [o for o in (self.user_start, tool.get("start"), tool.get("next")) if o]
        common = variants[0][: _unit_prefix(variants[0], min(_lcp(variants[0], v) for v in variants[1:]))]
        if common.strip() and not any(o.startswith(common) or common.startswith(o) for o in others):
            if common != main:
                self.assistant_start = common
            return [common]
        return [variants[0]] + [v for v in variants[1:] if not v.startswith(variants[0])]

    # -- thinking ----------------------------------------------------------------------------------

    def _thinking_flags(self) -> list[str]:
        flags = []
        if self.gp_text is None:
            return flags
        probe = self.chat_builder.build("U1", add_generation_prompt=True)
        for name, values in THINKING_FLAGS:
            if name not in self.t.text:
                continue
            for value in values:
                try:
                    if self._render(replace(probe, kwargs={**probe.kwargs, name: value})) != self.gp_text:
                        flags.append(name)
                        break
                except RenderError:
                    continue
        return flags

    def _switched_renders(self, probe: Probe, text: str) -> list[tuple[str, str]]:
        """The round-trip conversation rendered with each value of each thinking switch, where that
        changes the render."""
        out, seen = [], {text}
        for name, values in THINKING_FLAGS:
            if name not in self.caps.get("thinking_flags", ()):
                continue
            for value in values:
                try:
                    other = self._render(replace(probe, kwargs={**probe.kwargs, name: value}))
                except RenderError:
                    continue
                if other not in seen:
                    seen.add(other)
                    out.append((f"{name}={value!r}", other))
        return out

    # -- the round trip ----------------------------------------------------------------------------

    def _round_trip_render(self, system_mode: str, tool: dict):
        head = [] if system_mode == "rejected" else ["S1"]
        if tool.get("placement") in (None, "rejected", "unknown"):
            specs = [head + "U1 A1/R1 U2 A2 U3 A3 U4".split(), head + "U1 A1 U2 A2 U3 A3 U4".split()]
            builder = self.builder
        else:
            calls = tool.get("calls", "C1(G1) T1").split()
            # The first conversation ends like an agent session in progress: a tool call after the
            # last user message, whose reasoning many templates keep (they drop it from earlier turns).
            specs = [
                head + ["U1", "A1/R1", "U2", *calls, "A3", "U3", "C2(G3)", "T3", "A4", "U4", "C3/R5(G5)", "T5"],
                head + ["U1", "A1/R1", "U2", *calls, "A3", "U3", "C2(G3)", "T3", "A4", "U4"],
                head + ["U1", "A1", "U2", *calls, "A3", "U3", "C2(G3)", "T3", "A4", "U4"],
                head + ["U1", "A1", "U2", *calls, "A3", "U3"],
            ]
            builder = self.tool_builder.with_shape(replace(self.tool_builder.shape, extra=self.builder.shape.extra))
        # The first that renders every message the analysis expects to see (Mistral Nemo folds the
        # system prompt into the last message only when that is a user message), else the first
        # that renders at all.
        first = rendered = None
        for spec in specs:
            text, probe, builder, err = self.attempt(builder, " ".join(spec), add_generation_prompt=True)
            if text is None:
                first = first or (probe, err)
                continue
            seen = _Seen(text, probe)
            if all(seen.found(i) or mode == "dropped" for i, mode in enumerate(self._modes(probe, system_mode, tool))):
                return probe, text, None
            rendered = rendered or (probe, text)
        if rendered:
            return rendered[0], rendered[1], None
        return first[0], None, first[1]

    def _modes(self, probe: Probe, system_mode: str, tool: dict) -> list[str]:
        modes = []
        for i, role in enumerate(probe.roles):
            if role == "system":
                modes.append({"inside_user": "in_user", "preamble": "before", "dropped": "dropped"}.get(system_mode, "own"))
            elif role == "tool":
                if tool.get("placement") == "dropped":
                    modes.append("dropped")
                elif i > 0 and probe.roles[i - 1] == "tool" and self.caps.get("tool_responses_separated") is False:
                    modes.append("continues")
                else:
                    modes.append("own")
            elif (role == "assistant" and i > 0 and probe.roles[i - 1] == "tool" and not probe.tool_call_flags[i]
                  and self.caps.get("assistant_after_tool") == "continues"):
                modes.append("continues")
            else:
                modes.append("own")
        return modes

    def _done(self, status: str, **fields) -> Analysis:
        return Analysis(
            name=self.t.name,
            source=self.t.source,
            status=status,
            capabilities=dict(self.caps),
            errors=tuple(fields.pop("errors", ())) + tuple(self.errors),
            warnings=tuple(self.warnings),
            **fields,
        )


def _verdict(text: str, probe: Probe, delimiters, modes: list[str]) -> RoundTrip:
    """Split the round-trip render and check every message against the spans.

    Each message the template renders as a turn of its own must own the spans its content lies in
    (one, or several of its role when the template renders it as several turns, like one turn per
    tool call), in message order. A system prompt folded into a user turn must lie in a user span, one
    rendered before any delimiter must lie before the first span, and an answer that the template
    continues inside the tool turn before it must lie in that span. Spans before the first message's
    span and after the last one hold only template text (a default system prompt, the generation
    prompt) and are expected as they are. A span in between that holds no content is a turn opener
    rendered without content (an assistant start before its tool calls) when a neighbouring span of
    the same role belongs to a message; otherwise it is a delimiter matching where no turn starts.
    """
    spans = split_text(text, delimiters)
    starts = [s.start for s in spans]
    seen = _Seen(text, probe)
    problems: list[str] = []
    owner: dict[int, int] = {}  # span index -> message index
    spans_of: dict[int, list[int]] = {}  # message index -> its span indexes
    last_span: dict[int, int] = {}  # message index -> the span its content ends in

    def describe(i: int) -> str:
        return f"message {i} ({probe.roles[i]})"

    for i, role in enumerate(probe.roles):
        mode = modes[i]
        if not seen.found(i):
            if mode != "dropped":
                problems.append(f"{describe(i)}: its content is not in the render")
            continue
        if mode == "dropped":
            problems.append(f"{describe(i)}: rendered, though the analysis found that the template drops it")
            continue
        for pos in (p for p in seen.pos[i] if p >= 0):
            k = bisect.bisect_right(starts, pos) - 1
            last_span[i] = max(last_span.get(i, k), k)
            if mode == "before":
                if k >= 0:
                    problems.append(f"{describe(i)}: its content lies in a {spans[k].role} span, expected before the first delimiter")
            elif k < 0:
                problems.append(f"{describe(i)}: its content lies before the first delimiter")
            elif mode == "in_user":
                if spans[k].role != "user":
                    problems.append(f"{describe(i)}: folded into a user turn, but its content lies in a {spans[k].role} span")
            elif mode == "continues":
                if k != last_span.get(i - 1):
                    problems.append(f"{describe(i)}: continues the turn before it, but its content lies in another span")
            elif spans[k].role != role:
                what = "in a user span: a tool response classified as a user message" if (role, spans[k].role) == ("tool", "user") else f"in a {spans[k].role} span"
                problems.append(f"{describe(i)}: its content lies {what}")
            elif owner.setdefault(k, i) != i:
                problems.append(f"{describe(i)}: shares one span with {describe(owner[k])}")
            elif k not in spans_of.setdefault(i, []):
                spans_of[i].append(k)
    actual = tuple(s.role for s in spans)
    if not owner:
        return RoundTrip(False, (), actual, tuple(dict.fromkeys(problems)) or ("no message lies in any span",),
                         messages=tuple(probe.messages), render_kwargs=dict(probe.kwargs), rendered=text)
    first, last = min(owner), max(owner)
    for k in range(first + 1, last):
        if k in owner:
            continue
        role = spans[k].role
        nxt = next((n for n in range(k + 1, last + 1) if n in owner), None)
        prv = max((n for n in owner if n < k), default=None)
        for near in (nxt, prv):
            if near is not None and spans[near].role == role:
                owner[k] = owner[near]
                spans_of[owner[near]].append(k)
                break
        else:
            problems.append(f"a {role} delimiter matches at character {spans[k].start}, where no message starts")
    expected = [s.role for s in spans[:first]]
    order = []
    for i in range(len(probe.roles)):
        ks = sorted(spans_of.get(i, []))
        if not ks:
            continue
        if ks != list(range(ks[0], ks[-1] + 1)):
            problems.append(f"{describe(i)}: its content is split over spans of other messages")
        order.append(ks[0])
        expected.extend(probe.roles[i] for _ in ks)
    if order != sorted(order):
        problems.append("messages are not in their order in the spans")
    for k in range(first + 1, last):
        if k not in owner:
            expected.insert(min(k, len(expected)), spans[k].role)  # reported above; keeps the lists aligned
    expected.extend(s.role for s in spans[last + 1:])
    if tuple(expected) != actual and not problems:
        problems.append(f"span roles {list(actual)} differ from the expected {expected}")
    passed = not problems and tuple(expected) == actual
    return RoundTrip(passed, tuple(expected), actual, tuple(dict.fromkeys(problems)),
                     messages=tuple(probe.messages), render_kwargs=dict(probe.kwargs), rendered=text)


def analyze(template, *, limits: Limits | None = None) -> Analysis:
    """Derive every role's start delimiter of `template` from probe renders, and prove them.

    >>> from tmplkit.sources import ChatTemplate
    >>> chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
    ...           "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
    >>> a = analyze(ChatTemplate(text=chatml, name="chatml", source="-"))
    >>> a.status, a.user_start, a.generation_prompt
    ('pass', '<|im_start|>user\\n', '<|im_start|>assistant\\n')
    """
    t0 = time.perf_counter()
    try:
        result = _Analyzer(template, limits).run()
    except RenderLimitError as exc:
        # An output bomb stopped by the size limit is a resource exhaustion, as in the workers.
        status = "memory" if exc.kind == "size" else (exc.kind if exc.kind in STATUSES else "error")
        result = Analysis(name=template.name, source=template.source, status=status, errors=(str(exc),))
    except InputError as exc:  # pragma: no cover - probes are well-formed
        result = Analysis(name=template.name, source=template.source, status="error", errors=(str(exc),))
    return replace(result, seconds=time.perf_counter() - t0)
