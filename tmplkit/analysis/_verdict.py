"""The verdict: the round-trip conversation, rendered and split with the derived delimiters."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..delimiters import REASONING_ROLES, Delimiter, sort_delimiters, split_text
from ..delimiters import with_article as _a
from ..errors import RenderError
from ..sources.templates import family_special_tokens
from ._probing import Prober, Seen
from ._result import RoundTrip
from ._text import back_to_boundary, lcs, template_message
from ._tools import ToolFindings, ToolProbe
from .probes import CALL_ID_FORMAT, TOOL_NAME, Probe, ProbeBuilder

__all__ = ["GENERATION_PROMPT_MATCH", "extend_back", "message_modes", "prompt_cuts", "replaced",
           "render_round_trip", "round_trip", "round_trip_verdict", "agent_requests", "with_modes"]

# How a problem says that a user or tool start matches after the last message.
GENERATION_PROMPT_MATCH = "matches in the generation prompt"


def _turn_role(role: str) -> str:
    """The turn a span belongs to: reasoning spans are part of the assistant's."""
    return "assistant" if role in REASONING_ROLES else role


def render_round_trip(prober: Prober, builder: ProbeBuilder, system_mode: str, tool_probe: ToolProbe, tools: ToolFindings,
                      refused: list[str] | None = None):
    """The round-trip conversation: (probe, render or None, error).

    Its contexts refine the delimiters. The first conversation ends like an agent session in
    progress: a tool call after the last user message, whose reasoning many templates keep (they
    drop it from earlier turns); so reasoning is message content, and the empty `<think></think>`
    many templates print for earlier turns is no part of the assistant start (GLM 4.6:
    `<|assistant|>\\n<think>`). The first spec that renders every message the analysis expects to
    see is kept (Mistral Nemo folds the system prompt into the last message only when that is a user
    message), else the first that renders at all. Where none renders, the conversations shaped to
    the template are tried (`_shaped`), and what it refuses is added to `refused`."""
    head = [] if system_mode == "rejected" else ["S1"]
    if tools.placement in (None, "rejected", "unknown"):
        specs = [head + "U1 A1/R1 U2 A2 U3 A3 U4".split(), head + "U1 A1 U2 A2 U3 A3 U4".split()]
    else:
        calls = tool_probe.calls.split()
        # The second round of calls has no text content (as agents mostly send them), where the
        # template takes that: some open such a turn otherwise (gpt-oss: `<|start|>assistant to=`).
        specs = [spec for second in ("D2(G3)", "C2(G3)") for spec in (
            head + ["U1", "A1/R1", "U2", *calls, "A3", "U3", second, "T3", "A4", "U4", "C3/R5(G5)", "T5"],
            head + ["U1", "A1/R1", "U2", *calls, "A3", "U3", second, "T3", "A4", "U4"],
            head + ["U1", "A1", "U2", *calls, "A3", "U3", second, "T3", "A4", "U4"])]
        specs.append(head + ["U1", "A1", "U2", *calls, "A3", "U3"])
        assert tool_probe.builder is not None, "a tool round rendered (its placement is not 'rejected')"
        builder = tool_probe.builder.with_shape(replace(tool_probe.builder.shape, extra=builder.shape.extra))
    first = rendered = None
    for spec in specs:
        text, probe, builder, err = prober.attempt(builder, " ".join(spec), add_generation_prompt=True)
        if text is None:
            first = first or (probe, err)
            continue
        seen = Seen(text, probe)
        if all(seen.found(i) or mode == "dropped" for i, mode in enumerate(message_modes(probe, system_mode, tools))):
            return probe, text, None
        rendered = rendered or (probe, text)
    if rendered:
        return rendered[0], rendered[1], None
    assert first is not None, "no spec rendered, so the first failure is kept"
    for spec in _shaped(specs):
        text, probe, builder, _ = prober.attempt(builder, " ".join(spec), add_generation_prompt=True)
        if text is not None:
            if refused is not None:
                refused.append(f"the template refuses the round-trip conversation ({template_message(first[1])}); its "
                               "roles are proved on the conversation it accepts, without an answer right after tool "
                               "results (it takes a user message there)")
            return probe, text, None
    return first[0], None, first[1]


