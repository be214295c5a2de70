"""Tool-call arguments as a template expects them: JSON strings, or objects for templates that read them.

OpenAI-style clients send `arguments` as a JSON string. llama.cpp keeps them so, and parses them
into objects only for a template that reads what is inside them when given an object (its jinja
capability `supports_object_arguments`, vendored `common/jinja/caps.cpp`: rendering touches
`arguments.arg`, `tojson` included, then `func_args_not_string` in `common/chat.cpp`). Qwen3.5
iterates `arguments|items` and needs objects; functionary v3.2 concatenates `arguments` to a string
and fails on one. tmplkit renders what llama-server renders, so it decides the same way, once per
template: the server setting on the C++ check's own probe (`server_object_arguments`), the
transformers setting on a one-call conversation, keeping objects where that does not render
(`object_arguments`: transformers passes what the trainer gives, objects in its documentation).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache

from ..errors import InputError, RenderLimitError, TmplkitError
from ..jsonio import NotJsonNumber, number_problem, strict_loads
from ..sandbox import render
from ..sources.templates import ChatTemplate, family_special_tokens
from ._handlers import server_handler
from ._inputs import DEFAULT_INPUTS, given_messages, server_refuses, session_render
from ._workarounds import as_server_prepares

__all__ = ["messages_for", "object_arguments", "reads_thinking", "reasoning_for", "server_object_arguments",
           "template_messages"]

_NEEDLE = "tmplkit-argument-7f3a"


def object_arguments(template: ChatTemplate) -> bool:
    """Whether `template` reads tool-call arguments as an object: rendered with `{"arg": ...}` as an
    object it succeeds and prints the value; else whether it refuses them as a string too (then the
    parsed form is kept, as before this decision existed). Cached by template text.

    >>> object_arguments(ChatTemplate("{% for m in messages %}{% for c in m.tool_calls | default([]) %}"
    ...                               "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}", "t", "-"))
    True
    >>> object_arguments(ChatTemplate("{% for m in messages %}{% for c in m.tool_calls | default([]) %}"
    ...                               "{{ '>>>' + c.function.arguments }}{% endfor %}{% endfor %}", "t", "-"))
    False
    """
    return _object_arguments(template.text, template.bos_token, template.eos_token, template.name)


@lru_cache(maxsize=256)
def _object_arguments(text: str, bos: str | None, eos: str | None, name: str) -> bool:
    template = ChatTemplate(text, name, "-", bos, eos)  # (named as the caller's: a limit error names it)
    if _shows_arguments(template, {"arg": _NEEDLE}):
        return True
    # Objects are not read. Strings are kept only where a template takes them: one that refuses the
    # probe for a reason of its own (a system message it requires, say) keeps the parsed form.
    return _shows_arguments(template, json.dumps({"arg": _NEEDLE})) is None


def server_object_arguments(template: ChatTemplate) -> bool:
    """Whether llama-server gives `template` tool-call arguments as objects: its capability check
    (caps.cpp, "single tool with object arguments support") renders a conversation of a call, its
    result, an answer and a user message with empty BOS and EOS, and says yes only where that
    succeeds and reads the argument. Where the render fails on what only Python's engine refuses
    (a list's `append`, which the sandbox forbids; a generator given to `tojson`), the C++ render
    would go on: the transformers setting's decision is kept. Cached by template text.

    >>> server_object_arguments(ChatTemplate("{% if messages[-1].role != 'user' %}{{ raise_exception('x') }}{% endif %}"
    ...     "{% for m in messages %}{% for c in m.tool_calls | default([]) %}{{ c.function.arguments | tojson }}"
    ...     "{% endfor %}{% endfor %}", "t", "-"))
    True
    """
    return _server_object_arguments(template.text, template.bos_token, template.eos_token, template.name)


# What only Python's engine refuses, where the C++ engine renders on.
_PYTHON_ONLY = ("is unsafe", "is not JSON serializable")


@lru_cache(maxsize=256)
def _server_object_arguments(text: str, bos: str | None, eos: str | None, name: str) -> bool:
    template = ChatTemplate(text, name, "-")  # (BOS and EOS empty, as the C++ check renders)
    messages = [{"role": "user", "content": "User message"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": {"arg": _NEEDLE}}}]},
                {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                {"role": "assistant", "content": "The tool response was 'tool response'"},
                {"role": "user", "content": "User message"}]
    try:
        out = session_render(render, template, messages, tools=_CHECK_TOOLS, add_generation_prompt=True,
                             bos_token="", eos_token="")
    except RenderLimitError:
        raise  # (past the session's time or memory on a probe: its renders would be)
    except TmplkitError as exc:
        if any(why in str(exc) for why in _PYTHON_ONLY):
            return _object_arguments(text, bos, eos, name)
        return False  # (the C++ check's default where its render fails)
    return _NEEDLE in out


# The C++ check's tool, as it writes it (a template may print any of its fields).
_CHECK_TOOLS = [{"name": "tool", "type": "function", "function": {
    "name": "tool1", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                   "required": ["arg"]}}}]
_TOOLS = [{"type": "function", "function": {"name": "tool1", "description": "Tool 1",
                                            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}},
                                                           "required": ["arg"]}}}]


def _shows_arguments(template: ChatTemplate, arguments) -> bool | None:
    """Whether a one-call conversation with `arguments` renders the needle; None where it does not render."""
    messages = [{"role": "user", "content": "User message"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call00001", "content": "Tool response"}]
    try:
        out = session_render(render, template, messages, tools=_TOOLS, add_generation_prompt=True,
                             **family_special_tokens(template))
    except RenderLimitError:
        raise  # (past the session's time or memory on a probe: its renders would be; not tried again)
    except TmplkitError:
        return None
    return _NEEDLE in out


def messages_for(template: ChatTemplate, messages, inputs: str = DEFAULT_INPUTS) -> list[dict]:
    """`messages` as `template` is given them by the `inputs` engine (`session._inputs`): tool-call
    arguments parsed into objects where the template reads them as objects, else left as the engine
    gives them. "server": as llama-server reads and writes them again, a null content as `""`, its
    workarounds for what the template reads (`_workarounds`), and an assistant's `reasoning_content`
    also under `thinking` where llama-server gives it so (`reasoning_for`); a request llama-server
    refuses is refused here in one line. "transformers": null contents left for the sandbox to drop
    and reasoning under both names, as transformers gives them."""
    messages = list(messages)
    if inputs != "server":
        return template_messages(given_messages(messages, inputs), parse_arguments=object_arguments(template))
    if (why := server_refuses(messages)) is not None:
        raise InputError(why)
    given = as_server_prepares(template, given_messages(messages, inputs))
    return reasoning_for(template, template_messages(given, parse_arguments=server_object_arguments(template)))


def reads_thinking(template: ChatTemplate) -> bool:
    """Whether llama-server gives `template` an assistant's reasoning under `thinking` as well: the
    templates its gpt-oss and LFM2 / LFM2.5 handlers take (`server_handler`)."""
    return server_handler(template) in ("GPT-OSS", "LFM2", "LFM2.5")


def _gpt_oss(template: ChatTemplate) -> bool:
    return server_handler(template) == "GPT-OSS"


def reasoning_for(template: ChatTemplate, messages: list[dict]) -> list[dict]:
    """`messages` with each message's `reasoning_content` copied to `thinking` where llama-server
    does that for the template (`reads_thinking`; common/parsers/gpt-oss.cpp:7-11, lfm2.cpp:27-31:
    "Copy reasoning to the 'thinking' field the template expects"), and, for gpt-oss, the content
    of such a message with tool calls left out (gpt-oss.cpp:12-14: its template refuses a tool-call
    turn with both); unchanged elsewhere."""
    if not reads_thinking(template):
        return messages
    erase = _gpt_oss(template)
    out = []
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if erase and m.get("tool_calls"):
                del m["content"]
        out.append(m)
    return out


def template_messages(messages: Iterable[dict], *, parse_arguments: bool = True) -> list[dict]:
    """Messages as chat templates expect them: tool-call arguments as objects, not JSON strings
    (`parse_arguments=False`: as they were given; `messages_for` decides per template, as llama-server
    does).

    OpenAI-style logs keep `arguments` as a JSON string; templates such as Qwen's iterate over them
    as a mapping, and llama-server parses them before rendering for such templates. Arguments that
    are not valid JSON are the conversation's error, named by message, as llama-server refuses them
    (common/chat.cpp parses them with json::parse) rather than the template's.
    """
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls") and parse_arguments:
            m["tool_calls"] = [_parsed_call(c, i) for c in m["tool_calls"]]
        out.append(m)
    return out


def _parsed_call(call: dict, index: int = 0) -> dict:
    # Copied along the path it changes (the call, its function): the caller's messages stay as they
    # were, and the sandbox copies the rest as it prepares the message.
    call = dict(call)
    fn = call.get("function", call)
    if isinstance(fn, dict) and fn is not call:
        fn = call["function"] = dict(fn)
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if isinstance(args, str):
        try:
            fn["arguments"] = strict_loads(args)  # (NaN refused, as llama-server's json::parse does)
        except json.JSONDecodeError as exc:
            shown = args if len(args) <= 40 else args[:40] + "..."
            raise InputError(f"message [{index}]: the tool call's arguments are not valid JSON ({exc.msg}, column "
                             f"{exc.colno}): {shown!r}; the template reads them as an object, as llama-server "
                             "parses them; fix the conversation") from None
        except NotJsonNumber as exc:
            raise InputError(f"message [{index}]: the tool call's arguments hold {exc} (llama-server refuses it); "
                             "fix the conversation") from None
        except ValueError as exc:
            raise InputError(f"message [{index}]: the tool call's arguments hold {number_problem(exc)}; "
                             "fix the conversation") from None
        except RecursionError:
            raise InputError(f"message [{index}]: the tool call's arguments are nested too deeply to read; "
                             "fix the conversation") from None
    return call
