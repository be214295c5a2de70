"""The `audit` and `table` subcommands.

Both read their defaults from the configuration (`[tool.tmplkit]` or tmplkit.toml, see
tmplkit.cli.config); a flag given on the command line overrides the configuration's value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys

from .. import auditing as audit_mod  # its names load on first use (the runs), not with the parser
from ..auditing._choices import AUDIT_FORMAT_NAMES, TABLE_FORMATS
from ..errors import InputError, TmplkitError
from ._common import (
    EXTRAS,
    add_format,
    add_limits,
    add_name,
    add_output,
    config_of,
    configured_templates,
    emit,
    emit_all,
    memory_mb,
    positive,
    progress_printer,
    refuse_worker_options_in_process,
    require_tokenizers,
    use_color,
    verbosity,
)
from ._limits import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT
from ._lock import lock_for, precheck, print_checks, run_checks, upstreams_for
from ._outputs import refuse_reading_outputs
from .config import FAIL_ON, PREFIX_STABILITY, from_config, load_expected_failures

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

_DEFAULT_TIMEOUT, _DEFAULT_MEMORY_MB = DEFAULT_TIMEOUT, DEFAULT_MEMORY_MB


def add_audit(sub) -> None:
    p = sub.add_parser("audit")
    p.add_argument("sources", nargs="*", metavar="SOURCE",
                   help="a .gguf, .jinja, tokenizer_config.json, chat_template.json, folder, hf:org/name[@rev], "
                        "corpus:llama.cpp, or - (standard input); default: the configuration's sources")
    add_format(p, AUDIT_FORMAT_NAMES, "text", "the report")
    add_output(p, "the report")
    p.add_argument("--report", action="append", metavar="FORMAT:FILE",
                   help="also write the report in FORMAT to FILE, from the same run (repeatable), e.g. "
                        "--report junit:audit.xml --report markdown:summary.md; a junit report is written on bad "
                        "input (exit 2) too, with the error")
    add_name(p, many=True)
    p.add_argument("--jobs", "-j", type=int, default=None,
                   help="worker processes (default: the machine's cores); each template is analyzed in a sandboxed worker")
    add_limits(p, timeout=_DEFAULT_TIMEOUT, memory=_DEFAULT_MEMORY_MB)
    p.add_argument("--in-process", action="store_true", help="analyze in this process (no workers; render limits only)")
    p.add_argument("--tokenizer", metavar="PATH|auto",
                   help="also run the token-level round trip with this tokenizer (.gguf, tokenizer.json, vocab:NAME); "
                        "auto: the template's own GGUF or the corpus vocab paired with it")
    p.add_argument("--expected-failures", metavar="FILE", action="append",
                   help="JSON {template name: reason}: listed failures do not fail the audit, listed passes do "
                        "(may be repeated: the files are merged, a later one winning a name both list); "
                        "{name: {\"unstable\": reason}} does the same for --prefix-stability fail")
    p.add_argument("--fail-on", choices=FAIL_ON, default=None,
                   help="what ends the audit with exit code 1: fail (default; failing templates), unchecked (also a "
                        "template with a check asked for that did not run: prefix stability cut by its time limit, "
                        "no tokenizer for the token round trip) or warning (templates with warnings too)")
    p.add_argument("--prefix-stability", choices=PREFIX_STABILITY, default=None,
                   help="whether each request of a resumed agent session extends what the server holds (see "
                        "'tmplkit turns'): report adds a column (stable / unstable (first cause) / not applicable), "
                        "fail also makes an unstable template fail the audit. Default off: it renders a whole "
                        "agent session per template, about 15 times the audit's own time on the llama.cpp corpus; "
                        "it runs in the template's worker, within --timeout and --memory")
    p.add_argument("--session", metavar="FILE",
                   help="the session JSON the prefix-stability check resumes (default: a generated agent session)")
    p.add_argument("--lock", metavar="FILE",
                   help="also check each template against this behaviour lock (written by `tmplkit lock`; default: "
                        "the configuration's lock): a template whose behaviour differs fails the audit, each change "
                        "said in words; the configuration's [upstream] GGUFs are checked for drift the same way")
    p.set_defaults(func=_cmd_audit)


def _first(*values):
    """The first value that is not None: the flag, then the configuration, then the default."""
    return next((v for v in values if v is not None), None)


def _cmd_audit(args) -> int:
    reports = _more_reports(args.report)  # a bad --report before any work
    junit = [f for fmt, f in [(args.format, args.output), *reports] if fmt == "junit" and f]
    try:
        report, findings = _run_audit(args)
    except TmplkitError as exc:
        for path in junit:  # a CI reading the report finds why, not no file
            with contextlib.suppress(TmplkitError):
                emit(audit_mod.junit_error(str(exc)), path)
        raise
    quiet = verbosity(args) < 0
    if args.format == "text":
        color = use_color(args, sys.stdout) if not args.output else args.color == "always"
        text = audit_mod.format_text(report, color=color, verbosity=verbosity(args))
    else:
        text = audit_mod.AUDIT_FORMATS[args.format](report)
    # every file or none: a report that cannot be written (a full disk) leaves the others as they were
    emit_all([(text, args.output), *((audit_mod.AUDIT_FORMATS[fmt](report), path) for fmt, path in reports)])
    if (args.format not in ("text", "github", "summary") or args.output) and not quiet:
        print(audit_mod.summary_line(report, color=use_color(args, sys.stderr)), file=sys.stderr)
    print_checks(findings, args.format, args.output)
    return 0 if report.ok else 1


def _more_reports(specs: list[str] | None) -> list[tuple[str, str]]:
    """--report FORMAT:FILE, each (format, file)."""
    out = []
    for spec in specs or ():
        fmt, sep, path = spec.partition(":")
        if not sep or not path or fmt not in audit_mod.AUDIT_FORMATS:
            raise InputError(f"--report {spec}: give FORMAT:FILE, FORMAT one of {', '.join(audit_mod.AUDIT_FORMATS)}")
        out.append((fmt, path))
    return out


def worker_limits(args) -> dict:
    """timeout and memory_mb of the template workers: --timeout / --memory, else the
    configuration's, else the defaults."""
    cfg = config_of(args)
    return {"timeout": positive(_first(args.timeout, cfg.timeout, _DEFAULT_TIMEOUT), "--timeout"),
            "memory_mb": memory_mb(_first(args.memory, cfg.memory, _DEFAULT_MEMORY_MB))}


