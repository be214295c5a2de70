"""The `mask` subcommand: which tokens of a conversation the model learns."""

from __future__ import annotations

import sys

_ON, _OFF = "\x1b[1;32m", "\x1b[0m"


def add_mask(sub) -> None:
    p = sub.add_parser("mask", help="the tokens of a conversation the model learns (assistant turns as generated)",
                       description="Render CONVERSATION with the template, tokenize it and show which tokens the model "
                                   "learns.\n\nExample:\n  tmplkit mask chat.json --template model.gguf --tokenizer model.gguf",
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("conversation", metavar="CONVERSATION", help="a conversation JSON file (list of messages or {messages, tools}), - for stdin")
    p.add_argument("--template", required=True, metavar="SOURCE", help="a .gguf, .jinja, tokenizer_config.json, folder or hf:org/name")
    p.add_argument("--name", help="which template of the source (default: the first)")
    p.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a .gguf (vocab-only is enough), a tokenizer.json or its folder, vocab:NAME (corpus) or hf:org/name")
    p.add_argument("--format", choices=["auto", "text", "json"], default="auto",
                   help="auto (highlighted text on a terminal, JSON otherwise), text, json (default: auto)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (JSON unless --format text)")
    p.set_defaults(func=_cmd_mask)


def _cmd_mask(args) -> int:
    import json

    from ..auditing.contained import portable_tokenizer, run_contained
    from ..masks import assistant_mask
    from ..session import load_conversation
    from ..sources.templates import load_one
    from ..tokens.tokenizers import load_tokenizer
    from ._common import emit, require_tokenizers, use_color
    from ._limits import render_timeout

    require_tokenizers([args.tokenizer], "tmplkit mask --tokenizer " + args.tokenizer)  # before any work
    conversation = load_conversation(args.conversation)
    template = load_one(args.template, args.name)
    tokenizer = portable_tokenizer(load_tokenizer(args.tokenizer), args.tokenizer)
    # The template is untrusted: it renders in a worker under the audit's limits (tmplkit.auditing.contained).
    result = run_contained(assistant_mask, template, tokenizer, conversation, what=f"mask of '{template.name}'",
                           timeout=render_timeout(args))
    fmt = args.format
    if fmt == "auto":
        fmt = "text" if not args.output and sys.stdout.isatty() else "json"
    if fmt == "json":
        emit(json.dumps(result.to_dict(), ensure_ascii=False, indent=1) + "\n", args.output)
    else:
        color = not args.output and use_color(args, sys.stdout)
        emit(format_mask(result, color), args.output)
    return 0


def format_mask(result, color: bool) -> str:
    """The render with the learned text highlighted (or in [[...]] without colour), and a summary."""
    text, out, at = result.text, [], 0
    on, off = (_ON, _OFF) if color else ("[[", "]]")
    for a, b in result.text_mask.ranges:
        out += [text[at:a], on, text[a:b], off]
        at = b
    out.append(text[at:])
    n = sum(result.mask)
    summary = f"\n-- {n} of {len(result.mask)} tokens learned in {len(result.text_mask.ranges)} turns"
    dropped = [t.messages for t in result.turns if t.rule == "dropped"]
    if dropped:
        # (a turn the history does not write as generated learns nothing: say so, never silently)
        summary += (f"; nothing learned in {len(dropped)} turn(s) whose generated text the render does not hold in one "
                    f"piece (messages {', '.join(f'{a}..{b - 1}' for a, b in dropped)})")
    return "".join(out) + summary + "\n"
