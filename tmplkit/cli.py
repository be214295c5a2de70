"""The command line: a thin layer over the library. Each subcommand calls library functions.

Errors a user can cause end as one line on stderr and exit code 2; an audit with failures exits 1.
"""

from __future__ import annotations

import argparse
import sys

from .errors import TmplkitError


def _add_corpus(sub) -> None:
    p = sub.add_parser("corpus", help="fetch the pinned public template corpus into the cache")
    p.add_argument("action", choices=["fetch", "path"], help="fetch: download and verify; path: print the cache folder")
    p.set_defaults(func=_cmd_corpus)


def _cmd_corpus(args) -> int:
    from . import corpus

    if args.action == "fetch":
        root = corpus.fetch(progress=sys.stderr.isatty())
    else:
        root = corpus.corpus_dir()
    print(root)
    return 0


# Each subcommand registers itself here: (name, add_parser function).
_SUBCOMMANDS = [_add_corpus]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmplkit", description=__doc__.splitlines()[0])
    from . import __version__

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


if __name__ == "__main__":
    sys.exit(main())
