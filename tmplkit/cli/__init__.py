"""The command line: a thin layer over the library, one module per subcommand.

Exit codes: 0 success; 1 the audit failed (by --fail-on); 2 a usage or input error, told on one
line on stderr; 130 interrupted. A new subcommand is a module with an `add_NAME(subparsers)`
function, listed in `_COMMANDS` with the line `tmplkit --help` shows for it. The global options
(`--quiet`, `--verbose`, `--color`, `--config`, `--no-config`) are accepted before the subcommand
and after it.

A subcommand's module is imported, and its parser built, only when that subcommand is parsed (it
runs, or its --help is asked for): `tmplkit --version` and `tmplkit --help` import no layer of the
library. `build_parser()` builds every subcommand (for tests and tools that walk them all).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from functools import partial

from .._interrupt import forget_unhandled_interrupt, install_early_handler, raise_lost_interrupts, restore_default, unwind_on_sigterm
from .._version import __version__
from ..errors import InputError, TmplkitError
from ._once import StoreOnce, hold_notes
from ._outputs import BROKE, REFUSED, check_outputs, error_line, printable, refuse_found_configuration, refuse_loaded_outputs

__all__ = ["build_parser", "main"]

# Each subcommand, in the order `tmplkit --help` lists them: the module that declares it (imported
# when the subcommand is parsed), its add-parser function, and its line in `tmplkit --help`.
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "audit": ("._audit", "add_audit", "analyze templates, prove their delimiters by a round trip, report"),
    "table": ("._audit", "add_table", "print the delimiter table, one row per template"),
    "show": ("._show", "add_show", "render the mixed probe conversation and mark its spans"),
    "corpus": ("._corpus", "add_corpus", "fetch a pinned public template corpus into the cache"),
    "spans": ("._spans", "add_spans", "render a conversation, tokenize it, and print its message spans"),
    "prefill": ("._prefill", "add_prefill",
                "prefill an agent session on a model with each batch policy and compare them"),
    "turns": ("._turns", "add_turns", "per template: is a resumed agent session's prefix stable, where and why it "
                                      "diverges, and the tokens each request recomputes"),
    "request": ("._serve", "add_request",
                "print the llama-server /completion body for a conversation, or its message_delimiters alone"),
    "engine-parity": ("._serve", "add_engine_parity",
                      "render templates with llama-server's own Jinja engine and compare with tmplkit's render"),
    "server": ("._server", "add_server", "llama-server itself: its chat endpoint's delimiters, and reading its log"),
    "session": ("._session", "add_session",
                "agent sessions: generate one to try `tmplkit prefill`, `turns` and `replay`"),
    "replay": ("._replay", "add_replay", "replay an agent session on a model as llama-server serves it: per request "
                                         "the tokens reused, the checkpoint restored, the tokens recomputed (and "
                                         "predicted)"),
    "schema": ("._schema", "add_schema", "print the JSON Schema of a command's JSON output, or list them"),
    "mask": ("._mask", "add_mask", "the tokens of a conversation the model learns (assistant turns as generated)"),
    "annotate": ("._annotate", "add_annotate", "write a copy of the template with {%% generation %%} tags that make "
                                               "transformers' assistant mask equal tmplkit's"),
    "lock": ("._lock", "add_lock",
             "record what each template does (its behaviour lock), for the audit to check against"),
    "diff": ("._diff", "add_diff",
             "what changed in behaviour between two templates (exit 0 same, 1 different, 2 bad input)"),
}


EXIT_CODES = {0: "success (audit: nothing failed by --fail-on)",
              1: "a gate failed: the audit (table: a template failed; diff: the behaviour differs; spans: the "
                 "delimiters are not proven)",
              2: "usage or input error (one line on stderr)", 130: "interrupted"}


_ARGV: list[str] = []  # the command line being parsed (a subcommand's parser reads it for its error)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is one line like every other error (argparse prints the
    whole usage block first), naming the command's --help for the rest; subcommands inherit it.
    An option is given whole: argparse's prefix matching read `turns --template X` as
    `--template-kwargs X`, an option of another meaning. An option is given once (`_once.StoreOnce`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)

    # Positionals argparse must take as optional (an old spelling gives them another meaning) but
    # that the command needs: shown required in the usage and --help (`add_template_argument`).
    needed_positionals: tuple[str, ...] = ()

    def format_usage(self) -> str:
        return self._needed_shown(super().format_usage())

    def format_help(self) -> str:
        return self._needed_shown(super().format_help())

    def _needed_shown(self, text: str) -> str:
        for name in self.needed_positionals:
            text = text.replace(f"[{name}]", name)
        return text

    def error(self, message: str):
        required = "the following arguments are required: "
        if message.startswith(required):
            # (an option misspelt is what is wrong, not the one it misspells: `--tokenizr` named first;
            # a subcommand missing is what is wrong before any option of it)
            unknown = self._unknown_options() if self._subparsers is None else []
            message = ("unrecognized arguments: " + " ".join(unknown) if unknown else
                       "missing: " + ", ".join(map(self._missing, message[len(required):].split(", "))))
        self.exit(2, error_line(f"{self.prog}: error: {message}; see {self.prog} --help") + "\n")

    def _unknown_options(self) -> list[str]:
        """The long options (`--name`) of the command line this parser does not know (the
        subcommand's: the global options are its own too): not a value an option took, nothing after
        `--`. (A short option may hold its value, `-ofile`, or several flags, `-qv`: not judged.)"""
        out, value = [], False
        for a in _ARGV:
            if a == "--":
                break
            if value:
                value = False
                continue
            action = self._option_string_actions.get(a.split("=", 1)[0])
            if action is not None:
                value = "=" not in a and action.nargs != 0
            elif a.startswith("--") and len(a) > 2:
                out.append(a)
        return out

    def parse_args(self, args=None, namespace=None):
        # Arguments left over are the subcommand's to refuse: the line names its --help, not ours.
        _ARGV[:] = sys.argv[1:] if args is None else list(args)
        try:
            ns, extras = self.parse_known_args(args, namespace)
        finally:
            _ARGV.clear()  # (read by a usage error of this parse only)
        if extras:
            deepest = self._deepest(ns)
            if not _more_sources(deepest, ns, extras):
                deepest.error("unrecognized arguments: " + " ".join(extras))
        return ns

    def _deepest(self, ns) -> argparse.ArgumentParser:
        """The (sub)subcommand's parser `ns` was parsed by (`tmplkit server log`)."""
        parser: argparse.ArgumentParser = self
        while parser._subparsers is not None:
            action = next((a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction)), None)
            chosen = getattr(ns, action.dest, None) if action is not None else None
            nested = action._name_parser_map.get(chosen) if action is not None and isinstance(chosen, str) else None
            if nested is None:
                break
            parser = nested
        return parser

    def _missing(self, name: str) -> str:
        """A missing argument as a user reads it: a subcommand or a positional by its choices, not
        argparse's dest name."""
        for action in self._actions:
            if action.choices and not action.option_strings and name in (action.dest, action.metavar):
                what = "the subcommand" if isinstance(action, argparse._SubParsersAction) else name
                return f"{what}, one of {', '.join(action.choices)}"
        return name


