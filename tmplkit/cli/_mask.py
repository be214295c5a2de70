"""The `mask` subcommand: which tokens of a conversation the model learns."""

from __future__ import annotations

import sys

from ..errors import escape_controls
from ._common import (
    add_format,
    add_limits,
    add_name,
    add_output,
    add_session_option,
    add_template_argument,
    add_tokenizer,
    deprecation_note,
    emit,
    json_compact,
    template_conversation_tokenizer,
    use_color,
)
from ._limits import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, contained_limits

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

_ON, _OFF = "\x1b[1;32m", "\x1b[0m"


def add_mask(sub) -> None:
    p = sub.add_parser("mask",
                       description="Render the conversation with the template, tokenize it and show which tokens the "
                                   "model learns.\n\nExample:\n  tmplkit mask model.gguf --session chat.json --tokenizer auto",
                       formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    add_template_argument(p, old_template=True)
    add_name(p)
    add_session_option(p, required=True)
    add_tokenizer(p, required=True)
    add_format(p, ("text", "json"), None, "the mask", aliases={"auto": None},
               default_help="text on a terminal, json when written to a pipe or a file")
    add_output(p, "the mask")
    add_limits(p, timeout=DEFAULT_TIMEOUT, memory=DEFAULT_MEMORY_MB)
    p.set_defaults(func=_cmd_mask)


def _cmd_mask(args) -> int:
    from ..auditing.contained import run_contained
    from ..masks import assistant_mask, markup_only_turns

    limits = contained_limits(args)  # (a bad limit is refused before any work)
    template, conversation, tokenizer = template_conversation_tokenizer(args, "mask")
    # The template is untrusted: it renders in a worker under --timeout and --memory (tmplkit.auditing.contained).
    result = run_contained(assistant_mask, template, tokenizer, conversation, what=f"mask of '{template.name}'", **limits)
    fmt = args.format
    if fmt == "auto":
        deprecation_note("--format auto", "no --format (text on a terminal, json otherwise)")
    if fmt in (None, "auto"):
        fmt = "text" if not args.output and sys.stdout.isatty() else "json"
    if fmt == "json":
        emit(json_compact(result.to_dict()) + "\n", args.output)
    else:
        color = not args.output and use_color(args, sys.stdout)
        emit(format_mask(result, color), args.output)
    if not any(m.get("role") == "assistant" for m in conversation.messages):
        # (an all-zero mask is right for it, as transformers gives it, but teaches nothing)
        print("tmplkit: note: the conversation has no assistant message: nothing is masked, so it teaches the "
              "model nothing", file=sys.stderr)
    ends = markup_only_turns(result.text_mask, conversation.messages)
    if ends:
        print(f"tmplkit: note: {len(ends)} turn(s) learn their end marker alone, as the template writes them: it writes "
              f"none of their tool calls or content there (messages {_ranges(t.messages for t in ends)}); the model "
              "learns to end those turns at once", file=sys.stderr)
    if result.text_mask.left_out:
        print(f"tmplkit: note: {_left_out(result.text_mask.left_out, conversation.messages)}", file=sys.stderr)
    return 0


def _left_out(indices, messages) -> str:
    """The note for the messages the render leaves out (`masks._dropped`)."""
    named = ", ".join(f"{i} ({messages[i].get('role')})" for i in indices)
    many = len(indices) > 1
    note = (f"the render leaves out message{'s' if many else ''} {named}: the template prints none of "
            f"{'their' if many else 'its'} content, so a model trained on it never sees {'them' if many else 'it'}")
    if any(messages[i].get("role") == "developer" for i in indices):
        note += "; as system (as llama-server gives a developer message) the template may print it"
    return note


def format_mask(result, color: bool) -> str:
    """The render with the learned text highlighted (or in [[...]] without colour), and a summary."""
    text, out, at = result.text, [], 0
    on, off = (_ON, _OFF) if color else ("[[", "]]")
    for a, b in result.text_mask.ranges:  # (the render's control characters shown, not run; the marks are ours)
        out += [escape_controls(text[at:a]), on, escape_controls(text[a:b]), off]
        at = b
    out.append(escape_controls(text[at:]))
    n = sum(result.mask)
    turns = len(result.text_mask.ranges)
    summary = f"\n-- {n} of {len(result.mask)} tokens learned in {turns} turn{'' if turns == 1 else 's'}"
    dropped = [t.messages for t in result.turns if t.rule == "dropped"]
    if dropped:
        # (a turn the history does not write as generated learns nothing: say so, never silently)
        summary += (f"; nothing learned in {len(dropped)} turn(s) whose generated text the render does not hold in one "
                    f"piece (messages {_ranges(dropped)})")
    unasked = [t.messages for t in result.turns if t.rule == "unasked"]
    if unasked:
        # (transformers' generation tags mask them; a request-by-request mask has no request for them)
        summary += (f"; nothing learned in {len(unasked)} assistant turn(s) before the first user message, which no "
                    f"request asks for (messages {_ranges(unasked)})")
    partial = [t.messages for t in result.turns if t.rule == "history"]
    if partial:
        # (reasoning a later message drops, text Gemma 4 writes after the tool results: not learned)
        summary += (f"; {len(partial)} turn(s) learned as the history writes them, which leaves out part of what the "
                    f"model generated there (messages {_ranges(partial)})")
    return "".join(out) + summary + "\n"


def _ranges(turns) -> str:
    return ", ".join(f"{a}..{b - 1}" for a, b in turns)
