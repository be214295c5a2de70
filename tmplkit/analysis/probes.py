"""Probe conversations for differential analysis.

Every message of a probe carries a needle: a short unique string that no template contains, so
its position in a render tells exactly where that message's content went. Probes differ from one
another by one message, and `Shape` holds the adaptations a template needs (content as a list of
parts, tool-call arguments as a JSON string, flat tool schemas, ...); the analysis tries shapes
in the fixed order of the `*_SHAPES` tuples below and keeps the first one the template accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ..sandbox import PINNED_NOW, REASONING_KEYS

# The function every tool probe declares and calls. Its name, the call ids and the argument values
# vary per call in real conversations, so a delimiter is cut where one of them appears.
TOOL_NAME = "kq_lookup"
# The probe tool's one argument: a real call's arguments are named otherwise, so no delimiter holds it.
ARGUMENT = "query"
TOOL_DESCRIPTION = "Look up a record."
# The system message given to templates that cannot render a chat without one (Shape.system_first).
SYSTEM_PREAMBLE = "You are a helpful assistant."
# Mistral templates require tool-call ids of exactly 9 alphanumeric characters; others take any.
CALL_ID_FORMAT = "Kq{:02d}call0"


@dataclass(frozen=True)
class Shape:
    """How probe messages and tools are shaped for one template."""

    content_parts: bool = False  # content as [{"type": "text", "text": ...}] instead of a string
    string_arguments: bool = False  # tool-call arguments as a JSON string instead of an object
    flat_tools: bool = False  # tools as {"name", "description", "parameters"} (no "function" wrapper)
    tools_list: bool = True  # pass the tools list at all (some templates only fail on it)
    parallel_calls: bool = True  # several calls in one assistant message
    tools_always: bool = False  # declare tools even in plain chat (templates that iterate `tools` unguarded)
    call_content: bool = True  # give assistant messages with tool calls a text content too
    tool_calls: bool = True  # False: tool responses follow a plain assistant message (calls rejected)
    system_first: bool = False  # start every conversation with a system message (templates that need one)
    extra: tuple[tuple[str, object], ...] = ()  # extra template variables (e.g. Firefunction's `functions`)

    def with_extra(self, name: str, value) -> Shape:
        return replace(self, extra=self.extra + ((name, value),))

    def describe(self) -> list[str]:
        """The adaptations in use, for Analysis.capabilities['adaptations']."""
        out = []
        if self.content_parts:
            out.append("content_parts")
        if self.string_arguments:
            out.append("string_arguments")
        if self.flat_tools:
            out.append("flat_tools")
        if not self.tools_list:
            out.append("no_tools_list")
        if not self.parallel_calls:
            out.append("single_call_per_message")
        if self.tools_always:
            out.append("tools_always")
        if not self.call_content:
            out.append("no_text_with_tool_calls")
        if not self.tool_calls:
            out.append("tool_responses_without_calls")
        if self.system_first:
            out.append("system_first")
        out.extend(f"variable:{name}" for name, _ in self.extra)
        return out


BASE_SHAPE = Shape()
# Chat shapes, tried in this order until basic chat renders.
CHAT_SHAPES = (
    Shape(),
    Shape(content_parts=True),
    Shape(tools_always=True),
    Shape(tools_always=True, flat_tools=True),
    Shape(tools_always=True, content_parts=True),
)
# Tool shapes (applied on top of the chat shape), tried in this order until a tool round renders.
TOOL_SHAPES: tuple[dict[str, Any], ...] = (
    dict(),
    dict(string_arguments=True),
    dict(flat_tools=True),
    dict(flat_tools=True, string_arguments=True),
    dict(tools_list=False),
    dict(tools_list=False, string_arguments=True),
    dict(tool_calls=False),
)


def _tool_schema(shape: Shape) -> dict:
    function = {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {ARGUMENT: {"type": "string", "description": "What to look up."}},
            "required": [ARGUMENT],
        },
    }
    return function if shape.flat_tools else {"type": "function", "function": function}


def tools_for(shape: Shape) -> list[dict] | None:
    return [_tool_schema(shape)] if shape.tools_list else None


# Variables some templates read besides the standard ones; supplied when a render says they are
# undefined. Values are plain strings, as the models' own tooling passes them.
def extra_variable(name: str, shape: Shape):
    if name == "functions":
        return json.dumps([_tool_schema(replace(shape, flat_tools=True))], indent=4)
    if name == "datetime":
        return PINNED_NOW.strftime("%Y-%m-%d %H:%M")
    if name == "date_string":
        return PINNED_NOW.strftime("%d %b %Y")
    if name in ("bos_token", "eos_token"):
        return ""  # a bare .jinja carries no special tokens; templates that need one get an empty string
    return None


EXTRA_VARIABLES = ("functions", "datetime", "date_string", "bos_token", "eos_token")

# Template variables that switch thinking/reasoning, with the values probed for each.
THINKING_FLAGS: tuple[tuple[str, tuple], ...] = (
    ("enable_thinking", (False, True)),
    ("thinking", (False, True)),
    ("reasoning_effort", ("low", "high")),
    ("thinking_mode", ("off", "on")),
    ("reasoning", (False, True)),
)


class Needles:
    """Unique strings for message contents, guaranteed absent from the template text.

    Needles are letters and digits only, so no template escapes, splits or reformats them
    (contents are sometimes trimmed, JSON-encoded or split on `</think>`).
    """

    def __init__(self, template_text: str):
        salt = 0
        while f"Kq{salt or ''}" in template_text:
            salt += 1
        self.prefix, self.suffix = f"Kq{salt or ''}", "Zx"

    def __call__(self, tag: str) -> str:
        return f"{self.prefix}{tag}{self.suffix}"


@dataclass
class Probe:
    """One probe conversation: its messages, its render kwargs and each message's needles."""

    messages: list[dict]
    kwargs: dict
    needles: list[tuple[str, ...]]  # per message: content needle first, then tool-call argument needles
    roles: list[str] = field(default_factory=list)
    tool_call_flags: list[bool] = field(default_factory=list)
    # Messages rendered before `messages` but probed by none (the system message a template needs).
    preamble: list[dict] = field(default_factory=list)

    def conversation(self) -> list[dict]:
        """Every message rendered: the preamble, then the probed messages."""
        return self.preamble + self.messages