def _shaped(specs: list[list[str]]) -> list[list[str]]:
    """`specs` shaped to a template whose own constraint refuses them: without the answers right after
    tool results (a template that makes user and assistant turns alternate over every message but the
    tool results refuses an answer after them, as tiny test models of real families do)."""
    out = []
    for spec in specs:
        shaped = [s for j, s in enumerate(spec) if not (s[0] == "A" and j and spec[j - 1][0] == "T")]
        if shaped != spec and shaped not in out:
            out.append(shaped)
    return out


def message_modes(probe: Probe, system_mode: str, tools: ToolFindings) -> list[str]:
    """How each message of `probe` is expected in the spans: 'own' span, 'as_user' (a system message
    rendered as a user turn of its own), 'in_user' (a system prompt folded into a user turn),
    'before' the first delimiter, 'continues' the span before it, or 'dropped'."""
    modes = []
    for i, role in enumerate(probe.roles):
        if role == "system":
            modes.append({"inside_user": "in_user", "as_user": "as_user", "preamble": "before", "dropped": "dropped"}.get(system_mode, "own"))
        elif role == "tool":
            if tools.placement == "dropped":
                modes.append("dropped")
            elif i > 0 and probe.roles[i - 1] == "tool" and tools.separated is False:
                modes.append("continues")
            else:
                modes.append("own")
        elif role == "assistant" and i > 0 and probe.roles[i - 1] == "tool":
            # No start of its own after the results: the answer (or a next call's text) continues
            # their span. Where the template renders no results at all (no tool support), the answer
            # may run on in the tool-call turn before it or open a turn of its own: either is right.
            modes.append("continues" if tools.assistant_after_tool == "continues" else
                         "continues_or_own" if tools.placement == "dropped" else "own")
        else:
            modes.append("own")
    return modes


def _cut(probe: Probe, n: int, **kwargs) -> Probe:
    """The first `n` messages of `probe`, with `kwargs` set."""
    return Probe(probe.messages[:n], {**probe.kwargs, **kwargs}, probe.needles[:n], probe.roles[:n],
                 probe.tool_call_flags[:n], probe.preamble)


def _end_of(probe: Probe, role: str, nth: int) -> int | None:
    """The number of messages up to the end of the `nth` run of `role` messages (0-based), if any."""
    ends = [i + 1 for i, r in enumerate(probe.roles) if r == role and (i + 1 == len(probe.roles) or probe.roles[i + 1] != role)]
    return ends[nth] if len(ends) > nth else None


def prompt_cuts(prober: Prober, probe: Probe) -> list[tuple[str, Probe, str]]:
    """The round-trip conversation cut where a server is given it, rendered with the generation
    prompt: after a user message (the second: a short render, where that message is the last one,
    as the template sees a request) and after tool results, unless the round-trip render itself
    ends there. A template whose source gives no BOS/EOS gets its family's common pair in these
    renders, so the delimiters derived without them are proved with them too. [(label, probe, render)]."""
    out = []
    tokens = family_special_tokens(prober.template)
    with_tokens = "".join(f", {k}={v!r}" for k, v in tokens.items())
    ends_with = probe.roles[-1] if probe.kwargs.get("add_generation_prompt") else None
    for label, role in (("after a user message", "user"), ("after tool results", "tool")):
        n = _end_of(probe, role, 1 if role == "user" else 0)
        if n is None or (ends_with == role and not tokens):
            continue  # none there, or the round-trip render itself ends there
        cut = _cut(probe, n, add_generation_prompt=True, **tokens)
        try:
            out.append((f"cut {label}{with_tokens}", cut, prober.render(cut)))
        except RenderError:
            continue  # a template may refuse to end there
    return out


# Requests an agent sends that the round-trip conversation does not hold, each rendered and proved
# on its own: (label, spec after the system message). A template may write a lone result otherwise
# than several (as a user turn when it is the only one), a user message right after tool results
# into their turn with no start of its own (DeepSeek V4 Flash), or a call right after results into their
# span (Apertus): the round trip puts an answer after every batch of results.
AGENT_REQUESTS = (("the request after a single tool round", "U1 C1(G1) T1"),
                  ("the request after a user message that follows tool results", "U1 C1(G1) T1 U2"),
                  ("the request after a tool call that follows tool results", "U1 C1(G1) T1 D2(G2) T2"),
                  ("the request after a tool call with text that follows tool results", "U1 C1(G1) T1 C2(G2) T2"))
