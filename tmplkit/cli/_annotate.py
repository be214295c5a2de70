"""The `annotate` subcommand: a copy of a template with {%% generation %%} tags, proved."""

from __future__ import annotations

from ._common import add_limits, emit
from ._limits import DEFAULT_MEMORY_MB, contained_limits

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

# Seconds `annotate` may take per template: transformers' import and the renders of every check conversation.
ANNOTATE_TIMEOUT = 60.0


def add_annotate(sub) -> None:
    import argparse

    p = sub.add_parser("annotate",
                       description="Insert {% generation %}...{% endgeneration %} so that transformers' "
                                   "return_assistant_tokens_mask returns tmplkit's mask; the copy is written only "
                                   "when it renders byte-identically and the masks agree on every check "
                                   "conversation.\n\nExample:\n  tmplkit annotate model.gguf -o template.jinja",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="SOURCE", help="a .gguf, .jinja, tokenizer_config.json, folder or hf:org/name")
    p.add_argument("--name", help="which template of the source (default: its default one; needed where it holds several and none is)")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the annotated template (.jinja; - for standard output)")
    # (a template on purpose: it may be written into a folder SOURCE reads, as a new file: cli._outputs)
    p.set_defaults(_output_required=True, _writes_template=True)
    add_limits(p, timeout=ANNOTATE_TIMEOUT, memory=DEFAULT_MEMORY_MB)
    p.set_defaults(func=_cmd_annotate)


def _cmd_annotate(args) -> int:
    import importlib.util
    import sys

    from ..auditing.contained import run_contained
    from ..errors import InputError
    from ..masks import annotate_template
    from ..sources.templates import load_one

    if importlib.util.find_spec("transformers") is None:
        raise InputError("tmplkit annotate checks the copy with transformers, which is not installed; pip install transformers")
    limits = contained_limits(args, ANNOTATE_TIMEOUT)  # (-o was checked before the work: cli._outputs)
    template = load_one(args.source, args.name)
    # The template is untrusted: it renders in a worker under --timeout and --memory; the default
    # time allows for transformers' import and the check conversations (tmplkit.auditing.contained).
    annotated = run_contained(annotate_template, template, what=f"annotating '{template.name}'", **limits)
    emit(annotated.text, args.output)  # (None: -o -, standard output)
    print(f"{args.output or 'standard output'}: {template.name} annotated; masks equal on {annotated.checked} conversations "
          f"({annotated.masked_chars} masked characters)", file=sys.stderr)
    return 0
