"""The `request` subcommand: what to send llama-server, with tmplkit's delimiters."""

from __future__ import annotations

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
    format_of,
    load_templates,
    positive,
    require_extra,
    template_conversation_tokenizer,
)
from ._limits import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, contained_limits
from ._outputs import output_paths

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_request(sub) -> None:
    p = sub.add_parser(
        "request",
        description="Print the JSON body of a llama-server /completion request: the conversation rendered with "
                    "the template, message_delimiters from tmplkit's token-checked delimiters, and cache_prompt. "
                    "With --delimiters-only, print the message_delimiters list alone, for clients that render "
                    "the prompt themselves.")
    add_template_argument(p, old_template=True)
    add_name(p)
    add_session_option(p, what="the conversation (required, except with --delimiters-only)")
    add_tokenizer(p, required=True, what="the model's vocabulary as llama-server loads it")
    p.add_argument("--delimiters-only", action="store_true", help="print only the message_delimiters list")
    add_generation_prompt(p, default=True)
    p.add_argument("--n-predict", type=int, metavar="N", help="add n_predict to the body (default: the server's)")
    add_output(p, "the JSON")
    add_limits(p, timeout=DEFAULT_TIMEOUT, memory=DEFAULT_MEMORY_MB)
    p.set_defaults(func=_cmd_request)


def _cmd_request(args) -> int:
    import json

    from ..auditing.contained import run_contained
    from ..errors import InputError
    from ..server.process import completion_request, message_delimiters

    def check(session) -> None:
        if args.delimiters_only == (session is not None):
            raise InputError("give --session FILE (the conversation), or --delimiters-only without one")
        if args.delimiters_only and args.n_predict is not None:  # (the list alone has no body to add it to)
            raise InputError("--n-predict goes in a request body; leave it out with --delimiters-only")
        if args.delimiters_only and not args.add_generation_prompt:  # (nor a prompt to render without one)
            raise InputError("--no-generation-prompt is how the request body's prompt is rendered; leave it out with "
                             "--delimiters-only")
        if args.n_predict is not None and not -1 <= args.n_predict <= 2**31 - 1:  # (the library names its parameter)
            raise InputError(f"--n-predict must be -1 (until the model stops) or 0 to {2**31 - 1} (llama-server's "
                             f"int32), got {args.n_predict}")

    limits = contained_limits(args)  # (a bad limit is refused before any work)
    template, conversation, tokenizer = template_conversation_tokenizer(args, "request", conversation=not args.delimiters_only,
                                                                        check=check)
    # The template is untrusted: it renders in a worker under --timeout and --memory (tmplkit.auditing.contained).
    what = f"request for '{template.name}'"
    if args.delimiters_only:
        out: object = [d.to_dict() for d in run_contained(message_delimiters, template, tokenizer, what=what, **limits)]
    else:
        out = run_contained(completion_request, template, tokenizer, conversation, what=what,
                            add_generation_prompt=args.add_generation_prompt, n_predict=args.n_predict, **limits).to_dict()
    emit(json.dumps(out, ensure_ascii=False, indent=2) + "\n", args.output)
    return 0


