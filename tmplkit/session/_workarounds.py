"""What llama-server does to a conversation for a template before rendering it, once it has read
each message (`_inputs`): the workarounds of the vendored common/chat.cpp
(`common_chat_templates_apply_jinja`), chosen by what the template reads as its own Jinja engine
finds out (common/jinja/caps.cpp), found here the same way, by probe renders:

- roles: a `developer` message (what OpenAI-style clients send for instructions) is given as a
  `system` one, for every template but gpt-oss's (the server keeps it where the template holds
  `<|channel|>`), before the fold below (`map_developer_role_to_system`);
- content: a template that reads a message's content only as a string is given a list of text
  parts joined by newlines; one that reads it only as a list of parts is given a string as one
  text part (`messages_inp_normalizer`); one that reads both gets what the client sent;
- a template that never reads the content of a leading system message (it raises on the role,
  or leaves it out) is given that content at the start of the next message, after it and a
  newline, or nothing where the system message is the only one (`system_message_not_supported`);
- StepFun's templates (`You have access to the following functions in JSONSchema format`): every
  content, text part and reasoning trimmed of whitespace at both ends (llama.cpp issue 24181);
- the templates its Ministral / Magistral 3 handler takes (`ministral3`): a system or assistant
  message's content made a list of blocks, its reasoning a `thinking` block before the `text`
  one (a template that prints `content[0].text`, as Devstral's does, then prints no answer after
  reasoning: the server's render);
- DeepSeek V4's templates (`deepseek_v4`): the tool results after a tool-call turn in the order of
  its calls, as its reference renders them;
- Gemma 4's older templates (`'<|tool_call>call:'` without the official template's
  `{#- OpenAI Chat Completions:` note): a tool-call turn, the tool results after it and an answer
  right after them made one model turn holding `tool_responses` (common/parsers/gemma4.cpp,
  `convert_tool_responses_gemma4`); the Gemma 4 handler also writes `<|turn>model\n` after a
  prompt that asks for a generation and ends with `<turn|>\n` (`as_server_finishes`).

    >>> from tmplkit.sources import ChatTemplate
    >>> t = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
    ...                  "{% endif %}[{{ m.content }}]{% endfor %}", "t", "-")
    >>> as_server_renders(t, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    [{'role': 'user', 'content': 'Be brief.\\nhi'}]

The role, the content's form, the trim and the blocks change each message and are made once
(`as_server_prepares`, on the conversation); the fold, Gemma 4's turns and DeepSeek V4's order
change the list, so they are made on each list rendered (`as_server_renders`): message indices
stay the session's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from types import FrameType

from ..errors import RenderLimitError, TmplkitError
from ..jsonio import strict_loads
from ..sandbox import Prepared, render
from ..sources.templates import ChatTemplate
from ._handlers import server_handler
from ._inputs import session_render, text_part

__all__ = ["ContentReads", "as_server_finishes", "as_server_prepares", "as_server_renders", "content_reads"]

# (C's isspace, which llama.cpp trims with, in ASCII)
_SPACE = " \t\n\v\f\r"
_STEPFUN = "You have access to the following functions in JSONSchema format"
_MARKER = "STRING_MARKER"
_GEMMA4_OFFICIAL = "{#- OpenAI Chat Completions:"
# (the marker by which llama-server leaves a `developer` message to gpt-oss's template)
_HARMONY = "<|channel|>"
_SYSTEM = "System message"


@dataclass(frozen=True)
class ContentReads:
    """How a template reads what it is given, as llama.cpp's capability check finds it: a message's
    content as a string (`string`), as a list of parts (`typed`), and a leading system message's
    content at all (`system`)."""

    string: bool = True
    typed: bool = False
    system: bool = True


def content_reads(template: ChatTemplate) -> ContentReads:
    """`ContentReads` of `template`, by three probe renders (cached by the template's text and name: the
    probes set BOS and EOS empty, as the C++ check does). A probe past its time or memory raises
    the template's RenderLimitError (every render of it would)."""
    return _content_reads(template.text, template.name)


