"""The sandboxed Jinja environment: transformers' chat-template environment (its globals, its
filters, the `{% generation %}` tag) and the cooperative limit checks at the hooks Jinja's sandbox
documents (`call`, `call_binop` with `intercepted_binops`, every filter, every `{% for %}`), two its
code generator writes (`~` and `+`, whose sizes are checked before they are built), and the
compiled-template cache in front of it.
"""

from __future__ import annotations

import json
import random
import re
import string
import time
from collections.abc import Iterator
from functools import lru_cache

import jinja2
import jinja2.compiler
import jinja2.constants
import jinja2.defaults
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
import markupsafe
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment, is_internal_attribute

from ..errors import RenderLimitError
from ._limits import _STATE, PINNED_NOW, _check_planned, _check_size, _guard_iter, _timeout, _too_big
from ._planned import joined_size, sequence_sum_size, text_size, translated_size
from .compile_cache import cached_by_text, compile_template_cached

__all__: list[str] = []  # private: `_environment()` and `_compile()` serve the rendering

# --- the globals and filters transformers installs (our own code, same behaviour) -------------------


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Same signature as transformers' filter (positional arguments land in the same places), and
    # unlike Jinja's own `tojson` it does not HTML-escape.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_unserializable)


class SequenceToJson(TypeError):
    """`tojson` of a sequence a filter made (a generator): transformers refuses it, in json.dumps'
    own words; llama-server's engine writes it (`_ServerEnvironment`)."""


# The filters llama-server's engine answers with an empty list on none (its `items`, `unique` and
# the rest on none: common/jinja/value.cpp; Jinja's `map` and `select` family already give nothing
# for a false value). Only its environment wraps them: transformers' renders, the hot path, keep
# Jinja's own, and their refusal (`NONE_REFUSALS`) sends a render to this engine.
_EMPTY_ON_NONE = ("items", "unique", "map", "select", "selectattr", "reject", "rejectattr")
# What Jinja's `items` and `unique` raise on none (`tool_call.arguments | items` where a client sent
# the arguments as null).
NONE_REFUSALS = frozenset({"Can only get item pairs from a mapping.", "'NoneType' object is not iterable"})


def _empty_on_none(func):
    """`func`, one of `_EMPTY_ON_NONE`, as llama-server's engine has it: an empty list for none."""
    passes = getattr(func, "jinja_pass_arg", None) is not None

    def wrapped(*args, **kwargs):
        return [] if (args[1] if passes else args[0]) is None else func(*args, **kwargs)

    if passes:
        wrapped.jinja_pass_arg = func.jinja_pass_arg
    return wrapped


def _unserializable(value):
    # (json.dumps' own refusal, word for word; the type says the other engine would write it)
    kind = SequenceToJson if isinstance(value, Iterator) else TypeError
    raise kind(f"Object of type {type(value).__name__} is not JSON serializable")


def _now():
    state = _STATE.get()
    clock = state.clock if state is not None and state.clock is not None else None
    return clock() if clock is not None else PINNED_NOW


def _strftime_now(format):
    return _now().strftime(format)


def _draws() -> random.Random:
    """The render's random draws, seeded by its time as `strftime_now` reads it: a render is a
    function of its inputs and its time, as with the clock pinned. Two analyses of a template that
    draws agree (a lock holds), and a session's requests, each at its own time, draw anew as they
    do on a server."""
    state = _STATE.get()
    if state is None:
        return random.Random(_now().isoformat())
    if state.draws is None:
        state.draws = random.Random(_now().isoformat())
    return state.draws


@jinja2.pass_context
def _random(context, seq):
    # Jinja's `random` filter, drawing from the render's draws (not the process's).
    try:
        return _draws().choice(seq)
    except IndexError:
        return context.environment.undefined("No random item, sequence was empty.")


