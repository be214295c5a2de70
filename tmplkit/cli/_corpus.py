"""The `corpus` subcommand."""

from __future__ import annotations

import sys


def add_corpus(sub) -> None:
    p = sub.add_parser("corpus", help="fetch the pinned public template corpus into the cache")
    p.add_argument("action", choices=["fetch", "path"], help="fetch: download and verify; path: print the cache folder")
    p.set_defaults(func=_cmd_corpus)


def _cmd_corpus(args) -> int:
    from .. import corpus

    if args.action == "fetch":
        root = corpus.fetch(progress=sys.stderr.isatty())
    else:
        root = corpus.corpus_dir()
    print(root)
    return 0