def as_server_prepares(template: ChatTemplate, messages: list[dict]) -> list[dict]:
    """`messages` (as llama-server reads and writes them: `_inputs.given_messages`) after the
    workarounds of the module doc that change each message (a developer message as system,
    StepFun's trim, the content's form, Ministral 3's blocks); the caller's messages stay as they were."""
    if _HARMONY not in template.text:
        messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    if _STEPFUN in template.text:
        messages = [_trimmed(m) for m in messages]
    messages = in_content_form(template, messages)
    if ministral3(template):  # (its handler makes the blocks of the contents in their form)
        messages = [_blocks(m) if m.get("role") in ("system", "assistant") else m for m in messages]
    return messages


def in_content_form(template: ChatTemplate, messages: list[dict]) -> list[dict]:
    """`messages` with their contents in the form `template` reads, as the server gives them
    (`messages_inp_normalizer`): text parts joined for a template that reads only strings, a
    string made one text part for one that reads only parts; as they are where it reads both."""
    reads = content_reads(template)
    if reads.string == reads.typed:
        return messages
    return [_content_as(m, typed=reads.typed) for m in messages]


def as_server_renders(template: ChatTemplate, messages):
    """The list of `messages` (prepared: `as_server_prepares`) llama-server renders: a leading system
    message folded into the next where the template never reads it, Gemma 4's older templates
    given their model turns whole (`_model_turns`), DeepSeek V4's tool results in the order of the
    calls (`_results_in_call_order`); `messages` itself elsewhere."""
    if messages and messages[0].get("role") == "system" and not content_reads(template).system:
        messages = _system_folded(list(messages))
    if server_handler(template) == "Gemma 4" and _GEMMA4_OFFICIAL not in template.text:
        messages = _model_turns(list(messages))
    if deepseek_v4(template):
        messages = _results_in_call_order(list(messages))
    return messages


def as_server_finishes(template: ChatTemplate, text: str, add_generation_prompt: bool) -> str:
    """`text` (a render of `template`) as llama-server's prompt: the Gemma 4 handler starts the
    model's turn after a prompt that asks for a generation and ends with a closed turn (the
    template wrote none after a turn of text and calls), common/parsers/gemma4.cpp."""
    if add_generation_prompt and text.endswith("<turn|>\n") and server_handler(template) == "Gemma 4":
        return text + "<|turn>model\n"
    return text


def _model_turns(messages: list[dict]) -> list[dict]:
    """Each assistant message with tool calls, the tool messages right after it and an assistant
    message of content alone right after those made one message: the calls, `tool_responses`
    (`{name, response}`: the call's name by position, else the result's `tool_call_id`; a result
    that reads as JSON given as what it reads), that answer's content, the first message's
    reasoning; as `convert_tool_responses_gemma4` builds it (the first message's content is not
    kept)."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list) or not m["tool_calls"]:
            out.append(m)
            i += 1
            continue
        calls, responses = list(m["tool_calls"]), list[dict]()
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            responses.append(_tool_response(messages[i], calls, len(responses)))
            i += 1
        turn: dict = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        if i < len(messages) and messages[i].get("role") == "assistant" and not messages[i].get("tool_calls") \
                and messages[i].get("content") not in (None, "", []):
            turn["content"] = messages[i]["content"]
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        out.append(turn)
    return out


def _tool_response(m: dict, calls: list, k: int) -> dict:
    content = m.get("content")
    response = content
    if isinstance(content, str):
        try:
            response = strict_loads(content)
        except (ValueError, RecursionError):  # (not JSON: the text itself)
            response = content
    fn = calls[k].get("function") if k < len(calls) and isinstance(calls[k], dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return {"name": name or m.get("tool_call_id") or "", "response": response}


def ministral3(template: ChatTemplate) -> bool:
    """Whether llama-server's Ministral / Magistral 3 handler takes `template` (`server_handler`)."""
    return server_handler(template) == "Ministral/Magistral Large 3"


