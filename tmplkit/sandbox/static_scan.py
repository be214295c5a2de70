"""A static scan of a template's source for known sandbox escape routes, without rendering it.

The Jinja sandbox blocks these at render time; the scan says, before anything runs, that a
template *reaches* for them, which no legitimate chat template does (none of the 70 templates of
the llama.cpp corpus raises a warning). The audit shows the warnings next to the verdict.

What is flagged (each warning names the line):

- attributes or items whose name starts with an underscore (`__class__`, `__globals__`,
  `__subclasses__`, `_TemplateReference__context`, ...) reached by `.name`, `['name']`,
  `|attr('name')`, or an `attribute=` argument (`map`, `selectattr`, `sort`, `groupby`, ...);
- Python internals without underscores (`mro`, `gi_frame`, `f_globals`, `tb_frame`, `func_globals`, ...);
- `|attr(...)` with a computed name (a way to build `'__cla' ~ 'ss__'` at render time);
- `str.format`/`format_map` with a computed format string, or with a field that reaches into its
  argument (`'{0.__class__}'`, `'{x[key]}'`);
- `self` (the template reference) and free names that only exist in other Jinja setups
  (`config`, `request`, `os`, `eval`, `open`, ...);
- `{% include %}`, `{% import %}`, `{% extends %}`: chat templates are self-contained.

>>> scan("{{ messages[0].content }}")
[]
>>> scan("{{ ''.__class__.__mro__ }}")  # doctest: +NORMALIZE_WHITESPACE
["line 1: reads '__class__', a Python internal (a known sandbox escape route)",
 "line 1: reads '__mro__', a Python internal (a known sandbox escape route)"]
"""

from __future__ import annotations

import bisect
import re
import string

import jinja2
import jinja2.ext
from jinja2 import nodes

__all__ = ["scan", "MAX_WARNINGS"]

MAX_WARNINGS = 20
_MAX_SCAN_CHARS = 2_000_000

# Attribute names of Python internals that do not start with an underscore.
_INTERNAL_ATTRS = frozenset({
    "mro", "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
    "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "tb_frame", "tb_next", "co_code", "co_consts",
    "func_globals", "func_code", "func_closure", "func_defaults", "im_func", "im_self", "im_class",
})
# Free names that exist in Flask/Ansible/Python setups but never in a chat-template environment.
_FOREIGN_NAMES = frozenset({
    "self", "config", "request", "session", "g", "url_for", "get_flashed_messages", "os", "sys", "subprocess",
    "builtins", "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals", "vars",
    "importlib", "import", "__import__", "__builtins__", "input",
})
# Filters/tests that take an attribute path (`attribute=` keyword or a dotted string).
_ATTRIBUTE_FILTERS = frozenset({
    "map", "selectattr", "rejectattr", "sort", "groupby", "sum", "unique", "min", "max", "dictsort",
})

_TEXT_PATTERN = re.compile(r"""(?:\.\s*|\[\s*['"]|attr\s*\(\s*['"])(_\w*|mro|gi_frame|f_globals|tb_frame|func_globals)\b""")


class _Generation(jinja2.ext.Extension):
    # `{% generation %}` is a tag transformers adds; the scan only needs to parse it.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


_ENV = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, _Generation])


def _bad_name(name) -> bool:
    return isinstance(name, str) and (name.startswith("_") or name in _INTERNAL_ATTRS)


def _bad_path(path) -> str | None:
    """For dotted attribute paths such as 'a.__class__' or '0._x': the first bad part."""
    if not isinstance(path, str):
        return None
    for part in path.split("."):
        if _bad_name(part):
            return part
    return None


def _format_fields(fmt: str) -> list[str]:
    try:
        return [field for _, field, _, _ in string.Formatter().parse(fmt) if field]
    except ValueError:
        return []


class _Findings:
    def __init__(self):
        self.items: dict[str, int] = {}  # message -> first line

    def add(self, node, message: str) -> None:
        line = node if isinstance(node, int) else (getattr(node, "lineno", None) or 0)
        if message not in self.items or line < self.items[message]:
            self.items[message] = line

    def result(self) -> list[str]:
        ordered = sorted(self.items.items(), key=lambda kv: (kv[1], kv[0]))
        out = [f"line {line}: {msg}" if line else msg for msg, line in ordered]
        if len(out) > MAX_WARNINGS:
            out = out[:MAX_WARNINGS] + [f"... and {len(out) - MAX_WARNINGS} more scan warnings"]
        return out


def _internal(name: str) -> str:
    return f"reads {name!r}, a Python internal (a known sandbox escape route)"


def _walk(root):
    # Iterative: a hostile template may nest deeply enough to exhaust Python's recursion limit.
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        children = list(node.iter_child_nodes())
        stack.extend(reversed(children))


