"""An option is given once: argparse's store takes the last of two values silently (`-o a -o b`,
`-j 1 --jobs 2`, `--memory-model recurrent --memory swa:512`); these refuse the second."""

from __future__ import annotations

import argparse


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


def remember_value(action: argparse.Action, namespace, values, option_string) -> None:
    """Note that `action`'s option was given `values`; an ArgumentError where it was given another
    value before (under any of its spellings: an old one shares the new one's dest), compared as
    the option means it (`StoreOnce.meaning`)."""
    meaning = getattr(action, "meaning", None)
    meant = meaning(values) if meaning is not None else values
    given = namespace.__dict__.setdefault("_given", {})
    if action.dest in given and given[action.dest][2] != meant:
        first, before, _ = given[action.dest]
        raise argparse.ArgumentError(action, f"given twice ({first} {before} and {option_string} {values}); give it once")
    given[action.dest] = (option_string, values, meant)
