"""Chat findings: user and assistant starts, the generation prompt, the BOS and the turn opener."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._probing import Prober, Seen
from ._result import status_of
from ._text import UNIT, Note, agree, back_to_boundary, distinctive, from_first_unit, lcp, lcs, template_message, unit_prefix, unit_suffix
from .probes import CHAT_SHAPES, ProbeBuilder

__all__ = ["ChatDelimiters", "ChatFindings", "Stop", "assistant_delimiters", "chat_delimiters", "closer_header", "context_candidates",
           "context_starts", "generation_prompt_of", "probe_chat"]


class Stop(Exception):
    """The analysis cannot go on: `status` and the reason to report."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class ChatFindings:
    """What plain user/assistant chat shows, before any delimiter is cut."""

    builder: ProbeBuilder  # the shape plain chat renders in
    pre_user0: str  # the text before the first user message of a one-message chat
    bos_like: str  # what the template prints once at the very start (the BOS token)
    opener: str | None  # the markup that opens every turn (<|im_start|>, <|start_header_id|>, ...)
    generation_prompt: str | None
    generation_render: str | None  # the one-message chat with the generation prompt
    one_render: str = ""  # the one-message chat without it


@dataclass(frozen=True)
class ChatDelimiters:
    user_start: str
    assistant_start: str
    assistant_mode: str  # 'own', or 'user_closer' where the user's closer starts the answer
    notes: tuple[Note, ...] = ()

    @property
    def errors(self) -> tuple[str, ...]:
        out = []
        if not self.user_start:
            out.append("user turns have no start delimiter: nothing but the previous turn's end comes before a user message")
        if not self.assistant_start:
            out.append("assistant turns have no start delimiter: nothing separates an answer from the user message before it")
        return tuple(out)


def _one_message(prober: Prober) -> tuple[ProbeBuilder, Seen]:
    """One user message, in the first shape the template accepts."""
    first_error = None
    # A template that sets its system prompt only from a first system message, and reads it
    # unconditionally (`{{ '<s>' + system_message }}`), renders no chat without one: such shapes
    # come last, with a system message before every probe.
    for shape in CHAT_SHAPES + tuple(replace(s, system_first=True) for s in CHAT_SHAPES):
        text, probe, builder, err = prober.attempt(ProbeBuilder(prober.needles, shape), "U1")
        if text is not None and Seen(text, probe).found(0):
            return builder, prober.seen(text, probe)
        first_error = first_error or err
    if first_error is None:
        raise Stop("unsupported", "the template does not render the content of a user message")
    raise Stop(status_of(first_error), f"cannot render a one-message chat: {template_message(first_error)}")


def probe_chat(prober: Prober) -> ChatFindings:
    """Render one user message, then a user/assistant/user chat, then the generation prompt.
    Raises Stop where plain chat does not render."""
    builder, one = _one_message(prober)
    prober.note_tail(one, 0)
    pre_user0 = one.head(0)
    text, probe, builder, err = prober.attempt(builder, "U1 A1 U2")
    if text is None:
        assert err is not None, "a failed attempt carries its error"
        raise Stop(status_of(err), f"cannot render a user/assistant/user chat: {template_message(err)}")
    chat = prober.seen(text, probe)
    if not all(chat.found(i) for i in range(3)):
        raise Stop("unsupported", "the template drops the content of user or assistant messages")
    user_to_assistant, assistant_to_user = chat.between(0, 1), chat.between(1, 2)
    if user_to_assistant is None or assistant_to_user is None:
        raise Stop("unsupported", "the template does not render messages in their order")
    text, probe, builder, err = prober.attempt(builder, "U1 A1")
    if text is not None:
        prober.note_tail(prober.seen(text, probe, collect=False), 1)
    if "assistant" not in prober.tails:
        # The template wants the conversation to end elsewhere: take as the assistant's closer
        # the part of the user's closer that the assistant-to-user text starts with.
        seg = assistant_to_user
        prober.tails["assistant"] = seg[: lcp(seg, prober.tails["user"])]
    gp_text, probe, builder, err = prober.attempt(builder, "U1", add_generation_prompt=True)
    between_turns = user_to_assistant + assistant_to_user
    bos_like = find_bos(prober.template.bos_token, pre_user0, between_turns)
    opener = find_opener(pre_user0[len(bos_like):], between_turns)
    return ChatFindings(builder, pre_user0, bos_like, opener,
                        generation_prompt_of(prober, gp_text, one.text, opener), gp_text, one.text)


