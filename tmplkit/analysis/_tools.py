"""Tool findings: whether tools, calls and responses render, and the tool-response delimiters."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._chat import ChatDelimiters, ChatFindings
from ._probing import Prober, Seen
from ._text import UNIT, Note, back_to_boundary, distinctive, from_first_unit, lcp, lcs, template_message, unit_suffix
from .probes import ARGUMENT, TOOL_NAME, TOOL_SHAPES, ProbeBuilder

__all__ = ["ToolFindings", "ToolProbe", "probe_tools", "tool_delimiters"]


@dataclass(frozen=True)
class ToolProbe:
    """What the tool probes showed, before any delimiter is cut."""

    placement: str | None  # 'rejected' (calls refused), 'dropped' (responses not rendered), else None
    builder: ProbeBuilder | None  # the shape a tool round renders in
    declares_tools: bool
    tool_calls: str  # 'parallel', 'single' or 'rejected'
    calls: str = "C1(G1) T1"  # the calls and responses of the round-trip conversation
    adaptations: tuple[str, ...] | None = None
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class ToolFindings:
    placement: str = "unknown"
    start: str = ""
    next: str = ""
    after: str = ""  # the assistant start after tool responses, where it differs
    # Where that start is the last response's closer, and the closer also ends each response
    # followed by another: the closer and the next response's start, a tool delimiter that
    # (longest first) wins there over the assistant start.
    closer_next: str = ""
    start_mode: str | None = None  # 'own', or 'call_closer' where the call's closer starts the responses
    grouped: bool | None = None
    separated: bool | None = None
    # 'own_turn'; 'after_closer' (the answer opens at the last response's closer); 'continues' (no
    # markup at all between the last response and the answer)
    assistant_after_tool: str | None = None
    same_as_user: bool = False
    missing_start: bool = False  # nothing but the call's end came before the first response
    notes: tuple[Note, ...] = ()
    # The start of a tool-call turn right after tool responses, where it is not the answer's (`after`):
    # Mistral's answer opens `[/TOOL_RESULTS] `, its next call `[/TOOL_RESULTS][TOOL_CALLS]`; an
    # agent's next step after results is as often a call as an answer.
    call_after: str = ""

    @property
    def errors(self) -> tuple[str, ...]:
        if self.missing_start:
            return ("tool responses have no start delimiter: nothing separates a tool response from the tool call before it",)
        if self.same_as_user:
            return ("tool responses render exactly like user messages: no delimiter tells them apart",)
        return ()


def _first_tool_round(prober: Prober, builder: ProbeBuilder):
    """A call and its response, in the first tool shape the template accepts."""
    first_error = None
    for delta in TOOL_SHAPES:
        attempt = prober.attempt(builder.with_shape(replace(builder.shape, **delta)), "U1 C1(G1) T1")
        if attempt.text is not None:
            return attempt, first_error
        first_error = first_error or attempt.error
    return None, first_error


def probe_tools(prober: Prober, builder: ProbeBuilder) -> ToolProbe:
    attempt, first_error = _first_tool_round(prober, builder)
    if attempt is None:
        message = f"tool calls are rejected by the template: {template_message(first_error)}"
        return ToolProbe("rejected", None, _declares_tools(prober, builder), "rejected", notes=(Note(message, message),))
    text, probe, builder, _ = attempt
    notes = []
    if not builder.shape.tool_calls:
        message = (f"tool calls are rejected by the template ({template_message(first_error)}); "
                   "tool responses were probed after plain assistant messages")
        notes.append(Note(message, message))
    f = Seen(text, probe)
    if f.pos[1][0] >= 0 and f.pos[2][0] >= 0 and f.pos[1][0] > f.pos[2][0]:
        # The template moves the text of a tool-calling message after the responses (into the
        # answer); probe such messages with calls only.
        builder = builder.with_shape(replace(builder.shape, call_content=False))
        text, probe, builder, _ = prober.attempt(builder, "U1 C1(G1) T1")
        if text is None:  # pragma: no cover - the same conversation rendered a moment ago
            builder = builder.with_shape(replace(builder.shape, call_content=True))
            text, probe, builder, _ = prober.attempt(builder, "U1 C1(G1) T1")
    declares, adaptations = _declares_tools(prober, builder), tuple(builder.shape.describe())
    f = prober.seen(text, probe)
    prober.note_tail(f, 2)
    if not f.found(2):
        return ToolProbe("dropped", builder, declares, "parallel" if builder.shape.parallel_calls else "single",
                         adaptations=adaptations, notes=tuple(notes))
    text0, probe0, _, _ = prober.attempt(builder, "U1 C1(G1)")
    if text0 is not None:
        prober.note_tail(prober.seen(text0, probe0, collect=False), 1)
    if "call" not in prober.tails:
        # The template refuses a conversation that ends with the call: its closer is what comes
        # before the response up to the assistant's closer (the call's JSON and markup first).
        seg, closer = f.between(1, 2) or "", prober.tails["assistant"]
        at = seg.find(closer) if closer.strip() else -1
        prober.tails["call"] = seg[: at + len(closer)] if at >= 0 else seg[: lcp(seg, closer)]
    calls, tool_calls = _consecutive_responses(prober, builder, notes)
    if not builder.shape.tool_calls:
        tool_calls = "rejected"
    return ToolProbe(None, builder, declares, tool_calls, calls, adaptations, tuple(notes))


def _consecutive_responses(prober: Prober, builder: ProbeBuilder, notes: list) -> tuple[str, str]:
    """Consecutive tool responses: parallel calls, else two responses to one call. Three responses,
    so that text numbering them (a call index) shows as varying."""
    for spec, kind in (("U1 C1(G1,G2,G4) T1 T2 T4", "parallel"), ("U1 C1(G1) T1 T2 T4", "single")):
        text, probe, _, err = prober.attempt(builder, spec)
        if text is None:
            if kind == "parallel":
                message = f"parallel tool calls are rejected by the template: {template_message(err)}"
                notes.append(Note(message, message))
            continue
        g = prober.seen(text, probe)
        if g.found(2) and g.found(3) and g.found(4):
            tail = g.tail(4)
            assert tail is not None, "found(4) above"
            prober.tails["tool"] = tail
            return " ".join(spec.split()[1:]), kind
    return "C1(G1) T1", "single"


def _declares_tools(prober: Prober, builder: ProbeBuilder) -> bool:
    if not builder.shape.tools_list:
        return False
    text, _, _, _ = prober.attempt(builder, "U1", tools=True)
    return text is not None and TOOL_NAME in text


def _response_start(prober: Prober, chat: ChatFindings) -> tuple[str, str, Note | None]:
    """The first tool response's start, and whether it is its own ('own') or the call's closer.

    Where the text after a call varies before the call's closer (Apriel 1.5 prints the call's id
    only when a response follows), a response's start is what that text shares with the text after
    another response, once the response's own closer is cut off: calls and responses may end alike
    (`\\n<|end|>\\n`), and that ending is the previous turn's, not the next one's. Where the responses
    have no opener of their own, the call's closer that always precedes them is taken from its first
    markup unit: Apertus' tool results start at `<|tools_suffix|>[` ('call_closer')."""
    start, note = prober.role_start("call", "tool", "the tool response start", chat.opener)
    after_call, after_tool = prober.segs.get(("call", "tool")), prober.segs.get(("tool", "tool"))
    if after_call and after_tool:
        a, b = after_call[0], after_tool[0]
        b = b[prober.closer_end(b, "tool", chat.opener):]
        common = prober.clean(a[unit_suffix(a, len(a) - lcs(a, b)):])
        if distinctive(common) and (not distinctive(start) or (
                not UNIT.match(start) and UNIT.match(common) and not (start.endswith(common) or common.endswith(start)))):
            start = common
    if not distinctive(start) and after_call:
        start = from_first_unit(prober.clean(after_call[0]))
        if start:
            return start, "call_closer", note
    return start, "own", note