# Shapes every template is given besides: the round trip always starts with a system message and
# asks for the generation prompt, where the most common request has no system message (a template
# may open a first user message otherwise then) and a trainer renders a conversation that ends with
# an answer (a template may write the last answer otherwise). (label, spec, system first, prompt)
OTHER_SHAPES = (("the request without a system message", "U1 A1 U2", False, True),
                ("the conversation that ends with an answer, as a trainer renders it", "U1 A1 U2 A2", True, False))


def agent_requests(prober: Prober, system_mode: str, tool_probe: ToolProbe, tools: ToolFindings,
                   builder: ProbeBuilder | None = None):
    """The `AGENT_REQUESTS` the template renders, with the generation prompt, where it renders tool
    rounds, and the `OTHER_SHAPES` (with `builder`, the round trip's); one it refuses is no request a
    server is given, and one whose assistant messages it does not show is another's to prove (a
    template that prints no call's text, or no call at all). A call or a user message right after
    results is evidence for its start (`_collect`). [(label, probe, render)]."""
    head = "" if system_mode == "rejected" else "S1 "
    wanted = []
    if tools.placement not in (None, "rejected", "unknown", "dropped") and tool_probe.builder is not None:
        wanted += [(label, tool_probe.builder, head + spec, True) for label, spec in AGENT_REQUESTS]
    if builder is not None:
        wanted += [(label, builder, (head if system else "") + spec, prompt) for label, spec, system, prompt in OTHER_SHAPES]
    out = []
    for label, chosen, spec, prompt in wanted:
        text, probe, _, _ = prober.attempt(chosen, spec, add_generation_prompt=prompt)
        if text is None:
            continue
        seen = Seen(text, probe)
        if not all(seen.found(i) for i, role in enumerate(probe.roles) if role == "assistant"):
            continue
        _collect(prober, seen, ("tool", "call"))
        _collect(prober, seen, ("tool", "user"))
        out.append((label, probe, text))
    return out


def _collect(prober: Prober, seen: Seen, pair: tuple[str, str]) -> None:
    """The texts between a `pair` of neighbours in `seen`, as evidence for that context's start (a
    call or a user message right after results). Only that context's: a template's other starts
    are cut from the probes and the round trip, and these requests are what proves them."""
    for i in range(1, len(seen.probe.roles)):
        if (seen.kind(i - 1), seen.kind(i)) == pair and (seg := seen.between(i - 1, i)) is not None:
            prober.segs.setdefault(pair, []).append(seg)


def with_modes(requests, system_mode: str, tools: ToolFindings):
    """`agent_requests` with each one's message modes under the final tool findings: the round
    trip's `cuts` of a conversation of their own. [(label, probe, render, modes)]. A conversation
    that ends with an answer may write that answer inside a reasoning block it opens and never
    closes (`<think>\n` then the answer, a reasoning model's): its content may lie anywhere in
    its turn ('own_turn'), as no delimiter can part answer from reasoning there."""
    out = []
    for label, probe, text in requests:
        modes = _cut_modes(probe, text, message_modes(probe, system_mode, tools))
        if not probe.kwargs.get("add_generation_prompt") and probe.roles[-1] == "assistant" and modes[-1] == "own":
            modes = modes[:-1] + ["own_turn"]
        out.append((label, probe, text, modes))
    return out


def _cut_modes(cut: Probe, text: str, modes: list[str]) -> list[str]:
    """`modes` for a cut conversation: a system prompt the template writes only before a final user
    message (Mistral Nemo) is dropped when the conversation ends otherwise."""
    return ["dropped" if role == "system" and cut.needles[i][0] not in text else mode
            for i, (role, mode) in enumerate(zip(cut.roles, modes))]


