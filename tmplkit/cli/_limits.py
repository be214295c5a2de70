"""The limits a command renders an untrusted template under (tmplkit.auditing.contained): the audit's, or the
command's own `--timeout` where it has one."""

from __future__ import annotations

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

__all__ = ["DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT", "RENDER_TIMEOUT", "SESSION_TIMEOUT", "check_template_isolated", "contained_limits",
           "render_session"]

# A worker's limits where the command's --timeout / --memory do not say: tmplkit.auditing.contained's
# defaults, repeated here so that building the parser loads no layer (tests/test_cli_lazy.py holds them equal).
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024

# Seconds for every request of a session rendered in a worker (replay's pre-check): turns' default
# for the same work, since a long session's hundreds of renders legitimately take seconds.
SESSION_TIMEOUT = 60.0
# Seconds for the one render of a session (prefill's pre-check); None: the audit's limit.
RENDER_TIMEOUT: float | None = None


def contained_limits(args, default: float | None = None) -> dict:
    """`run_contained`'s limits for a command with --timeout and --memory (`_common.add_limits`): the
    values given (refused unless positive), else `default` seconds (the audit's when None) and the
    audit's MiB; a limit reached says which option raises it (a long conversation is legitimately slow)."""
    from ._common import memory_mb, positive

    memory = memory_mb(getattr(args, "memory", None))
    timeout = getattr(args, "timeout", None)
    return {"timeout": positive(timeout if timeout is not None else default or DEFAULT_TIMEOUT, "--timeout"),
            "memory_mb": memory if memory is not None else DEFAULT_MEMORY_MB,
            "advice": "; if the input is legitimately this long, raise --timeout",
            "memory_advice": "; if the input is meant to be this large, raise --memory"}


def check_template_isolated(template, model, what: str, session=None, *, every_request: bool = False,
                            limits: dict | None = None) -> None:
    """Before a model is loaded (prefill, replay): the template the run renders (`template`, else the
    model GGUF's own) analyzed in a worker under the audit's limits; one that runs out of time or
    memory there, or reaches for what the sandbox forbids, is refused on one line instead of being
    rendered in this process. With `session` (a `Session`), the session's own renders too (the last
    request, or `every_request`), since a template can pass the probes and turn hostile on the
    session's content: the renders this process then repeats have ended within the limits once.
    `limits`: those renders' (`contained_limits` of the command's --timeout and --memory)."""
    from ..analysis import LIMIT_STATUSES
    from ..auditing.contained import run_contained
    from ..auditing.isolate import analyze_isolated
    from ..errors import RenderLimitError, TmplkitError
    from ..sources.templates import load_one

    if template is None:
        try:
            template = load_one(str(model))
        except TmplkitError:
            return  # the run's own loading says what is wrong with the model
    (analysis,) = analyze_isolated([template], jobs=1)
    if analysis.status in LIMIT_STATUSES:
        why = analysis.errors[0] if analysis.errors else analysis.status
        raise RenderLimitError(f"{what}: the template is refused before the model loads ({analysis.status}): {why}",
                               kind=analysis.status)
    if session is not None:
        limits = limits or {"timeout": SESSION_TIMEOUT if every_request else (RENDER_TIMEOUT or DEFAULT_TIMEOUT)}
        try:
            run_contained(render_session, template, session, every_request, **limits,
                          what=f"rendering the session with template '{template.name}'")
        except RenderLimitError as exc:
            raise RenderLimitError(f"{what}: the template is refused before the model loads: {exc}",
                                   kind=exc.kind) from None


def render_session(template, session, every_request: bool) -> None:
    """In the worker: `session` rendered as the run renders it (every request, as replay does; else
    the whole session with the generation prompt, as prefill does); nothing is sent back."""
    if every_request:
        from ..turns import prepare_session

        prepare_session(session, template)
    else:
        from ..session import for_server

        for_server(template, session).render(add_generation_prompt=True)
