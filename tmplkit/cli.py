"""The command line: a thin layer over the library. Each subcommand calls library functions.

Errors a user can cause end as one line on stderr and exit code 2; an audit with failures exits 1.
"""

from __future__ import annotations

import argparse
import sys

from .errors import TmplkitError


def _add_corpus(sub) -> None:
    p = sub.add_parser("corpus", help="fetch the pinned public template corpus into the cache")
    p.add_argument("action", choices=["fetch", "path"], help="fetch: download and verify; path: print the cache folder")
    p.set_defaults(func=_cmd_corpus)


def _cmd_corpus(args) -> int:
    from . import corpus

    if args.action == "fetch":
        root = corpus.fetch(progress=sys.stderr.isatty())
    else:
        root = corpus.corpus_dir()
    print(root)
    return 0


def _load_templates(sources_: list[str]):
    from .sources import load_many

    return load_many(sources_)


def _progress_printer(enabled: bool):
    if not enabled:
        return None

    def report(done: int, total: int, analysis) -> None:
        end = "\n" if done == total else ""
        print(f"\r\x1b[2K[{done}/{total}] {analysis.name[:60]}", end=end, file=sys.stderr, flush=True)

    return report


def _emit(text: str, output: str | None) -> None:
    """Print, or write the file atomically (the old file stays whole if we are interrupted)."""
    if output:
        from .atomic import write_text_atomic
        from .errors import InputError

        try:
            write_text_atomic(output, text)
        except OSError as exc:
            raise InputError(f"{output}: cannot write the output file ({exc.strerror or exc}); "
                             "give a writable file path in an existing folder") from None
    else:
        sys.stdout.write(text)


def _add_audit(sub) -> None:
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


def _audit_module():
    # The package exports the function `audit`, which shadows the module as an attribute.
    import importlib

    return importlib.import_module("tmplkit.audit")


def _positive(value, flag: str):
    from .errors import InputError

    if value is not None and not value > 0:  # also refuses nan
        raise InputError(f"{flag} must be positive, got {value}")
    return value


def _cmd_audit(args) -> int:
    audit_mod = _audit_module()

    _positive(args.jobs, "--jobs")
    _positive(args.timeout, "--timeout")
    _positive(args.memory, "--memory")
    expected = audit_mod.load_expected_failures(args.expected_failures) if args.expected_failures else None
    templates = _load_templates(args.sources)
    progress = _progress_printer(sys.stderr.isatty())
    if args.in_process:
        report = audit_mod.audit(templates, jobs=1, expected_failures=expected, tokenizer=args.tokenizer,
                                 progress=progress)
    else:
        report = audit_mod.audit(templates, jobs=args.jobs, timeout=args.timeout, memory_mb=args.memory,
                                 expected_failures=expected, tokenizer=args.tokenizer, progress=progress)
    _emit(audit_mod.AUDIT_FORMATS[args.format](report), args.output)
    if args.format != "text":
        print(audit_mod.summary_line(report), file=sys.stderr)
    return 0 if report.ok else 1


def _add_table(sub) -> None:
    p = sub.add_parser("table", help="print the delimiter table, one row per template")
    p.add_argument("sources", nargs="+", metavar="SOURCE")
    p.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    p.add_argument("--output", "-o", metavar="FILE", help="write the table to FILE (atomically)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: the machine's cores)")
    p.set_defaults(func=_cmd_table)


def _cmd_table(args) -> int:
    audit_mod = _audit_module()

    _positive(args.jobs, "--jobs")
    templates = _load_templates(args.sources)
    report = audit_mod.audit(templates, jobs=args.jobs, timeout=10.0, progress=_progress_printer(sys.stderr.isatty()))
    _emit(audit_mod.format_table(report.results, args.format), args.output)
    return 0


def _add_show(sub) -> None:
    p = sub.add_parser("show", help="render the mixed probe conversation and mark its spans")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--name", help="which template of the source (default: the first)")
    p.set_defaults(func=_cmd_show)


def _cmd_show(args) -> int:
    from .audit import format_show
    from .isolate import analyze_isolated
    from .sources import load_one

    # The template is untrusted: analyze it in a worker with the audit's default limits.
    (analysis,) = analyze_isolated([load_one(args.source, args.name)], jobs=1)
    sys.stdout.write(format_show(analysis, color=sys.stdout.isatty()))
    return 0