def _lipsum(n=5, html=True, min=20, max=100):
    # Jinja's `lipsum` global in its shape (n paragraphs of min to max words), from the render's draws.
    draws, words = _draws(), jinja2.constants.LOREM_IPSUM_WORDS.split()
    paragraphs = []
    for _ in range(n):
        text = " ".join(draws.choice(words) for _ in range(draws.randrange(min, max)))
        paragraphs.append(text[:1].upper() + text[1:] + ".")
    if not html:
        return "\n\n".join(paragraphs)
    return markupsafe.Markup("\n".join(f"<p>{markupsafe.escape(p)}</p>" for p in paragraphs))


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
_STR_PLANNED_METHODS = _STR_PAD_METHODS | {"join", "translate", "replace"}  # (`_check_str_method`)
_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(\d+)")
_PERCENT_STAR = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\*|\d*\.\*)")


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
    return len(text) + hits * (len(new) - len(old))


_URL_SAFE = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-~/"


def _urlencoded_size(args, kwargs) -> int:
    """The length of a string's `|urlencode`: each of its UTF-8 bytes but the URL-safe ones written as
    three (`%20`, `%C3%A9`); a mapping or pairs are left to the check of the value built."""
    text = args[0] if args else None
    if not isinstance(text, str):
        return 0
    data = text.encode("utf-8", "surrogatepass")
    return len(data) + 2 * len(data.translate(None, _URL_SAFE))


def _limit() -> int:
    """The render's limit on a value's size (only asked where there is one)."""
    state = _STATE.get()
    return state.max_chars if state is not None and state.max_chars is not None else 0


def _texts_size(values) -> int:
    """At least the text of each container among `values` (a list, a mapping, bytes, printed); a
    string or a scalar is counted where it is known (`_concat_size`), or not at all."""
    return sum(text_size(v, _limit()) for v in values if isinstance(v, (dict, list, tuple, bytes)))


# Filters whose result size is known from their arguments: checked before they allocate (`_planned`).
_PLANNED_FILTERS = {
    "format": lambda a, k: _percent_widths(str(a[0]) if a else "", tuple(a[1:]) or tuple(k.values()))
    + _texts_size((*a[1:], *k.values())),
    "tojson": lambda a, k: (_int(_arg(a, k, 2, "indent")) or 0) + (text_size(a[0], _limit()) if a else 0),
    "replace": _replace_size,
    "batch": lambda a, k: _int(_arg(a, k, 1, "linecount")) or 0,
    "slice": lambda a, k: _int(_arg(a, k, 1, "slices")) or 0,
    "join": lambda a, k: joined_size(a[0] if a else None, _arg(a, k, 1, "d") or "", _limit()),
    "string": lambda a, k: 0 if not a or isinstance(a[0], str) else text_size(a[0], _limit()),  # (a message's content: at once)
    "sum": lambda a, k: sequence_sum_size(a[0] if a else None, _arg(a, k, 2, "start")),
    "urlencode": _urlencoded_size,
}


# Filters that work item by item in Python (a key, a test or an attribute each): a sequence given
# to one counts _ITEM_CHARS characters an item against the size limit, before it is walked. Sorting
# a 9-million-character string, or mapping a filter over it, ran 30 to 70 s past a 2 s limit and
# held up to a gigabyte (the time is checked between filter calls, never inside one).
_ITEM_FILTERS = frozenset(("sort", "unique", "groupby", "dictsort", "batch", "slice", "map", "select", "reject",
                           "selectattr", "rejectattr", "min", "max", "sum", "list"))
_ITEM_CHARS = 10


