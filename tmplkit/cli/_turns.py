"""The `turns` subcommand: an agent session request by request on each template."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys

from ._common import (
    add_format,
    add_name,
    add_output,
    add_settings_option,
    add_tokenizer,
    deprecation_note,
    emit,
    load_templates,
    memory_mb,
    positive,
    quiet_text,
    require_tokenizers,
    settings_of,
    tokenizer_spec,
)
from ._outputs import REFUSED, error_line
from ._terminal import ProgressLine, wanted

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_turns(sub) -> None:
    from ..turns.cost import CHOSEN
    from ..turns.formats import FORMATS

    p = sub.add_parser("turns")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="templates: .gguf, .jinja, tokenizer_config.json, folder or hf:org/name")
    add_name(p, many=True)
    p.add_argument("--session", metavar="FILE", help="a session JSON (messages with reasoning_content, tool calls, "
                                                     "tool results; or the Responses API or Anthropic Messages body "
                                                     "an agent sends, read as llama-server converts it), or - "
                                                     "(standard input); default: a generated agent session")
    add_tokenizer(p, what="compare token ids and count tokens recomputed with")
    p.add_argument("--add-bos", action="store_true", help="prepend the tokenizer's BOS to each request (with --tokenizer)")
    p.add_argument("--memory-model", dest="memory", default=None, metavar="swa:N|recurrent|full", meaning=_model_meaning,
                   help="the checkpointing model's memory, with --tokenizer: swa:N, recurrent or full (default: "
                        "--model's, else swa:512)")
    p.add_argument("--memory", type=mb_or_old_model, metavar="MB", action=_MemoryOption, dest="memory_mb",
                   help=f"MiB a template's worker may allocate beyond its start-up footprint (default {MEMORY_MB}): "
                        "a long session's requests and their token ids are held at once")
    p.add_argument("--model", metavar="MODEL", help="with --tokenizer, take the memory from this model's GGUF metadata (full, a sliding "
                                                    "window, recurrent or hybrid): a .gguf, `gemma`, `tiny:VOCAB` or "
                                                    "`tiny:VOCAB-hybrid`")
    p.add_argument("--server-delimiters", metavar="FILE",
                   help="with --tokenizer, llama-server's delimiter lists from a saved `tmplkit server delimiters --format json` (its "
                        "specialized handlers' hard-coded lists, its autoparser's logged starts, or none) for the "
                        "llama-server setting; default: the two ChatML or Gemma delimiters only")
    p.add_argument("--inputs", choices=("server", "transformers"), default="server",
                   help="messages as llama-server gives them (server, the default: a null content as \"\", only the "
                        "keys its message struct holds, its workarounds for what the template reads) or as "
                        "transformers' apply_chat_template does (transformers: null-valued keys dropped, reasoning "
                        "under reasoning_content and thinking)")
    p.add_argument("--template-kwargs", metavar="JSON", help="variables every render gets, a JSON object, e.g. "
                                                             "'{\"preserve_thinking\": true}' (default: none)")
    add_settings_option(p, CHOSEN, CHOSEN, "; without divergence-aware the next renders it predicts from are not "
                        "made (0.5-0.6 of the time on a long session)")
    p.add_argument("--no-switches", action="store_true", help="do not try the template's thinking switches")
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="templates studied at once, each in its worker (default: the machine's cores, at most one "
                        "per --memory MiB of available memory); one template and 2 or more: its next renders are made on a "
                        "second core")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="per template: study the requests rendered within SECONDS and say where it stopped; the template "
                        "renders in a worker stopped a grace after SECONDS (default: 60)")
    add_format(p, FORMATS, "text", "the report")
    add_output(p, "the report")
    p.set_defaults(func=_cmd_turns)


class OldMemoryModel(str):
    """A memory model given the old way, `--memory swa:N` (now --memory-model)."""


def mb_or_old_model(value: str):
    """--memory MB; until 0.4 a memory model given the old way too (swa:N, recurrent or full, by its
    kind: anything else is a mistyped MiB, said so; `nan` was read as a memory model and refused
    as an option the user never typed)."""
    try:
        return int(value)
    except ValueError:
        if value.partition(":")[0] in ("swa", "recurrent", "full"):
            return OldMemoryModel(value)
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of MiB") from None


def _model_meaning(value: str):
    """A memory model as --memory-model given twice compares it (`swa:512` and `swa:0512` are one)."""
    from ..errors import InputError
    from ..turns import MemoryModel

    try:
        return MemoryModel.parse(value)
    except InputError:  # (refused in one line where it is used)
        return value


class _MemoryOption(argparse.Action):
    """--memory MB, as every command that runs templates in workers takes it; a memory model given
    the old way goes to --memory-model, with the deprecation note."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ._once import remember_value

        if isinstance(values, OldMemoryModel):
            deprecation_note(option_string or "--memory", "--memory-model (--memory is MiB a worker may allocate, as "
                                                          "in the other commands)")
            model = parser._option_string_actions["--memory-model"]
            remember_value(model, namespace, str(values), option_string)
            namespace.memory = str(values)
        else:
            remember_value(self, namespace, values, option_string)
            namespace.memory_mb = values


