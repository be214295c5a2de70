"""The `spans` subcommand."""

from __future__ import annotations

import sys

from ._common import (
    add_format,
    add_generation_prompt,
    add_limits,
    add_name,
    add_output,
    add_session_option,
    add_template_argument,
    add_tokenizer,
    emit,
    template_conversation_tokenizer,
)
from ._limits import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, contained_limits
from ._outputs import error_line

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_spans(sub) -> None:
    p = sub.add_parser("spans")
    add_template_argument(p, old_template=True)
    add_name(p)
    add_session_option(p, required=True)
    add_tokenizer(p, required=True)
    add_generation_prompt(p, default=False, old="--add-generation-prompt")
    add_format(p, ("json", "text"), "json", "the spans")
    add_output(p, "the spans")
    add_limits(p, timeout=DEFAULT_TIMEOUT, memory=DEFAULT_MEMORY_MB)
    p.set_defaults(func=_cmd_spans)


def _cmd_spans(args) -> int:
    import json

    from ..auditing.contained import run_contained
    from ..session.token_spans import conversation_spans, format_spans_text

    limits = contained_limits(args)  # (a bad limit is refused before any work)
    template, conversation, tokenizer = template_conversation_tokenizer(args, "spans")
    # The template is untrusted: it renders in a worker under --timeout and --memory (tmplkit.auditing.contained).
    result = run_contained(conversation_spans, template, tokenizer, conversation, what=f"spans of '{template.name}'",
                           add_generation_prompt=args.add_generation_prompt, **limits)
    if args.format == "text":
        emit(format_spans_text(result), args.output)
    else:
        emit(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n", args.output)
    if not result.delimiters.passed:  # spans of delimiters not proven here are no answer: written, and failed
        print(error_line(f"tmplkit: spans: the delimiters of '{template.name}' are {result.delimiters.why_unproven()}; "
                         "the spans cannot be trusted (`tmplkit audit` says why)"), file=sys.stderr)
        return 1
    if result.misplaced:  # proven on the probes, misread on this conversation: written, and failed
        more = f" (and {len(result.misplaced) - 1} more)" if len(result.misplaced) > 1 else ""
        print(error_line(f"tmplkit: spans: on this conversation {result.misplaced[0]}{more}: '{template.name}' writes it "
                         "otherwise than its probes, and the spans cannot be trusted there"), file=sys.stderr)
        return 1
    if result.disagreements:  # proven on the probes, read otherwise than the text on this conversation
        more = f" (and {len(result.disagreements) - 1} more)" if len(result.disagreements) > 1 else ""
        print(error_line(f"tmplkit: spans: on this conversation {result.disagreements[0]}{more}: the ids of "
                         f"'{template.name}' read it otherwise than its text, and the spans cannot be trusted there"),
              file=sys.stderr)
        return 1
    return 0
