"""The `server` subcommand: what llama-server itself does, read off the real server and its log.

`tmplkit server delimiters SOURCE...` starts the pinned llama-server per template and compares
the user starts its chat endpoint takes with tmplkit's; `tmplkit server log LOG` reads a
llama-server log as a user has it.
"""

from __future__ import annotations

from typing import NoReturn

from ._common import (
    add_format,
    add_limits,
    add_name,
    add_output,
    add_session_option,
    add_template_option,
    add_tokenizer,
    emit,
    format_of,
    load_templates,
    quiet_text,
    require_extra,
    require_tokenizers,
    verbosity,
    worker_tokenizer,
)
from ._limits import DEFAULT_MEMORY_MB, SESSION_TIMEOUT, contained_limits
from ._serve import DELIMITERS_REQUEST_S, add_gate, add_server_run_options, server_run
from ._terminal import ProgressLine, wanted

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_server(sub) -> None:
    p = sub.add_parser("server")
    ss = p.add_subparsers(dest="server_command", required=True)

    d = ss.add_parser(
        "delimiters", help="which messages llama-server's chat endpoint starts as user messages, against tmplkit's",
        description="For each template, start llama-server (--jinja --chat-template-file) on a tiny model that "
                    "needs checkpoints, send the template's round-trip conversation to /v1/chat/completions, and "
                    "read from its log the delimiters it took (where it prints them) and where it ended prompt "
                    "batches (its user starts); compare with tmplkit's. Verdicts: agree; tool results taken for "
                    "user messages (extra breaks and checkpoints: llama.cpp issue 25213); real user messages "
                    "missed (no checkpoint there: a resume goes back further); no delimiters at all.",
        epilog="Example:\n  tmplkit server delimiters corpus:llama.cpp --format json -o delimiters.json",
        formatter_class=_raw())
    d.add_argument("sources", nargs="+", metavar="SOURCE", help="templates: files, folders, hf:org/name, corpus:llama.cpp, corpus:hub")
    d.add_argument("--server", metavar="PATH",
                   help="the llama-server binary (default: $TMPLKIT_LLAMA_SERVER, else the pinned one "
                        "`make llama-server` builds in a checkout)")
    d.add_argument("--model", metavar="MODEL", default="bytes",
                   help="the model it loads: 'bytes' (the default: a tiny model whose tokens are single bytes, so a "
                        "delimiter matches wherever its text occurs), 'family' (the tiny model of the template's "
                        "corpus vocabulary, else Qwen3.5's: what tokenizing changes), or yours (a GGUF, gemma, "
                        "tiny:VOCAB); it must need checkpoints (sliding-window, hybrid or recurrent)")
    add_name(d, many=True)
    add_format(d, ("markdown", "json"), "markdown", "the comparison", aliases={"table": "markdown"})
    add_server_run_options(d, request_timeout=DELIMITERS_REQUEST_S)
    add_gate(d, "differs (llama-server starts user messages elsewhere than tmplkit, or has "
             "no delimiters) or unchecked (also a template not compared: refused by llama-server, or no delimiters "
             "from tmplkit)")
    add_output(d, "the comparison")
    d.set_defaults(func=_cmd_delimiters)

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
    add_template_option(g, what="the chat template the server used")
    add_name(g)
    add_session_option(g, what="the conversation the client sent (its last request's messages)")
    add_tokenizer(g)
    add_format(g, ("text", "json"), "text", "the reading")
    add_output(g, "the reading")
    add_limits(g, timeout=SESSION_TIMEOUT, memory=DEFAULT_MEMORY_MB)
    g.set_defaults(func=_cmd_log)


def _raw():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def _cmd_delimiters(args) -> int:
    import json

    from .._interrupt import unwind_on_sigterm
    from ..server.delimiter_comparison import ComparisonReport, compare_delimiters, comparison_failures, format_comparison_table
    from ..server.delimiters import server_delimiters
    from ..server.process import check_server_model
    from ..sources.corpus import LLAMA_CPP_PYTHON_VERSION

    format_of(args)  # an old --format name, noted before the work
    binary = server_run(args)
    require_extra("llama", "tmplkit server delimiters (its tiny models and their tokenizers)")
    if args.model not in ("bytes", "family"):
        from ..prefill.models import resolve_model

        # a missing file, or one llama-server cannot load, is a one-line error before any template is analyzed
        check_server_model(resolve_model(args.model))
    from ..auditing.isolate import analyze_isolated

    templates = load_templates(args.sources, args.name)
    rows = []
    # SIGTERM too stops the server and removes its temporary folder on the way out
    with unwind_on_sigterm():
        analyses = analyze_isolated(templates, jobs=1)  # untrusted: analyzed in workers under the audit's limits
        line = ProgressLine(wanted(verbosity(args) < 0), keep=True)
        for i, (t, a) in enumerate(zip(templates, analyses), 1):
            line.step(i, len(templates), t.name)
            d = server_delimiters(t, binary, args.model, analysis=a, log_dir=args.log_dir, startup_s=args.start_timeout,
                                  request_s=args.request_timeout)
            rows.append(compare_delimiters(d, a))
        line.close()
    version = LLAMA_CPP_PYTHON_VERSION if not args.server else f"unknown ({args.server})"
    report = ComparisonReport(tuple(rows), version)
    if args.format == "json":
        emit(json.dumps(report.to_dict(), ensure_ascii=False, indent=1) + "\n", args.output)
    else:
        emit(format_comparison_table(rows), args.output)
    return 1 if args.fail_on and comparison_failures(rows, args.fail_on) else 0


