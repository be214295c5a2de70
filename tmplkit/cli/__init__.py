"""The command line: a thin layer over the library, one module per subcommand.

Exit codes: 0 success; 1 the audit failed (by --fail-on); 2 a usage or input error, told on one
line on stderr; 130 interrupted. A new subcommand is a module with an `add_NAME(subparsers)`
function, listed in `_SUBCOMMANDS`. The global options (`--quiet`, `--verbose`, `--color`,
`--config`, `--no-config`) are accepted before the subcommand and after it.
"""

from __future__ import annotations

import argparse
import os
import sys

from .._interrupt import install_early_handler, restore_default
from .._version import __version__
from ..errors import InputError, TmplkitError
from ..sandbox import hints_for
from ._annotate import add_annotate
from ._audit import add_audit, add_table
from ._corpus import add_corpus
from ._diff import add_diff
from ._lock import add_lock
from ._mask import add_mask
from ._outputs import check_outputs, printable
from ._prefill import add_prefill
from ._replay import add_replay
from ._schema import add_schema
from ._serve import add_engine_parity, add_request
from ._server import add_server
from ._session import add_session
from ._show import add_show
from ._spans import add_spans
from ._turns import add_turns

__all__ = ["build_parser", "main"]

# Each subcommand registers itself here: an add-parser function per subcommand.
_SUBCOMMANDS = [add_audit, add_table, add_show, add_corpus, add_spans, add_prefill, add_turns, add_request,
                add_engine_parity, add_server, add_session, add_replay, add_schema, add_mask, add_annotate,
                add_lock, add_diff]


EXIT_CODES = {0: "success (audit: nothing failed by --fail-on)", 1: "the audit failed (diff: the behaviour differs)",
              2: "usage or input error (one line on stderr)", 130: "interrupted"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tmplkit", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Chat-template boundary analysis: derive role delimiters, detect spans, drive checkpointing prefill.",
        epilog="exit codes:\n" + "\n".join(f"  {code:<4} {what}" for code, what in EXIT_CODES.items()))
    parser.add_argument("--version", action="version", version=f"tmplkit {__version__}")
    _add_global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    for subparser in _subcommand_parsers(sub):
        # After the subcommand too (and after `server log`, `session generate`); SUPPRESS keeps a
        # value given before it.
        _add_global_options(subparser, defaults=False)
    return parser


def _subcommand_parsers(sub):
    """Every subcommand's parser, the nested ones (`server log`) with their own."""
    for subparser in sub.choices.values():
        yield subparser
        for action in subparser._subparsers._group_actions if subparser._subparsers else ():
            yield from _subcommand_parsers(action)


def _add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    def default(value):
        return value if defaults else argparse.SUPPRESS

    g = parser.add_argument_group("global options")
    taken = parser._option_string_actions  # a subcommand's own short option wins over ours

    def add(*names: str, **kwargs) -> None:
        g.add_argument(*[n for n in names if n not in taken], **kwargs)

    add("-q", "--quiet", action="store_const", const=-1, dest="verbosity", default=default(0),
        help="print only what went wrong (nothing when all is well); no progress")
    add("-v", "--verbose", action="store_const", const=1, dest="verbosity", default=default(0),
        help="print more: every problem, each template's delimiters and time")
    add("--color", choices=["auto", "always", "never"], default=default("auto"),
        help="colour the output: auto (a terminal, unless NO_COLOR is set), always or never")
    add("--config", metavar="FILE", default=default(None),
        help="read settings from FILE (a tmplkit.toml or a pyproject.toml with [tool.tmplkit]) "
             "instead of the one found from the current folder")
    add("--no-config", action="store_true", default=default(False), help="read no configuration file")


class _Stdout:
    """Standard output as the commands write it: a failed write (a full disk, /dev/full) is one
    line naming standard output, not a folder; a closed one (`>&-`) too; a name that is no UTF-8
    (a file name's undecodable bytes) is written escaped (`printable`), never a traceback. After a failure the
    descriptor is pointed at /dev/null, so that Python's flush at exit does not fail again."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:
            raise InputError("standard output is closed; redirect it (> FILE) or give -o FILE")
        try:
            return self._stream.write(printable(text))
        except OSError as exc:
            self._fail(exc)
            raise

    def flush(self) -> None:
        if self._stream is not None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._fail(exc)

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    def _fail(self, exc: OSError):
        if isinstance(exc, BrokenPipeError):
            raise exc
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
        raise InputError(f"cannot write standard output ({exc.strerror or exc}); check where it goes (a full "
                         "disk?) or give -o FILE") from None


def main(argv: list[str] | None = None) -> int:
    stdout = sys.stdout
    try:  # the parser too: a Ctrl-C while it is built is still one line
        restore_default()  # from here, Ctrl-C is a KeyboardInterrupt caught below (see tmplkit._interrupt)
        sys.stdout = _Stdout(stdout)
        args = build_parser().parse_args(argv)
        check_outputs(args)  # a path that cannot be written is refused before the work, not after it
        with hints_for("cli"):  # limit messages name the flags a command-line user can change
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # a standard output that cannot be written is told here, not at Python's exit
        return code
    except TmplkitError as exc:
        print(f"tmplkit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tmplkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the environment (a folder that cannot be written, a full disk), not a bug
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"tmplkit: error: {where}{exc.strerror or exc}; check that the folder exists and can be written "
              "(the cache folder is $TMPLKIT_CACHE)", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout
        install_early_handler()  # a Ctrl-C while Python shuts down (its atexit work): one line, exit 130 too
