"""Which of llama-server's specialized chat handlers takes a template.

The server tries its handlers in one order (common/chat.cpp, `common_chat_try_specialized_template`)
and the first whose markers the template's source holds takes it; where none does, its
differential autoparser reads the template. Each handler is named as it logs itself ("Using
specialized template: NAME", the names `server_rules.HANDLER_DELIMITERS` keys), Gemma 4's, which
logs nothing, as "Gemma 4". Every decision of the server setting that follows the handler (the
reasoning under `thinking`, `enable_thinking`, Ministral 3's blocks, DeepSeek V4's order, Gemma 4's
turns) asks `server_handler`, so a template with two families' markers gets one handler's
treatment, as on the server.

    >>> from tmplkit.sources import ChatTemplate
    >>> server_handler(ChatTemplate("<|start|>{{ m }}<|channel|>", "t", "-"))
    'GPT-OSS'
    >>> server_handler(ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "t", "-")) is None
    True
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from ..sources.templates import ChatTemplate

__all__ = ["server_handler"]


def _all(*parts: str) -> Callable[[str], bool]:
    return lambda src: all(p in src for p in parts)


def _qwen3_coder(src: str) -> bool:
    # (not the templates that write no newline between the tags)
    return _all("<tool_call>", "<function=", "<parameter=")(src) \
        and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src


# In the server's order (chat.cpp:1090-1214): name, test of the template's source.
_HANDLERS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("Ministral/Magistral Large 3", lambda s: _all("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")(s) and "[CALL_ID]" not in s),
    ("GPT-OSS", _all("<|channel|>")),
    ("Muse Glimmer", _all("<atem:function_calls>", "<|eom|>")),
    ("Functionary v3.2", _all(">>>all", ">>>${recipient}")),
    ("Kimi K2 Thinking", _all("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    ("Kimi K3", _all("<|open|>", "<|close|>", "<|end_of_msg|>")),
    ("Ling 3.0 (Bailing V3)", _all("<role>ASSISTANT</role>", "<arg_key>")),
    ("Cohere2 MoE", _all("<|START_TEXT|>", "<|START_ACTION|>")),
    ("LFM2", _all("<|tool_list_start|>", "<|tool_list_end|>")),
    ("LFM2.5", lambda s: "List of tools: [" in s and "<|tool_list_start|>" not in s),
    ("GigaChatV3", lambda s: _all("<|role_sep|>", "<|message_sep|>")(s) and "<|function_call|>" not in s),
    ("MiniMax-M3", _all("]<]minimax[>[", "<tool_call>", "<invoke name=")),
    ("DeepSeek V3.2/V4", lambda s: _all("dsml_token", "DSML")(s) and ("function_calls" in s or "tool_calls" in s)),
    ("Gemma 4", _all("'<|tool_call>call:'")),
    ("MiniCPM5", _all("Tool usage guidelines:", '<function name="', '<param name="')),
    ("Qwen3-Coder", _qwen3_coder),
)


def server_handler(template: ChatTemplate) -> str | None:
    """The name of the specialized handler llama-server gives `template` (the module doc), or None
    where its autoparser reads it. Cached by the template's text."""
    return _handler(template.text)


@lru_cache(maxsize=1024)
def _handler(src: str) -> str | None:
    return next((name for name, takes in _HANDLERS if takes(src)), None)