def _more_sources(parser: argparse.ArgumentParser, ns, extras: list[str]) -> bool:
    """Sources given after an option (`tmplkit audit a.jinja -j 2 b.jinja`): argparse takes a list
    of positionals in one run, and leaves the rest over; they join that list, in the order given.
    False where `extras` are not all such (an unknown option among them)."""
    action = next((a for a in parser._actions if not a.option_strings and a.nargs in ("*", "+")), None)
    if action is None or not isinstance(getattr(ns, action.dest, None), list):
        return False
    if any(e.startswith("-") and e != "-" for e in extras):
        return False
    getattr(ns, action.dest).extend(extras)
    return True


class _Subcommands(argparse._SubParsersAction):
    """The subcommands of `_COMMANDS`, each listed at once and built when it is parsed (`load`)."""

    def declare(self, name: str, help: str) -> None:
        self._choices_actions.append(self._ChoicesPseudoAction(name, (), help))
        self._name_parser_map[name] = None  # a placeholder: `load` puts the parser here

    def load(self, name: str) -> argparse.ArgumentParser:
        """The parser of subcommand `name`, built by its module on first use."""
        parser = self._name_parser_map[name]
        if parser is not None:
            return parser
        module, add, _ = _COMMANDS[name]
        order = list(self._name_parser_map)
        del self._name_parser_map[name]  # the module's add_parser puts the real one in
        getattr(importlib.import_module(module, __package__), add)(self)
        for key in order:  # back in the declared order: an error's list of choices keeps it
            self._name_parser_map[key] = self._name_parser_map.pop(key)
        parser = self._name_parser_map[name]
        for each in _subcommand_parsers(parser):
            # After the subcommand too (and after `server log`, `session generate`); SUPPRESS keeps a
            # value given before it.
            _add_global_options(each, defaults=False)
            # (which arguments are options and which positional: messages name them as the help does)
            options: dict = {}
            for a in each._actions:
                if a.option_strings:
                    options[a.dest] = options.get(a.dest, ()) + tuple(a.option_strings)
            positionals = {a.dest: a.metavar or a.dest.upper() for a in each._actions
                           if not a.option_strings and not isinstance(a, argparse._SubParsersAction)}
            each.set_defaults(_options=options, _positionals=positionals)
        return parser

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        self.load(values[0])  # argparse has checked that values[0] is a subcommand's name
        before = dict(namespace.__dict__.get("_given", {}))  # (the subcommand's namespace replaces it)
        super().__call__(parser, namespace, values, option_string)
        after = namespace.__dict__.setdefault("_given", {})
        for dest, (first, shown, meant) in before.items():
            # a global option given before the subcommand and again after it, with another value
            if dest in after and after[dest][2] != meant:
                again, other, _ = after[dest]
                raise argparse.ArgumentError(None, f"{again} given twice ({shown} and {other}); give it once")
            after.setdefault(dest, (first, shown, meant))


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The `tmplkit` parser; `lazy`: each subcommand built only when it is parsed (what `main` uses),
    else all of them now."""
    parser = _Parser(
        prog="tmplkit", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Chat-template boundary analysis: derive role delimiters, detect spans, drive checkpointing prefill.",
        epilog="exit codes:\n" + "\n".join(f"  {code:<4} {what}" for code, what in EXIT_CODES.items()))
    parser.add_argument("--version", action="version", version=f"tmplkit {__version__}")
    _add_global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, action=_Subcommands)
    assert isinstance(sub, _Subcommands)
    for name, (_, _, help) in _COMMANDS.items():
        sub.declare(name, help)
    if not lazy:
        for name in _COMMANDS:
            sub.load(name)
    return parser


def _subcommand_parsers(parser: argparse.ArgumentParser):
    """A subcommand's parser and its nested ones (`server log`)."""
    yield parser
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction):
            for nested in action.choices.values():
                yield from _subcommand_parsers(nested)


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


