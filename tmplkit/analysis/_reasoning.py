"""Reasoning findings: the thinking switches that change a render, and the renders they give."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..errors import RenderError
from ._chat import ChatFindings, generation_prompt_of
from ._probing import Prober, Seen
from ._text import UNIT, Note, agree, canon, distinctive, lcp, template_message, unit_prefix
from .probes import REASONING_KEYS, THINKING_FLAGS, Probe

__all__ = ["ReasoningFindings", "generation_prompts", "probe_reasoning", "switch_renders", "switched_renders", "thinking_flags",
           "without_reasoning"]


def _names(text: str, name: str) -> bool:
    """Whether `text` holds `name` as a word of its own (`thinking`, not `enable_thinking`)."""
    i = text.find(name)
    while i >= 0:
        j = i + len(name)
        if (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) and (j == len(text) or not (text[j].isalnum() or text[j] == "_")):
            return True
        i = text.find(name, j)
    return False


def switch_renders(prober: Prober, chat: ChatFindings, names=None, have=None) -> dict[tuple[str, object], str]:
    """The one-message chat with the generation prompt, rendered with values of the thinking switches
    (enable_thinking, thinking, ...) the template names: {(name, value): render}. Without `names`,
    each switch's values until one changes the render (enough to tell which switches matter);
    with them, every value of those switches (those in `have` are not rendered again)."""
    out: dict[tuple[str, object], str] = dict(have or {})
    if chat.generation_render is None:
        return out
    probe = chat.builder.build("U1", add_generation_prompt=True)
    for name, values in THINKING_FLAGS:
        # Only a switch the template names can change its render (`thinking` inside
        # `enable_thinking` is no mention of its own).
        if (names is not None and name not in names) or not _names(prober.template.text, name):
            continue
        for value in values:
            try:
                if (name, value) not in out:
                    out[(name, value)] = prober.render(replace(probe, kwargs={**probe.kwargs, name: value}))
            except RenderError:
                continue
            if names is None and out.get((name, value)) != chat.generation_render:
                break
    return out


def thinking_flags(chat: ChatFindings, renders: dict[tuple[str, object], str]) -> list[str]:
    """The thinking switches that change the generation prompt."""
    return list(dict.fromkeys(name for (name, _), text in renders.items() if text != chat.generation_render))


def switched_renders(prober: Prober, probe: Probe, text: str, flags) -> tuple[list[tuple[str, str]], tuple[Note, ...]]:
    """`probe` rendered with each value of each thinking switch in `flags`, where that changes the
    render: (the switch as `name=value`, the render). A switch is set per request, so delimiters
    must hold either way (DeepSeek V4 opens answers with `</think>`, or with `<think>` when thinking).
    A value the template does not render the conversation with cannot be proved: a Note names it."""
    out, seen, notes = [], {text}, []
    for name, values in THINKING_FLAGS:
        if name not in flags:
            continue
        for value in values:
            try:
                other = prober.render(replace(probe, kwargs={**probe.kwargs, name: value}))
            except RenderError as exc:
                message = (f"with {name}={value!r} the template does not render the round-trip conversation "
                           f"({template_message(exc)}): the delimiters are not proved for that setting")
                notes.append(Note(message, message))
                continue
            if other not in seen:
                seen.add(other)
                out.append((f"{name}={value!r}", other))
    return out, tuple(notes)


@dataclass(frozen=True)
class ReasoningFindings:
    """Where reasoning goes in an assistant turn.

    `start`/`end` open and close the reasoning (`<think>`, `</think>\\n\\n`); `role_marker` is the
    assistant start without them (None where the assistant start holds no reasoning markup);
    `earlier_turns` says whether assistant turns before the last user message keep their reasoning
    ('kept') or lose it ('dropped'); `generation` maps each thinking-switch setting to what the
    generation prompt does: opens the reasoning itself ('open'), closes it ('closed'), or leaves it
    to the model ('model')."""

    start: str = ""
    end: str = ""
    role_marker: str | None = None
    earlier_turns: str | None = None
    generation: dict = field(default_factory=dict)
    notes: tuple[Note, ...] = ()

    def to_dict(self) -> dict:
        return {"reasoning_start": self.start or None, "reasoning_end": self.end or None,
                "earlier_turns": self.earlier_turns, "generation": dict(self.generation)}


# Words that name reasoning markup; an empty block of it (`<think></think>`) in a plain answer is
# reasoning markup even where no probe shows reasoning text.
_REASONING_WORDS = ("think", "reason", "thought", "analysis")


def _unit_name(unit: str) -> tuple[str, bool]:
    """A markup unit's name and whether it closes: `</think>` -> ('think', True),
    `<|END_THINKING|>` -> ('end_thinking', False), `<channel|>` -> ('channel', False)."""
    body = unit.strip("<>[]|｜〈〉")
    closing = body.startswith("/")
    m = re.match(r"[\w:.-]*", body.lstrip("/").lower())
    assert m is not None, "the pattern matches the empty string"
    return m.group(0), closing


def _partners(unit: str) -> set[str]:
    """The names of the units that open what `unit` closes (`</think>` -> think, `<|END_THINKING|>`
    -> start_thinking, `<|close|>` -> open, `<channel|>` -> channel)."""
    name, closing = _unit_name(unit)
    if closing:
        return {name}
    for closer, openers in (("end_", ("start_", "begin_")), ("close_", ("open_",))):
        if name.startswith(closer):
            return {o + name[len(closer):] for o in openers}
    if name in ("end", "close"):
        return {"start", "begin", "open"}
    return {name}


def _split_opener(before: str, end: str, assistant_start: str) -> tuple[str, str]:
    """`before` (what precedes the reasoning text in an assistant turn) as (role marker, reasoning start).

    The reasoning start is the last markup unit that `end` closes, where a role marker is left
    before it (`<|assistant|>\\n` + `<think>`; Kimi K3's `<|open|>think<|sep|>`); else what follows the
    assistant start found without reasoning (gpt-oss's `<|channel|>analysis<|message|>` after
    `<|start|>assistant`); else there is none: the reasoning follows the role marker directly."""
    m = UNIT.search(end)
    if m:
        names = _partners(m.group(0))
        for u in reversed(list(UNIT.finditer(before))):
            if _unit_name(u.group(0))[0] in names and distinctive(before[:u.start()]):
                return before[:u.start()], before[u.start():]
        first = UNIT.match(before)
        name = _unit_name(first.group(0))[0] if first else ""
        if name in names and any(w in name for w in _REASONING_WORDS) and before != assistant_start:
            # Nothing before the reasoning's opening unit (Mistral 3: `[/INST]` then `[THINK]`): the
            # turn has no role marker here, and all of it opens the reasoning.
            return "", before
    if assistant_start and before.startswith(assistant_start) and before[len(assistant_start):].strip():
        return assistant_start, before[len(assistant_start):]
    return before, ""


def _empty_block(seg: str) -> tuple[str, str, int] | None:
    """An empty reasoning block in `seg` (`<think></think>`): (start, end, where it starts)."""
    units = list(UNIT.finditer(seg))
    for a, b in zip(units, units[1:]):
        name = _unit_name(a.group(0))[0]
        if (a.end() <= b.start() and not seg[a.end():b.start()].strip() and any(w in name for w in _REASONING_WORDS)
                and name in _partners(b.group(0)) and not _unit_name(a.group(0))[1]):
            return a.group(0), b.group(0), a.start()
    return None


def _with_reasoning(prober: Prober, builder, spec: str):
    """Render `spec` (assistant messages with reasoning); the Seen, or None where it does not render."""
    text, probe, _, _ = prober.attempt(builder, spec)
    return None if text is None else prober.seen(text, probe, collect=False)


def _markers_from_text(prober: Prober, seen: Seen, chat: ChatFindings, assistant_start: str):
    """(role marker, start, end) from a render where an answer (or tool call) right after a user
    message shows its reasoning text, else None."""
    for i, message in enumerate(seen.probe.messages):
        if i == 0 or not message.get("reasoning_content") or seen.probe.roles[i - 1] != "user" or not seen.found(i - 1):
            continue
        reasoning = seen.pos[i][-1]
        after = [p for p in seen.pos[i][:-1] if p > reasoning]
        user_bounds = seen.bounds[i - 1]
        assert user_bounds is not None, "found(i - 1) above"
        user_end = user_bounds[1]
        if reasoning < 0 or not after or not user_end <= reasoning:
            continue
        before = prober.start_in(canon(seen.text[user_end:reasoning]), "user", chat.opener)
        end = prober.clean(canon(seen.text[reasoning + len(seen.probe.needles[i][-1]):min(after)]))
        marker, start = _split_opener(before, end, assistant_start)
        return marker, start, end
    return None


def _markers_from_block(prober: Prober, chat: ChatFindings, assistant_start: str):
    """(role marker, start, end) from an empty reasoning block the template writes into answers."""
    for seg in [assistant_start] + [prober.start_in(s, "user", chat.opener) for s in prober.segs.get(("user", "assistant"), ())]:
        block = _empty_block(seg)
        if block and distinctive(seg[:block[2]]):
            return seg[:block[2]], block[0], block[1]
    return None


def _closes(unit: str) -> bool:
    name, closing = _unit_name(unit)
    return closing or _partners(unit) != {name}


def _markers_from_prompts(prompts: list[str | None]):
    """(role marker, start, end) from generation prompts that differ by a thinking switch: what they
    share is the role marker, and they end by opening the reasoning or closing it (DeepSeek V4:
    `<｜Assistant｜>` then `<think>` or `</think>`)."""
    distinct = list(dict.fromkeys(p for p in prompts if p))
    if len(distinct) < 2:
        return None
    first = distinct[0]
    k = unit_prefix(first, min(lcp(first, p) for p in distinct[1:]))
    head, units = first[:k], [u for p in distinct for u in UNIT.findall(p[k:])]
    end = next((u for u in units if _closes(u) and any(w in u.lower() for w in _REASONING_WORDS)), None)
    if end is None:
        return None
    names = _partners(end)
    start = next((u for u in units if u != end and _unit_name(u)[0] in names), None)
    if start is None:
        last = list(UNIT.finditer(head))
        if not last or _unit_name(last[-1].group(0))[0] not in names:
            return None
        start, head = last[-1].group(0), head[:last[-1].start()]
    return (head, start, end) if distinctive(head) else None


def _markers_from_prompt_end(prompts: list[str | None]):
    """(role marker, start, "") where a generation prompt ends by opening the reasoning and no render
    shows how it ends (DeepSeek R1: `<｜Assistant｜><think>\n`, its history keeps no reasoning)."""
    for prompt in (p for p in prompts if p):
        units = list(UNIT.finditer(prompt))
        if not units or prompt[units[-1].end():].strip():
            continue
        last = units[-1]
        name, closing = _unit_name(last.group(0))
        if not closing and any(w in name for w in _REASONING_WORDS) and distinctive(prompt[:last.start()]):
            return prompt[:last.start()], prompt[last.start():], ""
    return None


def _generation_verdict(prompt: str | None, start: str, end: str) -> str:
    """'closed' where the generation prompt closes the reasoning, 'open' where it opens it,
    'model' where it leaves that to the model."""
    text = (prompt or "").rstrip()
    if end.strip() and text.endswith(end.strip()):
        return "closed"
    if start.strip() and text.endswith(start.strip()):
        return "open"
    return "model"


def generation_prompts(prober: Prober, chat: ChatFindings, renders: dict[tuple[str, object], str], flags) -> dict[str, str | None]:
    """The generation prompt of a one-message chat with each thinking-switch setting ('default':
    none set), cut like the analysis's generation prompt."""
    out: dict[str, str | None] = {"default": chat.generation_prompt}
    for name, values in THINKING_FLAGS:
        for value in values:
            if name in flags and (name, value) in renders:
                out[f"{name}={value!r}"] = generation_prompt_of(prober, renders[(name, value)], chat.one_render, chat.opener)
    return out


def _earlier_turns(prober: Prober, builder, renders) -> tuple[str | None, Note | None]:
    """'kept' where an answer before the last user message keeps its reasoning, 'dropped' where
    only the answer after it does, None where no reasoning renders; and a note where the answer
    depends on the conversation. The round-trip render (an agent session, with tools) tells where
    it has reasoning on both sides of its last user message; a plain chat probe is rendered too,
    since a template may keep reasoning only when tools are given (Hy3's `preserved_thinking`
    defaults to true with tools, false without)."""
    agent = _earlier_in(renders[0]) if renders else None
    seen = _with_reasoning(prober, builder, "U1 A1/R1 U2 A2/R2")
    plain = _earlier_in(seen) if seen is not None else None
    if agent and plain and agent != plain:
        text = (f"earlier reasoning is {agent} in an agent conversation with tools but {plain} in a plain chat: "
                "the template decides by context; earlier_reasoning reports the agent conversation")
        return agent, Note("earlier reasoning by context", text)
    return agent or plain, None


def _earlier_in(seen: Seen) -> str | None:
    """`_earlier_turns`' verdict on one render."""
    last_user = max(i for i, r in enumerate(seen.probe.roles) if r == "user")
    shown = [(i < last_user, seen.pos[i][-1] >= 0) for i, m in enumerate(seen.probe.messages) if m.get("reasoning_content")]
    if any(early and found for early, found in shown):
        return "kept"
    if any(not early and found for early, found in shown) and any(early for early, _ in shown):
        return "dropped"
    return None


def _through_closer(end: str, start: str) -> str:
    """`end` cut after the unit that closes `start` and the whitespace after it: what follows is the
    answer's or the tool call's own markup (Gemma 4's `<channel|>` before `<|tool_call>`)."""
    first = UNIT.search(start)
    if not first:
        return end
    name = _unit_name(first.group(0))[0]
    # What names the reasoning after its opening unit (Kimi K3's `think<|sep|>` after `<|open|>`)
    # follows the closing unit too.
    named = UNIT.search(start, first.end())
    naming = start[first.end():named.end() if named else len(start)]
    for u in UNIT.finditer(end):
        if name in _partners(u.group(0)) and u.group(0) != first.group(0):
            k = u.end() + (len(naming) if naming.strip() and end.startswith(naming, u.end()) else 0)
            while k < len(end) and end[k].isspace():
                k += 1
            return end[:k]
    return end


def _ends_in(renders) -> list[str]:
    """What follows each message's reasoning text, up to its next needle, in `renders`."""
    out = []
    for seen in renders:
        for i, message in enumerate(seen.probe.messages):
            r = seen.pos[i][-1] if message.get("reasoning_content") else -1
            after = [p for p in seen.pos[i][:-1] if p > r]
            if r >= 0 and after:
                out.append(canon(seen.text[r + len(seen.probe.needles[i][-1]):min(after)]))
    return out


def probe_reasoning(prober: Prober, chat: ChatFindings, assistant_start: str, switches: dict, flags,
                    renders=()) -> ReasoningFindings:
    """Reasoning markers, from the first of: a render whose reasoning text shows (`U1 A1/R1`), an
    empty reasoning block the template writes into answers, generation prompts that differ by a
    thinking switch. A role's start is the markup that says whose turn it is; reasoning is part of
    the turn's content, so the assistant start becomes the role marker alone."""
    # A template that names none of the keys renders no reasoning text from them.
    named = any(key in prober.template.text for key in REASONING_KEYS)
    markers = next((m for m in (_markers_from_text(prober, r, chat, assistant_start) for r in renders) if m), None)
    if not markers and named:
        one = _with_reasoning(prober, chat.builder, "U1 A1/R1")
        markers = one is not None and _markers_from_text(prober, one, chat, assistant_start)
    if not markers:
        prompts = list(generation_prompts(prober, chat, switches, flags).values())
        markers = _markers_from_block(prober, chat, assistant_start) or _markers_from_prompts(prompts) \
            or _markers_from_prompt_end(prompts)
    earlier, earlier_note = _earlier_turns(prober, chat.builder, list(renders)) if named else (None, None)
    if not markers:
        return ReasoningFindings(earlier_turns=earlier, notes=(earlier_note,) if earlier_note else ())
    marker, start, end = markers
    if end:
        # The reasoning ends alike before an answer and before tool calls (Command A Reasoning:
        # `<|END_THINKING|>`, then `<|START_TEXT|>` or `<|START_ACTION|>`): the end is what they share.
        end = agree([end] + [prober.clean(e) for e in _ends_in(renders)], "the reasoning end")[0]
    end = _through_closer(end, start)
    if marker.strip() and marker.strip() in end:
        # The answer is a message of its own after the reasoning (gpt-oss's final channel, Solar's
        # `<|content|>`): its assistant start ends the reasoning, and what comes before that is the
        # closer of every turn, no marker.
        end = ""
    notes = [earlier_note] if earlier_note else []
    if not start and end:
        message = (f"reasoning has no opening marker of its own: it follows the assistant start {marker!r} "
                   "directly, so the reasoning lies in the assistant span up to the reasoning end")
        notes.append(Note(message, message))
    # Every value of each switch, for a verdict per setting.
    by_setting = generation_prompts(prober, chat, switch_renders(prober, chat, flags, switches), flags)
    generation = {setting: _generation_verdict(p, start, end) for setting, p in by_setting.items()}
    return ReasoningFindings(start, end, marker if distinctive(marker) else None, earlier, generation, tuple(notes))


def without_reasoning(delimiter: str, found: ReasoningFindings) -> str:
    """An assistant delimiter with the reasoning markup it holds cut off (`<|assistant|>\\n<think>` ->
    `<|assistant|>\\n`); unchanged where it holds none."""
    marker = found.role_marker
    if not marker or delimiter == marker or not delimiter.startswith(marker):
        return delimiter
    rest = delimiter[len(marker):].strip()
    if not rest:
        return delimiter  # only whitespace after the marker: no reasoning markup to cut
    for piece in (found.start.strip(), found.end.strip()):
        if piece:
            rest = rest.replace(piece, "", 1).strip()
    if not rest or found.start.startswith(rest):
        return marker
    return delimiter