def _blocks(m: dict) -> dict:
    """A system or assistant message as the Ministral 3 handler gives it (parsers/ministral3.cpp):
    its content a list of blocks, a `thinking` block of its reasoning first, then a `text` block of
    its content (or the content's own parts); its `reasoning_content` key gone."""
    blocks: list = []
    if isinstance(m.get("reasoning_content"), str):
        blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
    content = m.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend(content)
    out = {k: v for k, v in m.items() if k != "reasoning_content"}
    out["content"] = blocks
    return out


def deepseek_v4(template: ChatTemplate) -> bool:
    """Whether llama-server's DeepSeek V3.2 handler takes `template` (`server_handler`) as V4's
    (parsers/deepseek.cpp: no `function_calls`, V3.2's name for the block)."""
    return server_handler(template) == "DeepSeek V3.2/V4" and "function_calls" not in template.text


def _results_in_call_order(messages: list[dict]) -> list[dict]:
    """The tool results of each run of user and tool messages in the order of the calls they
    answer, by `tool_call_id` (one that answers no call first, the rest as they came), as DeepSeek
    V4's reference renders them in one user block (parsers/deepseek.cpp,
    `deepseek_v4_sort_tool_results`); the order of the calls is the latest tool-call turn's."""
    order: dict = {}
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list) and m["tool_calls"]:
            order = {c["id"]: k for k, c in enumerate(m["tool_calls"]) if isinstance(c, dict) and c.get("id")}
            i += 1
            continue
        if m.get("role") not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(messages) and messages[end].get("role") in ("user", "tool"):
            end += 1
        at = [j for j in range(i, end) if messages[j].get("role") == "tool"]
        if len(at) > 1 and order:
            ranked = sorted((messages[j] for j in at), key=lambda r: order.get(r.get("tool_call_id") or "", 0))
            for j, r in zip(at, ranked):
                messages[j] = r
        i = end
    return messages


def _trimmed(m: dict) -> dict:
    out = dict(m)
    content = m.get("content")
    if isinstance(content, str):
        out["content"] = content.strip(_SPACE)
    elif isinstance(content, list):
        out["content"] = [{**p, "text": p["text"].strip(_SPACE)} if text_part(p) else p for p in content]
    if isinstance(m.get("reasoning_content"), str):
        trimmed = m["reasoning_content"].strip(_SPACE)
        if trimmed:
            out["reasoning_content"] = trimmed
        else:  # (the server writes an empty reasoning not at all)
            del out["reasoning_content"]
    return out


def _content_as(m: dict, *, typed: bool) -> dict:
    content = m.get("content")
    if typed and isinstance(content, str):
        return {**m, "content": [{"type": "text", "text": content}]}
    if not typed and isinstance(content, list):
        return {**m, "content": _joined(content)}
    return m


def _joined(parts: list) -> str:
    """Text parts joined as the server joins them: a newline before each after the first text."""
    text = ""
    for part in parts:
        if not text_part(part):
            continue
        if text:
            text += "\n"
        text += part.get("text") or ""
    return text


def _system_folded(messages: list[dict]) -> list[dict]:
    first, rest = messages[0], messages[1:]
    if not rest:
        return []
    before, after = first.get("content"), rest[0].get("content")
    if not (isinstance(before, str) and isinstance(after, str)):
        return messages  # (the server fails such a request: the engine's render shows it)
    return [{**rest[0], "content": before + "\n" + after}, *rest[1:]]


