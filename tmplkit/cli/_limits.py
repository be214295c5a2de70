"""The limits a command renders an untrusted template under (tmplkit.auditing.contained): the audit's, or the
command's own `--timeout` where it has one."""

from __future__ import annotations

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

__all__ = ["check_template_isolated", "render_timeout"]


def render_timeout(args, default: float | None = None) -> float:
    """Seconds per template: the command's `--timeout` when it has one and it is given, else `default`
    (the audit's default limit when None)."""
    from ..auditing.contained import DEFAULT_TIMEOUT

    given = getattr(args, "timeout", None)
    return given if given is not None else (default if default is not None else DEFAULT_TIMEOUT)


def check_template_isolated(template, model, what: str) -> None:
    """Before a model is loaded (prefill, replay): the template the run renders (`template`, else the
    model GGUF's own) analyzed in a worker under the audit's limits; one that runs out of time or
    memory there, or reaches for what the sandbox forbids, is refused on one line instead of being
    rendered in this process. (The session's own render then runs here, under the sandbox's
    per-render limits.)"""
    from ..auditing.isolate import analyze_isolated
    from ..errors import RenderLimitError, TmplkitError
    from ..sources.templates import load_one

    if template is None:
        try:
            template = load_one(str(model))
        except TmplkitError:
            return  # the run's own loading says what is wrong with the model
    (analysis,) = analyze_isolated([template], jobs=1)
    if analysis.status in ("timeout", "memory", "unsafe"):
        why = analysis.errors[0] if analysis.errors else analysis.status
        raise RenderLimitError(f"{what}: the template is refused before the model loads ({analysis.status}): {why}",
                               kind=analysis.status)
