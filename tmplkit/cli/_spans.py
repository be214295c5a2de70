"""The `spans` subcommand."""

from __future__ import annotations

from ._common import add_format, add_name, add_output


def add_spans(sub) -> None:
    p = sub.add_parser("spans", help="render a conversation, tokenize it, and print its message spans")
    p.add_argument("conversation", metavar="CONVERSATION", help="a conversation JSON file (list of messages or {messages, tools}), or -")
    p.add_argument("--template", required=True, metavar="SOURCE", help="a .gguf, .jinja, tokenizer_config.json, folder or hf:org/name")
    add_name(p)
    p.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a .gguf (vocab-only is enough), a tokenizer.json or its folder, vocab:NAME (corpus) or hf:org/name (local cache)")
    p.add_argument("--add-generation-prompt", action="store_true", help="render with the generation prompt")
    add_format(p, ("json", "text"), "json", "the spans")
    add_output(p, "the spans")
    p.set_defaults(func=_cmd_spans)


def _cmd_spans(args) -> int:
    import json

    from ..auditing.contained import portable_tokenizer, run_contained
    from ..session import load_conversation
    from ..session.token_spans import conversation_spans, format_spans_text
    from ..sources.templates import load_one
    from ..tokens.tokenizers import load_tokenizer
    from ._common import emit, require_tokenizers
    from ._limits import render_timeout

    require_tokenizers([args.tokenizer], "tmplkit spans --tokenizer " + args.tokenizer)  # before any work
    conversation = load_conversation(args.conversation)
    template = load_one(args.template, args.name)
    tokenizer = portable_tokenizer(load_tokenizer(args.tokenizer), args.tokenizer)
    # The template is untrusted: it renders in a worker under the audit's limits (tmplkit.auditing.contained).
    result = run_contained(conversation_spans, template, tokenizer, conversation, what=f"spans of '{template.name}'", timeout=render_timeout(args),
                           add_generation_prompt=args.add_generation_prompt)
    if args.format == "text":
        emit(format_spans_text(result), args.output)
    else:
        emit(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n", args.output)
    return 0

