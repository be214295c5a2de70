"""The `schema` subcommand: the JSON Schemas of tmplkit's JSON outputs, shipped with the package."""

from __future__ import annotations

from ._common import emit

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_schema(sub) -> None:
    p = sub.add_parser("schema",
                       description="Print the JSON Schema (draft 2020-12) of a JSON output: audit, table, turns, "
                                   "spans, mask, request, engine-parity, server-delimiters, server-log, prefill, replay, "
                                   "session, lock, diff. Without NAME, list them with the path of each file.")
    p.add_argument("name", metavar="NAME", nargs="?", help="the schema to print (default: list them)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the schema to FILE (atomically) instead of stdout")
    p.set_defaults(func=_cmd_schema)


def _cmd_schema(args) -> int:
    from ..schemas import schema_names, schema_path

    if args.name is None:
        emit("".join(f"{name:<18} {schema_path(name)}\n" for name in schema_names()), args.output)
    else:
        emit(schema_path(args.name).read_text(encoding="utf-8"), args.output)
    return 0
