"""Whether llama-server renders a template with `enable_thinking` true or false.

The server writes `enable_thinking` into every render (common/chat.cpp,
`common_chat_template_direct_apply_impl`), a request's own `chat_template_kwargs` aside; its value
is fixed at start (tools/server/server-context.cpp): true where the template "supports thinking"
and `--reasoning` is not off. A template supports thinking where one of the vendored handlers takes
it and says so (`common_chat_try_specialized_template`: Ministral 3, gpt-oss, Kimi, LFM2, DeepSeek
V3.2, Gemma 4, MiniCPM5, Qwen3-Coder with `<think>`, ...; GigaChat V3 and Functionary v3.2 do not),
or where the differential autoparser finds a reasoning mode (common/chat-diff-analyzer.cpp,
`analyze_reasoning` and its workarounds). The autoparser's three probes are made here the same way:

- presence: a reply rendered with and without `reasoning_content`; the reasoning is found, and a
  marker (`<...>` or `[...]`) follows it, or one stands on each side of it;
- the switch: a user message with the generation prompt, `enable_thinking` false against true;
  one side's extra text closes the render (trimmed), or a pair of markers follows the other
  side's tail;
- scope (a template that renders tool calls): reasoning that appears only on a tool-call turn.

Templates that do not name `enable_thinking` render alike either way; for those that do, a server
setting that left it unset rendered what no server renders (`{% if enable_thinking %}` reads an
unset switch as false, where the server passes true).

    >>> from tmplkit.sources import ChatTemplate
    >>> server_thinking(ChatTemplate("{% for m in messages %}{% if m.reasoning_content %}<think>"
    ...     "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}{% endfor %}", "t", "-"))
    True
    >>> server_thinking(ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "t", "-"))
    False
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import RenderLimitError, TmplkitError
from ..markup import lcp
from ..sandbox import render
from ..sources.templates import ChatTemplate, family_special_tokens
from ._handlers import server_handler
from ._inputs import session_render
from ._workarounds import _SPACE, in_content_form

__all__ = ["server_thinking"]

# The autoparser's probe texts (chat-diff-analyzer.cpp)
_USER = "U_USER_MSG Hello END_U"
_ANSWER = "A_ASST_MSG I can help END_A"
_REASONING = "REASON_PART I am thinking END_R"
_FUN = "FFF_FIRST_FUN_F"
_PARAMS = {"type": "object", "required": [],
           "properties": {"AA_ARG_FST_AA": {"type": "string", "description": "First argument"},
                          "BB_ARG_SND_BB": {"type": "string", "description": "Second argument"}}}
_TOOLS = [{"type": "function", "function": {"name": _FUN, "description": "Test function foo", "parameters": _PARAMS}},
          {"type": "function", "function": {"name": "SSS_SECOND_FUN_S", "description": "Test function bar",
                                            "parameters": _PARAMS}}]
_CALL = {"id": "call00001", "type": "function",
         "function": {"name": _FUN, "arguments": {"AA_ARG_FST_AA": "VVVV", "BB_ARG_SND_BB": "XXXX"}}}

# A marker as the autoparser's PEG builder reads one (`marker()`: "<" until ">", or "[" until "]")
_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"
_WRAPPED = re.compile(_MARKER + f"[{_SPACE}]*" + re.escape(_REASONING) + f"[{_SPACE}]*" + _MARKER)
_FOLLOWED = re.compile(re.escape(_REASONING) + f"[{_SPACE}]*" + _MARKER)


def server_thinking(template: ChatTemplate) -> bool:
    """Whether llama-server passes `enable_thinking` true to `template` by default (the module
    doc), cached by the template's text. A probe past its time or memory raises its RenderLimitError."""
    return _server_thinking(template.text, template.name, template.bos_token, template.eos_token)


@lru_cache(maxsize=256)
def _server_thinking(text: str, name: str, bos: str | None, eos: str | None) -> bool:
    template = ChatTemplate(text, name, "-", bos, eos)
    handled = _specialized(template)
    if handled is not None:
        return handled
    found = _presence(template) or _switch(template) or _scope(template)
    return found or _patched(text)