def _expected_failures(args, cfg) -> dict:
    """--expected-failures FILE... merged (a later file wins a name), else the configuration's."""
    if not args.expected_failures:
        return cfg.expected_failures
    return {name: reason for path in args.expected_failures for name, reason in load_expected_failures(path).items()}


def _run_audit(args):
    refuse_worker_options_in_process(args)
    cfg = config_of(args)
    jobs = positive(_first(args.jobs, cfg.jobs), "--jobs")
    limits_ = worker_limits(args)
    timeout, memory = limits_["timeout"], limits_["memory_mb"]
    tokenizer = _first(args.tokenizer, cfg.tokenizer)
    prefix_stability = _first(args.prefix_stability, cfg.prefix_stability, "off")
    if args.session and prefix_stability == "off":
        raise InputError("--session is the prefix-stability check's session; add --prefix-stability report (or fail)")
    session = None
    if args.session:
        from ..session import load_session

        session = load_session(args.session)
    expected = _expected_failures(args, cfg)
    needed_by = "the token round trip (--tokenizer)"
    require_tokenizers([tokenizer if tokenizer != "auto" else None, *cfg.tokenizers.values()], needed_by)
    _locate_tokenizers(args, cfg)
    templates = configured_templates(args, cfg)
    lock = lock_for(args, cfg)  # a bad lock, a template it lacks, an upstream not at hand: before any work
    if lock:
        precheck(lock, templates)
    pairs = upstreams_for(cfg, templates)
    quiet = verbosity(args) < 0
    tokenizers = dict(cfg.tokenizers)
    if tokenizer == "auto":  # which tokenizers 'auto' opens depends on the templates: still before any analysis
        tokenizers |= _auto_without_extras(templates, tokenizers, quiet)
        chosen = {audit_mod.tokenizer_for(t.name, t.source, "auto", tokenizers) for t in templates}
        refuse_reading_outputs(args, [], tokenizers=[("the tokenizer --tokenizer auto chose", s) for s in sorted(chosen - {None})])
    progress = progress_printer(sys.stderr.isatty() and not quiet)
    # In process: jobs=1 and no worker limits (audit's in-process path).
    limits = {"jobs": 1} if args.in_process else {"jobs": jobs, "timeout": timeout, "memory_mb": memory}
    report = audit_mod.audit(templates, **limits, expected_failures=expected, tokenizer=tokenizer,
                             tokenizers=tokenizers, fail_on=_first(args.fail_on, cfg.fail_on, "fail"),
                             prefix_stability=prefix_stability, session=session, progress=progress)
    findings = run_checks(args, cfg, templates, lock, pairs)
    # the lock's and upstreams' failures are the report's too: its JSON, JUnit and summary say them
    return dataclasses.replace(report, checks=tuple(f for f in findings if f[0] in ("LOCK", "DRIFT"))), findings


