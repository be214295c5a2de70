"""The one conversation type, and loading and validating conversations and sessions given as JSON.

A conversation is what a client sends a server: the messages so far and the tool definitions. An
agent session is a conversation too (`Session` is the same type): the client sends it again, one
message longer each time, on every request.

A conversation is either a list of messages, or an object `{"messages": [...], "tools": [...]}`
(other keys of the object, e.g. session metadata, are ignored). Messages follow the chat format
transformers' `apply_chat_template` takes:

- `role` is one of system, user, assistant, tool, or developer (instructions, as OpenAI-style
  clients send them: given to a template as they are under transformers' preparation, as a
  system message under llama-server's but for gpt-oss, `session._workarounds`);
- `content` is a string, or a list of OpenAI-style text parts `[{"type": "text", "text": ...}]`
  (passed to the template as is, as transformers does; `Conversation.flattened()` joins them
  for templates that only take strings). Other part types (images, audio, files) are refused;
- an assistant message may have `tool_calls` instead of content; other keys
  (`reasoning_content`, `tool_call_id`, `name`, ...) are kept and passed through.

Every problem is reported as an InputError naming the file and the JSON path, e.g.
`session.json: messages[3].role is 'function'; ...`.

>>> c = load_conversation([{"role": "user", "content": "hi"}])
>>> c.messages[0]["content"], c.tools
('hi', None)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_output
from ..delimiters import ROLES
from ..errors import InputError
from ..jsonio import json_kind, lone_surrogate, lone_surrogate_problem, read_json, shape_problem, source_name, stdin
from ._client_formats import body_format, converted

__all__ = ["Conversation", "Session", "load_conversation", "load_session", "save_session", "session_from_json"]

# The roles a message may have: the delimiters' roles, and the instructions' role of OpenAI-style
# clients, which both engines take (see the module doc).
MESSAGE_ROLES = ROLES + ("developer",)
# Roles other chat formats use, and what to write instead.
_ROLE_HINTS = {
    "function": "tool",
    "ipython": "tool",
    "tool_result": "tool",
    "model": "assistant",
    "bot": "assistant",
    "gpt": "assistant",
    "human": "user",
}
_PART_HINT = 'only text parts ({"type": "text", "text": "..."}) are supported'


@dataclass(frozen=True)
class Conversation:
    """Messages (plain dicts, in order) and the tool definitions, if any (None: the conversation
    gives none; a session read from a file has `()` then); `source` names where it came from."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None = None
    source: str = ""

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"messages": [dict(m) for m in self.messages]}
        if self.tools is not None:
            out["tools"] = [dict(t) for t in self.tools]
        return out

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(m["role"] for m in self.messages)

    def flattened(self) -> Conversation:
        """The same conversation with every list of text parts joined into one string."""
        messages = []
        for m in self.messages:
            content = m.get("content")
            if isinstance(content, list):
                m = {**m, "content": "".join(part["text"] for part in content)}
            messages.append(m)
        return Conversation(tuple(messages), self.tools, self.source)

    def with_messages(self, extra) -> Conversation:
        """A new conversation with `extra` messages appended (e.g. the next user turn)."""
        return Conversation(tuple(self.messages) + tuple(extra), self.tools, self.source)


# An agent session: a conversation sent again, one turn longer, on every request.
Session = Conversation