def _placement(prober: Prober, chat: ChatFindings, delims: ChatDelimiters, start: str) -> str:
    """Where the responses go: inside a user turn, inside the assistant turn, or a turn of their own."""
    seg = (prober.segs.get(("call", "tool")) or [""])[0]
    closer = prober.tails.get("assistant", "").strip()
    user, assistant = delims.user_start or "", delims.assistant_start or ""
    # (a user start that also opens the assistant's turns places nothing where the tool start goes
    # on past it: a template whose user headers vary has user start `<|im_start|>`, and its tool
    # turns of their own, `<|im_start|>tool\n`, begin with it too)
    if start and user and start.startswith(user) and (start == user or not assistant.startswith(user)):
        return "inside_user"
    if start and assistant and start.startswith(assistant) and (start == assistant or not user.startswith(assistant)):
        return "inside_assistant"
    if start and chat.opener and chat.opener in start:
        return "own_role"  # a turn of its own, opened like every other turn
    if closer and closer not in seg:
        return "inside_assistant"  # the assistant's turn is still open when the response comes
    return "own_role"


def tool_delimiters(prober: Prober, chat: ChatFindings, delims: ChatDelimiters, probe: ToolProbe) -> ToolFindings:
    """Tool-response delimiters from every context collected so far.

    Responses grouped in one JSON list are told apart by what opens each further item, up to its
    first varying value (Command R7B's `,\\n    {\\n        "tool_call_id": "`): the `,` is printed only
    when an item follows, so it starts the next item, and a JSON-encoded content holds no raw
    newline, so the delimiter cannot match inside one. Responses grouped with nothing between them
    share one span, and an answer that follows tool responses without an opener continues their span
    (assistant_after_tool 'continues')."""
    start, start_mode, note = _response_start(prober, chat)
    notes = [note] if note else []
    placement = _placement(prober, chat, delims, start)
    same_as_user = placement == "inside_user" and start == delims.user_start
    missing_start = not start
    nxt, grouped, separated = "", None, None
    if prober.segs.get(("tool", "tool")):
        candidate, note = prober.role_start("tool", "tool", "the next tool response start", chat.opener)
        notes += [note] if note else []
        if candidate.endswith(start) and UNIT.match(candidate) and not UNIT.match(start):
            # The call's ending took the responses' opener (a template that prints it after a
            # final call as a hint): the first response opens like the others.
            start = candidate
        grouped = not (start and (candidate == start or candidate.endswith(start)))
        if grouped:
            nxt = candidate if distinctive(candidate) else ""
        separated = bool(nxt) or not grouped
    after, after_tool, closer_next = "", None, ""
    if prober.segs.get(("tool", "assistant")):
        rest, note = prober.role_start("tool", "assistant", "the assistant start after tool responses", chat.opener)
        notes += [note] if note else []
        after = rest if distinctive(rest) else ""
        after_tool = "own_turn" if after else "continues"
        if not after:
            # The last response's ending swallowed what opens the answer: the render shows whether
            # that is the assistant's own start (a template that opens the answer's turn after every
            # result) or the results' closer.
            after, closer_next, note = _answer_after_closer(prober, start)
            own = bool(after) and bool(delims.assistant_start) and after.startswith(delims.assistant_start)
            after_tool = "own_turn" if own else "after_closer" if after else "continues"
            notes += [note] if note else []
    call_after = ""
    if prober.segs.get(("tool", "call")):
        candidate, note = prober.role_start("tool", "call", "the tool-call start after tool responses", chat.opener)
        notes += [note] if note else []
        at = candidate.find(f'"{ARGUMENT}"')  # (the probe's argument: a real call names its own)
        candidate = candidate[: back_to_boundary(candidate, at)] if at >= 0 else candidate
        if distinctive(candidate) and candidate != after and not (after and candidate.startswith(after)):
            call_after = candidate
    return ToolFindings(placement, start, nxt, after, closer_next, start_mode, grouped, separated, after_tool, same_as_user,
                        missing_start, tuple(notes), call_after)


