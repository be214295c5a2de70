"""The JSON Schemas (draft 2020-12) of every JSON tmplkit prints, shipped with the package.

Each `NAME.schema.json` here describes one command's JSON: `audit`, `table`, `turns`, `spans`,
`request`, `engine-parity`, `server-delimiters`, `server-log`, `prefill`, `replay`, `session`, `lock`
and `diff` (`tmplkit schema NAME` prints one; `tmplkit schema` lists them with their paths). tmplkit's own
reports carry a `schema_version`, the schema's `const`; the request body (POSTed to llama-server
as it is) and the session (an OpenAI-style conversation, also an input) carry none. A version is
raised when a field is removed or changes meaning; adding one does not, but the schema lists it.

>>> load_schema("audit")["properties"]["schema_version"]
{'const': 1}
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError

__all__ = ["SCHEMA_DIR", "load_schema", "schema_names", "schema_path"]

SCHEMA_DIR = Path(__file__).parent
_SUFFIX = ".schema.json"


def schema_names() -> tuple[str, ...]:
    """The names of the shipped schemas, sorted."""
    return tuple(sorted(p.name[: -len(_SUFFIX)] for p in SCHEMA_DIR.glob("*" + _SUFFIX)))


def schema_path(name: str) -> Path:
    """The file of schema `name`; InputError naming the schemas there are when there is none."""
    path = SCHEMA_DIR / f"{name}{_SUFFIX}"
    if name not in schema_names():  # (a name is never a path: `../x` would read a file outside)
        raise InputError(f"no JSON Schema named {name!r}; give one of {', '.join(schema_names())}")
    return path


def load_schema(name: str) -> dict:
    """Schema `name`, parsed."""
    return json.loads(schema_path(name).read_text(encoding="utf-8"))
