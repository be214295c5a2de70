"""The command line: a thin layer over the library, one module per subcommand.

Errors a user can cause end as one line on stderr and exit code 2; an audit with failures exits 1.
A new subcommand is a module with an `add_NAME(subparsers)` function, listed in `_SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import TmplkitError
from ._audit import add_audit, add_table
from ._corpus import add_corpus
from ._prefill import add_prefill
from ._show import add_show
from ._spans import add_spans

__all__ = ["build_parser", "main"]

# Each subcommand registers itself here: an add-parser function per subcommand.
_SUBCOMMANDS = [add_audit, add_table, add_show, add_corpus, add_spans, add_prefill]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="tmplkit", description="Chat-template boundary analysis: derive role delimiters, detect spans, drive checkpointing prefill.")
    parser.add_argument("--version", action="version", version=f"tmplkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TmplkitError as exc:
        print(f"tmplkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tmplkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
