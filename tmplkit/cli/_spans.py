"""The `spans` subcommand."""

from __future__ import annotations

import sys


def add_spans(sub) -> None:
    p = sub.add_parser("spans", help="render a conversation, tokenize it, and print its message spans")
    p.add_argument("conversation", metavar="CONVERSATION", help="a conversation JSON file (list of messages or {messages, tools})")
    p.add_argument("--template", required=True, metavar="SOURCE", help="a .gguf, .jinja, tokenizer_config.json, folder or hf:org/name")
    p.add_argument("--name", help="which template of the source (default: the first)")
    p.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a .gguf (vocab-only is enough), a tokenizer.json or its folder, vocab:NAME (corpus) or hf:org/name (local cache)")
    p.add_argument("--add-generation-prompt", action="store_true", help="render with the generation prompt")
    p.add_argument("--format", choices=["json", "text"], default="json")
    p.set_defaults(func=_cmd_spans)


def _cmd_spans(args) -> int:
    import json

    from ..sources import load_one
    from ..token_audit import conversation_spans, format_spans_text
    from ..tokenizers import load_tokenizer
    from ._common import require_tokenizers

    require_tokenizers([args.tokenizer], "tmplkit spans --tokenizer " + args.tokenizer)  # before any work
    template = load_one(args.template, args.name)
    tokenizer = load_tokenizer(args.tokenizer)
    result = conversation_spans(template, tokenizer, args.conversation, add_generation_prompt=args.add_generation_prompt)
    if args.format == "text":
        sys.stdout.write(format_spans_text(result))
    else:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
    return 0
