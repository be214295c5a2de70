"""Which engine's message preparation a render follows: llama-server's or transformers'.

The two engines give a template the same conversation in two ways where a message has no content:

- "server" (llama-server): every message reaches the template with a `content`; a null or missing
  one becomes `""` (the vendored common/chat.cpp, `common_chat_msg::to_json_oaicompat`: `else
  { jmsg["content"] = ""; }`), so a tool-call turn an OpenAI-style client sends with
  `content: null` renders with an empty content, as `m.content` and `m['content'] | length` read it;
- "transformers" (`apply_chat_template`): null-valued keys are dropped (`_normalize_chat_messages`),
  so `content: null` reaches the template as no `content` key at all, where `m.content` is undefined.

The turns study, the replay, the resume check and the request bodies render as a server does
("server", the default); training masks render as a trainer does ("transformers").

    >>> given_messages([{"role": "assistant", "content": None, "tool_calls": []}], "server")
    [{'role': 'assistant', 'content': '', 'tool_calls': []}]
    >>> given_messages([{"role": "assistant", "content": None}], "transformers")
    [{'role': 'assistant', 'content': None}]
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import InputError

__all__ = ["DEFAULT_INPUTS", "INPUTS", "check_inputs", "given_messages", "inputs_note"]

INPUTS = ("server", "transformers")
DEFAULT_INPUTS = "server"


def check_inputs(inputs: str) -> str:
    """`inputs` when it names a preparation, else a one-line InputError."""
    if inputs not in INPUTS:
        raise InputError(f"unknown inputs {inputs!r}: give 'server' (as llama-server gives messages: a null content "
                         "as \"\") or 'transformers' (as apply_chat_template: null-valued keys dropped)")
    return inputs


def given_messages(messages: Iterable[dict], inputs: str) -> list[dict]:
    """`messages` as the `inputs` engine gives them to a template, before the sandbox's own
    preparation (which drops the null-valued keys that remain, as both engines leave them out)."""
    check_inputs(inputs)
    if inputs == "transformers":
        return list(messages)
    messages = list(messages)
    _server_reads_arguments(messages)
    return [{**m, "content": ""} if m.get("content") is None else m for m in messages]


def _server_reads_arguments(messages: list[dict]) -> None:
    """llama-server refuses a request whose tool call has no `arguments` (the vendored
    common/chat.cpp, `common_chat_msgs_parse_oaicompat`: `fc.at("arguments")`): the session is
    refused so, not the template that would then fail on it."""
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or ()):
            fn = call.get("function", call) if isinstance(call, dict) else None
            if isinstance(fn, dict) and "arguments" not in fn:
                raise InputError(f"message {i} ({m.get('role')}): tool_calls[{j}] ({fn.get('name')}) has no 'arguments', "
                                 "which llama-server refuses (it reads function.arguments); give them, {} where the "
                                 "function takes none")


def inputs_note(inputs: str) -> str:
    """What the `inputs` preparation does, in words for a report."""
    if check_inputs(inputs) == "server":
        return "messages as llama-server gives them: a null or missing content as \"\""
    return "messages as transformers' apply_chat_template gives them: null-valued keys dropped"