def _cmd_turns(args) -> int:
    from ..session import generate_session, load_session
    from ..turns.cost import CHOSEN
    from ..turns.formats import format_turns

    memory, said = _memory(args)  # refuse a bad option before any work
    worker_mb = memory_mb(args.memory_mb) or MEMORY_MB
    _need_tokenizer(args)
    if said:  # (after the options' checks: a refused command line is one line)
        print(said, file=sys.stderr)
    settings = settings_of(args, CHOSEN)
    kwargs = _template_kwargs(args.template_kwargs)
    server = None
    if args.server_delimiters:
        from ..server_rules import load_server_delimiters

        server = load_server_delimiters(args.server_delimiters)
    timeout = positive(args.timeout, "--timeout") if args.timeout is not None else None
    if args.tokenizer and args.tokenizer != "auto":
        require_tokenizers([args.tokenizer], "tmplkit turns --tokenizer " + args.tokenizer)
    session = load_session(args.session) if args.session else generate_session(20000, seed=0, style="agent", requests=3)
    templates = load_templates(args.sources, args.name)
    tokenizer = None
    if args.tokenizer and args.tokenizer != "auto":
        from ..auditing.contained import portable_tokenizer
        from ..tokens.tokenizers import load_tokenizer

        tokenizer = portable_tokenizer(load_tokenizer(args.tokenizer), args.tokenizer)
    jobs = positive(args.jobs, "--jobs") or _default_jobs(worker_mb)
    calls = []
    for t in templates:
        if args.tokenizer == "auto":
            tokenizer = _auto_tokenizer(t, args)
        options = {"tokenizer": tokenizer, "add_bos": args.add_bos, "memory": memory, "switches": not args.no_switches,
                   "server": server, "inputs": args.inputs, "kwargs": kwargs, "settings": settings}
        calls.append((t, options))
    if jobs > 1 and len(calls) > 1:
        reports = _contained_studies(calls, session, timeout, jobs, worker_mb)
    else:
        # One template on a machine of several workers: its next renders on the second core.
        ahead = jobs > 1 and len(calls) == 1
        reports = [_contained_study(t, session, timeout, worker_mb, {**options, "ahead": ahead}) for t, options in calls]
    failed = [r for r in reports if r.error]
    # The text report is for a person: a template that cannot render the session is an error line
    # (below) instead; the tables and the JSON keep its row, with the error, for a program. A text
    # report written to a file keeps the row too, where the others were studied: a file that reads
    # as whole must not leave out the template that failed.
    keep_failed = args.format != "text" or (args.output and len(failed) < len(reports))
    shown = reports if keep_failed else [r for r in reports if not r.error]
    if quiet_text(args):  # -q: only the templates whose prefix is not kept
        shown = [r for r in shown if r.stable is False or (r.stable is None and not r.one_request)]
    # (a file is written only where some template was studied, in every format: one that replaced
    # it with rows of errors alone would be an input refused that clobbers a path)
    if shown and not (args.output and len(failed) == len(reports)):
        emit(format_turns(shown, args.format), args.output)
    for r in failed:
        why = r.error
        if r.refused:  # (what to do, before the template's words, which end the line as in every error)
            why = (f"{REFUSED}: {r.error}" if args.session else
                   f"the template's own check refuses the generated agent session (give --session FILE with a "
                   f"conversation it takes): {r.error}")
        print(error_line(f"tmplkit: error: {r.template}: cannot render the session: {why}"), file=sys.stderr)
    return 2 if failed else 0


def _contained_study(template, session, timeout: float | None, worker_mb: int, options: dict):
    """`study_turns` of one template in a worker under the audit's limits (tmplkit.auditing.contained): the
    study stops rendering at `timeout` seconds (default DEFAULT_TIMEOUT) and studies what it rendered;
    the worker is killed a grace later (a render that never checks the clock) or past `worker_mb` MiB,
    and a worker stopped becomes the template's error, as a template that cannot render the session is."""
    from ..auditing.contained import run_contained
    from ..errors import RenderError
    from ..turns import TurnsReport

    work, limits = _worker_limits(timeout, worker_mb)
    try:
        with _progress(template.name) as progress:  # drawn here, from what the worker sends
            return run_contained(work, template, session, what=f"turns of '{template.name}'", progress=progress,
                                 **limits, **options)
    except RenderError as exc:  # (RenderLimitError: the time or memory limit)
        return TurnsReport(template.name, 0, (), error=str(exc))


def _worker_limits(timeout: float | None, worker_mb: int):
    """The study a worker runs (it stops rendering at `timeout`, default DEFAULT_TIMEOUT) and the
    limits the worker runs under (killed a grace later, or past `worker_mb` MiB): one template at a
    time or several at once alike."""
    from ..turns import study_turns

    limit = timeout if timeout is not None else DEFAULT_TIMEOUT
    return (functools.partial(study_turns, timeout=limit),
            {"timeout": limit + max(1.0, 0.1 * limit), "memory_mb": worker_mb,
             "advice": "; if it is legitimately slow, raise --timeout",
             "memory_advice": "; a long session's requests and their token ids are held at once: if the session is "
                              "meant to be this long, raise --memory"})