# The handlers that say the template does not reason (`supports_thinking` false); every other says
# it does, Qwen3-Coder's where the source names `<think>` (parsers/qwen3-coder.cpp).
_NO_THINKING = ("Functionary v3.2", "GigaChatV3")


def _specialized(template: ChatTemplate) -> bool | None:
    """What the handler that takes `template` says (`server_handler`); None where none takes it
    and the autoparser decides."""
    handler = server_handler(template)
    if handler is None:
        return None
    if handler == "Qwen3-Coder":
        return "<think>" in template.text
    return handler not in _NO_THINKING


def _patched(src: str) -> bool:
    """The autoparser's workarounds that set a reasoning mode (chat-diff-analyzer.cpp): old Qwen /
    DeepSeek thinking templates, Granite 3.3, Nemotron Nano v2."""
    old_qwen = "content.split('</think>')" in src and "reasoning_content" not in src and "<SPECIAL_12>" not in src
    granite = "Write your thoughts between <think></think> and write your response between <response></response>" in src
    nano_v2 = all(p in src for p in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>"))
    return old_qwen or granite or nano_v2


def _render(template: ChatTemplate, messages: list[dict], *, add_generation_prompt: bool = False,
            enable_thinking: bool = True, tools: list | None = None) -> str | None:
    """One probe as the autoparser renders it (`apply_template`: the template's BOS/EOS, the
    switch, the content in the form the template reads); None where it does not render."""
    try:
        return session_render(render, template, in_content_form(template, messages), tools=tools,
                              add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
                              **family_special_tokens(template))
    except RenderLimitError:
        raise
    except TmplkitError:
        return None


def _presence(template: ChatTemplate) -> bool:
    """`compare_reasoning_presence`: the reasoning of a reply rendered, wrapped in markers or
    followed by one."""
    plain = _render(template, [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER}])
    shown = _render(template, [{"role": "user", "content": _USER},
                               {"role": "assistant", "content": _ANSWER, "reasoning_content": _REASONING}])
    if plain is None or shown is None or _REASONING not in diff_split(plain, shown).right:
        return False
    if _WRAPPED.search(shown):
        return True
    first = shown.index(_REASONING)
    return _FOLLOWED.match(shown, first) is not None


def _switch(template: ChatTemplate) -> bool:
    """`compare_thinking_enabled`: the generation prompt of a user message, the switch off (A)
    against on (B)."""
    ask = [{"role": "user", "content": _USER}]
    off = _render(template, ask, add_generation_prompt=True, enable_thinking=False)
    on = _render(template, ask, add_generation_prompt=True, enable_thinking=True)
    if off is None or on is None:
        return False
    diff = diff_split(off, on)
    left, right = diff.left.strip(_SPACE), diff.right.strip(_SPACE)
    if not left and diff.right:
        return bool(right) and on.endswith(right)
    if not right and diff.left:
        return bool(left) and off.endswith(left)
    if left and right:
        return _tail_markers(off, on)
    return False


def _tail_markers(off: str, on: str) -> bool:
    """One render's last 64 characters found in the other with exactly two markers after them."""
    for base, extended in ((on, off), (off, on)):
        anchor = base[-64:]
        at = extended.rfind(anchor)
        if at < 0 or at + len(anchor) >= len(extended):
            continue
        extra = extended[at + len(anchor):].strip(_SPACE)
        if not extra:
            continue
        seg = [s for s in segments(extra) if s.value.strip(_SPACE)]
        if len(seg) == 2 and seg[0].marker and seg[1].marker:
            return True
    return False


def _scope(template: ChatTemplate) -> bool:
    """`compare_reasoning_scope`: reasoning rendered on a tool-call turn and not on an answer (the
    C++ engine's null content is left out: the sandbox drops null-valued keys)."""
    answer = _render(template, [{"role": "user", "content": _USER},
                                {"role": "assistant", "content": _ANSWER, "reasoning_content": _REASONING}], tools=_TOOLS)
    call = _render(template, [{"role": "user", "content": _USER},
                              {"role": "assistant", "reasoning_content": _REASONING, "tool_calls": [_CALL]}], tools=_TOOLS)
    return answer is not None and call is not None and _REASONING not in answer and _REASONING in call


