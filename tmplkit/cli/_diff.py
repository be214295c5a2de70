"""The `diff` subcommand: the difference in behaviour between two templates."""

from __future__ import annotations

import argparse

from ._common import add_format, add_output, emit, quiet_text, refuse_worker_options_in_process
from ._lock import add_derive_options, derive

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_diff(sub) -> None:
    from ..behaviour import DIFF_FORMATS

    p = sub.add_parser(
        "diff",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compare what two templates do: the verdict, every role's delimiter, the generation prompt and "
                    "reasoning under each thinking switch, the tool placement, prefix stability on the agent session "
                    "and every probe render. Texts that differ but render the same on every probe are no change in "
                    "behaviour. Two folders of templates are compared template by template, by name. "
                    "Exit 0: the same behaviour; 1: it differs; 2: bad input.",
        epilog="Example:\n  tmplkit diff hf:org/name@v1.0 hf:org/name\n"
               "  tmplkit diff templates-v1/ templates/   # every template of the same name\n"
               "  tmplkit diff model.Q4_K_M.gguf hf:org/name --format markdown   # a GGUF against its upstream")
    p.add_argument("old", metavar="A", help="the first template source (.jinja, .json, .gguf, folder, hf:org/name[@rev], -)")
    p.add_argument("new", metavar="B", help="the second template source")
    p.add_argument("--name", help="which template of A (default: its default one; a GGUF's 'tool_use')")
    p.add_argument("--name-b", help="which template of B (default: --name where B has it, else its default one)")
    add_format(p, DIFF_FORMATS, "text", "the report")
    add_output(p, "the report")
    add_derive_options(p)
    p.set_defaults(func=_cmd_diff)


def _choose(templates, source: str, name: str | None, fallback: str | None):
    from ..errors import SourceError
    from ..sources import choose_one

    if name is None and fallback is not None:
        try:
            return choose_one(templates, source, fallback)
        except SourceError:
            return choose_one(templates, source)
    return choose_one(templates, source, name)


def _by_name(old: list, new: list) -> bool:
    """Whether the two sources are compared template by template, by name: each holds several and
    one of them has no default to take (two folders of templates)."""
    from ..sources import default_of

    return len(old) > 1 and len(new) > 1 and (default_of(old) is None or default_of(new) is None)


def _cmd_diff(args) -> int:
    from ..atomic import check_writable
    from ..behaviour import compare, format_diff, require_derived
    from ..sources import load

    refuse_worker_options_in_process(args)
    if args.output:
        check_writable(args.output)
    olds, news = load(args.old), load(args.new)
    if args.name is None and args.name_b is None and _by_name(olds, news):
        return _diff_by_name(args, olds, news)
    old = _choose(olds, args.old, args.name, None)
    new = _choose(news, args.new, args.name_b, args.name)
    a, b = derive(args, [old, new])
    require_derived([a, b], "nothing was compared")
    diff = compare(a, b)
    _emit_unless_quiet(args, format_diff(a, b, diff, args.format), diff.same)
    return 0 if diff.same else 1


def _emit_unless_quiet(args, report: str, same: bool) -> None:
    """The report, on stdout or to -o; with -q, the text report on stdout says nothing where nothing
    differs (-q prints only what went wrong, as everywhere; a JSON or markdown report is data a
    reader parses: written whatever -q says)."""
    if not (same and quiet_text(args)):
        emit(report, args.output)


def _diff_by_name(args, olds: list, news: list) -> int:
    """Two sources of several templates (two folders), template by template: exit 0 only where
    every pair behaves the same and neither source has a name the other lacks."""
    from ..behaviour import compare, format_diff_set, pair_by_name, require_derived
    from ..errors import InputError, SourceError
    from ..sources import names_of

    for t in (*olds, *news):
        if t.error:  # (a file of the folder that could not be read: as for one template asked for)
            raise SourceError(t.error)
    pairs, only_old, only_new = pair_by_name(olds, news)
    if not pairs:
        raise InputError(f"{args.old} and {args.new} have no template name in common (the first has "
                         f"{names_of(olds, 6)}; the second {names_of(news, 6)}); give --name and --name-b to compare two of them")
    records = derive(args, [t for pair in pairs for t in pair])
    require_derived(records, "nothing was compared")
    compared = [(a, b, compare(a, b)) for a, b in zip(records[0::2], records[1::2])]
    same = all(d.same for _, _, d in compared) and not only_old and not only_new
    _emit_unless_quiet(args, format_diff_set(compared, only_old, only_new, args.format), same)
    return 0 if same else 1

