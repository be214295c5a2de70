"""Request bodies of the two other APIs llama-server serves, read as it reads them.

Coding agents talk to llama-server through its OpenAI Responses endpoint (`/v1/responses`: Codex)
or its Anthropic Messages endpoint (`/v1/messages`: Claude Code). The server turns either body into
a chat-completions body before anything else (the pinned tools/server/server-chat.cpp,
`server_chat_convert_responses_to_chatcmpl` and `server_chat_convert_anthropic_to_oai`), so a
session saved as the agent sent it is the chat session those functions write. This module writes
it the same way, for every command that takes a conversation:

- Responses: `instructions` becomes a first system message, a string `input` one user message;
  input messages (user, system, developer) keep their text parts; an assistant output message
  (`"type": "message"`), a `function_call` and a `reasoning` item join the assistant message before
  them where there is one (its content, its tool calls, its `reasoning_content`), else open one;
  a `function_call_output` is a tool message; only function tools are kept (`strict` true unless
  given).
- Anthropic: `system` (a string, or its text blocks joined) becomes a first system message, with
  Claude Code's per-request `cch=` stamp written as `fffff` as the server writes it (it would end
  every prefix); a message's `thinking` blocks become its `reasoning_content`, its `tool_use`
  blocks its tool calls (the input written compactly, keys in the given order), its `tool_result`
  blocks tool messages after it; other blocks are dropped as the server drops them.

What the server refuses in them is refused here in one line, naming the item in the user's body
(`input[3]`, `messages[4]`: `converted` says where each message came from); images, which only a
multimodal model takes, are refused as in any conversation (one of a source the server does not
read is dropped, as it drops it).

    >>> chat_body({"instructions": "Be brief.", "input": "hi"}, "s.json")["messages"]
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}]
"""

from __future__ import annotations

from ..errors import InputError
from ._inputs import server_json

__all__ = ["body_format", "chat_body", "converted"]

# The content blocks only an Anthropic Messages body has (a chat body's parts are text or image_url).
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document"})
_IMAGE_HINT = "only text is supported (an image needs a multimodal model); leave it out"


def body_format(data: dict) -> str:
    """"responses", "anthropic" or "chat": which API's request body `data` is."""
    if "input" in data and "messages" not in data:
        return "responses"
    if "messages" not in data:
        return "chat"
    if "system" in data or any(isinstance(t, dict) and "input_schema" in t for t in _list(data.get("tools"))):
        return "anthropic"
    for m in _list(data.get("messages")):
        blocks = m.get("content") if isinstance(m, dict) else None
        if any(_anthropic_block(b) for b in _list(blocks)):
            return "anthropic"
    return "chat"


def _anthropic_block(block) -> bool:
    """Whether `block` is one only an Anthropic body has: an image with no source is not (its
    images always have one; `{"type": "image"}` alone is transformers' multimodal part, which the
    chat body's check refuses in one line, where the converter dropped it and its message)."""
    if not isinstance(block, dict) or block.get("type") not in _ANTHROPIC_BLOCKS:
        return False
    return block.get("type") != "image" or "source" in block


def chat_body(data: dict, where: str) -> dict:
    """`data` (a Responses or Anthropic Messages request body) as the chat body {"messages", "tools"}
    llama-server makes of it; a chat body as it is."""
    return converted(data, where)[0]


def converted(data: dict, where: str) -> tuple[dict, list[str] | None]:
    """`chat_body`, and where in `data` each of its messages came from (None for a chat body)."""
    fmt = body_format(data)
    if fmt == "chat":
        return data, None
    body = _from_responses(data, where) if fmt == "responses" else _from_anthropic(data, where)
    return body, body["messages"].origins


def _list(value) -> list:
    return value if isinstance(value, list) else []


class _Messages(list):
    """The chat messages made so far, with the place in the body each came from (`origins`: what
    a message's problem is named by, the user's own `input[3]`, not its place in the list made)."""

    def __init__(self) -> None:
        super().__init__()
        self.origins: list[str] = []

    def add(self, message, origin: str) -> None:
        self.append(message)
        self.origins.append(origin)


def _refused(where: str, at: str, what: str, hint: str) -> InputError:
    return InputError(f"{where}: {at}: {what}, which llama-server refuses; {hint}")


# --- the Responses API (server_chat_convert_responses_to_chatcmpl) ---------------------------------


def _from_responses(body: dict, where: str) -> dict:
    if isinstance(body.get("previous_response_id"), str) and body["previous_response_id"]:
        raise _refused(where, "previous_response_id", "the body continues a stored response",
                       "give the whole conversation in 'input' (llama.cpp stores no responses)")
    messages = _Messages()
    if "instructions" in body:  # (a value that is not a string is read as "", as the server reads it)
        messages.add({"role": "system", "content": _str_or(body["instructions"])}, "instructions")
    given = body["input"]
    if isinstance(given, str):
        messages.add({"role": "user", "content": given}, "input")
    elif isinstance(given, list):
        for i, item in enumerate(given):
            _response_item(messages, item, where, f"input[{i}]")
    else:
        raise _refused(where, "input", "it is neither a string nor a list of items", "give the conversation's items")
    out: dict = {"messages": messages}
    if "tools" in body:
        tools = _response_tools(body["tools"], where)
        if tools:
            out["tools"] = tools
    return out