def _cmd_log(args) -> int:
    import json
    from pathlib import Path

    from ..errors import InputError
    from ..server.log import LOG_MAX_BYTES, decode_log, format_server_log, read_server_log
    from ..server.log_breaks import locate_breaks

    limits = contained_limits(args, SESSION_TIMEOUT)  # (a bad limit is refused before any work)
    given = [x is not None for x in (args.template, args.session, args.tokenizer)]
    if any(given) and not all(given):
        raise InputError("give --template, --session and --tokenizer together (to place the breaks on messages), or none")
    # (what renders the session: without one, these did nothing, silently)
    idle = [o for dest, o in (("name", "--name"), ("timeout", "--timeout"), ("memory", "--memory"))
            if dest in getattr(args, "_given", {})]
    if idle and not any(given):
        raise InputError(f"{' and '.join(idle)} {'is' if len(idle) == 1 else 'are'} for the template that renders the "
                         "session; give --template, --session and --tokenizer with it, or leave it out")
    if all(given) and args.tokenizer != "auto":
        require_tokenizers([args.tokenizer], "tmplkit server log --tokenizer " + args.tokenizer)
    if args.log == "-":
        from ..jsonio import stdin

        source = "<stdin>"
        data = stdin("the log").read(LOG_MAX_BYTES + 1)  # (a stream that never ends is read no further)
    else:
        path = Path(args.log)
        _check_log_file(path)
        source = str(path)
        try:
            with path.open("rb") as f:  # (a log the server still writes grows while it is read)
                data = f.read(LOG_MAX_BYTES + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > LOG_MAX_BYTES:
        _too_big(source)
    text = decode_log(data, source) if isinstance(data, bytes) else data
    log = read_server_log(text, source)
    if all(given):
        from ..auditing.contained import run_contained
        from ..session import load_session
        from ..sources.templates import load_one

        template = load_one(args.template, args.name)
        session = load_session(args.session)  # here: '-' is this process's standard input
        # The template is untrusted: the session's renders run in a worker under the audit's limits.
        log = run_contained(locate_breaks, log, template, session, worker_tokenizer(args, template, "server log"),
                            what=f"placing the log on the session with template '{template.name}'", **limits)
    if args.format == "json":
        emit(json.dumps(log.to_dict(), ensure_ascii=False, indent=1) + "\n", args.output)
    else:
        if text := format_server_log(log, quiet=quiet_text(args)):  # (-q: only the tasks that show a pattern)
            emit(text, args.output)
    return 0


def _check_log_file(path) -> None:
    """A log given by path is a regular file: a missing one, a folder, a pipe or a device (which
    would block or never end) each said for what it is."""
    import stat

    from ..errors import InputError
    from ..server.log import LOG_MAX_BYTES

    try:
        info = path.stat()
        mode, size = info.st_mode, info.st_size
    except FileNotFoundError:
        raise InputError(f"log file not found: {path}; give the file llama-server's output went to, or - for "
                         "standard input") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror or exc}); check the path and permissions") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a folder; give the log file in it")
    if not stat.S_ISREG(mode):
        raise InputError(f"{path}: not a regular file (a pipe or device); give the log as a file, or pipe it to - "
                         "(standard input)")
    if size > LOG_MAX_BYTES:  # (refused before reading a gigabyte of it)
        _too_big(str(path))


def _too_big(source: str) -> NoReturn:
    from ..errors import InputError
    from ..server.log import LOG_MAX_BYTES

    raise InputError(f"{source}: more than {LOG_MAX_BYTES >> 20} MiB, more than tmplkit reads as one log; give the part "
                     "with the requests to read (e.g. `tail -c 200M LOG > part.log`)")