def _add_spans(sub) -> None:
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

    from .sources import load_one
    from .tokenize import load_tokenizer
    from .token_audit import conversation_spans, format_spans_text

    template = load_one(args.template, args.name)
    tokenizer = load_tokenizer(args.tokenizer)
    result = conversation_spans(template, tokenizer, args.conversation, add_generation_prompt=args.add_generation_prompt)
    if args.format == "text":
        sys.stdout.write(format_spans_text(result))
    else:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
    return 0


def _add_prefill(sub) -> None:
    p = sub.add_parser("prefill", help="prefill an agent session on a model with each batch policy and compare them")
    p.add_argument("model", metavar="MODEL.gguf", help="a GGUF model llama.cpp can load")
    p.add_argument("session", metavar="SESSION.json", help="OpenAI-style messages JSON (a list, or {messages, tools})")
    p.add_argument("--template", metavar="SOURCE", help="chat template source (default: the model GGUF's own)")
    p.add_argument("--policy", default="all", choices=["none", "every-user-start", "gated", "all"])
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per policy, interleaved; figures are medians")
    p.add_argument("--json", metavar="FILE", help="write the full comparison as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="plot batch sizes along the prompt, checkpoints marked")
    g = p.add_argument_group("llama.cpp settings (llama-server's names)")
    g.add_argument("-c", "--ctx-size", type=int, default=32768, dest="n_ctx")
    g.add_argument("-b", "--batch-size", type=int, default=2048, dest="n_batch")
    g.add_argument("-ub", "--ubatch-size", type=int, default=512, dest="n_ubatch")
    g.add_argument("-t", "--threads", type=int, default=None, dest="n_threads")
    g.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, dest="n_gpu_layers")
    g.add_argument("-fa", "--flash-attn", choices=["auto", "on", "off"], default="auto")
    g.add_argument("-ctk", "--cache-type-k", default="f16")
    g.add_argument("-ctv", "--cache-type-v", default="f16")
    g.add_argument("--swa-full", action="store_true", help="full-size sliding-window cache (can roll back: no checkpoints)")
    g.add_argument("-nr", "--no-repack", action="store_true", help="do not repack weights (default: repack unless the CPU has AMX)")
    g.add_argument("--poll", type=int, default=50, help="threadpool polling level 0-100, as llama-server's (default 50)")
    g.add_argument("--checkpoints", choices=["auto", "on", "off"], default="auto",
                   help="auto: exactly when the model cannot roll its memory back")
    g.add_argument("-ctxcp", "--ctx-checkpoints", type=int, default=32, dest="max_checkpoints")
    g.add_argument("-cms", "--checkpoint-min-step", type=int, default=8192)
    p.set_defaults(func=_cmd_prefill)


def _cmd_prefill(args) -> int:
    from .prefill import PrefillSettings, compare_policies
    from .prefill.compare import TerminalProgress
    from .prefill.plot import plot_comparison, require_matplotlib
    from .prefill.report import check_writable, write_json

    for out in (args.json, args.plot):  # refuse before the run, not after it
        if out:
            check_writable(out)
    if args.plot:
        require_matplotlib()
    settings = PrefillSettings(
        n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch, n_threads=args.n_threads,
        n_gpu_layers=args.n_gpu_layers, flash_attn=args.flash_attn, cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v, swa_full=args.swa_full, repack=False if args.no_repack else None, poll=args.poll,
        checkpoints={"auto": None, "on": True, "off": False}[args.checkpoints],
        max_checkpoints=args.max_checkpoints, checkpoint_min_step=args.checkpoint_min_step)
    bar = TerminalProgress(sys.stderr, args.repeat) if sys.stderr.isatty() else None
    try:
        comp = compare_policies(args.model, args.session, template=args.template, policies=args.policy,
                                repeat=args.repeat, settings=settings, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        write_json(args.json, comp.to_dict())
    if args.plot:
        plot_comparison(comp, args.plot)
    sys.stdout.write(comp.to_markdown())
    return 0


# Each subcommand registers itself here: an add-parser function per subcommand.
_SUBCOMMANDS = [_add_audit, _add_table, _add_show, _add_corpus, _add_spans, _add_prefill]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmplkit", description="Chat-template boundary analysis: derive role delimiters, detect spans, drive checkpointing prefill.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"tmplkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TmplkitError as exc:
        print(f"tmplkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tmplkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