def _contained_studies(calls, session, timeout: float | None, jobs: int, worker_mb: int) -> list:
    """`_contained_study` of each (template, options), `jobs` workers at once (a corpus of templates
    on every core); the progress line counts the templates done, not one template's requests."""
    from ..auditing.contained import run_contained_each
    from ..errors import RenderError
    from ..turns import TurnsReport

    work, limits = _worker_limits(timeout, worker_mb)
    with ProgressLine(wanted(), interval=0.1, steps=False) as line:
        results = run_contained_each([(work, (t, session), options, f"turns of '{t.name}'") for t, options in calls],
                                     jobs=jobs, **limits,
                                     progress=lambda done, total: line.show(f"turns: templates {done}/{total}",
                                                                            final=done == total))
    out = []
    for (t, _), r in zip(calls, results):
        if isinstance(r, RenderError):  # (RenderLimitError: the time or memory limit): the template's error
            r = TurnsReport(t.name, 0, (), error=str(r))
        elif isinstance(r, Exception):
            raise r  # (as one study alone raises it: the command's one-line error)
        out.append(r)
    return out


def _default_jobs(worker_mb: int = 0) -> int:
    """The machine's cores, at most one worker per `worker_mb` (default MEMORY_MB) of the memory
    available now (a worker may use that much on a long session: many cores and little memory must
    not run out of it)."""
    cores = os.cpu_count() or 1
    available = _available_memory()
    return cores if available is None else max(1, min(cores, available // ((worker_mb or MEMORY_MB) * 2**20)))


def _available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes of memory available without swapping: Linux's MemAvailable (free pages and the cache it
    can drop; the free pages alone are few on a machine that has read much), else the free pages,
    else None (macOS says neither)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# Per template: the seconds a study may take unless --timeout says, and the MiB its worker may use
# (a long session's requests and their token ids are held at once).
DEFAULT_TIMEOUT = 60.0
MEMORY_MB = 2048


def _auto_tokenizer(template, args):
    """--tokenizer auto for one template: the configuration's pairing, its own GGUF or its paired
    corpus vocabulary."""
    from ..auditing.contained import portable_tokenizer
    from ..tokens.tokenizers import load_tokenizer

    spec = tokenizer_spec("auto", template, args)
    require_tokenizers([spec], "tmplkit turns --tokenizer auto (" + str(spec) + ")")
    return portable_tokenizer(load_tokenizer(spec), spec)


def _need_tokenizer(args) -> None:
    """Options that only change what is counted in tokens, given without a tokenizer: refused, not
    silently ignored (the text-only study counts no tokens)."""
    from ..errors import InputError

    if args.tokenizer:
        return
    given = [flag for flag, value in (("--add-bos", args.add_bos), ("--memory-model", args.memory), ("--model", args.model),
                                      ("--server-delimiters", args.server_delimiters)) if value]
    if given:
        raise InputError(f"{', '.join(given)} only change{'s' if len(given) == 1 else ''} what is counted in tokens; give "
                         "--tokenizer too (auto: the template's own vocabulary), or leave "
                         f"{'it' if len(given) == 1 else 'them'} out for the text-only study")


def _template_kwargs(text: str | None) -> dict | None:
    """--template-kwargs as a dict; InputError for anything but a JSON object."""
    from ..errors import InputError
    from ..jsonio import parse_json

    if text is None:
        return None
    # (parse_json: a string nested past any template's variables is refused, not a RecursionError)
    value = parse_json(text, what="template variables", where="--template-kwargs", strict_numbers=True)
    if not isinstance(value, dict):
        raise InputError("--template-kwargs: give a JSON object, e.g. '{\"preserve_thinking\": true}'")
    return value


def _memory(args):
    """(--memory-model as given, else --model's memory, else Gemma 3's window of 512; the line that
    says --model's, for stderr, or None)."""
    from ..errors import InputError
    from ..turns import MemoryModel

    if args.memory and args.model:
        raise InputError("give --memory-model or --model, not both (--model reads the memory from the model)")
    if args.model:
        from ..turns.model_memory import describe_memory, memory_of_model

        memory, found = memory_of_model(args.model)
        return memory, f"tmplkit: memory of {args.model}: {describe_memory(found)}"
    try:
        return MemoryModel.parse(args.memory or "swa:512"), None
    except InputError as exc:  # (the option as typed, cut short where it is long)
        typed = args.memory if len(args.memory or "") <= 40 else args.memory[:24] + "..."
        raise InputError(f"--memory-model {typed}: {exc}") from None


@contextlib.contextmanager
def _progress(name: str):
    """The progress line on a terminal's stderr (none when redirected or TERM=dumb), erased at the end;
    redrawn at most ten times a second, since a long session has thousands of requests."""
    line = ProgressLine(wanted(), interval=0.1, steps=False)
    if not line.on:
        yield None
        return

    def show(stage: str, done: int, total: int) -> None:
        line.show(f"{name[:50]}: {stage} {done}/{total}", final=done == total)

    with line:
        yield show
