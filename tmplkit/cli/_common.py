"""Helpers the subcommands share: loading sources, progress, writing output, checking options,
the global options (verbosity, colour, configuration) and the optional extras a command needs."""

from __future__ import annotations

import importlib.util
import os
import sys


def load_templates(sources_: list[str]):
    from ..sources import load_many

    return load_many(sources_)


def progress_printer(enabled: bool):
    if not enabled:
        return None

    def report(done: int, total: int, analysis) -> None:
        end = "\n" if done == total else ""
        print(f"\r\x1b[2K[{done}/{total}] {analysis.name[:60]}", end=end, file=sys.stderr, flush=True)

    return report


def emit(text: str, output: str | None) -> None:
    """Print, or write the file atomically (the old file stays whole if we are interrupted)."""
    if output:
        from ..atomic import write_output

        write_output(output, text)
    else:
        sys.stdout.write(text)


def verbosity(args) -> int:
    """-1 with --quiet, 1 with --verbose, else 0."""
    return getattr(args, "verbosity", 0) or 0


def use_color(args, stream) -> bool:
    """Colour on `stream`: --color always/never decide; auto colours a terminal unless NO_COLOR
    (https://no-color.org) is set to a non-empty value or TERM is dumb."""
    mode = getattr(args, "color", "auto") or "auto"
    if mode != "auto":
        return mode == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty()


def config_of(args):
    """The configuration that applies: --config FILE, none with --no-config, else the one found
    from the current folder (tmplkit.config). Loaded once per run."""
    from ..config import Config, load_config

    if getattr(args, "_config", None) is None:
        args._config = Config() if getattr(args, "no_config", False) else load_config(getattr(args, "config", None))
    return args._config


# The optional extras: (module, extra, what it is), for one-line refusals before any work.
_EXTRAS = {
    "llama": ("llama_cpp", "llama", "llama-cpp-python"),
    "hf": ("tokenizers", "hf", "the Hugging Face tokenizers package"),
}


def require_extra(name: str, needed_by: str) -> None:
    """Refuse at once, on one line, when the optional extra `name` is not installed."""
    from ..errors import InputError

    module, extra, what = _EXTRAS[name]
    if importlib.util.find_spec(module) is None:
        raise InputError(f"{needed_by} needs {what}, which is not installed; "
                         f"install the '{extra}' extra: pip install 'tmplkit[{extra}]'")


def require_tokenizers(specs, needed_by: str) -> None:
    """Refuse at once when any of the tokenizer `specs` needs an extra that is not installed
    (`TokenizerSpec.extra`)."""
    from ..tokenizers import TokenizerSpec

    for extra in sorted({TokenizerSpec.parse(s).extra for s in specs if s}):
        require_extra(extra, needed_by)


def positive(value, flag: str):
    from ..errors import InputError

    if value is not None and not value > 0:  # also refuses nan
        raise InputError(f"{flag} must be positive, got {value}")
    return value
