"""Input preparation, as transformers' `apply_chat_template` does it: messages, tools and
documents reduced to plain JSON data, None-valued keys dropped (a session's reasoning fields are
aliased as transformers aliases them by `tmplkit.session.given_messages`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping

from ..errors import InputError
from ..jsonio import json_kind, shape_problem

__all__ = ["REASONING_KEYS"]

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


# Message keys templates read a message's reasoning from (Qwen3 and most: reasoning_content; gpt-oss,
# Command A Reasoning: thinking; Laguna, Hy3, Solar: reasoning). An analysis probe sets them all to
# one needle; a session is given its reasoning as the server gives it (tmplkit.session).
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class Prepared(list):
    """Messages already prepared (`prepare_message` each), or tools reduced to plain data: `render`
    takes them as they are. A session renders the same messages hundreds of times (every request is
    the conversation so far): each is prepared once."""


def prepare_message(message) -> dict:
    """One message as a template is given it: plain data, its null-valued keys dropped, as
    transformers' apply_chat_template drops them (`_normalize_chat_messages`: many templates crash
    on `content: null` and handle a missing key); no key is added."""
    with _refused_if_recursive("a message holds", message):
        if type(message) is not dict:  # (a plain dict's values are made plain below, in the same pass)
            message = _to_dicts(message)
            if not isinstance(message, dict):
                raise InputError(f"each message must be a dict with 'role' and 'content', got {message!r}")
        return {_plain(k): _plain(v) for k, v in message.items() if v is not None}


@contextlib.contextmanager
def _refused_if_recursive(what: str, *values) -> Iterator[None]:
    """The walk that makes inputs plain recurses: where a Python value holds itself (or nests past
    Python's depth), one line saying `what` ("a message holds") and which, not a RecursionError."""
    try:
        yield
    except RecursionError:
        problem = next(filter(None, map(shape_problem, values)), "values nested too deep")
        raise InputError(f"{what} {problem}; give JSON-like data") from None


def _prepare_messages(messages) -> list[dict]:
    if type(messages) is Prepared:
        prepared: list[dict] = messages
    else:
        if hasattr(messages, "messages"):
            messages = messages.messages
        if isinstance(messages, (str, bytes)) or not hasattr(messages, "__iter__"):
            raise InputError(f"messages must be a list of message dicts, got {json_kind(messages)}")
        prepared = [prepare_message(m) for m in messages]
    if not prepared:
        raise InputError("cannot render an empty conversation; give at least one message")
    return prepared


def prepare_tools(tools) -> Prepared | None:
    """`tools` reduced to plain data once, for renders that take them as they are."""
    with _refused_if_recursive("the tools hold", tools):
        return None if tools is None else Prepared(_prepare_dicts(tools, "tools", "JSON-schema dicts"))


def _prepare_dicts(values, what: str, hint: str):
    """`tools`/`documents`: None, or a list of dicts, reduced to plain data (a `Prepared` list is
    taken as it is: a session's tools, prepared once for its hundreds of renders)."""
    if values is None or type(values) is Prepared:
        return values
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
        raise InputError(f"{what} must be a list of {hint}, got {json_kind(values)}")
    values = list(values)
    for value in values:
        if not isinstance(value, Mapping):
            raise InputError(f"{what} must be a list of {hint}, got an item that is {json_kind(value)}")
    return _plain(values)
