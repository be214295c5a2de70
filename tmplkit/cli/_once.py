"""An option is given once: argparse's store takes the last of two values silently (`-o a -o b`,
`-j 1 --jobs 2`, `--memory-model recurrent --memory swa:512`); these refuse the second."""

from __future__ import annotations

import argparse


class StoreOnce(argparse._StoreAction):
    """argparse's store, which refuses an option given twice with two values. Options that may
    repeat say so (`action="append"`); the same value twice is taken."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        remember_value(self, namespace, values, option_string)
        super().__call__(parser, namespace, values, option_string)


def remember_value(action: argparse.Action, namespace, values, option_string) -> None:
    """Note that `action`'s option was given `values`; an ArgumentError where it was given another
    value before (under any of its spellings: an old one shares the new one's dest)."""
    given = namespace.__dict__.setdefault("_given", {})
    if action.dest in given and given[action.dest][1] != values:
        first, before = given[action.dest]
        raise argparse.ArgumentError(action, f"given twice ({first} {before} and {option_string} {values}); give it once")
    given[action.dest] = (option_string, values)
