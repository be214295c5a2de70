"""An option is given once: argparse's store takes the last of two values silently (`-o a -o b`,
`-j 1 --jobs 2`, `--memory-model recurrent --memory swa:512`); these refuse the second."""

from __future__ import annotations

import argparse
import os
import sys

# The metavars of options whose value names a file or folder: two spellings of one (`a.json`,
# `./a.json`, a link to it) are one value, as `-o`'s are (`path_meaning`). Of those that may also
# name something else (`vocab:qwen35`, `gemma`, `corpus:hub`), only a value that is a path there.
PATH_METAVARS = frozenset({"FILE", "DIR", "FILE.png", "PATH"})
SPEC_METAVARS = frozenset({"PATH|auto", "SOURCE", "MODEL"})


class StoreOnce(argparse._StoreAction):
    """argparse's store, which refuses an option given twice with two values. Options that may
    repeat say so (`action="append"`); the same value twice is taken: the same as the option
    understands it, after its `type=` and `meaning` (a function of the value: an old name of a
    `--format` value is that value, so `--format table --format markdown` is one value)."""

    def __init__(self, *args, meaning=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.meaning = meaning

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        remember_value(self, namespace, values, option_string)
        super().__call__(parser, namespace, values, option_string)


class BooleanOnce(argparse.BooleanOptionalAction):
    """argparse's `--x / --no-x`, which refuses both given (the last won silently:
    `--generation-prompt --no-generation-prompt`); one of them twice is taken."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        remember_value(self, namespace, not (option_string or "").startswith("--no-"), option_string, flag=True)
        super().__call__(parser, namespace, values, option_string)


def remember_value(action: argparse.Action, namespace, values, option_string, *, flag: bool = False) -> None:
    """Note that `action`'s option was given `values` (`flag`: a flag that sets it, named without
    a value); an ArgumentError where it was given another value before (under any of its
    spellings: an old one shares the new one's dest), compared as the option means it
    (`StoreOnce.meaning`)."""
    meaning = getattr(action, "meaning", None) or path_meaning(action.metavar)
    meant = meaning(values) if meaning is not None and isinstance(values, str) else values
    shown = option_string if flag else f"{option_string} {values}"
    given = namespace.__dict__.setdefault("_given", {})
    if action.dest in given and given[action.dest][2] != meant:
        _, before, _ = given[action.dest]
        if flag:
            raise argparse.ArgumentError(None, f"{before} and {shown} contradict each other; give one")
        raise argparse.ArgumentError(action, f"given twice ({before} and {shown}); give it once")
    given[action.dest] = (option_string, shown, meant)


def one_path(value: str) -> str:
    """A path as an option given twice compares it: `a.txt`, `./a.txt` and a link to it are one file
    ('-' and '' as given)."""
    try:
        return os.path.realpath(value) if value not in ("", "-") else value
    except (OSError, ValueError):  # (a NUL in a path: refused in one line where it is used)
        return value


def path_meaning(metavar):
    """How an option with `metavar` compares two values (None: as given): `PATH_METAVARS` as paths,
    `SPEC_METAVARS` as paths where they are one."""
    if metavar in PATH_METAVARS:
        return one_path
    if metavar in SPEC_METAVARS:
        return lambda value: one_path(value) if os.path.exists(value) else value
    return None


# The notes `tmplkit` (cli.main) holds until its command has done its work (None: printed at once,
# as a parser used on its own prints them): where the command line is refused, its error is then
# the one line bad input gets, and a note said twice (`--json a --json b`) is said once.
_held_notes: list[str] | None = None


def say_note(line: str) -> None:
    """A note on stderr (an old spelling's), now or once the work is done (`hold_notes`)."""
    if _held_notes is None:
        print(line, file=sys.stderr)
    elif line not in _held_notes:
        _held_notes.append(line)


def hold_notes(held: bool) -> list[str]:
    """Start holding the notes (`held`), or stop; the notes held so far."""
    global _held_notes
    notes, _held_notes = _held_notes or [], ([] if held else None)
    return notes
