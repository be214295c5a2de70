"""The files a command will write, checked before it works: `-o/--output`, audit's `--report
FORMAT:FILE`, prefill's and replay's `--json` and `--plot`. A missing folder, a read-only file or a
folder given as a file is refused on one line at once, not after the whole analysis."""

from __future__ import annotations

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

__all__ = ["check_outputs", "output_paths", "printable"]

# The options whose value is a file the command writes (argparse's dest names).
_FILE_OPTIONS = ("output", "json", "plot")


def output_paths(args) -> list[str]:
    """The paths `args` asks a command to write."""
    paths = [getattr(args, name, None) for name in _FILE_OPTIONS]
    for spec in getattr(args, "report", None) or ():  # audit's FORMAT:FILE (a bad spec is audit's to refuse)
        if isinstance(spec, str):
            paths.append(spec.partition(":")[2])
    return [p for p in paths if isinstance(p, str) and p]


def check_outputs(args) -> None:
    """Raise InputError (one line) for the first path of `output_paths(args)` that cannot be written."""
    from ..atomic import check_writable

    for path in output_paths(args):
        check_writable(path)


def printable(text: str) -> str:
    r"""`text` as valid UTF-8: a lone surrogate (a file name's byte that is no UTF-8, as Python decodes
    it) written as its escape, so that a JSON report stays JSON and a JUnit report XML.

    >>> printable("ok"), printable("x\udcff.jinja")
    ('ok', 'x\\udcff.jinja')
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
