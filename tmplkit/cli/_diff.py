"""The `diff` subcommand: the difference in behaviour between two templates."""

from __future__ import annotations

import argparse

from ._common import add_format, add_output, emit, refuse_worker_options_in_process
from ._lock import add_derive_options, derive

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_diff(sub) -> None:
    from ..behaviour import DIFF_FORMATS

    p = sub.add_parser(
        "diff",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare what two templates do: the verdict, every role's delimiter, the generation prompt and "
                    "reasoning under each thinking switch, the tool placement, prefix stability on the agent session "
                    "and every probe render. Texts that differ but render the same on every probe are no change in "
                    "behaviour. Exit 0: the same behaviour; 1: it differs; 2: bad input.",
        epilog="Example:\n  tmplkit diff hf:org/name@v1.0 hf:org/name\n"
               "  tmplkit diff model.Q4_K_M.gguf hf:org/name --format markdown   # a GGUF against its upstream")
    p.add_argument("old", metavar="A", help="the first template source (.jinja, .json, .gguf, folder, hf:org/name[@rev], -)")
    p.add_argument("new", metavar="B", help="the second template source")
    p.add_argument("--name", help="which template of A (default: its default one; a GGUF's 'tool_use')")
    p.add_argument("--name-b", help="which template of B (default: --name where B has it, else its default one)")
    add_format(p, DIFF_FORMATS, "text", "the report")
    add_output(p, "the report")
    add_derive_options(p)
    p.set_defaults(func=_cmd_diff)


def _load(source: str, name: str | None, fallback: str | None):
    from ..errors import SourceError
    from ..sources.templates import load_one

    if name is None and fallback is not None:
        try:
            return load_one(source, fallback)
        except SourceError:
            return load_one(source)
    return load_one(source, name)


def _cmd_diff(args) -> int:
    from ..atomic import check_writable
    from ..behaviour import compare, format_diff, require_derived

    refuse_worker_options_in_process(args)
    if args.output:
        check_writable(args.output)
    old = _load(args.old, args.name, None)
    new = _load(args.new, args.name_b, args.name)
    a, b = derive(args, [old, new])
    require_derived([a, b], "nothing was compared")
    diff = compare(a, b)
    emit(format_diff(a, b, diff, args.format), args.output)
    return 0 if diff.same else 1