def _locate_tokenizers(args, cfg) -> None:
    """Every tokenizer named (--tokenizer or the configuration's, and its pairings) is found before
    any work, not after the analyses that the token round trip follows."""
    from ..tokens.tokenizers import locate_tokenizer

    named = [("tokenizer", args.tokenizer if args.tokenizer is not None else cfg.tokenizer, args.tokenizer is None),
             *((f"tokenizers.{name}", spec, True) for name, spec in cfg.tokenizers.items())]
    for key, spec, configured in named:
        if spec and spec != "auto":
            with from_config(cfg.path, key, configured):
                locate_tokenizer(spec)


def _auto_without_extras(templates, tokenizers, quiet: bool) -> dict[str, str | None]:
    """`--tokenizer auto`'s templates whose vocabulary needs an extra that is not installed, mapped
    to no tokenizer: their token round trip is left out, said on one line, and the rest is run
    (a Python-only install still checks every vocabulary it can read)."""
    from ..tokens.tokenizers import TokenizerSpec

    left_out: dict[str, str | None] = {}
    needs: set[str] = set()
    for t in templates:
        spec = audit_mod.tokenizer_for(t.name, t.source, "auto", tokenizers)
        extra = TokenizerSpec.parse(spec).extra if spec else None
        if extra and importlib.util.find_spec(EXTRAS[extra][0]) is None:
            left_out[t.name] = None
            needs.add(extra)
    if left_out and not quiet:
        n = len(left_out)
        print(f"tmplkit: note: no token round trip for {n} template{'s' if n != 1 else ''} ({', '.join(sorted(left_out))}): "
              f"their vocabularies need {' and '.join(sorted(EXTRAS[e][2] for e in needs))}; "
              f"install {' '.join(sorted(repr(f'tmplkit[{e}]') for e in needs))} to check them", file=sys.stderr)
    return left_out


def add_table(sub) -> None:
    p = sub.add_parser("table",
                       description="One row per template: its delimiters when the round trip proved them, else "
                                   "none and why not. Exit code 1 when a template did not pass (and is not listed in "
                                   "--expected-failures), as for audit.")
    p.add_argument("sources", nargs="*", metavar="SOURCE", help="as for audit; default: the configuration's sources")
    add_format(p, TABLE_FORMATS, "markdown", "the table")
    add_output(p, "the table")
    add_name(p, many=True)
    p.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: the machine's cores)")
    add_limits(p, timeout=_DEFAULT_TIMEOUT, memory=_DEFAULT_MEMORY_MB)
    p.add_argument("--expected-failures", metavar="FILE", action="append",
                   help="JSON {template name: reason}, as for audit: listed failures do not make the exit code 1")
    p.set_defaults(func=_cmd_table)


def _cmd_table(args) -> int:
    cfg = config_of(args)
    jobs = positive(_first(args.jobs, cfg.jobs), "--jobs")
    limits = worker_limits(args)
    expected = _expected_failures(args, cfg)
    templates = configured_templates(args, cfg)
    progress = progress_printer(sys.stderr.isatty() and verbosity(args) >= 0)
    report = audit_mod.audit(templates, jobs=jobs, **limits, expected_failures=expected, progress=progress)
    emit(audit_mod.format_table(report.results, args.format), args.output)
    # A table of failing templates is no success: exit 1 as the audit does (their rows say why, and
    # the notes why a listed failure that passes fails it).
    if not report.ok and verbosity(args) >= 0:
        print(audit_mod.summary_line(report, color=use_color(args, sys.stderr)), file=sys.stderr)
        for note in report.list_notes():
            print(f"tmplkit: {note}", file=sys.stderr)
    return 0 if report.ok else 1