class ProbeBuilder:
    """Builds probe conversations of one shape with fresh needles."""

    def __init__(self, needles: Needles, shape: Shape = BASE_SHAPE):
        self.needles = needles
        self.shape = shape
        self._calls = 0

    def with_shape(self, shape: Shape) -> ProbeBuilder:
        return ProbeBuilder(self.needles, shape)

    def _content(self, text: str):
        return [{"type": "text", "text": text}] if self.shape.content_parts else text

    def message(self, role: str, tag: str) -> tuple[dict, tuple[str, ...]]:
        needle = self.needles(tag)
        return {"role": role, "content": self._content(needle)}, (needle,)

    def tool_call_message(self, tag: str, arg_tags: tuple[str, ...], text: bool = True) -> tuple[dict, tuple[str, ...], list[str]]:
        content = self.needles(tag) if self.shape.call_content and text else ""
        calls, arg_needles, ids = [], [], []
        for arg_tag in arg_tags:
            self._calls += 1
            call_id = CALL_ID_FORMAT.format(self._calls)
            arg = self.needles(arg_tag)
            arguments = {ARGUMENT: arg}
            calls.append({
                "id": call_id,
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": json.dumps(arguments) if self.shape.string_arguments else arguments},
            })
            arg_needles.append(arg)
            ids.append(call_id)
        if not self.shape.tool_calls:
            content = self.needles(tag)
            return {"role": "assistant", "content": self._content(content)}, (content,), ids
        msg = {"role": "assistant", "content": self._content(content), "tool_calls": calls}
        return msg, ((content,) if content else ()) + tuple(arg_needles), ids

    def tool_message(self, tag: str, call_id: str) -> tuple[dict, tuple[str, ...]]:
        needle = self.needles(tag)
        return {"role": "tool", "tool_call_id": call_id, "name": TOOL_NAME, "content": self._content(needle)}, (needle,)

    def _reason(self, msg: dict, tag: str) -> str:
        """Give `msg` the reasoning needle `tag` under every key templates read it from."""
        needle = self.needles(tag)
        msg.update((key, needle) for key in REASONING_KEYS)
        return needle

    def build(self, spec: str, *, add_generation_prompt: bool = False, tools: bool | None = None) -> Probe:
        """Build a conversation from a compact spec, e.g. "S1 U1 A1 U2 C1(G1,G2) T1 T2 A3".

        Letters: S system, U user, A assistant (`A1/R1`: with reasoning content R1), C assistant
        with tool calls (argument needles in parentheses; `C1/R1(G1)`: with reasoning content R1),
        D the same with no text content (as agents mostly send calls), T tool response (answering
        the calls in order). `tools` defaults to passing the tools list whenever the spec has tool
        calls.
        """
        self._calls = 0
        messages, needles, roles, flags = [], [], [], []
        pending_ids: list[str] = []
        for item in spec.split():
            kind = item[0]
            if kind in "CD":
                tag, _, args = item.partition("(")
                tag, _, reasoning = tag.partition("/")
                arg_tags = tuple(a for a in args.rstrip(")").split(",") if a)
                msg, nd, ids = self.tool_call_message(tag, arg_tags, text=kind == "C")
                if reasoning:
                    nd = nd + (self._reason(msg, reasoning),)
                pending_ids.extend(ids)
                role = "assistant"
            elif kind == "T":
                call_id = pending_ids.pop(0) if pending_ids else CALL_ID_FORMAT.format(99)
                msg, nd = self.tool_message(item, call_id)
                role = "tool"
            else:
                role = {"S": "system", "U": "user", "A": "assistant"}[kind]
                tag, _, reasoning = item.partition("/")
                msg, nd = self.message(role, tag)
                if reasoning:
                    nd = nd + (self._reason(msg, reasoning),)
            messages.append(msg)
            needles.append(nd)
            roles.append(role)
            flags.append(kind in "CD")
        has_calls = any(flags) or "T" in {i[0] for i in spec.split()}
        kwargs: dict = {"add_generation_prompt": add_generation_prompt}
        wants_tools = self.shape.tools_always or (has_calls if tools is None else tools)
        if wants_tools and self.shape.tools_list:
            kwargs["tools"] = tools_for(self.shape)
        kwargs.update(dict(self.shape.extra))
        preamble = []
        if self.shape.system_first and roles[:1] != ["system"]:
            preamble = [{"role": "system", "content": self._content(SYSTEM_PREAMBLE)}]
        return Probe(messages, kwargs, needles, roles, flags, preamble)


def variable_strings() -> tuple[str, ...]:
    """Strings that vary from one real conversation to the next (the tool's name, call ids, also
    the id 0 the analysis writes over every id): delimiters end before them."""
    return (TOOL_NAME, *(CALL_ID_FORMAT.format(i) for i in range(100)))
