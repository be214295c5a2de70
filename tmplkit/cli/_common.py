"""Helpers the subcommands share: loading sources, progress, writing output, checking options."""

from __future__ import annotations

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


def positive(value, flag: str):
    from ..errors import InputError

    if value is not None and not value > 0:  # also refuses nan
        raise InputError(f"{flag} must be positive, got {value}")
    return value
