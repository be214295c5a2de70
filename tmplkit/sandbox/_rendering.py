"""Rendering: `render()` (a template over prepared inputs, under the limits, the output counted as
it streams) and `compile_template()`, each failure told as a RenderError in the template's words.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError

from ..errors import InputError, RenderError, RenderLimitError
from ..sources.templates import ChatTemplate, require_template
from ._inputs import _plain, _prepare_dicts, _prepare_messages, _refused_if_recursive
from ._jinja import NONE_REFUSALS, PROMPT_MARK, SequenceToJson, _compile, _compile_server, _compile_split, _compile_split_server
from ._limits import _STATE, DEFAULT_LIMITS, Limits, _State, _timeout, _too_big, hint

__all__ = ["ENGINES", "compile_template", "render", "render_with_prompt"]

# Methods the immutable sandbox refuses because they modify a list, dict, set or deque.
_MUTATORS = frozenset({
    "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", "update", "setdefault", "popitem",
    "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
    "appendleft", "extendleft", "popleft", "rotate",
})
_MUTATOR_ACCESS = re.compile(r"access to attribute '(\w+)' of '\w+' object is unsafe")


def compile_template(template: ChatTemplate) -> jinja2.Template:
    """Compile (once; later calls hit a cache) and return the Jinja template, or raise RenderError."""
    token = _STATE.set(_State(DEFAULT_LIMITS, None, template.name))
    try:
        compiled = _compile(template.text)
    finally:
        _STATE.reset(token)
    if isinstance(compiled, Exception):
        raise _render_error(template, compiled, None) from compiled
    return compiled


# --- rendering ------------------------------------------------------------------------------------


def _template_line(compiled, exc) -> int | None:
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            try:
                line = compiled.get_corresponding_lineno(tb.tb_lineno)
            except Exception:  # pragma: no cover - best effort only
                pass
        tb = tb.tb_next
    return line


def _render_error(template: ChatTemplate, exc: BaseException, compiled) -> RenderError:
    if isinstance(exc, TemplateSyntaxError):
        err = RenderError(f"template '{template.name}' does not compile: {exc.message} (line {exc.lineno})")
        err.template_message = str(exc.message)
        return err
    line = _template_line(compiled, exc) if compiled is not None else None
    where = f" (line {line})" if line else ""
    if isinstance(exc, TemplateError):
        message = exc.message if getattr(exc, "message", None) is not None else str(exc)
        err = RenderError(f"template '{template.name}' raised{where}: {message}")
        # raise_exception() raises a bare TemplateError: the template refused the input on purpose.
        err.template_raised = type(exc) is TemplateError
    elif isinstance(exc, RecursionError):
        message = "recursion too deep"
        err = RenderError(f"template '{template.name}' recursed too deeply{where}; it may call a macro without end")
    else:
        # (the engine's own refusal in Python's words: transformers raises a TypeError there)
        kind = "TypeError" if isinstance(exc, SequenceToJson) else type(exc).__name__
        message = f"{kind}: {exc}"
        err = RenderError(f"template '{template.name}' failed{where}: {message}")
    err.template_message = str(message)
    if not hasattr(err, "template_raised"):
        err.template_raised = False
    return err


def render(
    template: ChatTemplate,
    messages,
    *,
    tools=None,
    documents=None,
    add_generation_prompt: bool = False,
    limits: Limits | None = None,
    clock: Callable[[], datetime] | None = None,
    engine: str = "transformers",
    **extra_context,
) -> str:
    """Render `messages` with `template` exactly as transformers' apply_chat_template(tokenize=False) does.

    `bos_token`/`eos_token` come from the ChatTemplate (when set) and are passed as template
    variables; `extra_context` (e.g. `enable_thinking=False`) is passed too and overrides them.
    `clock` is a zero-argument callable returning a datetime for `strftime_now` (default: the
    pinned `PINNED_NOW`; `system_clock` for the real time).

    Raises RenderError when the template raises or does not compile (its own message is kept in
    the error's `template_message`), RenderLimitError when the render goes past `limits`, and
    InputError for inputs transformers would refuse. `engine="llama-server"`: what transformers'
    sandbox refuses and llama-server's engine renders (a list changed in place, a filter's sequence
    to `tojson`) is rendered as that engine does (`_jinja._ServerEnvironment`, on a copy of the inputs).

        >>> render(t, [{"role": "user", "content": "hi"}], add_generation_prompt=True, limits=Limits(seconds=0.5))  # doctest: +SKIP
    """
    context = _context(template, messages, tools, documents, add_generation_prompt, extra_context)
    return _render(template, context, limits, clock, split=False, engine=engine)[0]


def render_with_prompt(
    template: ChatTemplate,
    messages,
    *,
    tools=None,
    documents=None,
    limits: Limits | None = None,
    clock: Callable[[], datetime] | None = None,
    engine: str = "transformers",
    **extra_context,
) -> tuple[str, str]:
    """`render(..., add_generation_prompt=True)` and `render(..., add_generation_prompt=False)`, in
    one pass where the template provably renders the second as the first less its generation prompt
    block (`_jinja._prompt_block`: nearly every chat template ends with it), else in two."""
    context = _context(template, messages, tools, documents, True, extra_context)
    with_prompt, without = _render(template, context, limits, clock, split="add_generation_prompt" not in extra_context,
                                   engine=engine)
    if without is None:
        without = render(template, messages, tools=tools, documents=documents, add_generation_prompt=False,
                         limits=limits, clock=clock, engine=engine, **extra_context)
    return with_prompt, without


def _context(template: ChatTemplate, messages, tools, documents, add_generation_prompt: bool, extra_context) -> dict:
    require_template(template)  # (render and render_with_prompt both start here)
    with _refused_if_recursive("the messages, tools or template variables hold", messages, tools, documents, extra_context):
        prepared = _prepare_messages(messages)
        context: dict[str, Any] = {}
        if template.bos_token is not None:
            context["bos_token"] = template.bos_token
        if template.eos_token is not None:
            context["eos_token"] = template.eos_token
        context.update(_plain(extra_context))
        return {
            "messages": prepared,
            "tools": _prepare_dicts(tools, "tools", "JSON-schema dicts"),
            "documents": _prepare_dicts(documents, "documents", "dicts with 'title' and 'text' keys"),
            "add_generation_prompt": add_generation_prompt,
            **context,
        }


def _render(template: ChatTemplate, context: dict, limits: Limits | None, clock, *, split: bool,
            engine: str = "transformers") -> tuple[str, str | None]:
    """The render, and with `split` the render without the generation prompt where the template's
    split variant (`_jinja._compile_split`) gives it in the same pass (else None). With
    `engine="llama-server"`, a render transformers' sandbox refuses for what llama-server's engine
    does (`engine_refusal`) is made again in that engine, on a copy of the inputs."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}: give one of {', '.join(ENGINES)}")
    if engine == "llama-server" and template.text in _SERVER_ONLY:
        return _render_in(template, _own_copy(context), limits, clock, split=split, server=True)
    try:
        return _render_in(template, context, limits, clock, split=split, server=False)
    except RenderError as exc:
        if engine != "llama-server" or not exc.engine_refusal:
            raise
    # (where transformers' sandbox renders, llama-server's engine renders the same: a template it
    # refused once is rendered there from then on, without the refused render first)
    if len(_SERVER_ONLY) >= 256:
        _SERVER_ONLY.clear()
    _SERVER_ONLY.add(template.text)
    return _render_in(template, _own_copy(context), limits, clock, split=split, server=True)


