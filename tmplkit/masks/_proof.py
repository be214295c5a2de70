"""The proof of an annotated copy: the check conversations, tmplkit's mask of each, and
transformers' own render and generation indices (`return_assistant_tokens_mask`), which must equal
tmplkit's render and mask on every one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..analysis.probes import Shape, extra_variable, tools_for
from ..environment import quiet_transformers
from ..errors import TmplkitError
from ..sandbox import PINNED_NOW
from ..session import Conversation, ServerConversation, for_server, generate_session, load_conversation
from ..sources.templates import ChatTemplate
from ._mask import TextMask, _analysis_of, text_mask
from ._tracing import rendered

__all__ = ["AnnotationError", "check_conversations", "transformers_mask"]


_PLAIN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
          {"role": "assistant", "content": "Goodbye."}]


_CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}


_TOOLS = [{"type": "function", "function": {"name": "ls", "description": "List files.",
                                             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


_REASONED = {"messages": [{"role": "user", "content": "What is 2+2?"},
                          {"role": "assistant", "reasoning_content": "Add them.", "content": "4"},
                          {"role": "user", "content": "List the files."},
                          {"role": "assistant", "reasoning_content": "Use the tool.", "content": "", "tool_calls": [_CALL]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
                          {"role": "assistant", "reasoning_content": "One file.", "content": "a.txt"}], "tools": _TOOLS}


_CHECKS = [_PLAIN, _PLAIN[1:], _REASONED]


class AnnotationError(TmplkitError, ValueError):
    """The generation tags cannot be placed so that transformers' mask provably equals tmplkit's."""


def transformers_mask(text: str, server: ServerConversation) -> tuple[str, list[tuple[int, int]]]:
    """transformers' own render of `server`'s conversation with `text` as the template, and the
    character ranges of its generation blocks (`return_assistant_tokens_mask`)."""
    with quiet_transformers():
        from transformers.utils.chat_template_utils import render_jinja_template

    server = for_server(server.template, server, inputs="transformers")  # (the messages as a trainer gives them)
    variables = {k: v for k, v in server.variables.items() if k not in ("messages", "tools")}
    _pin_clock(text)
    result: Any = render_jinja_template(
        conversations=[[dict(m) for m in server.messages]], tools=list(server.tools) if server.tools else None,
        chat_template=text, return_assistant_tokens_mask=True, add_generation_prompt=False, **variables)
    rendered, indices = result
    return rendered[0], [(int(a), int(b)) for a, b in indices[0]]


def _pin_clock(text: str) -> None:
    """transformers' compiled copy of `text` (cached by its text) reads tmplkit's pinned date from
    `strftime_now`, so a template that prints today's date prints in both the date tmplkit's renders
    print (template variables cannot carry a function there)."""
    with quiet_transformers():
        from transformers.utils import chat_template_utils

    compile_ = getattr(chat_template_utils, "_compile_jinja_template", None)
    if compile_ is not None:
        compile_(text).environment.globals["strftime_now"] = PINNED_NOW.strftime


def check_conversations() -> list[Conversation]:
    """The conversations an annotation is proved on: a plain chat, one with reasoning and tool
    calls, a short generated session of tool calls and a short agent session whose turns reason
    before their calls (where a captured body's headers or a mark's place first differ)."""
    return [load_conversation(c) for c in _CHECKS] + [generate_session(1500, seed=0, requests=2),
                                                      generate_session(6000, seed=3, style="agent")]


def proves(text: str, cases: Sequence[tuple[ServerConversation, TextMask]], only: frozenset | None = None) -> str | None:
    """Why `text` does not prove on `cases` (None: it does); `only`: the (case, turn) pairs whose
    masks its tags must give (default: every masked turn)."""
    for c, (server, mask) in enumerate(cases):
        ours = rendered(server, text)
        if ours != mask.text:
            return "the annotated template renders otherwise"
        try:
            theirs, indices = transformers_mask(text, server)
        except Exception as exc:  # transformers' own error on the annotated copy
            return f"transformers fails on it ({type(exc).__name__}: {exc})"
        if theirs != mask.text:
            return "transformers renders the conversation otherwise than tmplkit"
        want = [(t.start, t.end) for k, t in enumerate(mask.turns)
                if t.end > t.start and (only is None or (c, k) in only)]
        if [r for r in indices if r[1] > r[0]] != want:
            return "transformers' mask differs"
    return None


def check_cases(template: ChatTemplate, conversations) -> list[tuple[ServerConversation, TextMask]]:
    out = []
    first: TmplkitError | None = None
    for c in conversations if conversations is not None else check_conversations():
        conversation = c if isinstance(c, Conversation) else load_conversation(c)
        for shaped, kwargs in [(conversation, None), *_as_analysed(template, conversation)]:
            server = for_server(template, shaped, kwargs, inputs="transformers")  # as a trainer renders
            try:
                out.append((server, text_mask(template, server)))
                break
            except TmplkitError as exc:
                first = first or exc
                continue  # a conversation the template refuses (no tools, strict alternation) proves nothing
    if not out:
        why = f" (the first: {first})" if first is not None else ""
        raise AnnotationError(f"template '{template.name}' renders none of the check conversations{why}; "
                              "`tmplkit audit` on it says why")
    return out


def _as_analysed(template: ChatTemplate, conversation: Conversation) -> list[tuple[Conversation, dict]]:
    """`conversation` shaped as the template's analysis found it takes one (tools declared in every
    conversation, tools without the `function` wrapper, variables it reads such as Firefunction's
    `functions`): with the analysis' shape, then with the tools flattened too."""
    try:
        adaptations = _analysis_of(template).capabilities.get("adaptations") or []
    except TmplkitError:
        return []
    out = []
    for flat in sorted({"flat_tools" in adaptations, True}):
        shape = Shape(tools_always="tools_always" in adaptations, flat_tools=flat)
        tools = list(conversation.tools or (tools_for(shape) if shape.tools_always else None) or [])
        if flat:
            tools = [t.get("function", t) for t in tools]
        names = [a.split(":", 1)[1] for a in adaptations if a.startswith("variable:")]
        kwargs = {n: v for n in names if (v := extra_variable(n, shape)) is not None}
        out.append((replace(conversation, tools=tuple(tools) or None), kwargs))
    return out
