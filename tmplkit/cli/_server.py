"""The `server` subcommand: what llama-server itself does, read off the real server and its log.

`tmplkit server log LOG` reads a llama-server log as a user has it.
"""

from __future__ import annotations


def add_server(sub) -> None:
    p = sub.add_parser("server", help="llama-server itself: reading its log")
    ss = p.add_subparsers(dest="server_command", required=True)

    g = ss.add_parser(
        "log", help="read a llama-server log: decode calls, batch sizes, reuse, checkpoints, and the pattern",
        description="Read a llama-server log as you have it (its default lines, or every batch and checkpoint "
                    "at -lv 4) and report per task: decode calls, batch sizes and where batches ended early, "
                    "tokens reused and reprocessed, checkpoints created and restored, and whether the pattern "
                    "is batch fragmentation at message starts (llama.cpp issue 25213) or a resume from too far "
                    "back. With --template, --session and --tokenizer, say which message of the session each "
                    "early batch end, checkpoint and restore fell on.",
        epilog="Example:\n  llama-server ... -lv 4 2> server.log\n"
               "  tmplkit server log server.log --template model.gguf --session session.json --tokenizer model.gguf",
        formatter_class=_raw())
    g.add_argument("log", metavar="LOG", help="the log file ('-': standard input)")
    g.add_argument("--template", metavar="SOURCE", help="the chat template the server used (a .gguf, .jinja, ...)")
    g.add_argument("--name", help="which template of the source (default: the first)")
    g.add_argument("--session", metavar="FILE", help="the conversation the client sent (its last request's messages)")
    g.add_argument("--tokenizer", metavar="PATH", help="the model's vocabulary (its .gguf, or vocab:NAME)")
    g.add_argument("--format", choices=["text", "json"], default="text")
    g.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    g.set_defaults(func=_cmd_log)


def _raw():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def _cmd_log(args) -> int:
    import json
    import sys
    from pathlib import Path

    from ..errors import InputError
    from ..server_log import format_server_log, locate_breaks, read_server_log
    from ._common import emit, require_tokenizers

    given = [x is not None for x in (args.template, args.session, args.tokenizer)]
    if any(given) and not all(given):
        raise InputError("give --template, --session and --tokenizer together (to place the breaks on messages), or none")
    if all(given):
        require_tokenizers([args.tokenizer], "tmplkit server log --tokenizer " + args.tokenizer)
    if args.log == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        path = Path(args.log)
        if not path.is_file():
            raise InputError(f"log file not found: {path}")
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except OSError as exc:
            raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        source = str(path)
    log = read_server_log(text, source)
    if all(given):
        from ..sources import load_one
        from ..tokenize import load_tokenizer

        template = load_one(args.template, args.name)
        log = locate_breaks(log, template, args.session, load_tokenizer(args.tokenizer))
    if args.format == "json":
        emit(json.dumps(log.to_dict(), ensure_ascii=False, indent=1) + "\n", args.output)
    else:
        emit(format_server_log(log), args.output)
    return 0