def round_trip(probe: Probe, text: str | None, error, variants, delimiters, modes: list[str], cuts=()) -> RoundTrip:
    """The verdict over the plain render, every render with a thinking switch set (`variants`:
    (switch, render)), and other renders of the conversation (`cuts`: (label, probe, render): cut
    where a server is given it, with common BOS/EOS strings; or (label, probe, render, modes): a
    conversation of its own, `agent_requests`); another render's problems are reported once more only
    where they differ from the plain render's."""
    if text is None:
        return RoundTrip(False, (), (), (f"the round-trip conversation does not render: {template_message(error)}",),
                         messages=tuple(probe.conversation()), render_kwargs=dict(probe.kwargs))
    result = round_trip_verdict(text, probe, delimiters, modes)
    base = result.problems
    others = [(f"with {switch}", probe, other, modes) for switch, other in variants]
    others += [(label, cut, other, _cut_modes(cut, other, modes)) if not own else (label, cut, other, own[0])
               for label, cut, other, *own in cuts]
    for label, other_probe, other_text, other_modes in others:
        other = round_trip_verdict(other_text, other_probe, delimiters, other_modes)
        if not other.passed:
            result = replace(result, passed=False, problems=result.problems + tuple(
                f"{label}: {p}" for p in other.problems if p not in base))
        if other.notes:
            result = replace(result, notes=result.notes + tuple(f"{label}: {n}" for n in other.notes if n not in result.notes),
                             stray_reasoning=result.stray_reasoning or other.stray_reasoning)
    return result