def _checked_filter(func, key: str):
    """`func` (the filter `key`) under the render's limits: the size of what it is about to build
    where that is known from its arguments (`_PLANNED_FILTERS`, a padding width, the items of a
    sequence it walks) and the time before such a one runs, and the size of what it built."""
    size_of = _PLANNED_FILTERS.get(key)
    items = key in _ITEM_FILTERS
    width = key in ("center", "indent")
    planned = size_of is not None or items or width
    passes = getattr(func, "jinja_pass_arg", None) is not None

    def wrapped(*args, **kwargs):
        state = _STATE.get()
        if state is None:
            return func(*args, **kwargs)
        if planned:  # (the time too: a filter that walks a sequence may take long; a cheap one is not worth a clock read)
            if state.deadline is not None and time.perf_counter() > state.deadline:
                _timeout(state)
            if state.max_chars is not None:
                _check_plan(key, size_of, items, width, args[1:] if passes else args, kwargs, state)
        limit = state.max_chars
        if limit is None:
            return func(*args, **kwargs)
        value = func(*args, **kwargs)
        if isinstance(value, (str, list, tuple)) and len(value) > limit:
            _too_big(state, len(value), "built a value")
        return value

    if passes:
        wrapped.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
    wrapped.__name__ = getattr(func, "__name__", "filter")
    return wrapped


def _checked_call(state, args) -> bool:
    """What every call of a render checks first: the time, and the size of each argument; False
    outside a render (no state)."""
    if state is None:
        return False
    if state.deadline is not None and time.perf_counter() > state.deadline:
        _timeout(state)
    if state.max_chars is not None:
        for value in args:
            _check_size(value, "passed an argument")
    return True


def _check_plan(key: str, size_of, items: bool, width: bool, args, kwargs, state) -> None:
    """The checks before filter `key` runs (see `_checked_filter`); `args` without the environment
    or context Jinja passes first to some filters."""
    if size_of is not None and (size := size_of(args, kwargs)) > state.max_chars:
        _too_big(state, size, "asked a filter for a value")
    if items and args and isinstance(args[0], (str, list, tuple, dict)):
        n = len(args[0])
        if n * _ITEM_CHARS > state.max_chars:
            _too_big(state, n * _ITEM_CHARS, f"gave the filter '{key}' {n} items, counted as a value")
    if width:
        _check_width(key, args, kwargs)


def _check_width(key: str, args, kwargs) -> None:
    """`center` and `indent` pad to a width: the padded size, before it is built."""
    width = kwargs.get("width", args[1] if len(args) > 1 else None)
    if isinstance(width, int) and not isinstance(width, bool):
        lines = str(args[0] if args else "").count("\n") + 1 if key == "indent" else 1
        _check_planned(width * lines, "asked for a padded string")


def _check_str_method(text: str, name: str, args, kwargs, limit: int) -> None:
    """The size a string method is about to build, where its arguments say: padding, a join, a
    translation, a replacement (a thousand characters each replaced by a 1 MB string)."""
    if name in _STR_PAD_METHODS:
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool):
                _check_planned(value * (1 if name != "expandtabs" else max(1, text.count("\t"))), "asked for a padded string")
    elif name in ("join", "translate") and args:
        _check_planned(joined_size(args[0], text, limit) if name == "join" else translated_size(text, args[0]),
                       "asked for a string")
    elif name == "replace" and len(args) >= 2:
        _check_planned(_replace_size((text, *args), kwargs), "asked for a string")


_DICT_ATTRIBUTES = frozenset(dir(dict))
# `loop.index0`, `loop.previtem`, ...: properties of Jinja's own loop object whose values are numbers,
# flags or the loop's items (its methods, `cycle` and `changed`, take the sandbox's path).
_LOOP_ATTRIBUTES = frozenset(("index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
                              "depth0", "previtem", "nextitem"))
# Values a namespace hands out as they are (the sandbox wraps a method, which these are not).
_PLAIN_VALUES = (str, int, bool, float, list, dict, tuple, type(None))


# Sums shorter than this are not checked at `+` (a render's limit is millions of characters; the
# value built is still checked wherever it goes), so the check costs a length comparison.
_ADD_FLOOR = 1 << 16