@dataclass(frozen=True)
class Segment:
    value: str
    marker: bool


def segments(text: str) -> list[Segment]:
    """`segmentize_markers` (chat-auto-parser-helpers.cpp): text and `<...>` / `[...]` markers."""
    out: list[Segment] = []
    border, opener = 0, ""
    for i, c in enumerate(text):
        if not opener and c in "<[":
            if border < i:
                out.append(Segment(text[border:i], False))
            border, opener = i, c
        elif opener and c == {"<": ">", "[": "]"}[opener]:
            out.append(Segment(text[border:i + 1], True))
            border, opener = i + 1, ""
    if border < len(text):
        out.append(Segment(text[border:], False))
    return out


@dataclass(frozen=True)
class Diff:
    prefix: str
    left: str
    right: str
    suffix: str


def diff_split(left: str, right: str) -> Diff:
    """`calculate_diff_split` (chat-auto-parser-helpers.cpp): the two renders' common prefix and
    suffix, by marker segments and then by characters, and what lies between on each side."""
    ls, rs = segments(left), segments(right)
    if not ls:
        return Diff("", "", right, "")
    if not rs:
        return Diff("", left, "", "")
    prefix, suffix = "", ""
    l0, l1, r0, r1 = 0, len(ls) - 1, 0, len(rs) - 1
    lfull = rfull = False
    while l0 != l1 and r0 != r1:
        moved = False
        if ls[l0] == rs[r0]:
            prefix += ls[l0].value
            l0, r0, moved = l0 + 1, r0 + 1, True
        if ls[l1] == rs[r1]:
            suffix = ls[l1].value + suffix
            if l0 != l1:
                l1 -= 1
            else:
                lfull = True
            if r0 != r1:
                r1 -= 1
            else:
                rfull = True
            moved = True
        if not moved:
            break
    if l0 == l1 and r0 != r1:
        if ls[l0] == rs[r1]:
            suffix, r1, lfull = rs[r1].value + suffix, r1 - 1, True
        elif ls[l0] == rs[r0]:
            prefix, r0, lfull = prefix + rs[r0].value, r0 + 1, True
    elif r0 == r1 and l0 != l1:
        if ls[l1] == rs[r0]:
            suffix, l1, rfull = ls[l1].value + suffix, l1 - 1, True
        elif ls[l0] == rs[r0]:
            prefix, l0, rfull = prefix + ls[l0].value, l0 + 1, True
    elif l0 == l1 and r0 == r1 and ls[l0] == rs[r0] and ls[l0].marker:
        prefix, lfull, rfull = prefix + rs[r0].value, True, True
    text_suffix = not ls[l1].marker and not rs[r1].marker
    text_prefix = not rs[r0].marker and not ls[l0].marker
    rest_l = "".join(s.value for s in ls[l0:l1 if lfull else l1 + 1])
    rest_r = "".join(s.value for s in rs[r0:r1 if rfull else r1 + 1])
    n_suffix = lcp(rest_l[::-1], rest_r[::-1]) if text_suffix else 0
    n_prefix = lcp(rest_l[:len(rest_l) - n_suffix], rest_r[:len(rest_r) - n_suffix]) if text_prefix else 0
    prefix += rest_l[:n_prefix]
    suffix = rest_l[len(rest_l) - n_suffix:] + suffix
    d_left, d_right = rest_l[n_prefix:len(rest_l) - n_suffix], rest_r[n_prefix:len(rest_r) - n_suffix]
    if not d_left and not d_right:
        prefix, suffix = left, ""
    if not d_left and d_right and right.startswith(left):
        prefix, suffix, d_right = left, "", right[len(left):]
    return Diff(prefix, d_left, d_right, suffix)
