"""The `show` subcommand."""

from __future__ import annotations

import sys

from ._common import add_limits, add_name, add_output, emit, use_color

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_show(sub) -> None:
    p = sub.add_parser("show")
    p.add_argument("source", metavar="SOURCE", help="a .gguf, .jinja, tokenizer_config.json, folder, hf:org/name or -")
    add_name(p)
    add_output(p, "the marked conversation")
    from ._audit import _DEFAULT_MEMORY_MB, _DEFAULT_TIMEOUT

    add_limits(p, timeout=_DEFAULT_TIMEOUT, memory=_DEFAULT_MEMORY_MB)
    p.set_defaults(func=_cmd_show)


def _cmd_show(args) -> int:
    from ..auditing import format_show, unrendered_reason
    from ..auditing.isolate import analyze_isolated
    from ..errors import RenderError
    from ..sources.templates import load_one
    from ._audit import worker_limits

    # The template is untrusted: analyze it in a worker with the audit's limits.
    (analysis,) = analyze_isolated([load_one(args.source, args.name)], jobs=1, **worker_limits(args))
    why = unrendered_reason(analysis)
    if why is not None:  # nothing to show is an error of the input, as everywhere else
        raise RenderError(f"{analysis.name}: cannot render the probe conversation ({why})")
    color = use_color(args, sys.stdout) if not args.output else args.color == "always"
    emit(format_show(analysis, color=color), args.output)
    return 0