def _concat_size(values) -> int:
    """At least the length of `str_join(values)`: strings by their length, containers by their
    text, anything else as nothing (a number, None, an undefined value)."""
    return sum(len(v) for v in values if isinstance(v, str)) + _texts_size(values)


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code generator, `~` written as a call of the environment's `checked_join`: a chain of
    `{% set %}` concatenations grows tenfold a step with no check between (a set is no hook), and
    the last step built gigabytes before anything looked at it."""

    def visit_Concat(self, node, frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            return super().visit_Concat(node, frame)  # (markup joins; transformers' environment has none)
        self.write("environment.checked_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")
        return None

    def visit_Add(self, node, frame) -> None:
        # `a + b` as `(x + y if <two short strings, or an integer first> else environment.checked_add(x, y))`,
        # `x` and `y` evaluated once, in order: the common case stays a few bytecodes, no call. The
        # names are per depth of right operands, so that a left-nested chain (`a + b + c`) reuses
        # one pair and holds no more of its partial sums than Python's own `+` does.
        depth = getattr(self, "_add_depth", 0)
        x, y = f"tk_add{depth}x", f"tk_add{depth}y"
        self.write(f"({x} + {y} if ({x} := ")
        self.visit(node.left, frame)
        self.write(f") is {x} and ({y} := ")
        self._add_depth = depth + 1
        try:
            self.visit(node.right, frame)
        finally:
            self._add_depth = depth
        self.write(f") is {y} and ({x}.__class__ is str and {y}.__class__ is str and len({x}) + len({y}) <= {_ADD_FLOOR} "
                   f"or {x}.__class__ is int) else environment.checked_add({x}, {y}))")


class _Environment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, plus cooperative limit checks."""

    intercepted_binops = frozenset(("*", "**", "%"))
    code_generator_class = _CodeGenerator

    @staticmethod  # (no bound method made at every `+`)
    def checked_add(left, right):
        """`a + b`: the size of two sequences joined, checked before they are, where it is large."""
        try:
            n = len(left) + len(right)
        except TypeError:  # (numbers, or something without a length: their sum is the operator's own)
            return left + right
        if n > _ADD_FLOOR:
            _check_planned(n, "concatenated a value")
        return left + right

    def checked_join(self, values) -> str:
        """`a ~ b ~ ...`: Jinja's `str_join`, its size checked before it is built."""
        state = _STATE.get()
        if state is None or state.max_chars is None:
            return "".join(map(str, values))
        try:
            # Strings alone (the common case), at C speed: the lengths are the size, and a join
            # that meets anything else raises before it builds.
            size = sum(map(len, values))  # (a container's length is at most its text's: a lower bound)
            if size <= state.max_chars:
                return "".join(values)
        except TypeError:
            size = _concat_size(values)
        if size > state.max_chars:
            _too_big(state, size, "concatenated a string")
        return "".join(map(str, values))

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        # Jinja's optimizer only folds constant expressions at compile time; without it the same
        # values are computed at render time instead. Compiling is most of an analysis's time and
        # the optimizer a fifth of compiling; tests/test_parity.py shows the output is unchanged.
        self.optimized = False
        for key, func in list(self.filters.items()):
            self.filters[key] = _checked_filter(func, key)
        self.filters["tojson"] = _checked_filter(_tojson, "tojson")
        self.filters["random"] = _checked_filter(_random, "random")
        self.filters[_GUARD_FILTER] = _guard_iter
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["dict"] = _TemplateDict()
        self.globals["namespace"] = _TemplateNamespace
        def bounded_lipsum(n=5, html=True, min=20, max=100):
            if isinstance(n, int) and isinstance(max, int):
                _check_planned(n * max * 12, "asked lipsum for a text")
            return _lipsum(n, html, min, max)

        self.globals["lipsum"] = bounded_lipsum

    def _parse(self, source, name, filename):
        # Every `{% for %}` iterates through a guard that checks the time budget.
        tree = super()._parse(source, name, filename)
        for node in tree.find_all(jinja2.nodes.For):
            node.iter = jinja2.nodes.Filter(node.iter, _GUARD_FILTER, [], [], None, None, lineno=node.lineno)
        return tree

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (same convention as Jinja)
        state = _STATE.get()
        if type(__obj) is jinja2.runtime.Macro:
            return __self._call_macro(state, __context, __obj, args, kwargs)
        if _checked_call(state, args):
            if state.max_chars is not None:
                self_obj = getattr(__obj, "__self__", None)
                name = getattr(__obj, "__name__", "")
                if isinstance(self_obj, str):
                    if name in _STR_PLANNED_METHODS:
                        _check_str_method(self_obj, name, args, kwargs, state.max_chars)
                elif name in ("format", "format_map"):
                    # The sandbox hands out str.format wrapped; the string is the wrapped method's __self__.
                    fmt = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
                    mapping = args[0] if name == "format_map" and args and isinstance(args[0], dict) else None
                    if isinstance(fmt, str):
                        _check_planned(_format_widths(fmt, () if mapping else args, mapping or kwargs),
                                       "asked for a formatted string")
        result = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
        return _check_size(result, "built a value")

    @staticmethod
    def _call_macro(state, context, macro, args, kwargs):
        """A macro of the template: what Jinja's sandbox and context do for it (a template's own
        macro is safely callable; it takes the evaluation context), without asking each time
        (a long session's render calls one per message part)."""
        _checked_call(state, args)
        kwargs.pop("_block_vars", None)
        kwargs.pop("_loop_vars", None)
        try:
            result = macro(context.eval_ctx, *args, **kwargs)
        except StopIteration:
            return context.environment.undefined("value was undefined because a callable raised a StopIteration exception")
        return _check_size(result, "built a value")

    # Whether an attribute is safe depends on the object's type and the name alone (Jinja's
    # is_internal_attribute and modifies_known_mutable test both, never the value), so the answer
    # is kept per (type, name): a long conversation asked the sandbox again for every message.
    # Bounded: a template can name any number of attributes.
    _SAFE: dict = {}

    def is_safe_attribute(self, obj, attr, value):
        key = (type(obj), attr)
        safe = self._SAFE.get(key)
        if safe is None:
            if len(self._SAFE) > 4096:
                self._SAFE.clear()
            safe = self._SAFE[key] = super().is_safe_attribute(obj, attr, value)
        return safe

    def getattr(self, obj, attribute):
        # `message.content` on a message: Jinja tries the attribute, fails, then takes the item. A
        # plain dict has no attribute of that name, so take the item (the same answer, without an
        # AttributeError raised and caught per lookup).
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        # A template's loop flags and namespace values: the sandbox's answer, without the safety
        # checks it would repeat for every message (a fifth of a long agent session's render).
        if kind is jinja2.runtime.LoopContext and attribute in _LOOP_ATTRIBUTES:
            return getattr(obj, attribute)
        if kind is _TemplateNamespace and attribute[:1] != "_":
            value = object.__getattribute__(obj, "_Namespace__attrs").get(attribute, _TemplateNamespace)
            if type(value) in _PLAIN_VALUES:
                return value
        return super().getattr(obj, attribute)

    def unsafe_undefined(self, obj, attribute):
        # Jinja answers an unsafe attribute with an undefined value that raises only when printed or
        # called; `x|attr('__class__')|attr('__mro__')` passes it on unused and nothing raises. An
        # internal one (a dunder, a frame, a function's globals) is refused at once, as `x.__class__`
        # printed is (pallets/jinja sandbox.py documents this hook); a mutating method of a known
        # mutable (`messages.append`) keeps Jinja's answer, which raises when called.
        if isinstance(attribute, str) and (attribute.startswith("_") or is_internal_attribute(obj, attribute)):
            raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe.")
        return super().unsafe_undefined(obj, attribute)

    def call_binop(self, context, operator_, left, right):
        if operator_ == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
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
            values = right if isinstance(right, tuple) else (right,)
            _check_planned(_percent_widths(left, right) + (_texts_size(values) if _limit() else 0), "asked for a formatted string")
        return _check_size(self.binop_table[operator_](left, right), "built a value")


