"""The `show` subcommand."""

from __future__ import annotations

import sys


def add_show(sub) -> None:
    p = sub.add_parser("show", help="render the mixed probe conversation and mark its spans")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--name", help="which template of the source (default: the first)")
    p.set_defaults(func=_cmd_show)


def _cmd_show(args) -> int:
    from ..auditing import format_show
    from ..isolate import analyze_isolated
    from ..sources import load_one
    from ._common import use_color

    # The template is untrusted: analyze it in a worker with the audit's default limits.
    (analysis,) = analyze_isolated([load_one(args.source, args.name)], jobs=1)
    sys.stdout.write(format_show(analysis, color=use_color(args, sys.stdout)))
    return 0