def load_conversation(path_or_obj, *, source: str | None = None) -> Conversation:
    """Load a conversation from a JSON file path, an open file, or an already-parsed object.

    >>> load_conversation({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    ...                    "tools": []}).flattened().messages[0]["content"]
    'hi'
    """
    origins: list[str] | None = None
    if isinstance(path_or_obj, str) and path_or_obj == "-":  # standard input, as command-line tools read it
        path_or_obj, source = stdin("the conversation"), source or "<stdin>"
    if isinstance(path_or_obj, (str, os.PathLike)) or hasattr(path_or_obj, "read"):
        where = source or source_name(path_or_obj)
        data = read_json(path_or_obj, what="a conversation (a JSON list of messages)", where=where, stdin_ok=True,
                         strict_numbers=True)
    else:
        where = source or "<conversation>"
        data = path_or_obj.to_dict() if isinstance(path_or_obj, Conversation) else path_or_obj
        if (problem := shape_problem(data)) is not None:  # (a file's JSON cannot be such; Python values can)
            raise InputError(f"{where}: {problem}; give the conversation as JSON-like data")
        if (lone := lone_surrogate(data)) is not None:  # (a file's JSON is checked as it is read)
            raise InputError(f"{where}: {lone_surrogate_problem(lone)}")
    where = str(where)
    if isinstance(data, (list, tuple)) and body_format({"messages": list(data)}) == "anthropic":
        data = {"messages": list(data)}  # (an Anthropic body's messages saved alone: read as the body's)
    if isinstance(data, (list, tuple)):
        messages_value, tools_value, prefix = data, None, ""
    elif isinstance(data, dict):
        data, origins = converted(data, where)
        if "messages" not in data:
            hint = ""
            if "conversations" in data:
                hint = " (this looks like ShareGPT data; convert it to role/content messages)"
            raise InputError(
                f"{where}: expected a list of messages or an object with 'messages'; "
                f"the object has keys {_keys(data)}{hint}"
            )
        messages_value, tools_value, prefix = data["messages"], data.get("tools"), "messages"
    else:
        raise InputError(
            f"{where}: expected a list of messages or an object with 'messages', got {json_kind(data)}"
        )
    if not isinstance(messages_value, (list, tuple)):
        raise InputError(f"{where}: 'messages' must be a list of messages, got {json_kind(messages_value)}")
    if not messages_value:
        raise InputError(f"{where}: the conversation has no messages; give at least one")
    # (a converted body's message is named by where it came from in the body, the user's own place)
    messages = tuple(_check_message(m, origins[i] if origins else f"{prefix}[{i}]", where) for i, m in enumerate(messages_value))
    tools = None if tools_value is None else _check_tools(tools_value, where)
    return Conversation(messages, tools, where)


# --- sessions --------------------------------------------------------------------------------------


def load_session(path: str | os.PathLike) -> Conversation:
    """Read and validate a session file; any problem is one InputError line naming the cause.

    Validation is the conversation check (`load_conversation`); a session's tools are `()` when it gives none.
    `-` reads standard input.
    """
    if str(path) == "-":
        return _from_conversation(load_conversation("-"))
    p = Path(path)
    if not p.exists():  # (a folder, a pipe or a device: said for what it is by the guarded reader)
        raise InputError(f"session file not found: {p}; give a session JSON (e.g. from `tmplkit session generate`)")
    return _from_conversation(load_conversation(p))


def session_from_json(obj, source: str = "<session>") -> Conversation:
    """Validate a parsed session (a list of messages, or an object with `messages` and `tools`)."""
    if isinstance(obj, (str, bytes, os.PathLike)):  # parsed JSON, not a path
        raise InputError(f"{source}: expected a list of messages or an object with 'messages', got a string")
    return _from_conversation(load_conversation(obj, source=source))


def _from_conversation(conv: Conversation) -> Conversation:
    return Conversation(tuple(conv.messages), tuple(conv.tools or ()), conv.source)


def save_session(session: Conversation, path: str | os.PathLike) -> None:
    write_output(path, json.dumps(session.to_dict(), indent=1, ensure_ascii=False) + "\n")


# --- validation ------------------------------------------------------------------------------------


