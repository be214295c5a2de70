"""Rendering chat templates: a sandboxed Jinja environment that renders exactly as transformers does.

`render()` gives the same text as transformers' `tokenizer.apply_chat_template(..., tokenize=False)`:
the same environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, a
`{% generation %}` tag), the same `tojson` filter and `raise_exception`/`strftime_now`/`dict`/
`namespace` globals, and the same preparation of the inputs (None-valued message keys dropped,
reasoning fields aliased, everything reduced to plain JSON data, bos/eos passed as variables).

Two things differ on purpose:

- `strftime_now` reads a pinned clock (`PINNED_NOW`) unless `clock=` is given, so renders are
  deterministic; pass `clock=system_clock` for the real time.
- Templates are untrusted code, so every render runs under `Limits`: a wall-clock budget and a cap
  on the characters produced. They are checked cooperatively inside the sandbox (on every loop
  iteration, every call, the intercepted `*`/`**`/`%` operators, every filter result, every
  namespace store, and on the output stream), and a render that goes past one raises
  `RenderLimitError` with kind 'timeout' or 'size'.

    >>> from tmplkit.sources import ChatTemplate
    >>> t = ChatTemplate(text="{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", name="t", source="-")
    >>> render(t, [{"role": "user", "content": "hi"}])
    '<user>hi'
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import string
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .compile_cache import compile_template_cached
from .errors import InputError, RenderError, RenderLimitError
from .sources import ChatTemplate

__all__ = ["Limits", "DEFAULT_LIMITS", "PINNED_NOW", "system_clock", "render", "compile_template", "hint", "hint_place",
           "hints_for"]

# The time `strftime_now` reports unless a clock is given.
PINNED_NOW = datetime(2025, 1, 1, 12, 0, 0)
system_clock: Callable[[], datetime] = datetime.now


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-render limits. `None` turns a limit off.

    `seconds`: wall-clock budget of one render (compiling included the first time).
    `max_output_chars`: cap on the rendered text, and on any single string or list the template
    builds on the way (so a template cannot blow up memory before its output is counted).
    """

    seconds: float | None = 2.0
    max_output_chars: int | None = 10_000_000

    def __post_init__(self):
        for name in ("seconds", "max_output_chars"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(f"Limits.{name} must be a number or None, got {value!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise InputError(f"Limits.seconds must be positive or None, got {self.seconds!r}")
        if self.max_output_chars is not None and not self.max_output_chars > 0:
            raise InputError(f"Limits.max_output_chars must be positive or None, got {self.max_output_chars!r}")

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "max_output_chars": self.max_output_chars}


DEFAULT_LIMITS = Limits()


# --- the state of the render in progress (read by the sandbox hooks) -------------------------------


class _State:
    __slots__ = ("deadline", "seconds", "max_chars", "clock", "name")

    def __init__(self, limits: Limits, clock: Callable[[], datetime] | None, name: str):
        self.seconds = limits.seconds
        self.deadline = None if limits.seconds is None else time.perf_counter() + limits.seconds
        self.max_chars = limits.max_output_chars
        self.clock = clock
        self.name = name


_STATE: ContextVar[_State | None] = ContextVar("tmplkit_render_state", default=None)


# --- hints: how a user raises a limit, in the terms of where they are -------------------------------

# A library caller raises a limit with `Limits(...)` or a function's argument, a command-line user
# with a flag; the CLI runs its commands inside `hints_for("cli")`, and isolate.py carries the place
# into its workers. The per-render limits have no flag: on the command line the hint says so.
_HINTS = {
    "library": {
        "seconds": "raise Limits(seconds=...)",
        "max_output_chars": "raise Limits(max_output_chars=...)",
        "timeout": "raise the timeout argument (seconds per template)",
        "memory_mb": "raise the memory_mb argument (MiB per worker)",
    },
    "cli": {
        "seconds": "analyze it from Python with a larger Limits(seconds=...) (one render's limit is not a command-line option)",
        "max_output_chars": "analyze it from Python with a larger Limits(max_output_chars=...) "
                            "(the output limit is not a command-line option)",
        "timeout": "raise --timeout",
        "memory_mb": "raise --memory",
    },
}
_HINT_PLACE: ContextVar[str] = ContextVar("tmplkit_hint_place", default="library")


def hint(limit: str) -> str:
    """How to raise `limit` ('seconds', 'max_output_chars', 'timeout' or 'memory_mb') from where the user is.

    >>> with hints_for("cli"):
    ...     hint("timeout")
    'raise --timeout'
    >>> hint("seconds")
    'raise Limits(seconds=...)'
    """
    return _HINTS[_HINT_PLACE.get()][limit]


def hint_place() -> str:
    """Where limit hints are worded for now: 'library' (the default) or 'cli'."""
    return _HINT_PLACE.get()


@contextlib.contextmanager
def hints_for(place: str) -> Iterator[None]:
    """Word limit hints for `place` ('library' or 'cli') inside the `with` block."""
    if place not in _HINTS:
        raise ValueError(f"hint place must be one of {', '.join(_HINTS)}, not {place!r}")
    token = _HINT_PLACE.set(place)
    try:
        yield
    finally:
        _HINT_PLACE.reset(token)


def _timeout(state: _State):
    raise RenderLimitError(
        f"rendering template '{state.name}' took longer than {state.seconds:g} s; the template may loop "
        f"without end. If it is legitimately slow, {hint('seconds')}",
        kind="timeout",
    )


def _too_big(state: _State, size: int, what: str):
    raise RenderLimitError(
        f"template '{state.name}' {what} of {size} characters, over the limit of {state.max_chars}; "
        f"if the conversation is legitimately that long, {hint('max_output_chars')}",
        kind="size",
    )


def _check_time():
    state = _STATE.get()
    if state is not None and state.deadline is not None and time.perf_counter() > state.deadline:
        _timeout(state)


def _check_size(value, what: str = "built a value"):
    if isinstance(value, (str, list, tuple)):
        state = _STATE.get()
        if state is not None and state.max_chars is not None and len(value) > state.max_chars:
            _too_big(state, len(value), what)
    return value


def _check_planned(size: int, what: str):
    state = _STATE.get()
    if state is not None and state.max_chars is not None and size > state.max_chars:
        _too_big(state, size, what)


def _guard_iter(iterable):
    """Wraps the iterable of every `{% for %}`: the time budget is checked on each iteration."""
    state = _STATE.get()
    if state is None or state.deadline is None:
        yield from iterable
        return
    deadline = state.deadline
    clock = time.perf_counter
    for item in iterable:
        if clock() > deadline:
            _timeout(state)
        yield item


# --- the globals and filters transformers installs (our own code, same behaviour) -------------------


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Same signature as transformers' filter (positional arguments land in the same places), and
    # unlike Jinja's own `tojson` it does not HTML-escape.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    state = _STATE.get()
    clock = state.clock if state is not None and state.clock is not None else None
    now = clock() if clock is not None else PINNED_NOW
    return now.strftime(format)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` without exposing the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore-prefixed names and values over the size limit."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for key in attrs:
            _TemplateNamespace._check_name(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        _check_size(value, f"stored a namespace value ({name})")
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


_GUARD_FILTER = "tmplkit_guard_iter"
_STR_PAD_METHODS = {"ljust", "rjust", "center", "zfill", "expandtabs"}
_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(\d+)")
_PERCENT_STAR = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\*|\d*\.\*)")


def _wrap_filter(func):
    def wrapped(*args, **kwargs):
        return _check_size(func(*args, **kwargs), "built a value")

    for attr in ("jinja_pass_arg",):
        if hasattr(func, attr):
            setattr(wrapped, attr, getattr(func, attr))
    wrapped.__name__ = getattr(func, "__name__", "filter")
    return wrapped


def _width_filter(func, width_at: int):
    """Filters that pad to a width (`center`, `indent`) are checked before they allocate."""

    def wrapped(*args, **kwargs):
        width = kwargs.get("width", args[width_at] if len(args) > width_at else None)
        if isinstance(width, int) and not isinstance(width, bool):
            text = args[0] if args else ""
            lines = str(text).count("\n") + 1 if func.__name__ == "do_indent" else 1
            _check_planned(width * lines, "asked for a padded string")
        return _check_size(func(*args, **kwargs), "built a value")

    for attr in ("jinja_pass_arg",):
        if hasattr(func, attr):
            setattr(wrapped, attr, getattr(func, attr))
    return wrapped


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _arg(args, kwargs, at: int, name: str):
    return kwargs.get(name, args[at] if len(args) > at else None)


def _format_widths(fmt: str, args=(), kwargs=None) -> int:
    """The largest width/precision a str.format string asks for (nested `{:{w}}` specs take it from the arguments)."""
    largest = 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return 0  # format() will raise on it anyway
    for _, _, spec, _ in fields:
        if spec:
            largest = max([largest, *(int(d) for d in re.findall(r"\d+", spec))])
            if "{" in spec:
                values = (*args, *(kwargs or {}).values())
                largest = max([largest, *(v for v in map(_int, values) if v is not None)])
    return largest


def _percent_widths(fmt: str, values) -> int:
    """The largest width a printf-style string asks for, `*` widths included."""
    largest = max([0, *(int(w) for w in _PERCENT_WIDTH.findall(fmt))])
    if _PERCENT_STAR.search(fmt):
        values = values if isinstance(values, tuple) else (values,)
        largest = max([largest, *(v for v in map(_int, values) if v is not None)])
    return largest


def _replace_size(args, kwargs) -> int:
    text, old, new = (str(_arg(args, kwargs, i, n) or "") for i, n in ((0, "s"), (1, "old"), (2, "new")))
    count = _int(_arg(args, kwargs, 3, "count"))
    hits = len(text) + 1 if old == "" else text.count(old)
    if count is not None and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * len(new)


# Filters whose result size is known from their arguments: checked before they allocate.
_PLANNED_FILTERS = {
    "format": lambda a, k: _percent_widths(str(a[0]) if a else "", tuple(a[1:]) or tuple(k.values())),
    "tojson": lambda a, k: _int(_arg(a, k, 2, "indent")) or 0,
    "replace": _replace_size,
    "batch": lambda a, k: _int(_arg(a, k, 1, "linecount")) or 0,
    "slice": lambda a, k: _int(_arg(a, k, 1, "slices")) or 0,
}


def _planned_filter(func, size_of):
    def wrapped(*args, **kwargs):
        # Jinja passes the environment/context first to some filters; the plan looks at the value and after.
        plain = args[1:] if getattr(func, "jinja_pass_arg", None) is not None else args
        _check_planned(size_of(plain, kwargs), "asked a filter for a value")
        return _check_size(func(*args, **kwargs), "built a value")

    for attr in ("jinja_pass_arg",):
        if hasattr(func, attr):
            setattr(wrapped, attr, getattr(func, attr))
    return wrapped


class _Environment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, plus cooperative limit checks."""

    intercepted_binops = frozenset(("*", "**", "%"))

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        # Jinja's optimizer only folds constant expressions at compile time; without it the same
        # values are computed at render time instead. Compiling is most of an analysis's time and
        # the optimizer a fifth of compiling; tests/test_parity.py shows the output is unchanged.
        self.optimized = False
        for key, func in list(self.filters.items()):
            if key in ("center", "indent"):
                self.filters[key] = _width_filter(func, 1)
            elif key in _PLANNED_FILTERS:
                self.filters[key] = _planned_filter(func, _PLANNED_FILTERS[key])
            else:
                self.filters[key] = _wrap_filter(func)
        self.filters["tojson"] = _planned_filter(_tojson, _PLANNED_FILTERS["tojson"])
        self.filters[_GUARD_FILTER] = _guard_iter
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["dict"] = _TemplateDict()
        self.globals["namespace"] = _TemplateNamespace
        lipsum = self.globals["lipsum"]

        def bounded_lipsum(n=5, html=True, min=20, max=100):
            if isinstance(n, int) and isinstance(max, int):
                _check_planned(n * max * 12, "asked lipsum for a text")
            return lipsum(n, html, min, max)

        self.globals["lipsum"] = bounded_lipsum

    def _parse(self, source, name, filename):
        # Every `{% for %}` iterates through a guard that checks the time budget.
        tree = super()._parse(source, name, filename)
        for node in tree.find_all(jinja2.nodes.For):
            node.iter = jinja2.nodes.Filter(node.iter, _GUARD_FILTER, [], [], None, None, lineno=node.lineno)
        return tree

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (same convention as Jinja)
        state = _STATE.get()
        if state is not None:
            if state.deadline is not None and time.perf_counter() > state.deadline:
                _timeout(state)
            if state.max_chars is not None:
                for value in args:
                    _check_size(value, "passed an argument")
                self_obj = getattr(__obj, "__self__", None)
                if isinstance(self_obj, str) and getattr(__obj, "__name__", "") in _STR_PAD_METHODS:
                    for value in (*args, *kwargs.values()):
                        if isinstance(value, int) and not isinstance(value, bool):
                            _check_planned(value * (1 if __obj.__name__ != "expandtabs" else max(1, self_obj.count("\t"))),
                                           "asked for a padded string")
                elif getattr(__obj, "__name__", "") in ("format", "format_map"):
                    # The sandbox hands out str.format wrapped; the string is the wrapped method's __self__.
                    fmt = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
                    mapping = args[0] if __obj.__name__ == "format_map" and args and isinstance(args[0], dict) else None
                    if isinstance(fmt, str):
                        _check_planned(_format_widths(fmt, () if mapping else args, mapping or kwargs),
                                       "asked for a formatted string")
        result = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
        return _check_size(result, "built a value")

    def call_binop(self, context, operator_, left, right):
        if operator_ == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                    _check_planned(len(seq) * n, "multiplied a sequence to a length")
        elif operator_ == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                bits = right * max(1, abs(left).bit_length())
                if bits > 1_000_000:
                    state = _STATE.get()
                    name = state.name if state is not None else "?"
                    raise RenderLimitError(
                        f"template '{name}' computed {left} ** {right}, a number of about {bits} bits; refusing",
                        kind="size",
                    )
        elif operator_ == "%" and isinstance(left, str):
            _check_planned(_percent_widths(left, right), "asked for a formatted string")
        return _check_size(self.binop_table[operator_](left, right), "built a value")


# Methods the immutable sandbox refuses because they modify a list, dict, set or deque.
_MUTATORS = frozenset({
    "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", "update", "setdefault", "popitem",
    "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
    "appendleft", "extendleft", "popleft", "rotate",
})
_MUTATOR_ACCESS = re.compile(r"access to attribute '(\w+)' of '\w+' object is unsafe")

_ENV: _Environment | None = None


def _environment() -> _Environment:
    global _ENV
    if _ENV is None:
        _ENV = _Environment()
    return _ENV


@lru_cache(maxsize=256)
def _compile(text: str):
    """The compiled template, or the TemplateError that compiling raised (cached as well).

    Compiled code is also kept between runs in the cache folder (tmplkit.compile_cache), so a
    later run of unchanged templates skips compiling; TMPLKIT_NO_CACHE=1 turns that off.
    """
    try:
        return compile_template_cached(_environment(), text)
    except (TemplateError, RecursionError) as exc:  # deeply nested source: the parser recurses
        return exc.with_traceback(None)


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


# --- input preparation, as transformers' apply_chat_template does it ------------------------------


# Exact types that need no conversion. Checked first, with plain dicts and lists, because messages
# are nearly all made of them and the general checks (an ABC's isinstance, is_dataclass, a
# model_dump lookup) are most of an input preparation's time when run on every string.
_PLAIN_TYPES = (str, int, float, bool, type(None))


def _to_dicts(value):
    # Message objects (dataclasses, pydantic models, mappings) become dicts, recursively.
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is dict:
        return {k: _to_dicts(v) for k, v in value.items()}
    if kind is list:
        return [_to_dicts(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _to_dicts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_dicts(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_dicts(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _to_dicts(value.model_dump())
    return value


def _plain(value):
    # Everything a template sees is rebuilt from plain JSON-like types; anything else becomes an
    # inert "<TypeName>" placeholder.
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if kind.__module__ == "numpy" and callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ():
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{kind.__name__}>"


_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _prepare_messages(messages) -> list[dict]:
    if hasattr(messages, "messages"):
        messages = messages.messages
    if isinstance(messages, (str, bytes)) or not hasattr(messages, "__iter__"):
        raise InputError(f"messages must be a list of message dicts, got {type(messages).__name__}")
    prepared = []
    for message in _to_dicts(list(messages)):
        if not isinstance(message, dict):
            raise InputError(f"each message must be a dict with 'role' and 'content', got {message!r}")
        # Keys whose value is None are dropped: templates handle a missing key better than None.
        message = _plain({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            # The standard name is `reasoning_content`; gpt-oss templates read `thinking`.
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    if not prepared:
        raise InputError("cannot render an empty conversation; give at least one message")
    return prepared


def _prepare_dicts(values, what: str, hint: str):
    """`tools`/`documents`: None, or a list of dicts, reduced to plain data."""
    if values is None:
        return None
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise InputError(f"{what} must be a list of {hint}, got {type(values).__name__}")
    values = list(values)
    for value in values:
        if not isinstance(value, Mapping):
            raise InputError(f"{what} must be a list of {hint}, got an item of type {type(value).__name__}")
    return _plain(values)


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
        message = f"{type(exc).__name__}: {exc}"
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
    **extra_context,
) -> str:
    """Render `messages` with `template` exactly as transformers' apply_chat_template(tokenize=False) does.

    `bos_token`/`eos_token` come from the ChatTemplate (when set) and are passed as template
    variables; `extra_context` (e.g. `enable_thinking=False`) is passed too and overrides them.
    `clock` is a zero-argument callable returning a datetime for `strftime_now` (default: the
    pinned `PINNED_NOW`; `system_clock` for the real time).

    Raises RenderError when the template raises or does not compile (its own message is kept in
    the error's `template_message`), RenderLimitError when the render goes past `limits`, and
    InputError for inputs transformers would refuse.

        >>> render(t, [{"role": "user", "content": "hi"}], add_generation_prompt=True, limits=Limits(seconds=0.5))  # doctest: +SKIP
    """
    limits = DEFAULT_LIMITS if limits is None else limits
    prepared = _prepare_messages(messages)
    context: dict[str, Any] = {}
    if template.bos_token is not None:
        context["bos_token"] = template.bos_token
    if template.eos_token is not None:
        context["eos_token"] = template.eos_token
    context.update(_plain(extra_context))
    context = {
        "messages": prepared,
        "tools": _prepare_dicts(tools, "tools", "JSON-schema dicts"),
        "documents": _prepare_dicts(documents, "documents", "dicts with 'title' and 'text' keys"),
        "add_generation_prompt": add_generation_prompt,
        **context,
    }

    state = _State(limits, clock, template.name)
    token = _STATE.set(state)
    compiled = None
    try:
        compiled = _compile(template.text)
        if isinstance(compiled, Exception):
            raise _render_error(template, compiled, None) from compiled
        ctx = compiled.new_context(context)
        parts: list[str] = []
        total = 0
        max_chars = state.max_chars
        deadline = state.deadline
        for piece in compiled.root_render_func(ctx):
            total += len(piece)
            if max_chars is not None and total > max_chars:
                _too_big(state, total, "produced output")
            parts.append(piece)
        if deadline is not None and time.perf_counter() > deadline:
            _timeout(state)
        return "".join(parts)
    except (RenderError, InputError):
        raise
    except MemoryError as exc:
        raise RenderLimitError(f"template '{template.name}' ran out of memory while rendering", kind="memory") from exc
    except SecurityError as exc:
        m = _MUTATOR_ACCESS.match(str(exc))
        if m is not None and m.group(1) in _MUTATORS:
            # list.append & co. under the immutable sandbox: transformers fails the same way; not an escape.
            raise _render_error(template, exc, compiled) from exc
        line = _template_line(compiled, exc) if compiled is not None else None
        where = f" (line {line})" if line else ""
        raise RenderLimitError(f"template '{template.name}' did something the sandbox forbids{where}: {exc}",
                               kind="unsafe") from exc
    except Exception as exc:
        raise _render_error(template, exc, compiled) from exc
    finally:
        _STATE.reset(token)