def add_engine_parity(sub) -> None:
    p = sub.add_parser(
        "engine-parity",
        description="For each template, render the analysis's round-trip conversation (without and with the "
                    "generation prompt) through llama-server's /apply-template (--jinja --chat-template-file) and "
                    "with tmplkit, compare byte for byte, and check the round trip on llama.cpp's render.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="templates: files, folders, hf:org/name, corpus:llama.cpp")
    p.add_argument("--server", metavar="PATH",
                   help="the llama-server binary (default: $TMPLKIT_LLAMA_SERVER, else the pinned one "
                        "`make llama-server` builds in a checkout)")
    p.add_argument("--model", metavar="MODEL", help="the model llama-server loads: a GGUF, gemma or tiny:VOCAB (default: "
                   "tiny:qwen35, the tiny model around Qwen3.5's vocabulary)")
    add_name(p, many=True)
    add_format(p, ("markdown", "json"), "markdown", "the comparison", aliases={"table": "markdown"})
    add_server_run_options(p, request_timeout=PARITY_REQUEST_S)
    add_gate(p, "differs (a render llama-server writes otherwise than tmplkit) or "
             "unchecked (also a render not compared: refused by llama-server, or not rendered by tmplkit)")
    add_output(p, "the comparison")
    p.set_defaults(func=_cmd_engine_parity)


# --fail-on of the commands that compare with llama-server (the library's PARITY_FAIL_ON and
# COMPARISON_FAIL_ON, named here so that building the parser loads neither module).
GATE_CHOICES = ("differs", "unchecked")


def add_gate(p, what: str) -> None:
    """--fail-on for a command that reports by default (exit 0 whatever it finds)."""
    p.add_argument("--fail-on", choices=GATE_CHOICES, default=None,
                   help=f"exit 1 where a template's row is {what}; default: report only (exit 0)")


# How long llama-server may take to answer one request: a render (/apply-template), and in `server
# delimiters` also a prefill of the round trip on the user's model (the library's defaults too).
PARITY_REQUEST_S = 120.0
DELIMITERS_REQUEST_S = 300.0


def add_server_run_options(p, *, request_timeout: float) -> None:
    """--log-dir, --start-timeout and --request-timeout, for a command that starts llama-server per template."""
    p.add_argument("--log-dir", metavar="DIR", help="keep llama-server's logs in DIR")
    p.add_argument("--start-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="how long llama-server may take to start and load the model, per template (default 120); "
                        "one that is not ready by then is an error")
    p.add_argument("--request-timeout", type=float, default=request_timeout, metavar="SECONDS",
                   help=f"how long llama-server may take to answer each request (default {request_timeout:g}); "
                        "one that does not answer by then is an error")


_MAX_WAIT_S = 7 * 24 * 3600


def server_run(args):
    """The llama-server binary to run (--server, else the pinned build), checked with the start and
    request timeouts: each refused in one line before any template is analyzed."""
    import os

    from ..errors import InputError
    from ..server.process import BUILD_HINT, llama_server_binary

    binary = args.server or llama_server_binary()
    if binary is None:
        raise InputError(f"llama-server is not built; {BUILD_HINT}")
    if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
        raise InputError(f"{binary}: cannot run llama-server (not an executable file); {BUILD_HINT}")
    binary = os.path.abspath(binary)  # (a bare name of a file here is that file, not one looked up on PATH)
    for flag, value in (("--start-timeout", args.start_timeout), ("--request-timeout", args.request_timeout)):
        if positive(value, flag) > _MAX_WAIT_S:  # (a socket's timeout past time_t's range is an OverflowError)
            raise InputError(f"{flag} must be at most {_MAX_WAIT_S} seconds (a week), got {value:g}")
    inputs = [binary, args.model, *(getattr(args, "sources", None) or ())]  # (files a log's name could be)
    _check_log_dir(args.log_dir, output_paths(args), [p for p in inputs if isinstance(p, str) and os.path.isfile(p)])
    return binary


def _check_log_dir(log_dir: str | None, outputs=(), inputs=()) -> None:
    """--log-dir, refused in one line before any work where llama-server's logs cannot be written
    there (a file, a missing or read-only folder): it was found only when the first server started;
    and where one of `outputs` is a log's name there (`llama-server-NAME.log`): the report and a
    log would be one file, one of them lost; so where one of `inputs` is (the model, the server, a
    template): a log would replace it before it is read."""
    import os

    from ..errors import InputError
    from ..server.process import LOG_PREFIX

    if log_dir is None:
        return
    if not os.path.isdir(log_dir):  # (False for a path with a NUL too)
        what = "it is not a folder" if os.path.lexists(log_dir) else "no such folder"
        raise InputError(f"--log-dir {log_dir}: {what}; give an existing folder for llama-server's logs, or leave "
                         "--log-dir out")
    if not os.access(log_dir, os.W_OK | os.X_OK):
        raise InputError(f"--log-dir {log_dir}: the folder cannot be written; give a writable folder for "
                         "llama-server's logs, or leave --log-dir out")
    def a_log(path: str) -> bool:
        name = os.path.basename(path)
        return name.startswith(LOG_PREFIX) and name.endswith(".log") and \
            os.path.realpath(os.path.dirname(os.path.abspath(path))) == os.path.realpath(log_dir)

    if (out := next(filter(a_log, outputs), None)) is not None:
        raise InputError(f"{out}: --log-dir {log_dir} keeps llama-server's logs under such names, and one would "
                         "replace the other; give the output another name")
    if (given := next(filter(a_log, inputs), None)) is not None:
        raise InputError(f"{given}: --log-dir {log_dir} keeps llama-server's logs under such names, and one would "
                         "replace this file the command reads; move it, or give another --log-dir")


def _cmd_engine_parity(args) -> int:
    import json

    from .._interrupt import unwind_on_sigterm
    from ..server.parity import engine_parity, format_parity_table, parity_failures, parity_report
    from ..server.process import check_server_model

    binary = server_run(args)
    spec = args.model or "tiny:qwen35"
    if spec.startswith("tiny:"):
        require_extra("llama", "tmplkit engine-parity (its tiny models)")
    from ..prefill.models import resolve_model

    model = check_server_model(resolve_model(spec))  # a file llama-server cannot load: one line before any analysis
    templates = load_templates(args.sources, args.name)
    # The templates are untrusted: analyzed in workers under the audit's limits; tmplkit's side of
    # the comparison then renders only the conversation a template rendered there.
    from ..auditing.isolate import analyze_isolated

    # SIGTERM too stops the server and removes its temporary folder on the way out
    with unwind_on_sigterm():
        analyses = analyze_isolated(templates, jobs=1)
        rows = [row for t, a in zip(templates, analyses)
                for row in engine_parity(t, binary, model, analysis=a, log_dir=args.log_dir, startup_s=args.start_timeout,
                                           request_s=args.request_timeout)]
    if format_of(args) == "json":
        emit(json.dumps(parity_report(rows), ensure_ascii=False, indent=2) + "\n", args.output)
    else:
        emit(format_parity_table(rows), args.output)
    return 1 if args.fail_on and parity_failures(rows, args.fail_on) else 0