def _answer_after_closer(prober: Prober, start: str) -> tuple[str, str, Note | None]:
    """The start of an answer that has no opener of its own after tool responses: the last markup
    unit before it, which closes the responses (Mistral's `[/TOOL_RESULTS]`, DeepSeek R1's
    `<｜tool▁outputs▁end｜>`, Gemma 4's `<tool_response|>`), as Mistral's answers start at the
    user's `[/INST]`. Where that unit also ends a response followed by another, the closer and the
    next response's start make a tool delimiter that wins there. Text that varies (Mistral Nemo's
    `"call_id": "..."`) lies before the closer, so the closer is looked for after it. Where no markup at all lies between
    the last response and the answer (`...result]answer`), no delimiter can mark the answer: it
    continues the responses' span, and a Note says so. (start, closer and next start, note)."""
    segs = [prober.after_varying(seg) for seg in prober.segs.get(("tool", "assistant"), ())]
    units = [list(UNIT.finditer(seg)) for seg in segs]
    ends = {seg[u[-1].start():] for seg, u in zip(segs, units) if u}
    if len(ends) != 1 or len(ends) != len(set(segs)) and any(not u for u in units):
        shown = segs[0].strip() if segs else ""
        if not shown:  # nothing at all between them: the roles render alike, which the verdict proves
            return "", "", None
        text = (f"the answer after tool results has no start of its own (nothing but {shown!r} between them): "
                "it continues the span of the last result")
        return "", "", Note(text, text)
    after = ends.pop()
    closer_next = ""
    for seg in prober.segs.get(("tool", "tool"), ()):
        at = seg.find(after.rstrip())
        candidate = prober.clean(seg[at:]) if at >= 0 else ""
        if candidate and start and candidate.endswith(start):
            closer_next = candidate
    return after, closer_next, None