def _response_item(messages: _Messages, item, where: str, at: str) -> None:
    """Item `at` of a Responses body's input, added to `messages` as the server adds it."""
    if not isinstance(item, dict):
        raise _refused(where, at, "it is not an object", "give each input item as an object")
    item = dict(item)
    after_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    if isinstance(item.get("content"), str):  # (an input message's text, as the server rewrites it first)
        item["content"] = [{"text": item["content"], "type": "input_text"}]
    kind, role = item.get("type"), item.get("role")
    if isinstance(item.get("content"), list) and role in ("user", "system", "developer"):
        item.pop("type", None)
        item.pop("status", None)
        item["content"] = [_input_part(p, where, f"{at}.content[{j}]") for j, p in enumerate(item["content"])]
        messages.add(item, at)
    elif role == "assistant" and kind == "message":
        parts = [_output_part(p, where, f"{at}.content[{j}]") for j, p in enumerate(_list(item.get("content")))]
        if after_assistant:
            prev = messages[-1]
            prev["content"] = [*_list(prev.get("content")), *parts]
        else:
            item.pop("status", None)
            item.pop("type", None)
            messages.add({**item, "content": parts}, at)
    elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")):
        call = {"function": {"arguments": item["arguments"], "name": item["name"]}, "id": item["call_id"],
                "type": "function"}
        if after_assistant:
            messages[-1]["tool_calls"] = [*_list(messages[-1].get("tool_calls")), call]
        else:
            messages.add({"role": "assistant", "tool_calls": [call]}, at)
    elif kind == "function_call_output" and isinstance(item.get("call_id"), str) and isinstance(item.get("output"), (str, list)):
        output = item["output"]
        if isinstance(output, list):
            output = [_output_item(p, where, f"{at}.output[{j}]") for j, p in enumerate(output)]
        messages.add({"content": output, "role": "tool", "tool_call_id": item["call_id"]}, at)
    elif kind == "reasoning" and isinstance(item.get("summary"), list):
        text = _reasoning_text(item, where, at)
        if after_assistant:
            messages[-1]["reasoning_content"] = text
        else:
            messages.add({"role": "assistant", "content": [], "reasoning_content": text}, at)
    else:
        raise _refused(where, at, "its type cannot be told ('Cannot determine type of item')",
                       "give an input message, an assistant message with \"type\": \"message\", a function_call, "
                       "a function_call_output or a reasoning item")


def _input_part(part, where: str, at: str) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_text":
        if "text" not in part:
            raise _refused(where, at, "an input_text part without 'text'", "give its text")
        return {"text": part["text"], "type": "text"}
    if kind == "input_image":
        raise InputError(f"{where}: {at} is an image; {_IMAGE_HINT}")
    if kind == "input_file":
        raise _refused(where, at, "a file part (\"'input_file' is not supported\")", "give its text instead")
    raise _refused(where, at, f"a part of type {kind!r}", "give input_text parts")


def _output_part(part, where: str, at: str) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("output_text", "input_text") and isinstance(part.get("text"), str):
        return {"text": part["text"], "type": "text"}
    if kind == "refusal":  # (the server converts it, then refuses the part it made)
        raise _refused(where, at, "a refusal part (\"Unsupported content part type\")", "give the refusal as output_text")
    raise _refused(where, at, f"a part of type {kind!r} (or without text)", "give output_text parts")


def _output_item(part, where: str, at: str) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_text":
        return {**part, "type": "text"}
    if kind == "input_image":
        raise InputError(f"{where}: {at} is an image; {_IMAGE_HINT}")
    raise _refused(where, at, f"a tool output part of type {kind!r}", "give input_text parts")


def _reasoning_text(item: dict, where: str, at: str) -> str:
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise _refused(where, f"{at}.content", "a reasoning item without its text (\"item['content'] is not an array\" "
                       "or is empty)", "give its content as [{\"type\": \"reasoning_text\", \"text\": ...}], or leave "
                       "the item out (a summary or encrypted_content alone is not read)")
    text = content[0].get("text") if isinstance(content[0], dict) else None
    if not isinstance(text, str):
        raise _refused(where, f"{at}.content[0]", "a reasoning text that is not a string", "give its text")
    return text


def _response_tools(tools, where: str) -> list[dict]:
    if not isinstance(tools, list):
        raise _refused(where, "tools", "it is not a list", "give the tools as a list of objects")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue  # (web search and other built-in tools: the server skips them)
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _refused(where, f"tools[{i}]", "a function tool without a name",
                           'give {"type": "function", "name": ..., "parameters": ...}')
        fn = {k: v for k, v in tool.items() if k != "type"}
        fn.setdefault("strict", True)
        out.append({"type": "function", "function": fn})
    return out


