"""Which engine's message preparation a render follows: llama-server's or transformers'.

The two engines give a template the same conversation in two ways:

- "server" (llama-server): each message is read into the server's own message struct and written
  out again for the template (the vendored common/chat.cpp, `common_chat_msgs_parse_oaicompat`,
  then `common_chat_msg::to_json_oaicompat`). So every message has a `content`, `""` where the
  client sent `null` or none (a tool-call turn an OpenAI-style client sends with `content: null`
  renders with an empty content, as `m.content` and `m['content'] | length` read it); only `role`,
  `content`, `reasoning_content`, `name`, `tool_call_id` and `tool_calls` reach the template, the
  last four only where they are not empty (a `reasoning` or `thinking` key, or any other, is left
  out); a text part keeps only its `type` and `text`; a tool call is rebuilt as `{"type": "function",
  "function": {"name", "arguments"}, "id"}` (its other keys left out; `arguments` a JSON string, an
  object the client sent written out compactly, `_arguments` parses them back for a template that
  reads objects). What the server refuses to read (a null or non-string `reasoning_content`, `name`,
  `tool_call_id` or call `id`; a call without `type: "function"`, `function`, a name or
  `arguments`) is refused here in one line, naming the message.
- "transformers" (`apply_chat_template`): null-valued keys are dropped (`_normalize_chat_messages`),
  so `content: null` reaches the template as no `content` key at all, where `m.content` is
  undefined; every other key is kept; a message's reasoning, under any of `reasoning_content`,
  `thinking` or `reasoning`, is given as `reasoning_content` and as `thinking` too
  (`_alias_reasoning_fields`, transformers 5.24), so a gpt-oss template reads it.

The turns study, the replay, the resume check and the request bodies render as a server does
("server", the default); training masks render as a trainer does ("transformers").

    >>> given_messages([{"role": "assistant", "content": None, "tool_calls": []}], "server")
    [{'role': 'assistant', 'content': ''}]
    >>> given_messages([{"role": "assistant", "content": None}], "transformers")
    [{'role': 'assistant', 'content': None}]
    >>> given_messages([{"role": "assistant", "content": "ok", "reasoning": "r"}], "transformers")
    [{'thinking': 'r', 'role': 'assistant', 'content': 'ok', 'reasoning': 'r', 'reasoning_content': 'r'}]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Iterator
from contextvars import ContextVar

from ..errors import InputError
from ..sandbox import Limits, hint_place, hints_for
from ._tool_schema import schema_problem

__all__ = ["DEFAULT_INPUTS", "INPUTS", "active_session_limits", "check_inputs", "content_text", "given_messages", "given_tools",
           "inputs_note", "server_json", "server_refuses", "session_limits", "session_render"]

INPUTS = ("server", "transformers")
DEFAULT_INPUTS = "server"
# A session render is a whole agent session (tens of thousands of tokens, hundreds of messages):
# more time and output than one probe render's defaults. The probes of what a template reads for
# those renders (`_workarounds`, `_arguments`) run under the same, so a probe meets a limit only
# where the session's renders would (here, below both: `_render` gives it out).
SESSION_LIMITS = Limits(seconds=60, max_output_chars=50_000_000)
_LIMITS: ContextVar[Limits] = ContextVar("tmplkit_session_limits", default=SESSION_LIMITS)


def active_session_limits() -> Limits:
    """The limits of a session's renders now: `SESSION_LIMITS`, or the innermost `session_limits` block's."""
    return _LIMITS.get()


_KEEP = object()  # (a limit not given to `session_limits`: the one in force stays)


@contextlib.contextmanager
def session_limits(*, seconds=_KEEP, max_output_chars=_KEEP) -> Iterator[None]:
    """Render sessions under other limits inside the block: each one given replaces the one in force
    (`SESSION_LIMITS`: 60 s and 50M characters a render), None lifts it, one not given stays. Every
    library function that renders a session takes them while it runs inside the block, in this
    thread (`study_turns`, `session_requests`, masks, `check_resume`, a prefill's prompt; not a
    thread it starts, nor a generator such as `iter_requests` read after the block; a worker process
    of `tmplkit turns` runs under the command's `--timeout`).

        >>> with session_limits(seconds=300):                                     # doctest: +SKIP
        ...     report = study_turns(template, session)
    """
    given = {k: v for k, v in (("seconds", seconds), ("max_output_chars", max_output_chars)) if v is not _KEEP}
    if not given:
        raise InputError("session_limits() changes nothing; give seconds=... or max_output_chars=... (None: no limit)")
    token = _LIMITS.set(dataclasses.replace(_LIMITS.get(), **given))  # (Limits checks the values)
    try:
        yield
    finally:
        _LIMITS.reset(token)


# Where a session's render words its limit hints, by where the hints are worded (sandbox.hint_place).
_SESSION_PLACES = {"library": "session", "cli": "cli_session"}


def session_render(render_fn, *args, **kwargs):
    """`render_fn(*args, **kwargs)` (`sandbox.render` or `render_with_prompt`) under the session limits
    in force, a limit's message worded for a session: the `session_limits` block (the session
    functions take no `limits` argument), from Python or, on the command line, as the way there."""
    place = _SESSION_PLACES.get(hint_place())
    with hints_for(place) if place else contextlib.nullcontext():
        return render_fn(*args, limits=_LIMITS.get(), **kwargs)


def check_inputs(inputs: str) -> str:
    """`inputs` when it names a preparation, else a one-line InputError."""
    if inputs not in INPUTS:
        raise InputError(f"unknown inputs {inputs!r}: give 'server' (as llama-server gives messages: a null content "
                         "as \"\", only the keys it holds) or 'transformers' (as apply_chat_template: null-valued keys "
                         "dropped)")
    return inputs


def given_messages(messages: Iterable[dict], inputs: str) -> list[dict]:
    """`messages` as the `inputs` engine gives them to a template, before the sandbox's own
    preparation (which drops the null-valued keys that remain, as both engines leave them out)."""
    check_inputs(inputs)
    messages = list(messages)
    if inputs == "transformers":
        return [_reasoning_aliased(m) for m in messages]
    out = []
    for i, m in enumerate(messages):
        _server_reads(m, i)
        try:
            out.append(_as_server_writes(m))
        except InputError as exc:  # (a number in its call's arguments past what the server reads)
            raise InputError(f"message {i} ({m.get('role')}): its tool call's arguments hold {exc}") from None
    return out


def given_tools(tools, inputs: str) -> tuple[dict, ...] | None:
    """`tools` as the `inputs` engine gives them to a template: None for none. llama-server reads each
    into its tool struct and writes it out again (common/chat.cpp, `common_chat_tools_parse_oaicompat`
    then `common_chat_tools_to_json_oaicompat`): `{"type": "function", "function": {"name",
    "description", "parameters"}}`, a missing description "" and missing parameters {}, any other
    key (an OpenAI client's `"strict": true`) left out; a tool it refuses (not in that shape, a
    description that is no string, parameters its schema builder refuses: `_tool_schema`) is
    refused here in one line. Transformers gives them as they are."""
    if not tools:
        return None
    if check_inputs(inputs) == "transformers":
        return tuple(tools)
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise InputError(f"tools[{i}] is not {{\"type\": \"function\", \"function\": {{...}}}}, which llama-server "
                             "refuses (\"Missing tool type\" or \"function\"); give the tool in that shape")
        if "description" in fn and not isinstance(fn["description"], str):
            raise InputError(f"tools[{i}] ({fn['name']}): its description is not a string, which llama-server refuses "
                             "(\"type must be string\"); give a string or leave it out")
        # (a null the server takes, as it takes none given)
        problem = schema_problem(fn["parameters"]) if fn.get("parameters") is not None else None
        if problem is not None:
            raise InputError(f"tools[{i}] ({fn['name']}): its parameters are a schema llama-server refuses "
                             f"(\"{problem}\"); give a JSON Schema object, or leave them out")
        out.append({"type": "function", "function": {
            "name": fn["name"], "description": fn.get("description", ""),
            "parameters": fn["parameters"] if "parameters" in fn else {}}})
    return tuple(out)


# The string keys of the server's message struct (common_chat_msg) besides its role and content, in
# the order it writes them: each read as a string, and written only where it is not empty.
_SERVER_STRINGS = ("reasoning_content", "name", "tool_call_id")
# Where a message's reasoning may be, in the order transformers looks (its `_REASONING_FIELDS`).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _reasoning_aliased(m: dict) -> dict:
    """`m` with its reasoning (the first of `_REASONING_FIELDS` that is not null) also under
    `reasoning_content` and under `thinking` where that has none, as transformers gives it."""
    reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
    if reasoning is None:
        return m
    out = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    if out["thinking"] is None:  # (transformers drops the null before it aliases)
        out["thinking"] = reasoning
    return out


def _as_server_writes(m: dict) -> dict:
    """One message as llama-server writes it for the template (`to_json_oaicompat`)."""
    content = m.get("content")
    if isinstance(content, list):
        # (an image or audio part the server turns into its media marker, or refuses without a
        # model that reads it: left as the client sent it)
        content = [{"type": "text", "text": p["text"]} if text_part(p) else p for p in content]
    out = {"role": m.get("role"), "content": "" if content is None else content}
    out.update((key, m[key]) for key in _SERVER_STRINGS if m.get(key))
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call_as_server_writes(c) for c in calls]
    return out


def text_part(part) -> bool:
    """Whether `part` is a text part of a message's content (`{"type": "text", "text": "..."}`)."""
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def content_text(content) -> str:
    """A message's content as text: a string as it is, a list's text parts joined (other parts and
    anything else: nothing)."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if text_part(p)) if isinstance(content, list) else ""


def _call_as_server_writes(call: dict) -> dict:
    fn = call["function"]
    args = fn["arguments"]
    written = {"type": "function", "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else
                                                server_json(args)}}
    if call.get("id"):
        written["id"] = call["id"]
    return written


def server_json(value) -> str:
    """`value` written as the server's JSON library (nlohmann's ordered_json) writes it: no spaces,
    keys in the given order, characters unescaped, and its numbers: an integer past 64 bits as a
    float, a float from 1e15 up in exponent form (Python's from 1e16): an object the client sent for
    `arguments` (or an Anthropic `tool_use` input), which the server keeps as text."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_string(str(k))}:{server_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(server_json(v) for v in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int) and -2**63 <= value < 2**64:
        return str(value)
    if isinstance(value, (int, float)):
        try:
            return _server_float(float(value))
        except OverflowError:  # (an integer past what a double holds: the server's reader refuses it)
            raise InputError(f"a number of {len(str(value))} digits, more than llama-server's JSON reader takes (a "
                             "double); give a smaller one") from None
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _server_float(x: float) -> str:
    """A float as nlohmann's writer puts it (its shortest digits, then `format_buffer` with a
    decimal point from 1e-4 up to below 1e15, else an exponent of two digits at least)."""
    if x != x or x in (float("inf"), float("-inf")):
        return "null"
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    sign = "-" if x < 0 else ""
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits, e = (whole + frac).lstrip("0"), int(exp or 0) - len(frac)
    stripped = digits.rstrip("0")
    e += len(digits) - len(stripped)
    digits, k = stripped, len(stripped)
    n = k + e  # where the decimal point goes
    if k <= n <= 15:
        return f"{sign}{digits}{'0' * (n - k)}.0"
    if 0 < n <= 15:
        return f"{sign}{digits[:n]}.{digits[n:]}"
    if -4 < n <= 0:
        return f"{sign}0.{'0' * -n}{digits}"
    shown = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{sign}{shown}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1):02d}"