# Methods that change a list, dict or set in place, and those of them that make it larger.
_PLAIN_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", "update",
                             "setdefault", "popitem", "add", "discard", "difference_update", "intersection_update",
                             "symmetric_difference_update"})
_GROWERS = frozenset({"append", "extend", "insert", "update", "setdefault", "add"})


def _server_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # llama.cpp's engine writes a sequence a filter made (`tools | map(attribute='function')`, a
    # generator in Python) as the list it is.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_listed)


def _listed(value):
    if isinstance(value, Iterator):
        return list(_guard_iter(value))
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _ServerEnvironment(_Environment):
    """llama-server's engine where it renders what transformers' refuses: a list, dict or set may
    change in place (`ns.ids.append(x)`: Kimi K2 queues its call ids so) and a sequence a filter
    made is JSON (`tools | map(attribute='function') | tojson`: llama.cpp's DeepSeek R1). Its
    renders get their own copy of the inputs (`_rendering`), so nothing a template changes outlives
    the render; what it adds counts against the size limit as it is added."""

    _SAFE: dict = {}  # (its own answers: a list's `append` is safe here)

    def __init__(self):
        super().__init__()
        self.filters["tojson"] = _checked_filter(_server_tojson, "tojson")
        for key in _EMPTY_ON_NONE:
            self.filters[key] = _checked_filter(_empty_on_none(jinja2.defaults.DEFAULT_FILTERS[key]), key)

    def is_safe_attribute(self, obj, attr, value):
        if attr in _PLAIN_MUTATORS and type(obj) in (list, dict, set):
            return True
        return super().is_safe_attribute(obj, attr, value)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (same convention as Jinja)
        target = getattr(__obj, "__self__", None)
        if type(target) in (list, dict, set) and getattr(__obj, "__name__", "") in _GROWERS:
            added = len(args[0]) if args and __obj.__name__ in ("extend", "update") and hasattr(args[0], "__len__") else 1
            _check_planned(len(target) + added, "grew a list or dict to a length")
        return _Environment.call(__self, __context, __obj, *args, **kwargs)


