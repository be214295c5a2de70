"""System findings: whether system messages render, where, and the system start."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime

from ..delimiters import Delimiter, split_text
from ..errors import RenderError, RenderLimitError
from ..sandbox import reads_clock
from ._chat import ChatDelimiters, ChatFindings
from ._probing import Prober, Seen
from ._text import BOUNDARY, MARKUP_END, UNIT, Note, back_to_boundary, distinctive, lcp, lcs, template_message, unit_prefix, unit_suffix
from .probes import Probe, ProbeBuilder

__all__ = ["SystemFindings", "probe_developer", "probe_system", "refine_system_start"]

# A second clock: text that differs between renders at two dates is no fixed marker.
_OTHER_NOW = datetime(2031, 11, 23, 17, 45, 0)


def _other_clock() -> datetime:
    return _OTHER_NOW


@dataclass(frozen=True)
class SystemFindings:
    start: str
    # 'own_turn'; 'as_user' (a user turn of its own); 'inside_user' / 'inside_assistant' (folded into
    # the next message's turn); 'preamble' (before any delimiter); 'dropped'; 'rejected'
    mode: str
    builder: ProbeBuilder  # the chat shape, adapted with any variable the system probe needed
    notes: tuple[Note, ...] = ()
    # The system probe ("S1 U1") and its render, where the template rendered it (`probe_developer` reads them)
    rendered: tuple[Probe, str] | None = field(default=None, repr=False, compare=False)


def probe_system(prober: Prober, chat: ChatFindings, delims: ChatDelimiters) -> SystemFindings:
    text, probe, builder, err = prober.attempt(chat.builder, "S1 U1")
    if text is None:
        message = f"system messages are rejected by the template: {template_message(err)}"
        return SystemFindings("", "rejected", chat.builder, (Note(message, message),))
    seen = prober.seen(text, probe)
    first = seen.bounds[0]
    if first is None:  # not seen.found(0)
        return SystemFindings("", "dropped", builder, rendered=(probe, text))
    chat_delims = [Delimiter("user", delims.user_start or ""), Delimiter("assistant", delims.assistant_start or "")]
    at = first[0]
    inside = next((s for s in split_text(text, chat_delims) if s.start <= at < s.end), None)
    second = seen.bounds[1]
    holds_next = inside is not None and second is not None and inside.start <= second[0] < inside.end
    if inside is not None and inside.role == "assistant" and not holds_next:
        inside = None  # an assistant start's text in a preamble the template writes first: no turn of a message
    if inside is not None:
        if inside.role == "user" and second is not None and not holds_next:
            # A user turn of its own (`<|im_start|>user\n` + the system text): to a prefill engine it
            # is one user start more than the conversation has user messages, unless the turn opens
            # with more than a user start (`<|im_start|>user\n[SYSTEM] `): that is the system start.
            own = prober.clean(text[inside.start:at])
            if own.startswith(delims.user_start) and own[len(delims.user_start):].strip():
                return SystemFindings(own, "own_turn", builder, rendered=(probe, text))
            return SystemFindings("", "as_user", builder, rendered=(probe, text))
        return SystemFindings("", "inside_user" if inside.role == "user" else "inside_assistant", builder,
                              rendered=(probe, text))
    candidate = system_candidate(seen.head(0), chat, delims, prober.clean)
    if candidate and reads_clock(prober.template.text):
        # Text that depends on today's date, or on a random draw (seeded by the render's time), is no
        # fixed marker (the date reaches a template only through strftime_now); cut at a boundary,
        # since two dates or draws can share a first character ("2025" and "2031", "Hi" and "Hey").
        try:
            other = Seen(prober.render(probe, clock=_other_clock), probe)
            if other.found(0):
                shared = lcp(candidate, system_candidate(other.head(0), chat, delims, prober.clean))
                candidate = candidate[:shared if shared == len(candidate) else back_to_boundary(candidate, shared)]
        except RenderError:
            pass
    candidate = candidate if candidate.strip() else ""
    return SystemFindings(candidate, "own_turn" if candidate else "preamble", builder, rendered=(probe, text))


def probe_developer(prober: Prober, system: SystemFindings) -> str:
    """What the template does with a `developer` message (an OpenAI-style client's instructions) first,
    as transformers gives it (llama-server gives it as `system`): "as_system" (rendered as the system
    probe's message is), "own" (otherwise, its content printed), "dropped" (its content nowhere: a
    model trained on the render never sees it) or "rejected" (the template raises)."""
    probe, as_system = system.rendered if system.rendered else (system.builder.build("S1 U1"), None)
    probe = replace(probe, messages=[{**probe.messages[0], "role": "developer"}, *probe.messages[1:]])
    try:
        text = prober.render(probe)
    except RenderLimitError:
        raise
    except RenderError:
        return "rejected"
    if probe.needles[0][0] not in text:  # (first: a template that drops a system message renders both alike)
        return "dropped"
    return "as_system" if text == as_system else "own"


def refine_system_start(start: str, renders: list[Seen], index: int, chat: ChatFindings, delims: ChatDelimiters,
                        clean) -> tuple[str, list[str]]:
    """`start` checked against the system turn of each round-trip render (message `index`): the
    start, and the starts of other contexts.

    Where the text before the system content there ends with `start`, it holds (a tool list the
    template writes before the system turn, EXAONE 4.5's `<|tool_declare|>...<|endofturn|>\n`, is no
    part of it). Where it does not, the system turn opens otherwise in that context: the two starts
    are cut to what both start with where that is whole markup, else each context keeps a start of
    its own (LongCat's `<longcat_system>` is no `<longcat_`, the prefix it shares with every tag)."""
    others: list[str] = []
    for rt in (r for r in renders if r.found(index)):
        head = rt.head(index)
        if head.endswith(start):
            continue
        # Text a thinking switch changes before the marker (GLM 5's `Max<|system|>`, `<|system|>` with
        # thinking off) is no part of the start: keep what every render ends with.
        shared = start[unit_suffix(start, len(start) - lcs(start, head)):]
        if distinctive(shared) and UNIT.match(shared):
            start = shared
            continue
        other = system_candidate(head, chat, delims, clean)
        k = lcp(start, other)
        if not other:
            continue
        if start[:k].strip() and unit_prefix(start, k) == k and (k == len(start) or start[k - 1] in BOUNDARY or UNIT.search(start[:k])):
            start = start[:k]
        elif distinctive(other) and other not in others:
            others.append(other)
    return start, [o for o in others if o != start]


def _turn_start(pre_system: str, chat: ChatFindings, delims: ChatDelimiters, bos: str) -> int:
    """Where the system turn starts in the text before the system content.

    At the last turn opener when there is one (a markup unit that opens every turn, or the start
    that user and assistant delimiters share); else where that text first differs from the text
    before a first user message; else at the markup (units and role words) that ends it; else (the
    system content goes into a default system turn) at the first markup unit after the BOS."""
    shared = ""
    if delims.user_start and delims.assistant_start:
        shared = delims.user_start[: unit_prefix(delims.user_start, lcp(delims.user_start, delims.assistant_start))]
    opener = next((o for o in (chat.opener, shared) if o and len(o.strip()) >= 2 and o in pre_system[len(bos):]), None)
    if opener:
        return pre_system.rfind(opener)
    start = lcp(pre_system, chat.pre_user0)
    if start < len(pre_system):
        start = back_to_boundary(pre_system, start, len(bos))
    if not pre_system[start:].strip():
        end = start = len(pre_system.rstrip())
        while start > len(bos):
            m = MARKUP_END.search(pre_system, len(bos), start)
            if not m or m.start() == start:
                break
            start = m.start()
        if start == end:
            m = UNIT.match(pre_system, len(bos))
            start = m.start() if m else start
    return start


def system_candidate(pre_system: str, chat: ChatFindings, delims: ChatDelimiters, clean) -> str:
    """The system delimiter in the text before the system content, cut at its first line of prose.

    A system delimiter ends at its first line of prose: a default system prompt the template writes
    before the given one is system content, not markup, and so is its heading (Solar's
    `## Provider System Prompt`, Command R's `# Safety Preamble`): the delimiter ends at the turn's
    markup. A heading the template writes right before the given prompt, and only when there is
    one, is kept (gpt-oss's `# Instructions\\n\\n`, the same for every system prompt)."""
    bos = chat.bos_like if pre_system.startswith(chat.bos_like) else ""
    start = _turn_start(pre_system, chat, delims, bos)
    candidate = clean(pre_system[max(start, len(bos)):])
    m = re.search(r"\n\s*", candidate)
    if m and m.end() < len(candidate) and candidate[m.end()] not in "<[":
        # Prose follows the first line: a default system prompt. Text after the turn's markup on
        # that line, other than a role word, is its heading (Solar's `## Provider System Prompt`).
        units = list(UNIT.finditer(candidate, 0, m.start()))
        cut = units[-1].end() if units else 0
        if cut and not re.fullmatch(r"\s*(?:[A-Za-z_]+:?)?\s*", candidate[cut:m.start()]):
            candidate = candidate[:cut]
        else:
            candidate = candidate[: m.end()]
    return candidate