def scan(template_text: str) -> list[str]:
    """Warnings (one line each, at most MAX_WARNINGS + 1) for escape routes the source reaches for.

    Never renders or executes the template. An empty list means nothing suspicious was found.
    """
    if not isinstance(template_text, str):
        raise TypeError(f"scan() takes the template text, not {type(template_text).__name__}")
    text = template_text[:_MAX_SCAN_CHARS]
    try:
        tree = _ENV.parse(text)
    except Exception:  # a syntax error, or a parser/lexer failure on hostile input: fall back to text search
        result = _scan_text(text)
    else:
        found = _Findings()
        _scan_tree(tree, found)  # _walk is iterative: no recursion limit to hit
        result = found.result()
    if len(template_text) > _MAX_SCAN_CHARS:
        result.append(f"template is {len(template_text)} characters; only the first {_MAX_SCAN_CHARS} were scanned")
    return result


def _scan_tree(tree, found: _Findings) -> None:
    stored: set[str] = set()
    loaded: list[nodes.Name] = []
    for node in _walk(tree):
        if isinstance(node, nodes.Getattr):
            if _bad_name(node.attr):
                found.add(node, _internal(node.attr))
        elif isinstance(node, nodes.NSRef):  # {% set ns.attr = ... %}
            if _bad_name(node.attr):
                found.add(node, _internal(node.attr))
        elif isinstance(node, nodes.Getitem):
            if isinstance(node.arg, nodes.Const) and _bad_name(node.arg.value):
                found.add(node, _internal(node.arg.value))
        elif isinstance(node, (nodes.Filter, nodes.Test)):
            _check_filter(node, found)
        elif isinstance(node, nodes.Call):
            _check_call(node, found)
        elif isinstance(node, nodes.Name):
            if node.ctx in ("store", "param"):
                stored.add(node.name)
            elif node.name in _FOREIGN_NAMES:
                loaded.append(node)
        elif isinstance(node, nodes.Macro):
            stored.add(node.name)
        elif isinstance(node, (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
            tag = {nodes.Include: "include", nodes.Import: "import", nodes.FromImport: "from ... import",
                   nodes.Extends: "extends"}[type(node)]
            found.add(node, f"uses {{% {tag} %}}; chat templates are self-contained and may not load other templates")
    for node in loaded:
        if node.name in stored:
            continue
        if node.name == "self":
            found.add(node, "reads 'self', the template reference (its internals are a known sandbox escape route)")
        else:
            found.add(node, f"reads {node.name!r}, which no chat-template environment defines (a known escape route in other Jinja setups)")


def _check_filter(node, found: _Findings) -> None:
    name = node.name
    if name == "attr":
        arg = node.args[0] if node.args else None
        if isinstance(arg, nodes.Const):
            if _bad_name(arg.value):
                found.add(node, _internal(arg.value))
        elif arg is not None:
            found.add(node, "uses |attr() with a computed name (can build an internal attribute name at render time)")
    if name in _ATTRIBUTE_FILTERS:
        consts = [kw.value for kw in node.kwargs if kw.key == "attribute"]
        if name != "map":
            consts += node.args  # selectattr/rejectattr/groupby/sum take the path positionally
        for value in consts:
            bad = _bad_path(value.value) if isinstance(value, nodes.Const) else None
            if bad:
                found.add(node, _internal(bad))
        if name == "map" and node.args and isinstance(node.args[0], nodes.Const) and node.args[0].value == "attr":
            for arg in node.args[1:]:
                if isinstance(arg, nodes.Const) and _bad_name(arg.value):
                    found.add(node, _internal(arg.value))
                elif not isinstance(arg, nodes.Const):
                    found.add(node, "uses map('attr', ...) with a computed name (can build an internal attribute name at render time)")


def _check_call(node: nodes.Call, found: _Findings) -> None:
    target = node.node
    if isinstance(target, nodes.Getattr) and target.attr in ("format", "format_map"):
        _check_format_string(node, target.node, found)


def _check_format_string(node, fmt_node, found: _Findings) -> None:
    if isinstance(fmt_node, nodes.Const) and isinstance(fmt_node.value, str):
        for field in _format_fields(fmt_node.value):
            if "." in field or "[" in field:
                found.add(node, f"format string field {{{field}}} reaches into its argument (a known sandbox escape route)")
    elif isinstance(fmt_node, (nodes.Name, nodes.Concat, nodes.Getattr, nodes.Getitem, nodes.Filter, nodes.Call,
                               nodes.Add, nodes.Mod)):
        found.add(node, "calls format() on a computed format string (a known sandbox escape route)")


def _scan_text(text: str) -> list[str]:
    """Fallback for sources Jinja cannot parse: a plain text search for internal attribute access."""
    found = _Findings()
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    for m in _TEXT_PATTERN.finditer(text):
        name = m.group(1)
        if name == "_":
            continue
        line = bisect.bisect_right(line_starts, m.start(1))
        found.add(line, _internal(name) + " (found by a text search: the template does not parse)")
    return found.result()
