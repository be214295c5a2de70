"""The `prefill` subcommand."""

from __future__ import annotations

from ..errors import InputError
from ._common import (
    add_format,
    add_limits,
    add_llama_options,
    add_output,
    add_report_option,
    add_session_option,
    add_settings_option,
    add_template_option,
    at_least,
    deprecated,
    emit_model_run,
    model_run_outputs,
    model_template,
    prefill_settings,
    require_extra,
    session_of,
    settings_of,
)
from ._limits import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, RENDER_TIMEOUT, check_template_isolated, contained_limits
from ._terminal import ProgressLine, wanted

# Runs per policy at most: each prefills the whole session once per policy (a count past this is
# a typo, and would run for days).
MAX_REPEAT = 1000

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_prefill(sub) -> None:
    # Choices and defaults come from the library: a policy added to POLICIES is offered here, and
    # a default changed in PrefillSettings is the command's default too.
    from ..server_rules import POLICIES

    p = sub.add_parser("prefill")
    p.add_argument("model", metavar="MODEL", help="a GGUF model llama.cpp can load, gemma or tiny:VOCAB (built on first use)")
    add_session_option(p, required=True, what="the agent session", old_positional="SESSION.json")
    add_template_option(p, what="the chat template (default: the model GGUF's own)")
    p.add_argument("--name", help="which template of --template's source, or of the model GGUF's (default: its default one)")
    names = tuple(POLICIES)
    add_settings_option(p, names, names, "; the batch policies, each run on the session: " +
                        "; ".join(f"{name}: {pol.description}" for name, pol in POLICIES.items()))
    # (the old spelling: one policy, or all of them)
    deprecated(p, "--policy", new="--settings LIST", dest="settings", choices=[*names, "all"],
               convert=lambda value: ",".join(names) if value == "all" else value)
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help=f"runs per policy, interleaved, 1 to {MAX_REPEAT}; figures are medians")
    add_format(p, ("markdown", "json"), "markdown", "the comparison")
    add_output(p, "the comparison")
    add_report_option(p, ("json", "markdown"), old_json=True)
    p.add_argument("--plot", metavar="FILE.png", help="plot batch sizes along the prompt, checkpoints marked")
    add_llama_options(p)
    add_limits(p, timeout=RENDER_TIMEOUT or DEFAULT_TIMEOUT, memory=DEFAULT_MEMORY_MB)  # (the session's render, checked in a worker first)
    p.set_defaults(func=_cmd_prefill)


def _cmd_prefill(args) -> int:
    require_extra("llama", "tmplkit prefill")  # before any work
    from ..prefill import compare_policies
    from ..prefill.models import resolve_model
    from ..prefill.plot import comparison_png
    from ..server_rules import POLICIES
    from ..session import load_session

    policies = settings_of(args, tuple(POLICIES))
    limits = contained_limits(args, default=RENDER_TIMEOUT)  # (a bad limit: refused before any work)
    session_of(args, "prefill")
    reports = model_run_outputs(args)
    at_least(args.repeat, 1, "--repeat")
    if args.repeat > MAX_REPEAT:
        raise InputError(f"--repeat must be at most {MAX_REPEAT}, got {args.repeat}: each run prefills the whole "
                         "session once per policy; give fewer runs")
    settings = prefill_settings(args)
    # A bar redrawn in place: a terminal only, and not a dumb one (TERM=dumb, CI logs).
    line = ProgressLine(wanted(), steps=False)
    bar = _token_bar(line, args.repeat) if line.on else None
    session = load_session(args.session)
    try:
        model = resolve_model(args.model)
        template = model_template(args, model)
        check_template_isolated(template, model, "tmplkit prefill", session, limits=limits)
        comp = compare_policies(model, session, template=template, policies=list(policies),
                                repeat=args.repeat, settings=settings, progress=bar)
    finally:
        line.close()
    emit_model_run(comp, args, reports, comparison_png)
    return 0


def _token_bar(line: ProgressLine, repeat: int, width: int = 30):
    """The runner's progress callback: policy, repeat, and tokens done as a bar on `line`."""

    def show(policy: str, k: int, done: int, total: int) -> None:
        fill = int((done / total if total else 1.0) * width)
        line.show(f"{policy:>16} {k + 1}/{repeat} [{'#' * fill}{'-' * (width - fill)}] {done}/{total} tokens")

    return show