_ENV: _Environment | None = None
_SERVER_ENV: _ServerEnvironment | None = None


def _environment() -> _Environment:
    global _ENV
    if _ENV is None:
        _ENV = _Environment()
    return _ENV


def _server_environment() -> _ServerEnvironment:
    global _SERVER_ENV
    if _SERVER_ENV is None:
        _SERVER_ENV = _ServerEnvironment()
    return _SERVER_ENV


@lru_cache(maxsize=256)
def _compile(text: str):
    """The compiled template, or the TemplateError that compiling raised (cached as well).

    Compiled code is also kept between runs in the cache folder (tmplkit.sandbox.compile_cache), so a
    later run of unchanged templates skips compiling; TMPLKIT_NO_CACHE=1 turns that off.
    """
    try:
        return compile_template_cached(_environment(), text)
    except (TemplateError, RecursionError) as exc:  # deeply nested source: the parser recurses
        return exc.with_traceback(None)


@lru_cache(maxsize=32)
def _compile_server(text: str):
    """`_compile` in llama-server's engine (`_ServerEnvironment`)."""
    try:
        return compile_template_cached(_server_environment(), text)
    except (TemplateError, RecursionError) as exc:
        return exc.with_traceback(None)


# --- one pass for a render with and without the generation prompt ------------------------------------

# The piece the split variant yields around the generation prompt: a string made at run time (not
# interned), told apart by identity; no template can name it (the variant is refused if it does).
PROMPT_MARK = "".join(["\x00tmplkit", " prompt mark\x00"])
_MARK_NAME = "tmplkit_prompt_mark"


@lru_cache(maxsize=64)
def _compile_split(text: str):
    """The template compiled with `PROMPT_MARK` yielded before and after its generation prompt, or
    None where a render without the prompt is not provably the variant's output less what lies
    between the marks (`_prompt_block`)."""
    return _split_variant(text, _environment())


@lru_cache(maxsize=16)
def _compile_split_server(text: str):
    """`_compile_split` in llama-server's engine (`_ServerEnvironment`)."""
    return _split_variant(text, _server_environment())