class _Placement:
    """Which spans each message's content lies in, and the problems found placing them."""

    def __init__(self, spans, seen: Seen, modes: list[str], reasoning_spans: bool):
        self.spans = spans
        self.reasoning_spans = reasoning_spans  # reasoning has a start delimiter: it must lie in a reasoning span
        self.starts = [s.start for s in spans]
        self.seen = seen
        self.modes = modes
        self.problems: list[str] = []
        self.notes: list[str] = []  # delimiters that match where no message starts, misleading no consumer
        self.stray: list[str] = []  # reasoning markup matched outside an assistant turn
        self.stray_spans: list[int] = []  # ... the indexes of those spans
        self.roles = self._turn_roles()
        self.any_reasoning = any(role in REASONING_ROLES for role in self.roles)
        self.owner: dict[int, int] = {}  # span index -> message index
        self.spans_of: dict[int, list[int]] = {}  # message index -> its span indexes
        self.last_span: dict[int, int] = {}  # message index -> the span its content ends in
        for i in range(len(modes)):
            self._place(i)

    def _turn_roles(self) -> list[str]:
        """Each span's role, where a reasoning span that does not follow an assistant turn's span
        takes the role of the turn it lies in. Reasoning markup quoted inside another turn (Command
        R7B's system prompt names `<|START_THINKING|>`; Laguna's shows `</think>` in its tool-call
        example) starts no role, so no role is misread: it is reported as a warning, not a failure."""
        roles: list[str] = []
        for s in self.spans:
            role = s.role
            if role in REASONING_ROLES and roles and _turn_role(roles[-1]) != "assistant":
                self.stray.append(f"{_a(role)} delimiter matches inside {_a(roles[-1])} turn (character {s.start} of the round-trip render)")
                self.stray_spans.append(len(roles))
                role = roles[-1]
            roles.append(role)
        return roles

    def expected_role(self, i: int) -> str:
        """The role of the spans message `i` owns: its own, or 'user' for a system message the
        template renders as a user turn of its own."""
        return "user" if self.modes[i] == "as_user" else self.seen.probe.roles[i]

    def describe(self, i: int) -> str:
        return f"message {i} ({self.seen.probe.roles[i]})"

    def _place(self, i: int) -> None:
        mode, role = self.modes[i], self.expected_role(i)
        if not self.seen.found(i):
            if mode != "dropped":
                self.problems.append(f"{self.describe(i)}: its content is not in the render")
            return
        if mode == "dropped":
            self.problems.append(f"{self.describe(i)}: rendered, though the analysis found that the template drops it")
            return
        if mode == "as_user":
            self.problems.append(f"{self.describe(i)}: rendered as a user turn of its own, so a prefill engine sees a user "
                                 "start where no user message begins")
        for pos in (p for p in self.seen.pos[i] if p >= 0):
            k = bisect.bisect_right(self.starts, pos) - 1
            self.last_span[i] = max(self.last_span.get(i, k), k)
            if mode == "before":
                if k >= 0:
                    self.problems.append(f"{self.describe(i)}: its content lies in {_a(self.roles[k])} span, expected before the first delimiter")
            elif k < 0:
                self.problems.append(f"{self.describe(i)}: its content lies before the first delimiter")
            elif mode == "in_user":
                if self.roles[k] != "user":
                    self.problems.append(f"{self.describe(i)}: folded into a user turn, but its content lies in {_a(self.roles[k])} span")
            elif mode in ("continues", "continues_or_own") and self._continues_in(i, k):
                continue
            elif mode == "continues" and self._continued(i) is not None and _turn_role(self.roles[k]) != role:
                self.problems.append(f"{self.describe(i)}: continues the turn before it, but its content lies in "
                                     f"{_a(self.roles[k])} span")
            elif _turn_role(self.roles[k]) != role:
                self.problems.append(self._misread(i, k))
            elif self.any_reasoning and mode != "own_turn" and self._misplaced_reasoning(i, pos, self.roles[k]):
                self.problems.append(f"{self.describe(i)}: {self._misplaced_reasoning(i, pos, self.roles[k])}")
            elif self.owner.setdefault(k, i) != i:
                self.problems.append(f"{self.describe(i)}: shares one span with {self.describe(self.owner[k])}")
            elif k not in self.spans_of.setdefault(i, []):
                self.spans_of[i].append(k)
                if mode == "continues" and self._continued(i) is not None:
                    # Written on in the turn before it, yet a start of its own role matches: it is read
                    # as a message of its role, which misleads nothing.
                    self.notes.append(f"{self.describe(i)}: the template writes it on in the turn before it, and "
                                      f"{_a(role)} start opens a span of its own there: it is read as {_a(role)} message, "
                                      "which misleads no consumer")

    def _misread(self, i: int, k: int) -> str:
        """The problem of message i's content lying in span k of another role, in words a template's
        publisher can act on where the template itself leaves out the marker: an assistant turn right
        after a message in whose span it lies has no start of its own there."""
        got, role = self.roles[k], self.expected_role(i)
        if (role, got) == ("tool", "user"):
            return f"{self.describe(i)}: its content lies in a user span: a tool response classified as a user message"
        prev = i - 1
        if role == "assistant" and prev >= 0 and self.last_span.get(prev) == k:
            between = (self.seen.between(prev, i) or "").split(TOOL_NAME)[0].split(CALL_ID_FORMAT[:2])[0]
            shown = repr(between if len(between) <= 60 else between[:57] + "...")
            turn = "tool-call turn" if self.seen.probe.tool_call_flags[i] else "answer"
            gap = f"only {shown}" if between.strip() else "nothing between them"
            return (f"{self.describe(i)}: the template writes no assistant start before this {turn}: it follows the "
                    f"{self.seen.probe.roles[prev]} message with {gap}, so it lies in that message's {got} span; "
                    "the template should open an assistant turn there")
        return f"{self.describe(i)}: its content lies in {_a(got)} span"

    def _continues_in(self, i: int, k: int) -> bool:
        """Whether message i's content lies in span k, the span the message before it ends in."""
        before = self._continued(i)
        return before is not None and k == self.last_span[before]

    def _continued(self, i: int) -> int | None:
        """The message that message i continues: the last one rendered before it, where that is a
        tool result or an assistant turn (a tool-call turn whose results the template drops); None
        where there is none, and message i is then placed as a turn of its own."""
        prev = max((j for j in self.last_span if j < i), default=None)
        return prev if prev is not None and self.seen.probe.roles[prev] in ("tool", "assistant") else None

    def _misplaced_reasoning(self, i: int, pos: int, span_role: str) -> str:
        """Reasoning text must lie in a reasoning span of its turn, and content outside one."""
        message = self.seen.probe.messages[i]
        is_reasoning = bool(message.get("reasoning_content")) and self.seen.text.startswith(message["reasoning_content"], pos)
        if is_reasoning and self.reasoning_spans and span_role != "reasoning":
            return f"its reasoning lies in {_a(span_role)} span, not in a reasoning span"
        if not is_reasoning and span_role == "reasoning" and not self.seen.probe.tool_call_flags[i]:
            # (The text of a message with tool calls may be written as reasoning: gpt-oss puts it in
            # the analysis channel while the calls are in progress.)
            return "its content lies in a reasoning span"
        return ""

    def quotes_reasoning(self) -> bool:
        """Whether reasoning markup matched inside another role's turn ahead of that message's own
        content (the template's instructions quote the markers), rather than opening an answer that
        has no role marker of its own (DeepSeek V3.2's `<think>` right after tool results)."""
        return any(k in self.owner and self.seen.probe.roles[self.owner[k]] != "assistant" for k in self.stray_spans)

    def preamble_matches(self) -> list[str]:
        """Notes for user, assistant or tool starts that match in the text the template writes before
        the first message (a built-in preamble that describes the turn markup, a tool list under a
        shared marker): they move no boundary between messages, but a prefill engine sees a start there."""
        first = min(self.owner)
        return [f"{_a(s.role)} delimiter also matches in the text the template writes before the first message: it moves no "
                f"message boundary, but a prefill engine sees {_a(s.role)} start there"
                for s in self.spans[:first] if s.role in ("user", "assistant", "tool")]

    def adopt_empty_spans(self) -> None:
        """A span between the first and last message's spans that holds no content is a turn opener
        rendered without content (an assistant start before its tool calls) when a neighbouring span
        of the same role belongs to a message; otherwise a delimiter matches where no turn starts."""
        first, last = min(self.owner), max(self.owner)
        for k in range(first + 1, last):
            if k in self.owner:
                continue
            role = self.roles[k]
            nxt = next((n for n in range(k + 1, last + 1) if n in self.owner), None)
            prv = max((n for n in self.owner if n < k), default=None)
            for near in (nxt, prv):
                # (a user start that holds no content opens no user message's turn: a stray one)
                if role == "user":
                    continue
                if near is not None and _turn_role(self.roles[near]) == _turn_role(role):
                    self.owner[k] = self.owner[near]
                    self.spans_of[self.owner[near]].append(k)
                    break
            else:
                self._stray(k, role)

    def _stray(self, k: int, role: str) -> None:
        """A delimiter that matches where no message starts (a tool marker a system preamble names,
        Bielik's `<|function_output|>`): every message's content still lies in its own role's span
        (checked apart), so it fails only where a consumer is misled: a user start, where a server
        ends a batch and a trainer sees a user turn. Any other role's is a warning that says where
        it is and what it does."""
        start = self.spans[k].start
        prev = max((j for j in self.owner if j < k), default=None)
        inside = f"inside {_a(self.seen.probe.roles[self.owner[prev]])} message's turn" if prev is not None else "between turns"
        shown = self.seen.text[start:start + 40]
        if role == "user":
            self.problems.append(f"a user delimiter matches at character {start}, {inside}, where no message starts "
                                 f"({shown!r}...): a server ends a batch there and a span detector reads a user turn")
            return
        self.notes.append(f"{_a(role)} delimiter also matches at character {start} of the round-trip render, {inside}, where no "
                          f"message starts ({shown!r}...): no message's content moves, but a span detector opens {_a(role)} "
                          f"span there, and a server that breaks its batches at {role} starts breaks one there")

    def expected_roles(self) -> list[str]:
        """The span roles the messages call for; spans before the first message's span and after the
        last one hold only template text (a default system prompt, the generation prompt)."""
        roles, spans = self.seen.probe.roles, self.spans
        # (the last message's content may lie in a span of another role, reported already: the
        # generation prompt comes after that span)
        first, last = min(self.owner), max([*self.owner, *self.last_span.values()])
        expected = [s.role for s in spans[:first]]
        order = []
        for i in range(len(roles)):
            ks = sorted(self.spans_of.get(i, []))
            if not ks:
                continue
            if ks != list(range(ks[0], ks[-1] + 1)):
                self.problems.append(f"{self.describe(i)}: its content is split over spans of other messages")
            order.append(ks[0])
            # Spans inside the turn (its reasoning) keep their own role.
            own = self.expected_role(i)
            expected.extend(spans[k].role if spans[k].role in REASONING_ROLES else own for k in ks)
        if order != sorted(order):
            self.problems.append("messages are not in their order in the spans")
        for k in range(first + 1, last + 1):
            if k not in self.owner:
                expected.insert(min(k, len(expected)), spans[k].role)  # reported already; keeps the lists aligned
        for k in range(last + 1, len(spans)):
            # After the last message comes only the generation prompt (with what the template adds
            # before it, like Command R+'s closing system instructions): a prefill engine sees it at
            # the end of every request, so no user or tool start may match inside it.
            if spans[k].role in ("user", "tool"):
                self.problems.append(f"{_a(spans[k].role)} delimiter {GENERATION_PROMPT_MATCH}, at character {spans[k].start}")
        expected.extend(s.role for s in spans[last + 1:])
        return expected