def _keys(d: dict) -> str:
    keys = [repr(k) for k in list(d)[:8]]
    return "{" + ", ".join(keys) + (", ..." if len(d) > 8 else "") + "}"


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_message(m, at: str, where: str) -> dict:
    if not isinstance(m, dict):
        raise InputError(f"{where}: {at} must be an object with 'role' and 'content', got {json_kind(m)}")
    if "role" not in m:
        hint = (" (this looks like ShareGPT 'from'/'value'; use 'role'/'content')" if "from" in m else
                "; give each message its 'role' (user, assistant, system or tool) and its 'content'")
        raise InputError(f"{where}: {at} has no 'role'{hint}")
    role = m["role"]
    if not isinstance(role, str):
        raise InputError(f"{where}: {at}.role must be a string, got {json_kind(role)}")
    if role not in MESSAGE_ROLES:
        hint = f"; use '{_ROLE_HINTS[role]}'" if role in _ROLE_HINTS else ""
        raise InputError(f"{where}: {at}.role is {_short(role)}; known roles: {', '.join(MESSAGE_ROLES)}{hint}")
    for key in m:
        if not isinstance(key, str):
            raise InputError(f"{where}: {at} has a non-string key {_short(key)}")
    content = m.get("content")
    tool_calls = m.get("tool_calls")
    if content is None:
        # A null content is taken from any role, as llama-server takes it (`content: ""` for the
        # template) and transformers (the key dropped); a missing one only beside calls or reasoning.
        if "content" not in m and (role != "assistant" or not (tool_calls or m.get("reasoning_content") or m.get("thinking"))):
            raise InputError(
                f"{where}: {at} ({role}) has no 'content'; give a string (only assistant messages with tool_calls may omit it)"
            )
    elif isinstance(content, list):
        for j, part in enumerate(content):
            _check_part(part, f"{at}.content[{j}]", where)
    elif not isinstance(content, str):
        raise InputError(
            f"{where}: {at}.content must be a string or a list of text parts, got {json_kind(content)}"
        )
    if tool_calls is not None:
        if role != "assistant":
            raise InputError(f"{where}: {at} ({role}) has tool_calls; only assistant messages make tool calls")
        if not isinstance(tool_calls, list):
            raise InputError(f"{where}: {at}.tool_calls must be a list, got {json_kind(tool_calls)}")
        for j, call in enumerate(tool_calls):
            _check_call(call, f"{at}.tool_calls[{j}]", where)
    return dict(m)


def _check_part(part, at: str, where: str) -> None:
    if not isinstance(part, dict):
        raise InputError(f"{where}: {at} must be an object, got {json_kind(part)}; {_PART_HINT}")
    kind = part.get("type")
    if kind != "text":
        what = f"a {_short(kind)} part" if kind is not None else "a part without 'type'"
        raise InputError(f"{where}: {at} is {what}; {_PART_HINT}")
    if not isinstance(part.get("text"), str):
        raise InputError(f"{where}: {at}.text must be a string, got {json_kind(part.get('text'))}")


def _check_call(call, at: str, where: str) -> None:
    if not isinstance(call, dict):
        raise InputError(f"{where}: {at} must be an object, got {json_kind(call)}")
    fn = call.get("function", call)
    if not isinstance(fn, dict):
        raise InputError(f"{where}: {at}.function must be an object with 'name' and 'arguments', got {json_kind(fn)}")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise InputError(f"{where}: {at} has no function name; give {{\"function\": {{\"name\": ..., \"arguments\": ...}}}}")
    args = fn.get("arguments")
    if args is not None and not isinstance(args, (dict, str)):
        raise InputError(f"{where}: {at}.arguments must be an object or a JSON string, got {json_kind(args)}")


def _check_tools(tools, where: str) -> tuple[dict, ...]:
    if not isinstance(tools, (list, tuple)):
        raise InputError(f"{where}: 'tools' must be a list of tool definitions, got {json_kind(tools)}")
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InputError(f"{where}: {at} must be an object, got {json_kind(tool)}")
        fn = tool.get("function", tool)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InputError(
                f"{where}: {at} has no name; give {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}"
            )
    return tuple(dict(t) for t in tools)
