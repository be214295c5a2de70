"""A tool's `parameters` as llama-server reads them: the JSON Schema it builds a tool-call parser
from for every template (its autoparser's, a specialized handler's), and refuses a request over
(HTTP 400 or 500, "JSON schema error at #/properties/a: schema must be an object") where it cannot.

The rules are the pinned source's (common/json-schema.cpp, `common_chat_schema_builder`): what a
schema node may hold, walked as it walks it (`$ref` within the document, `anyOf`/`oneOf`, a list
of types, `const` and `enum`, then by type). A schema it takes may still be one no model is helped
by: only its refusals are repeated here.
"""

from __future__ import annotations

import re

__all__ = ["schema_problem"]


class _Refused(ValueError):
    pass


def schema_problem(schema) -> str | None:
    """Why llama-server refuses `schema` as a tool's parameters, in its words (None: it takes it)."""
    try:
        _Walk(schema).node(schema, "#")
    except _Refused as exc:
        return str(exc)
    except RecursionError:
        return "JSON schema error at #: nested too deeply to read"
    return None


def _fail(path: str, message: str):
    raise _Refused(f"JSON schema error at {path}: {message}")


def _integer(value) -> bool:  # (JSON's integers: nlohmann's booleans are no numbers)
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Walk:
    def __init__(self, root) -> None:
        self.root = root
        self.refs: set[str] = set()

    def node(self, schema, path: str) -> None:
        if not isinstance(schema, dict):
            _fail(path, "schema must be an object")
        if "$ref" in schema:
            return self.ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self.alternatives(schema[key], f"{path}/{key}")
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                _fail(path, "type must not be empty")
            for i, t in enumerate(kind):
                self.node({**schema, "type": t}, f"{path}/type/{i}")
            return None
        if "const" in schema:
            return None
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                _fail(path, "enum must be a non-empty array")
            return None
        if kind is not None and not isinstance(kind, str):
            _fail(path, "type must be a string or an array of strings")
        return self.typed(schema, kind or "", path)

    def typed(self, schema: dict, kind: str, path: str) -> None:
        has_properties = "properties" in schema or schema.get("additionalProperties", True) is not True
        if not kind:  # (the structural keywords decide, in the builder's order)
            if has_properties:
                return self.object(schema, path)
            if "allOf" in schema:
                return self.alternatives(schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self.array(schema, path)
            if any(k in schema for k in ("pattern", "minLength", "maxLength")) or self.formatted(schema, path):
                return self.string(schema, path)
            return None
        if kind == "object":
            if not has_properties and "allOf" in schema:
                return self.alternatives(schema["allOf"], f"{path}/allOf")
            return self.object(schema, path)
        if kind == "string":
            if "allOf" in schema:
                return self.alternatives(schema["allOf"], f"{path}/allOf")
            return self.string(schema, path)
        if kind == "array":
            return self.array(schema, path)
        if kind == "integer":
            return self.integer(schema, path)
        if kind in ("number", "boolean", "null"):
            return None
        _fail(path, f"unrecognized type {kind}")

    def ref(self, value, path: str) -> None:
        if not isinstance(value, str):
            _fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            _fail(path, f"unsupported $ref {value}, only references into the same document are supported")
        if value in self.refs:
            return
        self.refs.add(value)  # (first: a cycle back to this $ref stops here)
        self.node(self.resolve(value, path), value)

    def resolve(self, ref: str, path: str):
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                m = re.match(r"\s*([+-]?)(\d+)", sel)  # (std::stoull: a leading number, a minus wrapping round)
                idx = int(m.group(2)) if m and (m.group(1) != "-" or not int(m.group(2))) else len(target)
                if idx >= len(target):
                    _fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                _fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def alternatives(self, alts, path: str) -> None:
        if not isinstance(alts, list):
            _fail(path, "must be an array of schemas")
        if not alts:
            _fail(path, "must not be empty")
        for i, alt in enumerate(alts):
            self.node(alt, f"{path}/{i}")

    def object(self, schema: dict, path: str) -> None:
        if "properties" in schema:
            if not isinstance(schema["properties"], dict):
                _fail(path, "properties must be an object")
            for name, prop in schema["properties"].items():
                self.node(prop, f"{path}/properties/{name}")
        if "additionalProperties" in schema:
            more = schema["additionalProperties"]
            if isinstance(more, dict):
                self.node(more, f"{path}/additionalProperties")
            elif not isinstance(more, bool):
                _fail(path, "additionalProperties must be a boolean or a schema")

    def array(self, schema: dict, path: str) -> None:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                for i, item in enumerate(items):
                    self.node(item, f"{path}/{key}/{i}")
                return  # (a tuple: its counts are not read)
            self.node(items, f"{path}/{key}")
        self.count(schema, "minItems", path)
        self.count(schema, "maxItems", path)

    def string(self, schema: dict, path: str) -> None:
        if "pattern" in schema and not isinstance(schema["pattern"], str):
            _fail(path, "pattern must be a string")
        self.formatted(schema, path)
        self.count(schema, "minLength", path)
        self.count(schema, "maxLength", path)

    def integer(self, schema: dict, path: str) -> None:
        for first, second in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            key = first if first in schema else second if second in schema else None
            if key is not None and not _number(schema[key]):
                _fail(path, f"{key} must be a number")

    @staticmethod
    def formatted(schema: dict, path: str) -> bool:
        """Whether `schema` names a format the builder knows (a format that is no string refused)."""
        if "format" not in schema:
            return False
        value = schema["format"]
        if not isinstance(value, str):
            _fail(path, "format must be a string")
        return value in ("date", "time", "date-time", "uuid") or bool(re.fullmatch(r"uuid[1-5]", value))

    @staticmethod
    def count(schema: dict, key: str, path: str) -> None:
        if key in schema and not (_integer(schema[key]) and 0 <= schema[key] < 2**31):
            _fail(path, f"{key} must be a non-negative integer")