def round_trip_verdict(text: str, probe: Probe, delimiters, modes: list[str]) -> RoundTrip:
    """Split the round-trip render and check every message against the spans.

    Each message the template renders as a turn of its own must own the spans its content lies in
    (one, or several of its role when the template renders it as several turns, like one turn per
    tool call), in message order. A system prompt folded into a user turn must lie in a user span, one
    rendered before any delimiter must lie before the first span, and an answer that the template
    continues inside the tool turn before it must lie in that span. The round trip passes only if
    the spans' roles are exactly the roles expected and no tool response lies in a user span.
    """
    spans = split_text(text, delimiters)
    placed = _Placement(spans, Seen(text, probe), modes, any(d.role == "reasoning" for d in delimiters))
    actual = tuple(s.role for s in spans)
    messages, render_kwargs = tuple(probe.conversation()), dict(probe.kwargs)
    if not placed.owner:
        return RoundTrip(False, (), actual, tuple(dict.fromkeys(placed.problems)) or ("no message lies in any span",),
                         messages=messages, render_kwargs=render_kwargs, rendered=text)
    placed.adopt_empty_spans()
    expected = placed.expected_roles()
    problems = placed.problems
    if tuple(expected) != actual and not problems:
        problems.append(f"span roles {list(actual)} differ from the expected {expected}")
    passed = not problems and tuple(expected) == actual
    notes = tuple(dict.fromkeys(placed.stray + placed.preamble_matches() + placed.notes))
    return RoundTrip(passed, tuple(expected), actual, tuple(dict.fromkeys(problems)), notes=notes,
                     stray_reasoning=placed.quotes_reasoning(), messages=messages, render_kwargs=render_kwargs, rendered=text)