def generation_prompt_of(prober: Prober, text: str | None, without: str, opener: str | None) -> str | None:
    """What the generation prompt adds to a one-message chat, cut like a delimiter: a closer the
    user turn gets only before a next turn, and the whitespace that ends it, belong to the user turn
    (Apriel 1.6's `\\n` before `<|begin_assistant|>`)."""
    if text is None:
        return None
    k = lcp(text, without)
    if k < len(without):  # the render without it ends differently (an EOS): cut at a boundary
        k = back_to_boundary(text, k)
    added = text[k:]
    return added[prober.closer_end(added, "user", opener):].lstrip()


def find_bos(bos: str | None, pre_user0: str, between_turns: str) -> str:
    """The BOS token when given and printed first; else a markup unit the template prints first,
    never between turns, and right before another unit (a template may set its own BOS).

    The BOS token is part of a delimiter only where the template repeats it at each turn (ByteDance
    Seed's `<seed:bos>user\\n`); a BOS printed once at the start belongs to no span."""
    if bos and pre_user0.startswith(bos):
        return bos
    m = UNIT.match(pre_user0)
    if m and m.group(0) not in between_turns and UNIT.match(pre_user0, m.end()):
        return m.group(0)  # followed right away by the first turn's own markup
    return ""


def find_opener(text: str, between_turns: str) -> str | None:
    """The markup unit that opens every turn: one of the first units of the conversation (`text`,
    after the BOS) that also appears between later turns."""
    pos = 0
    for _ in range(3):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        m = UNIT.match(text, pos)
        if not m:
            return None
        if m.group(0) in between_turns:
            return m.group(0)
        pos = m.end()
    return None


def chat_delimiters(prober: Prober, chat: ChatFindings) -> ChatDelimiters:
    """User and assistant starts from every context collected so far.

    A delimiter must be able to mark a turn: it holds a markup unit or a word. Where the assistant
    has none of its own, the user's closer that always precedes the answer is taken from its first
    markup unit: Mistral's answers start at `[/INST]` (assistant_mode 'user_closer')."""
    user, note_u = prober.role_start("assistant", "user", "the user start", chat.opener)
    if user and not chat.pre_user0.endswith(user):
        # A closer the template renders only before a following turn (Hy3's eos) is not part of
        # the user start: keep the part that also starts the first user turn.
        j = unit_suffix(user, len(user) - lcs(user, chat.pre_user0))
        if user[j:].strip():
            user = user[j:].lstrip()
    assistant, note_a = prober.role_start("user", "assistant", "the assistant start", chat.opener)
    if assistant and "" in prober.starts("user", "assistant", chat.opener):
        # Some answer follows the user's closer directly: what opens the others (Mistral 3's
        # `[THINK]`, a reasoning block) is content of those turns, no marker of the role.
        assistant, note_a = "", None
    mode = "own"
    if not distinctive(assistant):
        seg = (prober.segs.get(("user", "assistant")) or [""])[0]
        assistant = closer_header(prober.clean(seg))
        if assistant:
            mode = "user_closer"
    return ChatDelimiters(user if distinctive(user) else "", assistant, mode,
                          tuple(n for n in (note_u, note_a) if n))


def closer_header(closer: str) -> str:
    """The assistant's start inside the user's closer that always precedes an answer: from its
    first markup unit (Mistral's `[/INST]`), else its last line that holds a word (the header a
    template prints at the end of every user turn: `|Bot|: `, `Assistant: `, `### Response:\n`)."""
    start = from_first_unit(closer)
    if start:
        return start
    lines = closer.splitlines(keepends=True)
    for k in range(len(lines) - 1, -1, -1):
        if lines[k].strip():
            header = "".join(lines[k:]).lstrip()
            return header if distinctive(header) else ""
    return ""


