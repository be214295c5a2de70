"""Reading a user's text and JSON files: one set of checks, one-line errors of the caller's class.

The text and JSON files tmplkit reads on a user's behalf (.jinja templates, tokenizer configs,
conversations and sessions, expected-failures lists; standard input too) go through `read_text` /
`read_json` / `parse_json`, so each gets the same checks (GGUF files have their own reader,
gguf_meta, and TOML configuration files tomllib):

- a pipe, socket or device is refused before it is read (reading a FIFO would wait for a writer
  forever; /dev/zero would never end);
- a file over `max_bytes` is refused before it is read into memory;
- the text must be UTF-8; a leading byte-order mark is dropped when `strip_bom` (conversations: what
  editors on Windows write) and kept otherwise (a tokenizer config with a BOM is not JSON for
  transformers either, so it is reported as not valid JSON);
- JSON nested deeper than `max_depth` is refused, so a later recursive step (the renderer's input
  preparation) cannot run out of stack on it.

Each problem raises `error` (the caller's TmplkitError subclass) with a message naming `where`.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "c.json"
>>> _ = p.write_bytes(b'\\xef\\xbb\\xbf[{"role": "user", "content": "hi"}]')
>>> read_json(p, what="a conversation")[0]["content"]
'hi'
>>> read_json(p, what="a tokenizer config", strip_bom=False)
Traceback (most recent call last):
...
tmplkit.errors.InputError: ...: not valid JSON (it starts with a UTF-8 byte-order mark); save the file without one
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import IO, Union

from .errors import InputError, TmplkitError

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_DEPTH", "json_kind", "lone_surrogate", "lone_surrogate_problem", "number_problem", "shape_problem",
           "NotJsonNumber", "parse_json", "read_json", "strict_loads", "read_text", "source_name", "stdin"]

# Far above any real template, tokenizer config or agent session (a 90k-token session is ~0.4 MB;
# the largest tokenizer configs, with 200k added tokens, ~30 MB); a guard against mistakes.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# Deeper than any real config or conversation (tool arguments included), and shallow enough that
# the renderer's recursive input preparation stays within Python's recursion limit.
DEFAULT_MAX_DEPTH = 256

_BOM = "\ufeff"
# A JSON string (escapes included), in the "unrolled loop" form that matches in linear time.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")

Source = Union[str, os.PathLike, IO]  # noqa: UP007 - a runtime alias; `|` on typing.IO needs 3.12


def read_text(
    source: Source,
    *,
    what: str = "a file",
    where: str | None = None,
    error: type[TmplkitError] = InputError,
    strip_bom: bool = False,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    stdin_ok: bool = False,
) -> str:
    """The text of a file path or an open file (binary or text), checked as the module says.

    `what` names the content in messages ("a conversation"); `where` names the source (default:
    the path, or the open file's name). Whitespace-only text is refused as empty. `stdin_ok`: the
    caller reads `-` as standard input, so the refusal of a pipe (`<(cmd)`, /dev/stdin) says so.
    """
    where = source_name(source, where)
    if isinstance(source, (str, os.PathLike)):
        raw = _read_path(Path(source), what, where, error, max_bytes, stdin_ok)
    else:
        raw = _read_stream(source, where, error, max_bytes)
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}: not valid UTF-8 at byte {exc.start}; save the file as UTF-8") from None
    else:
        text = raw
    if strip_bom and text.startswith(_BOM):
        text = text[1:]
    if not text.strip():
        raise error(f"{where}: empty file; give {what}")
    return text


def read_json(
    source: Source,
    *,
    what: str = "a JSON file",
    where: str | None = None,
    error: type[TmplkitError] = InputError,
    strip_bom: bool = True,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    max_depth: int | None = DEFAULT_MAX_DEPTH,
    stdin_ok: bool = False,
    strict_numbers: bool = False,
):
    """The parsed JSON value of a file path or an open file (see `read_text` for the arguments).

    One JSON value per file: JSON Lines is refused with a hint. `max_depth`: most levels of
    nested lists and objects (None: as deep as Python's recursion limit lets the parser go).
    `strict_numbers`: NaN, Infinity and -Infinity, which Python reads and JSON has not, are
    refused (what a client sends to a server: llama-server refuses them).
    """
    where = source_name(source, where)
    text = read_text(source, what=what, where=where, error=error, strip_bom=strip_bom, max_bytes=max_bytes,
                     stdin_ok=stdin_ok)
    return parse_json(text, what=what, where=where, error=error, max_depth=max_depth, strict_numbers=strict_numbers)


def parse_json(text: str, *, what: str = "a JSON file", where: str = "<json>",
               error: type[TmplkitError] = InputError, max_depth: int | None = DEFAULT_MAX_DEPTH,
               strict_numbers: bool = False):
    """Parse JSON text already read (e.g. from stdin) with read_json's checks and messages.

    >>> parse_json('{"x": NaN}', where="c.json", strict_numbers=True)
    Traceback (most recent call last):
    ...
    tmplkit.errors.InputError: c.json: not valid JSON (NaN is no JSON number, and llama-server refuses it); give a number, or null
    """
    fix = "fix the value" if where.startswith("--") else "fix the file"  # (an option's value: --template-kwargs)
    if text.startswith(_BOM):
        raise error(f"{where}: not valid JSON (it starts with a UTF-8 byte-order mark); save the file without one")
    try:
        value = _strict(text) if strict_numbers else json.loads(text)
    except _Overflow as exc:
        raise error(f"{where}: a number out of range ({exc} is more than a double holds, and llama-server refuses "
                    "it); give a smaller number") from None
    except _Constant as exc:
        raise error(f"{where}: not valid JSON ({exc} is no JSON number, and llama-server refuses it); give a "
                    "number, or null") from None
    except json.JSONDecodeError as exc:
        hint = "give one JSON value (JSON Lines is not supported)" if exc.msg == "Extra data" else "fix the JSON"
        raise error(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {hint}") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply for {what}; {fix}") from None
    except ValueError as exc:  # (Python refuses to read an integer of more than 4,300 digits)
        raise error(f"{where}: {number_problem(exc)}; {fix}") from None
    if max_depth is not None and _depth(text, max_depth) > max_depth:
        raise error(f"{where}: JSON nested too deeply for {what} (more than {max_depth} levels); {fix}")
    if "\\u" in text and (lone := lone_surrogate(value)) is not None:
        raise error(f"{where}: {lone_surrogate_problem(lone)}")
    return value


class _Constant(Exception):
    """NaN, Infinity or -Infinity met where `strict_numbers` refuses them."""


class _Overflow(_Constant):
    """A number too large for a double (`1e999`), which Python reads as infinity."""


class NotJsonNumber(ValueError):
    """NaN, Infinity or -Infinity in text `strict_loads` read."""


def strict_loads(text: str):
    """`json.loads` as a client's JSON is read by llama-server: NaN, Infinity and -Infinity raise
    ValueError ("NaN, which is no JSON number") where Python would take them, and so does a number
    too large for a double (`1e999`, which Python reads as infinity).

    >>> strict_loads('[1, -Infinity]')
    Traceback (most recent call last):
    ...
    tmplkit.jsonio.NotJsonNumber: -Infinity, which is no JSON number
    """
    try:
        return _strict(text)
    except _Overflow as exc:
        raise NotJsonNumber(f"{exc}, which is more than a double holds") from None
    except _Constant as exc:
        raise NotJsonNumber(f"{exc}, which is no JSON number") from None


def _strict(text: str):
    """`json.loads` raising _Constant for NaN and the infinities, _Overflow for a number no double holds."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_finite_int)


def _no_constant(name: str):
    raise _Constant(name)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Overflow(_shown(text))
    return value


def _finite_int(text: str) -> int:
    """An integer, refused where a double cannot hold it (llama-server reads one beyond 64 bits as a double)."""
    value = int(text)
    if len(text) > 300:
        try:
            float(value)
        except OverflowError:
            raise _Overflow(_shown(text)) from None
    return value


def _shown(number: str) -> str:
    return number if len(number) <= 24 else f"{number[:12]}...{number[-6:]} ({len(number)} characters)"


def stdin(what: str = "the input", error: type[TmplkitError] = InputError) -> IO:
    """Standard input for `-`, as bytes where it has them (a text stream put in its place is given
    as it is); one line where it is closed (`<&-`: sys.stdin is None), and where it is a terminal
    (nothing piped in: the command would wait, silently, for what is typed)."""
    import sys

    if sys.stdin is None:
        raise error(f"standard input is closed, so - cannot be read; give {what} as a file")
    try:
        typed = sys.stdin.isatty()
    except (OSError, ValueError, AttributeError):  # (closed under us, or a stream with no such question)
        typed = False
    if typed:
        raise error(f"standard input is a terminal (nothing is piped in), so - would wait for typing; give {what} as a "
                    "file, or pipe it in (`cat FILE | tmplkit ... -`, or `- < FILE`)")
    return getattr(sys.stdin, "buffer", sys.stdin)


def json_kind(value) -> str:
    """What a parsed JSON value is, in JSON's words (for messages: "got null", not "got NoneType").

    >>> json_kind(None), json_kind({}), json_kind("x"), json_kind(1.5)
    ('null', 'an object', 'a string', 'a number')
    """
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", tuple: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def number_problem(exc: ValueError) -> str:
    """What a ValueError from `json.loads` or `int` other than a syntax error says, in the user's
    words: an integer with more digits than Python converts (`sys.get_int_max_str_digits`)."""
    if "digits" in str(exc):
        return f"a number with more than {sys.get_int_max_str_digits()} digits, which no chat or setting holds"
    return f"a value that cannot be read ({exc})"


def lone_surrogate_problem(lone: str) -> str:
    """What is wrong with a value that holds the lone surrogate `lone` (`lone_surrogate`), and what to do."""
    return f"a string holds {lone}, half of a UTF-16 pair and no character (no tokenizer or server can encode it); fix the text"


def lone_surrogate(value) -> str | None:
    r"""The first lone surrogate escape (as '\ud800') in a parsed JSON value's strings, or None.

    >>> lone_surrogate({"content": ["ok", "x\ud800"]}), lone_surrogate("\U0001f600")
    ('\\ud800', None)
    """
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"\\u{ord(v[exc.start]):04x}"
        elif isinstance(v, (dict, list)) and id(v) not in seen:  # (each once: a Python value can hold itself)
            seen.add(id(v))
            stack.extend([*v.keys(), *v.values()] if isinstance(v, dict) else v)
    return None


_END = object()


def _items(v):
    return iter(v.values() if isinstance(v, dict) else v)


def shape_problem(value, max_depth: int = DEFAULT_MAX_DEPTH) -> str | None:
    """What makes a Python value (given to the library, not read from a file) no JSON value in shape,
    or None: a list or dict that holds itself (every walk over it would loop or recurse without end),
    or nesting deeper than `max_depth` (`read_json`'s limit for a file).

    >>> loop = [1]; loop.append(loop)
    >>> shape_problem({"messages": loop}), shape_problem({"a": [[1], {"b": 2}]})
    ('a list or object that holds itself, which no JSON value can', None)
    """
    if not isinstance(value, (dict, list, tuple)):
        return None
    on_path, done = {id(value)}, set()  # (done: a value held twice is walked once)
    stack = [(value, _items(value))]
    while stack:
        child = next(stack[-1][1], _END)
        if child is _END:
            finished = id(stack.pop()[0])
            on_path.discard(finished)
            done.add(finished)
        elif isinstance(child, (dict, list, tuple)) and id(child) not in done:
            if id(child) in on_path:
                return "a list or object that holds itself, which no JSON value can"
            if len(stack) >= max_depth:
                return f"lists or objects nested deeper than {max_depth} levels"
            on_path.add(id(child))
            stack.append((child, _items(child)))
    return None


def source_name(source: Source, where: str | None = None) -> str:
    """How messages name `source`: `where` when given, else the path, the open file's name, or <stdin>."""
    if where is not None:
        return str(where)
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        return name if isinstance(name, str) else "<stdin>"
    return str(source)


def _read_path(path: Path, what: str, where: str, error: type[TmplkitError], max_bytes: int | None,
               stdin_ok: bool) -> bytes:
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; on a regular file
    # it changes nothing. The checks then run on the opened file itself, not on its name.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:  # Windows; POSIX opens a folder and fstat says so below
        raise error(f"{where}: is a folder; give {what} as a file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise error(f"{where}: cannot read ({reason}); check the path and permissions") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{where}: is a folder; give {what} as a file")
        if not stat.S_ISREG(info.st_mode):
            # (a pipe is not waited on: with no writer it would never end)
            pipe = ", or pipe it to - (standard input)" if stdin_ok else ""
            raise error(f"{where}: not a regular file (a pipe or device); give {what} as a file{pipe}")
        if max_bytes is not None and info.st_size > max_bytes:
            _too_big(where, info.st_size, max_bytes, error)
        with os.fdopen(fd, "rb") as f:
            fd = -1  # closed by `f` from here on
            return _read_bounded(f, where, max_bytes, error)
    except OSError as exc:
        raise error(f"{where}: cannot read ({exc.strerror or exc}); check the path and permissions") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _read_stream(stream: IO, where: str, error: type[TmplkitError], max_bytes: int | None):
    try:
        return _read_bounded(stream, where, max_bytes, error)
    except OSError as exc:
        raise error(f"{where}: cannot read ({exc.strerror or exc})") from None


def _read_bounded(f: IO, where: str, max_bytes: int | None, error: type[TmplkitError]):
    # One byte (or character) past the limit tells a file that grew, or a stream, that is too big.
    data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        _too_big(where, None, max_bytes, error)
    return data


def _too_big(where: str, size: int | None, max_bytes: int, error: type[TmplkitError]):
    size_text = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
    raise error(f"{where}: {size_text}, over the limit of {max_bytes} bytes for one file; give a smaller file")


def _depth(text: str, limit: int) -> int:
    """The deepest nesting of lists and objects in valid JSON `text` (cheap when it cannot exceed `limit`)."""
    if text.count("[") + text.count("{") <= limit:
        return 0
    skeleton = _JSON_STRING.sub("", text)  # brackets inside strings do not nest anything
    steps = (1 if c in "[{" else -1 for c in _BRACKETS.findall(skeleton))
    return max(itertools.accumulate(steps, initial=0))