# --- the Anthropic Messages API (server_chat_convert_anthropic_to_oai) -----------------------------

_BILLING = "x-anthropic-billing-header:"


def _stamp_normalized(text: str) -> str:
    """Claude Code's system prompt with its per-request `cch=` stamp as `fffff`, as the server writes it
    (`normalize_anthropic_billing_header`, on the UTF-8 bytes): otherwise no two requests would
    share a prefix."""
    if not text.startswith(_BILLING):
        return text
    data = text.encode("utf-8")
    at = data.find(b"cch=", len(_BILLING))
    if at < 0:
        return text
    at += 4
    if at + 5 < len(data) and data[at + 5:at + 6] == b";":
        return (data[:at] + b"fffff" + data[at + 5:]).decode("utf-8", errors="replace")
    return text


def _from_anthropic(body: dict, where: str) -> dict:
    messages = _Messages()
    system = body.get("system")
    if system is not None:
        if isinstance(system, str):
            text = _stamp_normalized(system)
        else:
            text = "".join(_stamp_normalized(_str_or(b.get("text")))
                           for b in _list(system) if isinstance(b, dict) and b.get("type") == "text")
        messages.add({"role": "system", "content": text}, "system")
    given = body["messages"]
    if not isinstance(given, list):
        raise _refused(where, "messages", "it is not a list", "give the conversation's messages")
    for i, m in enumerate(given):
        _anthropic_message(messages, m, where, f"messages[{i}]")
    out: dict = {"messages": messages}
    if isinstance(body.get("tools"), list):
        out["tools"] = [_anthropic_tool(t, where, f"tools[{i}]") for i, t in enumerate(body["tools"])]
    return out


def _anthropic_message(messages: _Messages, m, where: str, at: str) -> None:
    if not isinstance(m, dict) or not isinstance(m.get("content"), list):
        if not (isinstance(m, dict) and "content" not in m and m.get("role") == "assistant"):
            messages.add(m, at)  # (as it is: the conversation's own check then reads it)
        return
    content, calls, results, reasoning = [], [], [], ""
    for j, block in enumerate(m["content"]):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            content.append(block)
        elif kind == "thinking":
            reasoning += block.get("thinking") if isinstance(block.get("thinking"), str) else ""
        elif kind == "image" and _image_source(block):
            raise InputError(f"{where}: {at}.content[{j}] is an image; {_IMAGE_HINT}")
        elif kind == "tool_use":
            args = block.get("input")
            try:
                written = server_json({} if args is None else args)
            except InputError as exc:
                raise InputError(f"{where}: {at}.content[{j}].input: {exc}") from None
            calls.append({"id": _str_or(block.get("id")), "type": "function",
                          "function": {"name": _str_or(block.get("name")), "arguments": written}})
        elif kind == "tool_result":
            results.append(({"role": "tool", "tool_call_id": _str_or(block.get("tool_use_id")),
                             "content": _result_content(block.get("content"), where, f"{at}.content[{j}]")},
                            f"{at}.content[{j}]"))
    if content or calls or reasoning:
        # (the role as given: one that is no string is refused as such)
        out: dict = {"role": m.get("role"), "content": content or ""}
        if calls:
            out["tool_calls"] = calls
        if reasoning:
            out["reasoning_content"] = reasoning
        messages.add(out, at)
    for result, origin in results:  # (after the message that holds them, as the server puts them)
        messages.add(result, origin)


def _str_or(value, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _image_source(block: dict) -> bool:
    """Whether an image block has a source the server reads (base64 or url; another it drops)."""
    source = block.get("source")
    return isinstance(source, dict) and source.get("type") in ("base64", "url")


def _result_content(content, where: str, at: str) -> str | list:
    """A tool_result's content as the server gives it: a string, or its text blocks joined; with an
    image block among them, the text blocks as parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    blocks = [c for c in content if isinstance(c, dict)]
    if any(c.get("type") == "image" and _image_source(c) for c in blocks):
        raise InputError(f"{where}: {at} holds an image; {_IMAGE_HINT}")
    texts = [_str_or(c.get("text")) for c in blocks if c.get("type") == "text"]
    if any(c.get("type") == "image" for c in blocks):  # (an image of no source it reads: dropped, the text as parts)
        return [{"type": "text", "text": t} for t in texts]
    return "".join(texts)


def _anthropic_tool(tool, where: str, at: str) -> dict:
    # (the server writes a nameless tool with the name "": refused, as a chat body's is)
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
        raise InputError(f"{where}: {at} has no name; give {{\"name\": ..., \"description\": ..., \"input_schema\": ...}}")
    return {"type": "function", "function": {"name": tool["name"],
                                             "description": _str_or(tool.get("description")),
                                             "parameters": tool.get("input_schema", {})}}