def assistant_delimiters(prober: Prober, chat: ChatFindings, delims: ChatDelimiters, tool) -> tuple[str, list[str], tuple[Note, ...]]:
    """The assistant start and the assistant delimiters: one shared prefix of all variants (plain
    answer, tool call, answer after tool responses) when it tells assistant turns apart from every
    other role's delimiter, else each variant the plain one does not already cover."""
    main = delims.assistant_start
    variants, notes = [main], []
    if tool.placement not in (None, "rejected"):
        if delims.assistant_mode == "user_closer":
            # The answer's start is the user's closer: keep it in front of the call too.
            call, note = agree([prober.clean(seg) for seg in prober.segs.get(("user", "call"), ())], "the tool-call assistant start")
        else:
            call, note = prober.role_start("user", "call", "the tool-call assistant start", chat.opener)
        notes += [note] if note else []
        variants.append(call)
        if tool.after and not (main and main in tool.after) and tool.assistant_after_tool != "after_closer":
            variants.append(tool.after)
    # An answer that opens at the responses' closer has no opener to share with the others, nor does
    # a call right after responses where it opens otherwise (Mistral's `[TOOL_CALLS]`).
    closer = [tool.after] if tool.assistant_after_tool == "after_closer" and tool.after else []
    variants = [v for v in dict.fromkeys(variants) if v]
    if len(variants) <= 1:
        return main, _with_call_after(variants + closer, tool), tuple(notes)
    others = [o for o in (delims.user_start, tool.start, tool.next) if o]
    common = variants[0][: unit_prefix(variants[0], min(lcp(variants[0], v) for v in variants[1:]))]
    if common.strip() and not any(o.startswith(common) or common.startswith(o) for o in others):
        return common, _with_call_after([common] + closer, tool), tuple(notes)
    out = [variants[0]] + [v for v in variants[1:] if not v.startswith(variants[0])] + closer
    return main, _with_call_after(out, tool), tuple(notes)


def _with_call_after(delimiters: list[str], tool) -> list[str]:
    """`delimiters` and the start of a call right after tool responses, where none of them opens it
    (Mistral's `[TOOL_CALLS]`, where its answers open at `[/TOOL_RESULTS]`)."""
    call = getattr(tool, "call_after", "")
    return delimiters + [call] if call and not any(call.startswith(d) for d in delimiters if d) else delimiters


def context_starts(prober: Prober, renders: list[Seen], role: str, start: str, opener: str | None) -> list[list[str]]:
    """Starts of `role` messages in the contexts where `start` does not open them (a first user turn
    that follows the tool list with an opener of its own), as sets to try in turn: one start per
    context, the i-th set taking each context's i-th candidate (`context_candidates`)."""
    per_context: list[list[str]] = []
    for seen in renders:
        for i, r in enumerate(seen.probe.roles):
            if r != role or seen.probe.tool_call_flags[i] or not seen.found(i):
                continue
            prev = max((j for j in range(i) if seen.found(j)), default=None)
            if prev is None:
                continue
            seg = seen.between(prev, i)
            if seg is None or (start and seg.endswith(start)):
                continue
            options = [c for c in context_candidates(prober, seg, seen.kind(prev), opener) if c != start]
            if options and options not in per_context:
                per_context.append(options)
    depth = max(map(len, per_context), default=0)
    sets = [list(dict.fromkeys(opts[min(k, len(opts) - 1)] for opts in per_context)) for k in range(depth)]
    return [s for n, s in enumerate(sets) if s not in sets[:n]]


def context_candidates(prober: Prober, seg: str, prev: str, opener: str | None) -> list[str]:
    """The start candidates in `seg`, the text before a message in a context of its own.

    Where the segment holds text that varies (a tool list the template writes right before the first
    user turn), the turn's opener is the markup after it: the lines that follow the last varying
    line, shortest first (`Question:\n`, then `</tools>\nQuestion:\n`), so the tool list stays with
    what came before and a checkpoint at the turn's start holds it. The start cut like every other
    start (from the previous closer up to the first varying text) comes last."""
    out: list[str] = []
    ends = [m.end() for m in prober.varying.finditer(seg)]
    line_end = seg.find("\n", ends[-1]) if ends else -1
    if line_end >= 0:
        rest = seg[line_end + 1:]
        k = len(rest)
        while k > 0:
            k = back_to_boundary(rest, k - 1)
            candidate = rest[k:].lstrip()
            if distinctive(candidate) and candidate not in out:
                out.append(candidate)
    plain = prober.start_in(seg, prev, opener)
    if distinctive(plain) and plain not in out:
        out.append(plain)
    return out