_SERVER_ONLY: set[str] = set()  # the texts of templates only llama-server's engine renders


def _own_copy(context: dict) -> dict:
    """The render's own copy of its inputs, rebuilt as plain data (a `Prepared` list a plain list):
    the template changes what it is given, and a session's prepared messages are shared by its renders."""
    return {k: _plain(v) for k, v in context.items()}


ENGINES = ("transformers", "llama-server")


def _render_in(template: ChatTemplate, context: dict, limits: Limits | None, clock, *, split: bool,
               server: bool) -> tuple[str, str | None]:
    state = _State(DEFAULT_LIMITS if limits is None else limits, clock, template.name)
    token = _STATE.set(state)
    compiled = None
    try:
        compiled = (_compile_server if server else _compile)(template.text)
        if isinstance(compiled, Exception):
            raise _render_error(template, compiled, None) from compiled
        # (the variant's own line table for the errors: its code has two more statements)
        compiled = ((_compile_split_server if server else _compile_split)(template.text) if split else None) or compiled
        ctx = compiled.new_context(context)
        parts: list[str] = []
        marks: list[int] = []
        total = 0
        max_chars = state.max_chars
        deadline = state.deadline
        for piece in compiled.root_render_func(ctx):
            if piece is PROMPT_MARK:
                marks.append(len(parts))
                continue
            total += len(piece)
            if max_chars is not None and total > max_chars:
                _too_big(state, total, "produced output")
            parts.append(piece)
        if deadline is not None and time.perf_counter() > deadline:
            _timeout(state)
        without = "".join(parts[:marks[0]] + parts[marks[1]:]) if len(marks) == 2 else None
        return "".join(parts), without
    except (RenderError, InputError):
        raise
    except MemoryError as exc:
        raise RenderLimitError(f"template '{template.name}' ran out of memory while rendering{_memory_hint()}",
                               kind="memory") from exc
    except SecurityError as exc:
        m = _MUTATOR_ACCESS.match(str(exc))
        if m is not None and m.group(1) in _MUTATORS:
            # list.append & co. under the immutable sandbox: transformers fails the same way; not an escape.
            err = _render_error(template, exc, compiled)
            err.engine_refusal = not server  # (llama-server's engine renders it)
            raise err from exc
        line = _template_line(compiled, exc) if compiled is not None else None
        where = f" (line {line})" if line else ""
        raise RenderLimitError(f"template '{template.name}' did something the sandbox forbids{where}: {exc}",
                               kind="unsafe") from exc
    except Exception as exc:
        err = _render_error(template, exc, compiled)
        # (a filter's sequence to `tojson`: transformers' json.dumps refuses a generator; llama-server's engine
        # writes it; `none | items`: its engine gives an empty list)
        err.engine_refusal = not server and (isinstance(exc, SequenceToJson) or
                                             (type(exc) is TypeError and str(exc) in NONE_REFUSALS))
        raise err from exc
    finally:
        _STATE.reset(token)


def _memory_hint() -> str:
    """How to raise the memory a render ran out of: a worker's limit (its address space is capped,
    tmplkit.auditing.workers) is the user's to raise; the machine's is not."""
    try:
        import resource

        capped = resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY
    except (ImportError, OSError, ValueError):
        capped = False
    return f" (the template may build a huge value); if the input is meant to be this large, {hint('memory_mb')}" if capped else ""