def extend_back(delim: str, contexts: Sequence[str], passes: Callable[[str], bool]) -> str | None:
    """`delim` extended back (to the left) over the text every context ends with (the text before
    each content of its role), to the shortest form starting at a markup boundary that `passes`;
    None where `delim` does not end that text or no longer form passes.

    A start cut as short as its contexts allow (`user\\n\\n ` where the previous turn's closer is
    ` <step> Source: `) may match inside the generation prompt (`Destination: user\\n\\n `); the
    markup before it in every render of the role is what tells the turn apart.

    >>> extend_back("user: ", ["<step> Source: user: ", "Source: user: "], lambda d: d.startswith("S"))
    'Source: user: '
    """
    if not delim or not contexts:
        return None
    first = contexts[0]
    shared = first[len(first) - min(lcs(first, c) for c in contexts):]
    if not shared.endswith(delim):
        return None
    k, tried = len(shared) - len(delim), delim
    while k > 0:
        k = back_to_boundary(shared, k - 1)
        candidate = shared[k:].lstrip()
        if candidate != tried and passes(candidate):
            return candidate
        tried = candidate
    return None


def replaced(delimiters, role: str, old: str, new: str) -> tuple[Delimiter, ...]:
    """`delimiters` with the `role` delimiter `old` replaced by `new`, longest first."""
    return sort_delimiters(Delimiter(d.role, new) if (d.role, d.text) == (role, old) else d for d in delimiters)
