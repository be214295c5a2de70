"""The `audit` and `table` subcommands."""

from __future__ import annotations

import sys

from .. import auditing as audit_mod
from ._common import emit, load_templates, positive, progress_printer


def add_audit(sub) -> None:
    p = sub.add_parser("audit", help="analyze templates, prove their delimiters by a round trip, report")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="a .gguf, .jinja, tokenizer_config.json, chat_template.json, folder, hf:org/name[@rev] or corpus:llama.cpp")
    p.add_argument("--format", choices=["text", "json", "markdown", "junit"], default="text")
    p.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE (atomically) instead of stdout")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="worker processes (default: the machine's cores); each template is analyzed in a sandboxed worker")
    p.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds per template (default 10)")
    p.add_argument("--memory", type=int, default=1024, metavar="MB", help="MiB a worker may allocate beyond its start-up footprint (default 1024)")
    p.add_argument("--in-process", action="store_true", help="analyze in this process (no workers; render limits only)")
    p.add_argument("--tokenizer", metavar="PATH|auto",
                   help="also run the token-level round trip with this tokenizer (.gguf, tokenizer.json, vocab:NAME); "
                        "auto: the template's own GGUF or the corpus vocab paired with it")
    p.add_argument("--expected-failures", metavar="FILE",
                   help="JSON {template name: reason}: listed failures do not fail the audit, listed passes do")
    p.set_defaults(func=_cmd_audit)


def _cmd_audit(args) -> int:
    positive(args.jobs, "--jobs")
    positive(args.timeout, "--timeout")
    positive(args.memory, "--memory")
    expected = audit_mod.load_expected_failures(args.expected_failures) if args.expected_failures else None
    templates = load_templates(args.sources)
    progress = progress_printer(sys.stderr.isatty())
    if args.in_process:
        report = audit_mod.audit(templates, jobs=1, expected_failures=expected, tokenizer=args.tokenizer,
                                 progress=progress)
    else:
        report = audit_mod.audit(templates, jobs=args.jobs, timeout=args.timeout, memory_mb=args.memory,
                                 expected_failures=expected, tokenizer=args.tokenizer, progress=progress)
    emit(audit_mod.AUDIT_FORMATS[args.format](report), args.output)
    if args.format != "text":
        print(audit_mod.summary_line(report), file=sys.stderr)
    return 0 if report.ok else 1


def add_table(sub) -> None:
    p = sub.add_parser("table", help="print the delimiter table, one row per template")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    p.add_argument("--output", "-o", metavar="FILE", help="write the table to FILE (atomically)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: the machine's cores)")
    p.set_defaults(func=_cmd_table)


def _cmd_table(args) -> int:
    positive(args.jobs, "--jobs")
    templates = load_templates(args.sources)
    report = audit_mod.audit(templates, jobs=args.jobs, timeout=10.0, progress=progress_printer(sys.stderr.isatty()))
    emit(audit_mod.format_table(report.results, args.format), args.output)
    return 0