def _server_reads(m: dict, i: int) -> None:
    """A one-line InputError for what llama-server refuses to read in message `i`
    (`common_chat_msgs_parse_oaicompat`: a key it reads into a string, a tool call's shape)."""
    role = m.get("role")
    for key in _SERVER_STRINGS:
        if key in m and not isinstance(m[key], str):
            got = "null" if m[key] is None else type(m[key]).__name__
            raise InputError(f"message {i} ({role}): '{key}' is {got}, which llama-server refuses (it reads a string: "
                             f"\"type must be string\"); leave the key out or give a string")
    for j, call in enumerate(m.get("tool_calls") or ()):
        _server_reads_call(call, f"message {i} ({role}): tool_calls[{j}]")


def _server_reads_call(call, at: str) -> None:
    """llama-server refuses a tool call that is not `{"type": "function", "function": {"name",
    "arguments"}}` (the vendored common/chat.cpp, `common_chat_msgs_parse_oaicompat`: `fc.at("arguments")`
    among them): the session is refused so, not the template that would then fail on it."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or call.get("type") != "function":
        shape = "has no 'function'" if not isinstance(fn, dict) else (
            "has no 'type'" if "type" not in call else f"has type {call.get('type')!r}")
        raise InputError(f"{at} {shape}, which llama-server refuses (it reads {{\"type\": \"function\", \"function\": "
                         "{\"name\": ..., \"arguments\": ...}}); give the call in that shape")
    if "arguments" not in fn:
        raise InputError(f"{at} ({fn.get('name')}) has no 'arguments', which llama-server refuses (it reads "
                         "function.arguments); give them, {} where the function takes none")
    if "id" in call and not isinstance(call["id"], str):
        got = "null" if call["id"] is None else type(call["id"]).__name__
        raise InputError(f"{at} ({fn.get('name')}): 'id' is {got}, which llama-server refuses (it reads a string); "
                         "leave the key out or give a string")


def server_refuses(messages) -> str | None:
    """Why llama-server refuses a request of `messages` before it reads them (server-common.cpp,
    `oaicompat_chat_params_parse`), or None: an assistant message with neither `content` nor
    `tool_calls` (the session's loader refuses the other roles' missing content already)."""
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and "content" not in m and "tool_calls" not in m:
            return (f"message {i} (assistant) has neither 'content' nor 'tool_calls', which llama-server refuses "
                    "(\"Assistant message must contain either 'content' or 'tool_calls'!\"); give its content")
    return None


def inputs_note(inputs: str) -> str:
    """What the `inputs` preparation does, in words for a report."""
    if check_inputs(inputs) == "server":
        return ("messages as llama-server gives them: a null or missing content as \"\", only the keys its message "
                "struct holds; its default switches that keep earlier reasoning and its enable_thinking")
    return ("messages as transformers' apply_chat_template gives them: null-valued keys dropped, reasoning also "
            "under reasoning_content and thinking")
