"""`analyze()`: the findings stages composed, in order, into one Analysis."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

from ..delimiters import REASONING_ROLES, Delimiter, sort_delimiters
from ..errors import InputError, RenderError, RenderLimitError
from ..sandbox import Limits, compile_template
from ..sources.templates import require_template
from ._chat import ChatDelimiters, ChatFindings, Stop, assistant_delimiters, chat_delimiters, context_starts, probe_chat
from ._probing import Prober
from ._proofs import indistinguishable
from ._reasoning import ReasoningFindings, probe_reasoning, switch_renders, switched_renders, thinking_flags, without_reasoning
from ._result import Analysis, RoundTrip, failed_analysis, one_line, status_of
from ._system import SystemFindings, probe_developer, probe_system, refine_system_start
from ._text import distinctive, from_first_unit
from ._tools import ToolFindings, ToolProbe, probe_tools, tool_delimiters
from ._verdict import (
    GENERATION_PROMPT_MATCH,
    agent_requests,
    extend_back,
    message_modes,
    prompt_cuts,
    render_round_trip,
    replaced,
    round_trip,
    with_modes,
)

__all__ = ["analyze"]

# Capabilities -> the ToolFindings field that holds them.
_TOOL_CAPS = (("tool_response_start", "start_mode"), ("tool_responses_grouped", "grouped"),
              ("tool_responses_separated", "separated"), ("assistant_after_tool", "assistant_after_tool"))


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
    require_template(template)
    try:
        result = _analysis(template, limits)
    except (RenderLimitError, InputError) as exc:  # InputError: pragma no cover, probes are well-formed
        result = failed_analysis(template, status_of(exc), (str(exc),))
    # Each reported string on one line and bounded, as a worker reports it (analyze_isolated).
    return replace(result, errors=tuple(map(one_line, result.errors)), warnings=tuple(map(one_line, result.warnings)),
                   seconds=time.perf_counter() - t0)


def _analysis(template, limits: Limits | None) -> Analysis:
    if getattr(template, "error", None):  # a folder's file that could not be read (sources.load_dir)
        return failed_analysis(template, "error", (template.error,))
    try:
        compile_template(template)
    except RenderError as exc:
        return failed_analysis(template, "error", (str(exc),))
    prober = Prober(template, limits)
    try:
        chat = probe_chat(prober)
    except Stop as stop:
        return failed_analysis(template, stop.status, (stop.reason,))
    return _Stages(prober, chat).finish()


def _proves(check, delimiters, role: str, old: str, new: str) -> bool:
    """Whether the round trip (`check`) passes with the `role` delimiter `old` replaced by `new`."""
    return check(replaced(delimiters, role, old, new)).passed


class _Stages:
    """The findings of one analysis, each stage computed once, in order, in the constructor.

    Delimiters are cut twice: from the probes, then again once the round-trip conversation (and
    its renders with each thinking switch) added its contexts to the evidence."""

    def __init__(self, prober: Prober, chat: ChatFindings):
        self.prober, self.chat = prober, chat
        self.chat_probed = chat_delimiters(prober, chat)
        self.system: SystemFindings = probe_system(prober, chat, self.chat_probed)
        self.developer = probe_developer(prober, self.system)
        self.tool_probe: ToolProbe = probe_tools(prober, self.system.builder)
        self.tools_probed = self._tool_delimiters(self.chat_probed)
        self.switches = switch_renders(prober, chat)
        self.thinking_flags = thinking_flags(chat, self.switches)
        self.rt_refused: list[str] = []  # what the template refuses of the round-trip conversation
        rt_probe, rt_text, rt_error = render_round_trip(prober, self.system.builder, self.system.mode,
                                                        self.tool_probe, self.tools_probed, self.rt_refused)
        self.rt_probe, self.rt_text, self.rt_error = rt_probe, rt_text, rt_error
        self.variants: list[tuple[str, str]] = []
        self.switch_notes: tuple = ()  # switch values the round-trip conversation does not render with
        self.stray_note: tuple[str, ...] = ()  # reasoning delimiters left out (without_stray_reasoning)
        self.renders: list = []  # the round-trip conversation as rendered, plain and with each switch
        self.system_start = self.system.start
        self.system_others: list[str] = []  # the system turn's starts in other contexts
        self.chat_final, self.tools_final = self.chat_probed, self.tools_probed
        # The requests an agent sends that the round trip does not hold: their contexts are evidence
        # too (a call right after results), and each is proved (`proved`).
        requests = (agent_requests(prober, self.system.mode, self.tool_probe, self.tools_probed, self.system.builder)
                    if rt_text is not None else [])
        if rt_text is not None:
            self.variants, self.switch_notes = switched_renders(prober, rt_probe, rt_text, self.thinking_flags)
            self.renders = [prober.seen(rt_text, rt_probe)] + [prober.seen(v, rt_probe, switched=True) for _, v in self.variants]
            if self.system.mode == "own_turn" and "system" in rt_probe.roles:
                self.system_start, self.system_others = refine_system_start(self.system.start, self.renders, rt_probe.roles.index("system"),
                                                        chat, self.chat_probed, prober.clean)
            self.chat_final = chat_delimiters(prober, chat)
            if self.tools_probed.placement not in (None, "rejected", "dropped"):
                self.tools_final = self._tool_delimiters(self.chat_final)
        self.requests = with_modes(requests, self.system.mode, self.tools_final)
        assistant_start, assistant, self.assistant_notes = assistant_delimiters(prober, chat, self.chat_final, self.tools_final)
        self.reasoning: ReasoningFindings = probe_reasoning(prober, chat, assistant_start, self.switches,
                                                          self.thinking_flags, self.renders)
        self.assistant_start = without_reasoning(assistant_start, self.reasoning)
        self.assistant = [without_reasoning(d, self.reasoning) for d in assistant]

    def _tool_delimiters(self, delims: ChatDelimiters) -> ToolFindings:
        if self.tool_probe.placement is not None:
            return ToolFindings(placement=self.tool_probe.placement)
        return tool_delimiters(self.prober, self.chat, delims, self.tool_probe)

    def delimiters(self, context_users=()) -> tuple[Delimiter, ...]:
        tools = self.tools_final
        out = [Delimiter("user", self.chat_final.user_start)] + [Delimiter("user", d) for d in context_users]
        out += [Delimiter("assistant", d) for d in self.assistant]
        if self.system.mode == "own_turn":
            out += [Delimiter("system", d) for d in (self.system_start, *self.system_others)]
        out += [Delimiter("tool", tools.start), Delimiter("tool", tools.next), Delimiter("tool", tools.closer_next)]
        out += [Delimiter("reasoning", self.reasoning.start), Delimiter("reasoning_end", self.reasoning.end)]
        return sort_delimiters(out)  # drops the empty ones

    def capabilities(self) -> dict:
        tp, tools = self.tool_probe, self.tools_final
        caps: dict = {"assistant_start": self.chat_final.assistant_mode, "tools": tp.declares_tools}
        if tp.adaptations is not None:
            caps["adaptations"] = list(tp.adaptations)
        caps["tool_calls"] = tp.tool_calls
        # Keys in the order they were first found: from the probes, then from the round trip's contexts.
        present = [(key, attr) for key, attr in _TOOL_CAPS if getattr(tools, attr) is not None]
        probed = [(key, attr) for key, attr in present if getattr(self.tools_probed, attr) is not None]
        caps.update((key, getattr(tools, attr)) for key, attr in probed)
        caps["thinking_flags"] = self.thinking_flags
        caps.update((key, getattr(tools, attr)) for key, attr in present if (key, attr) not in probed)
        caps["system"] = self.system.mode
        if tools.same_as_user:
            # Rendered exactly as user turns, like a system 'as_user': each is one user start more.
            caps["tool"] = "as_user"
        caps["system_supported"] = self.system.mode != "rejected"
        caps["developer"] = self.developer
        # The template renders no chat without a system message: every probe starts with one.
        caps["system_required"] = self.chat.builder.shape.system_first
        caps["tools_supported"] = bool(caps.get("tools")) or caps.get("tool_calls") not in (None, "rejected")
        return caps

    def warnings(self) -> tuple[str, ...]:
        """Every note once (a delimiter that differs between contexts is reported the first time)."""
        groups = (self.chat_probed.notes, self.system.notes, self.tool_probe.notes, self.tools_probed.notes,
                  self.chat_final.notes, self.tools_final.notes, self.assistant_notes, self.reasoning.notes, self.switch_notes)
        said: dict[str, str] = {}
        for note in (n for g in groups for n in g):
            said.setdefault(note.key, note.text)
        return tuple(said.values()) + tuple(self.rt_refused) + self.dropped_tools() + self.fused()

    def dropped_tools(self) -> tuple[str, ...]:
        """A template without tool support renders no tool result: in an agent session the model never
        sees them (and a tool-call turn may run on into the answer after the results)."""
        if self.tools_final.placement != "dropped":
            return ()
        return ("tool messages are dropped by the template (tool_placement 'dropped'): in an agent session the model "
                "never sees the tool results",)

    def fused(self) -> tuple[str, ...]:
        """Where an assistant turn opens with reasoning markup alone (DeepSeek-V3.2's answer after
        tool results: `</function_results>` then `\n\n</think>`, no role marker), its assistant
        delimiter is that marker: the two are fused, and it is said."""
        r = self.reasoning
        marks = {m.strip(): name for m, name in ((r.start, "reasoning start"), (r.end, "reasoning end")) if m.strip()}
        return tuple(f"the assistant delimiter {d!r} is also the {marks[d.strip()]}: some assistant turns open with "
                     "reasoning markup alone, no role marker of their own (fused)"
                     for d in self.assistant if d.strip() in marks)

    def contexts(self, role: str, same: bool = False) -> list[str]:
        """The texts before each content of `role` after another message (`same`: after one of its
        own role too) and as the first message (a user's in a one-message chat, a system's in the
        round trip's renders), in every render so far."""
        segs = [*self.prober.segs.items(), *self.prober.switched_segs.items()]
        out = [seg for (prev, kind), texts in segs if kind == role and (same or prev != role) for seg in texts]
        if role == "user":
            return out + [self.chat.pre_user0]
        return out + [r.head(0) for r in self.renders if role == "system" and r.found(0) and r.kind(0) == role]

    def extended(self, delimiters, check) -> tuple[tuple[Delimiter, ...], dict[str, str]]:
        """The delimiters with a user or tool start that matched inside the generation prompt
        extended back to the shortest form the round trip proves (`extend_back`), the other roles'
        starts extended back alike (`extended_alike`), and {role: its start, for each start
        extended} ({} where none is)."""
        for role, old in (("user", self.chat_final.user_start), ("tool", self.tools_final.start)):
            new = extend_back(old, self.contexts(role), partial(_proves, check, delimiters, role, old))
            if new:
                return self.extended_alike(replaced(delimiters, role, old, new), check, new[:len(new) - len(old)],
                                           {role: new})
        return delimiters, {}

    def extended_alike(self, delimiters, check, head: str, ext: dict[str, str]):
        """`delimiters` with each other role's delimiter `d` extended back over the same `head` (the
        markup a start was extended back over: `Source: `), to `head + d`, where every text before
        a content of its role that ends with `d` ends with that, at a markup boundary, and the round
        trip still passes; and `ext` with each role's start so extended. A template whose turns end
        by opening the next one's header does so whoever speaks next: left short, the start of a
        tool result after an answer (`tool\\n\\n `) would leave the next header's `Source: ` to the
        answer's turn."""
        starts = {"user": self.chat_final.user_start, "assistant": self.assistant_start,
                  "system": self.system_start, "tool": self.tools_final.start}
        for d in tuple(delimiters):
            if d.role in ext or d.role in REASONING_ROLES or d.text.startswith(head):
                continue
            new = head + d.text
            before = [c for c in self.contexts(d.role, same=True) if c.endswith(d.text)]
            if (before and all(c.endswith(new) for c in before) and extend_back(d.text, before, new.__eq__)
                    and _proves(check, delimiters, d.role, d.text, new)):
                delimiters = replaced(delimiters, d.role, d.text, new)
                if d.text == starts[d.role]:
                    ext[d.role] = new
        return delimiters, ext

    def proved(self) -> tuple[tuple[Delimiter, ...], RoundTrip, dict[str, str]]:
        """The delimiters, their round-trip verdict, and {role: start} for a start extended back.

        Where the delimiters as derived fail: widened with a user start for each context, or with a
        user or tool start that matched in the generation prompt extended back, kept if it passes."""
        delimiters = self.delimiters()
        modes = message_modes(self.rt_probe, self.system.mode, self.tools_final)
        cuts = prompt_cuts(self.prober, self.rt_probe) + self.requests if self.rt_text is not None else []

        def check(delims):
            return round_trip(self.rt_probe, self.rt_text, self.rt_error, self.variants, delims, modes, cuts)

        verdict = check(delimiters)
        if not verdict.passed and self.renders:
            # Turns that differ by context (a first user turn after the tool list with an opener of
            # its own): a user delimiter for each context, kept where the round trip proves them all.
            for extra in context_starts(self.prober, self.renders, "user", self.chat_final.user_start, self.chat.opener):
                widened = self.delimiters(extra)
                other = check(widened)
                if other.passed:
                    delimiters, verdict = widened, other
                    break
        if not verdict.passed and (closer_led := self.user_after_results()):
            widened = sort_delimiters(delimiters + closer_led)
            other = check(widened)
            if other.passed:
                delimiters, verdict = widened, other
        ext: dict[str, str] = {}
        if any(GENERATION_PROMPT_MATCH in p for p in verdict.problems):
            delimiters, ext = self.extended(delimiters, check)
            verdict = check(delimiters) if ext else verdict
        if verdict.passed and verdict.stray_reasoning:
            delimiters, verdict = self.without_stray_reasoning(delimiters, verdict, check)
        return delimiters, verdict, ext

    def user_after_results(self) -> tuple[Delimiter, ...]:
        """Where a user message right after tool results opens with no start of its own, only the
        results' closer before it (DeepSeek V4 Flash: `</tool_result>\n\n` then the text), the closer is
        its start, and a next result's start takes the closer too, so that it wins there (longest
        first): `</tool_result>\n\n<tool_result>`. () where the render shows no such context."""
        after, between = self.prober.segs.get(("tool", "user")), self.prober.segs.get(("tool", "tool"))
        if not after or not between or self.chat_final.user_start and self.chat_final.user_start in after[0]:
            return ()
        user, nxt = from_first_unit(self.prober.clean(after[0])), self.prober.clean(between[0])
        if not distinctive(user) or not nxt.startswith(user) or nxt == user:
            return ()
        return (Delimiter("user", user), Delimiter("tool", nxt))

    def without_stray_reasoning(self, delimiters, verdict, check):
        """Reasoning markup the template's own text quotes in another turn (Command R7B's and a Qwen
        3.6 finetune's tool instructions show `<think>`, `<|START_THINKING|>`) would split that
        turn's text into a reasoning span for anyone splitting by every delimiter: the reasoning
        delimiters are left out where the round trip passes without them (reasoning then lies in the
        assistant span; `reasoning_start`/`reasoning_end` still name the markers), and it is said."""
        plain = tuple(d for d in delimiters if d.role not in REASONING_ROLES)
        other = check(plain)
        if not other.passed:
            return delimiters, verdict
        text = ("the reasoning markers also occur in the template's own text inside another turn (its instructions quote "
                "them), so they are left out of the delimiters: splitting by them would put that turn's text in a reasoning "
                "span; reasoning stays in the assistant's span")
        self.stray_note = (text,)
        return plain, other

    def finish(self) -> Analysis:
        delimiters, verdict, ext = self.proved()
        tools = self.tools_final
        # A round trip that places every message in its own role's span tells the roles apart on
        # that conversation, but a start that also matches where no message starts (a warning) may
        # be what places them (Hunyuan-7B-Pretrain-0124: tool results after the answer's `<|eos|>`,
        # rendered exactly as system prompts): the proof is looked for there too.
        modes = message_modes(self.rt_probe, self.system.mode, tools)
        proof = (indistinguishable(self.prober, self.rt_probe, self.rt_text)
                 if not verdict.passed or "as_user" in modes or tools.same_as_user or verdict.notes else None)
        for label, probe, text, _ in self.requests if not verdict.passed and not proof else ():
            proof = indistinguishable(self.prober, probe, text, label)
            if proof:
                break
        errors = self.chat_final.errors + tools.errors
        if proof and not tools.same_as_user:  # (a tool result rendered as a user turn says so already)
            errors = (proof,) + errors
        return Analysis(
            name=self.prober.template.name,
            source=self.prober.template.source,
            status="impossible" if proof else "pass" if verdict.passed else "fail",
            user_start=ext.get("user", self.chat_final.user_start) or None,
            assistant_start=ext.get("assistant", self.assistant_start) or None,
            system_start=ext.get("system", self.system_start) if self.system.mode == "own_turn" and self.system_start else None,
            tool_response_start=ext.get("tool", tools.start) or None,
            tool_response_next=tools.next or None,
            generation_prompt=self.chat.generation_prompt,
            tool_placement=tools.placement,
            reasoning_start=self.reasoning.start or None,
            reasoning_end=self.reasoning.end or None,
            earlier_reasoning=self.reasoning.earlier_turns,
            generation_reasoning=dict(self.reasoning.generation),
            capabilities=self.capabilities(),
            delimiters=delimiters,
            round_trip=verdict,
            errors=errors,
            warnings=self.warnings() + self.stray_note + verdict.notes,
        )