def _split_variant(text: str, env):
    try:
        tree = env.parse(text)
    except (TemplateError, RecursionError):
        return None
    at = _prompt_block(tree)
    if at is None:
        return None
    line = tree.body[at].lineno

    def mark():
        return jinja2.nodes.Output([jinja2.nodes.Name(_MARK_NAME, "load", lineno=line)], lineno=line)

    tree.body[at:at + 1] = [mark(), tree.body[at], mark()]
    try:
        code = env.compile(tree)
        return env.template_class.from_code(env, code, env.make_globals({_MARK_NAME: PROMPT_MARK}), None)
    except (TemplateError, RecursionError):
        return None


def _prompt_block(tree) -> int | None:
    """The index in `tree.body` of the template's generation prompt, where rendering without it is
    provably the same render with that block's output left out: the variable is read once in the
    whole template, as the (leftmost) test of a top-level `{% if %}` with no elif/else that only
    constant text follows. The render is then the same up to the test (nothing before it can see the
    variable), a false test runs nothing (`and` stops at the variable), and the text after is constant."""
    body = tree.body
    at = len(body) - 1
    while at >= 0 and isinstance(body[at], jinja2.nodes.Output) \
            and all(isinstance(n, jinja2.nodes.TemplateData) for n in body[at].nodes):
        at -= 1
    node = body[at] if at >= 0 else None
    if not isinstance(node, jinja2.nodes.If) or node.elif_ or node.else_:
        return None
    test = node.test
    while isinstance(test, jinja2.nodes.And):
        test = test.left
    names = [n for n in tree.find_all(jinja2.nodes.Name) if n.name in ("add_generation_prompt", _MARK_NAME)]
    if not isinstance(test, jinja2.nodes.Name) or len(names) != 1 or names[0] is not test:
        return None
    return at


@lru_cache(maxsize=256)
def _time_reads(text: str) -> tuple[bool, bool] | None:
    """(names `strftime_now`, draws at random), or None where the template does not parse. Kept in
    the cache folder with the compiled code (`cached_by_text`): parsing the template again for it was
    half of a warm audit's time."""
    got = cached_by_text(_parsed_time_reads, text)
    return (bool(got[0]), bool(got[1])) if got is not None else None


def _parsed_time_reads(text: str) -> list[bool] | None:
    """`_time_reads`, read off the parsed template (a list: the cache keeps JSON)."""
    try:
        tree = _environment().parse(text)
    except (TemplateError, RecursionError):
        return None
    names = {n.name for n in tree.find_all(jinja2.nodes.Name)}
    return ["strftime_now" in names, "lipsum" in names or any(map(_draws_in, tree.find_all(jinja2.nodes.Filter)))]


def _draws_in(f: jinja2.nodes.Filter) -> bool:
    """Whether the filter draws: `random`, or `map` given it by name (`map('random')`; a name not
    written out may be it)."""
    if f.name == "random":
        return True
    first = f.args[0] if f.name == "map" and f.args else None
    return first is not None and not (isinstance(first, jinja2.nodes.Const) and first.value != "random")


def reads_clock(text: str) -> bool:
    """Whether two renders of the template with the same inputs can differ: it names `strftime_now`
    (the one global that reads the clock), or draws at random (the `random` filter, `lipsum`: the
    draws are seeded by the render's time); True where it does not parse (nothing is proved)."""
    reads = _time_reads(text)
    return reads is None or any(reads)


def draws_at_random(text: str) -> bool:
    """Whether the template draws at random (the `random` filter, `map('random')`, `lipsum`): a render
    differs from one time to another as the draws do, not as a date does (the words a cause names)."""
    reads = _time_reads(text)
    return reads is not None and reads[1]


def reads_date(text: str) -> bool:
    """Whether the template names `strftime_now` (the one global that reads the clock); True where it
    does not parse (nothing is proved)."""
    reads = _time_reads(text)
    return reads is None or reads[0]