def _refuse_contradictions(argv: list[str], args) -> None:
    """-q with -v, --config with --no-config: the last would win silently (-q and -v share one
    setting, given at either level: `tmplkit -q audit -v`); no subcommand has a -q or -v of its own."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    said = {w for w in words if w in ("-q", "--quiet", "-v", "--verbose")}
    said |= {f"-{c}" for w in words if w.startswith("-") and not w.startswith("--") and w[1:].isalpha() for c in w[1:]
             if c in "qv"}
    if {"-q", "--quiet"} & said and {"-v", "--verbose"} & said:
        raise InputError("-q (--quiet) and -v (--verbose) contradict each other; give one")
    if getattr(args, "config", None) is not None and getattr(args, "no_config", False):
        raise InputError("--config FILE and --no-config contradict each other; give one")
    # An option given '' (a shell variable left unset): its default would be used silently
    # (`--server ''` ran the pinned llama-server); -o '' has its own line (cli._outputs).
    options = getattr(args, "_options", None) or {}
    for dest in sorted(options):
        value = getattr(args, dest, None)
        if dest != "output" and (value == "" or isinstance(value, list) and "" in value):
            flag = ([o for o in options[dest] if any(w == o or w.startswith(o + "=") for w in words)] or options[dest])[-1]
            what = "the path is empty; give a file path" if flag in ("-o", "--output") else "the value is empty; give one"
            raise InputError(f"{flag} '': {what}, or leave the option out")  # (lock's -o: its --lock)
    # A positional given '' reads as the current folder (`tmplkit audit "$DIR"`, DIR unset, audited it)
    for dest, shown in (getattr(args, "_positionals", None) or {}).items():
        value = getattr(args, dest, None)
        if value == "" or isinstance(value, list) and "" in value:
            raise InputError(f"{shown} '': the argument is empty; give one")


def _say(line: str) -> None:
    """The one line of an error, on one line whatever the message holds (a template's raise_exception
    text, a name with a newline: escaped), and never a second failure where stderr cannot be
    written (2>/dev/full): the exit code says it."""
    try:
        print(error_line(line), file=sys.stderr)
    except (OSError, ValueError):
        pass


class _Stdout:
    """Standard output as the commands write it: a failed write (a full disk, /dev/full) is one
    line naming standard output, not a folder; a closed one (`>&-`) too; a name that is no UTF-8
    (a file name's undecodable bytes) is written escaped (`printable`), never a traceback; a reader
    that stops reading ends nothing: the command's exit code stands. After a failure the descriptor
    is pointed at /dev/null, so that Python's flush at exit does not fail again."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:
            raise InputError("standard output is closed; redirect it (> FILE) or give -o FILE")
        try:
            return self._stream.write(printable(text))
        except OSError as exc:
            self._fail(exc)
            if isinstance(exc, BrokenPipeError):
                return len(text)
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
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass
        if isinstance(exc, BrokenPipeError):
            # The reader stopped reading (`| head -1`, `| grep -q`): the rest goes nowhere and the
            # command ends with its own exit code (a failing audit still exits 1).
            return
        raise InputError(f"cannot write standard output ({exc.strerror or exc}); check where it goes (a full "
                         "disk?) or give -o FILE") from None


def main(argv: list[str] | None = None) -> int:
    with raise_lost_interrupts():  # (a Ctrl-C Python would print as "Exception ignored" and lose)
        return _main(argv)


def _with_advice(exc: TmplkitError, args) -> str:
    """`exc`'s message, and what to do where it says only what the template said: a template's own
    refusal (its raise_exception) of the user's conversation, or its failure on it (a TypeError
    where it adds a string to content given as parts, a key its messages lack)."""
    from ..errors import RenderError, RenderLimitError

    # (not a limit, and not an engine's refusal: those say what to do themselves)
    if isinstance(exc, RenderError) and not isinstance(exc, RenderLimitError) and not exc.engine_refusal \
            and getattr(args, "session", None):
        # (before the template's words, which end the line as they do in every other error)
        return f"{REFUSED if exc.template_raised else BROKE}: {exc}"
    return str(exc)


def _main(argv: list[str] | None) -> int:
    stdout = sys.stdout
    args = None
    if sys.stderr is None:  # closed (2>&-): progress and errors go nowhere, the work and its exit code stand
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    hold_notes(True)  # (an old spelling's note is said once the work is done; an error is the one line)
    try:  # the parser too: a Ctrl-C while it is built is still one line
        restore_default()  # from here, Ctrl-C is a KeyboardInterrupt caught below (see tmplkit._interrupt)
        sys.stdout = _Stdout(stdout)
        args = build_parser(lazy=True).parse_args(argv)
        _refuse_contradictions(sys.argv[1:] if argv is None else argv, args)
        check_outputs(args)  # a path that cannot be written is refused before the work, not after it
        refuse_found_configuration(args)  # (the project's settings, whether this command reads them or not)
        if getattr(args, "config", None) is not None:
            # A file the user named is read by every command, whichever of its settings it uses:
            # a missing or broken one is an error here too, never ignored.
            from ._common import config_of

            config_of(args)
        from ..sandbox import hints_for  # here, not at the top: --version and --help load no layer
        from ..sources.templates import watching_loads

        # Limit messages name the flags a command-line user can change; an output that is a file a
        # source read, which only loading shows, is refused then (cli._outputs).
        # SIGTERM (`timeout`, CI cancelling a job) unwinds as a Ctrl-C does, in every command: its
        # default ended the process at once, silently (143), the workers' forkserver folder left in
        # $TMPDIR and a command's temporary files with it.
        with hints_for("cli"), watching_loads(partial(refuse_loaded_outputs, args)), unwind_on_sigterm():
            code = int(args.func(args) or 0)
        for note in hold_notes(False):  # (the work was done, whatever it found: `turns` exits 2 where a template refuses)
            _say(note)
        sys.stdout.flush()  # a standard output that cannot be written is told here, not at Python's exit
        return code
    except TmplkitError as exc:
        _say(f"tmplkit: error: {_with_advice(exc, args)}")
        return exc.exit_code
    except KeyboardInterrupt:
        forget_unhandled_interrupt()  # (handled here: the process exits 130, not by the signal)
        _say("tmplkit: interrupted")
        return 130
    except BrokenPipeError as exc:  # (a pipe other than standard output: standard output's is _Stdout's)
        _say(f"tmplkit: error: a pipe the command wrote to was closed ({exc.strerror or exc}); nothing more was done")
        return 2
    except OSError as exc:  # the environment (a folder that cannot be written, a full disk), not a bug
        where = f"{exc.filename}: " if exc.filename else ""
        _say(f"tmplkit: error: {where}{exc.strerror or exc}; check that the folder exists and can be written "
             "(the cache folder is $TMPLKIT_CACHE)")
        return 2
    finally:
        hold_notes(False)  # (dropped where the command line was refused: the error is the one line)
        sys.stdout = stdout
        install_early_handler()  # a Ctrl-C while Python shuts down (its atexit work): one line, exit 130 too
