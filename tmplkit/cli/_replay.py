"""The `replay` subcommand: an agent session request by request on a model, predicted beside measured."""

from __future__ import annotations

import sys

from ._common import (
    add_format,
    add_limits,
    add_llama_options,
    add_output,
    add_report_option,
    add_session_option,
    add_settings_option,
    add_template_option,
    emit_model_run,
    model_run_outputs,
    model_template,
    prefill_settings,
    session_of,
    settings_of,
)
from ._limits import DEFAULT_MEMORY_MB, SESSION_TIMEOUT, check_template_isolated, contained_limits

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_replay(sub) -> None:
    from ..turns.cost import BASELINES, CHOSEN  # (replaying's REPLAYED and REPLAYABLE, without the model layer)

    p = sub.add_parser("replay")
    p.add_argument("model", metavar="MODEL", help="a GGUF file, `gemma` (Gemma 3 270M) or `tiny:VOCAB` (e.g. tiny:qwen35)")
    add_session_option(p, required=True, what="the agent session (e.g. from `tmplkit session generate`)",
                       old_positional="SESSION.json")
    add_template_option(p, what="the chat template (default: the model GGUF's own)")
    p.add_argument("--name", help="which template of --template's source, or of the model GGUF's (default: its default one)")
    add_settings_option(p, CHOSEN + BASELINES, CHOSEN, "; none: no batch ends, every-user-start: the 73618f2 regression's rule")
    add_format(p, ("markdown", "json"), "markdown", "the replay")
    add_output(p, "the replay")
    add_report_option(p, ("json", "markdown"), old_json=True)
    p.add_argument("--plot", metavar="FILE.png", help="plot tokens recomputed per request, one line per setting")
    # (all but --checkpoints: the replay compares where its settings take checkpoints)
    add_llama_options(p, without=("checkpoints",), n_ctx=65536)
    add_limits(p, timeout=SESSION_TIMEOUT, memory=DEFAULT_MEMORY_MB)  # (the session's renders, checked in a worker first)
    p.set_defaults(func=_cmd_replay)


def _cmd_replay(args) -> int:
    from ..prefill import PrefillRunner
    from ..prefill.compare import resolve_template
    from ..prefill.models import resolve_model
    from ..replay.replaying import REPLAYABLE, replay_png, replay_session
    from ..session import load_session

    names = settings_of(args, REPLAYABLE)
    limits = contained_limits(args, default=SESSION_TIMEOUT)  # (a bad limit: refused before any work)
    session_of(args, "replay")
    reports = model_run_outputs(args)
    session = load_session(args.session)
    settings = prefill_settings(args)
    model = resolve_model(args.model)
    template = model_template(args, model)
    check_template_isolated(template, model, "tmplkit replay", session, every_request=True, limits=limits)
    with PrefillRunner(model, settings) as runner:
        rep = replay_session(runner, session, resolve_template(template, runner), settings=tuple(names))
    emit_model_run(rep, args, reports, replay_png)
    if not rep.matches:
        print("prediction differs from the replay: " + "; ".join(rep.mismatches()[:5]), file=sys.stderr)
    return 0