class _Watched(str):
    """A probe's content: a string that notes whether the template read it at all (`used`) and
    whether it read it as a list (`as_list`: iterated or indexed by a number), as the C++ engine's
    statistics note it. Iterating it fails, as the C++ engine's for loop fails on a string."""

    def __new__(cls, text: str):
        obj = super().__new__(cls, text)
        obj.used = obj.as_list = False
        return obj

    def __iter__(self):
        self.used = True
        if not _by_loop_or_selectattr():
            return str.__iter__(self)
        self.as_list = True
        raise TypeError("a string is not a list of parts")

    def __getitem__(self, key):
        self.used = True
        if isinstance(key, int):
            self.as_list = True
        return str.__getitem__(self, key)

    def __getattribute__(self, name):
        if not name.startswith("_") and name not in ("used", "as_list"):
            str.__setattr__(self, "used", True)  # (a method called on it: strip, split, startswith...)
        return str.__getattribute__(self, name)

    def __str__(self):
        self.used = True
        return str.__str__(self)

    def _note(self):
        self.used = True

    def __contains__(self, item):
        self._note()
        return str.__contains__(self, item)

    def __len__(self):
        self._note()
        return str.__len__(self)

    def __eq__(self, other):
        self._note()
        return str.__eq__(self, other)

    __hash__ = str.__hash__

    def __add__(self, other):
        self._note()
        return str.__add__(self, other)


class _Message(dict):
    """A probe's message: reading its content (`m.content`, `m['content']`, `m.get('content')`)
    counts as reading the content, as the C++ engine counts a value read when it is looked up,
    printed or not (a template that sets `content = message['content']` for every role reads the
    system message's)."""

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        if key == "content" and isinstance(value, _Watched):
            value._note()
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default


class _WatchedList(list):
    """An empty list of parts that notes whether the template read it as a list."""

    as_list = False

    def __iter__(self):
        self.as_list = self.as_list or _by_loop_or_selectattr()
        return list.__iter__(self)

    def __getitem__(self, key):
        if isinstance(key, int):
            self.as_list = True
        return list.__getitem__(self, key)


def _by_loop_or_selectattr() -> bool:
    """Whether the value being iterated is iterated by the template's own for loop or by
    `selectattr` (which the C++ engine notes as reading it as a list), not by another filter (`tojson`,
    `join`: the C++ engine notes only the filter's name). Read off the frames above: the sandbox's
    loop guard and Jinja's loop context are passed over, then the template's own code, or the filter's."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_filename == "<template>" or code.co_name == "select_or_reject":
            return True
        if not code.co_filename.endswith(("runtime.py", "_limits.py")):
            return False
        frame = frame.f_back
    return False


def _probe(template: ChatTemplate, messages: list[dict]) -> str | None:
    """The render of the probe `messages` as the C++ check renders it (no tools, empty BOS/EOS, the
    generation prompt); None where the template fails on it; `_UNKNOWN` where it fails on a name or
    key it reads that the probe does not set (the C++ engine goes on with an undefined value where
    Python's raises, so the failure tells nothing of the check)."""
    try:
        return session_render(render, template, Prepared(_Message(m) for m in messages), tools=[],
                              add_generation_prompt=True, bos_token="", eos_token="")
    except RenderLimitError:
        raise  # (past the session's time or memory on a probe: its renders would be; not tried again)
    except TmplkitError as exc:
        # (an undefined name, or a key the probe's messages lack: `message['title']`)
        return _UNKNOWN if "is undefined" in str(exc) or "has no attribute" in str(exc) else None


_UNKNOWN = "\0unknown"


@lru_cache(maxsize=256)
def _content_reads(text: str, name: str) -> ContentReads:
    template = ChatTemplate(text, name, "-")  # (named as the caller's: a limit error names it)
    content = _Watched(_MARKER)
    out = _probe(template, [{"role": "user", "content": content}])
    typed = content.as_list
    string = out is not None and not (content.as_list and _MARKER not in out)
    if not typed and ("is string" in text or "is not string" in text):
        # (the C++ check tries a list only where the template tests whether the content is a string)
        parts = _WatchedList()
        typed = _probe(template, [{"role": "user", "content": parts}]) not in (None, _UNKNOWN) and parts.as_list
    system = _Watched(_SYSTEM)
    shown = _probe(template, [{"role": "system", "content": system}, {"role": "user", "content": "User message"}])
    return ContentReads(string, typed, system.used or shown == _UNKNOWN or (shown is not None and _SYSTEM in shown))
