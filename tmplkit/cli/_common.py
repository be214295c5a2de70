"""Helpers the subcommands share: loading sources, progress, writing output, checking options,
the global options (verbosity, colour, configuration) and the optional extras a command needs."""

from __future__ import annotations

import importlib.util
import json
import sys

from ..environment import no_color, terminal_is_dumb
from ._once import BooleanOnce, StoreOnce, one_path, say_note
from ._outputs import printable
from ._terminal import ProgressLine

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def load_templates(sources_: list[str], name: str | None = None, *, config=None):
    """The templates of `sources_`; with `name` (--name), only those of that name. `config`: the
    Config the sources came from (an error loading one names its file)."""
    from ..sources.templates import load_many, select_named
    from .config import from_config

    with from_config(getattr(config, "path", None), "sources", config is not None):
        templates = load_many(sources_)
    return select_named(templates, name, sources_)


def configured_templates(args, cfg):
    """The templates of the SOURCE arguments, else of the configuration's sources (audit, table, lock)."""
    from ..errors import InputError

    if args.sources:
        return load_templates(args.sources, args.name)
    if cfg.sources:
        return load_templates(list(cfg.sources), args.name, config=cfg)
    where = f" (none in {cfg.path})" if cfg.path else ""
    raise InputError(f"no template sources given{where}; give SOURCE arguments or set "
                     "'sources' in [tool.tmplkit] of pyproject.toml or in tmplkit.toml")


# ---- options every command that has them declares alike -----------------------------------------------

def add_format(parser, choices, default: str | None, what: str = "the output", *, aliases: dict | None = None,
               default_help: str | None = None) -> None:
    """--format FORMAT, its choices and default shown in --help; `aliases`: old names of values,
    still accepted (`format_of` notes them and gives the new one). `text` is the format for a person
    in every command: where that is a markdown table, `text` is its other name (`text_is_markdown`)."""
    # (an old name given with its new one is one value: `--format table --format markdown`)
    meaning = (lambda value: aliases.get(value, value)) if aliases else None
    named = text_names_markdown(choices)
    shown = [f"{c} (or text)" if c == "markdown" and named else c for c in choices]
    synonym = {"type": text_is_markdown} if named else {}
    parser.add_argument("--format", choices=[*choices, *(aliases or {})], default=default, metavar="FORMAT",
                        help=f"{what}'s format: {', '.join(shown)} (default: {default_help or default})",
                        **synonym, **({"action": StoreOnce, "meaning": meaning} if meaning else {}))
    if aliases:
        add_format_aliases(parser, aliases)


def text_names_markdown(formats) -> bool:
    """Whether `text` is another name of `markdown` among a command's `formats` (it has no text
    report of its own)."""
    return "markdown" in formats and "text" not in formats


def quiet_text(args) -> bool:
    """Whether the report is cut to what went wrong: -q, on a text report bound for the terminal (a
    data format, or a report written to -o, is written whole)."""
    return verbosity(args) < 0 and args.format == "text" and not args.output


def text_is_markdown(value: str) -> str:
    """A --format value of a command whose report for a person is a markdown table: `text` names it,
    as in the commands whose report is lines (one word for "a person reads it" in every command)."""
    return "markdown" if value == "text" else value


def add_output(parser, what: str = "the output") -> None:
    """-o/--output FILE, written atomically."""
    # (`-o a.txt -o ./a.txt` names one file, as does a link to it: one value, as the lock's are)
    parser.add_argument("-o", "--output", metavar="FILE", action=StoreOnce, meaning=one_path,
                        help=f"write {what} to FILE (atomically) instead of stdout")


def add_name(parser, many: bool = False) -> None:
    """--name: which template of the source (one-template commands) or which templates of the sources."""
    parser.add_argument("--name", help="only the templates of this name (e.g. a GGUF's 'tool_use')" if many
                        else "which template of the source (default: its default one; needed where it holds several and none is)")


def progress_printer(enabled: bool):
    """A progress callback for the audit on stderr (`ProgressLine`: a line per template on a dumb
    terminal, one line rewritten elsewhere, the last kept), or None."""
    if not enabled:
        return None
    line = ProgressLine(True, keep=True)

    def report(done: int, total: int, analysis) -> None:
        line.step(done, total, analysis.name)
        if done == total:
            line.close()

    return report


def json_compact(obj, indent: str = " ", _level: int = 0) -> str:
    """JSON with objects one key a line but arrays of numbers, strings and booleans on one line:
    a mask's token ids, flags and offsets read as rows, not as one value a line.

    >>> print(json_compact({"ids": [1, 2], "turns": [{"a": [0, 5]}]}))
    {
     "ids": [1, 2],
     "turns": [
      {
       "a": [0, 5]
      }
     ]
    }
    """
    pad, inner = indent * _level, indent * (_level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {json_compact(v, indent, _level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) and x and not _flat(x) for x in obj):
        return "[\n" + ",\n".join(inner + json_compact(x, indent, _level + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def _flat(x) -> bool:
    """A list of scalars (kept on one line inside a list of lists: offsets)."""
    return isinstance(x, list) and all(not isinstance(y, (dict, list)) for y in x)


def emit(text: str, output: str | None) -> None:
    """Print, or write the file atomically (the old file stays whole if we are interrupted)."""
    emit_all([(text, output)])


def emit_all(outputs: list[tuple[str | bytes, str | None]]) -> None:
    """`emit` of several (text, output): the files all or none (`atomic.write_outputs`: a report
    that cannot be written leaves the others as they were), then standard output. Bytes (a plot)
    are written as they are, to a file only."""
    from ..atomic import write_outputs

    write_outputs([(output, text if isinstance(text, bytes) else printable(text)) for text, output in outputs if output])
    for text, output in outputs:
        if not output and isinstance(text, str):
            sys.stdout.write(printable(text))


def model_template(args, model):
    """The template --template and --name give for a model (None: the model GGUF's default own one)."""
    from ..sources.templates import load_one

    if args.template is None and args.name is None:
        return None
    return load_one(args.template or model, args.name)


def result_text(result, fmt: str) -> str:
    """A result with `to_markdown()` and `to_dict()`, as markdown or JSON."""
    return result.to_markdown() if fmt == "markdown" else json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n"


def verbosity(args) -> int:
    """-1 with --quiet, 1 with --verbose, else 0."""
    return getattr(args, "verbosity", 0) or 0


def use_color(args, stream) -> bool:
    """Colour on `stream`: --color always/never decide; auto colours a terminal unless NO_COLOR
    (https://no-color.org) is set to a non-empty value or TERM is dumb."""
    mode = getattr(args, "color", "auto") or "auto"
    if mode != "auto":
        return mode == "always"
    if no_color() or terminal_is_dumb():
        return False
    return stream.isatty()


def config_of(args):
    """The configuration that applies: --config FILE, none with --no-config, else the one found
    from the current folder (tmplkit.cli.config). Loaded once per run."""
    from .config import Config, load_config

    if getattr(args, "_config", None) is None:
        args._config = Config() if getattr(args, "no_config", False) else load_config(getattr(args, "config", None))
        _refuse_configured_outputs(args, args._config)
    return args._config


def _refuse_configured_outputs(args, cfg) -> None:
    """An output that is the configuration or a file it names is refused, as one the command line
    names is (the `lock` command writes the configuration's lock: that one is its output)."""
    from ._outputs import refuse_reading_outputs

    if cfg.path is None:
        return
    writes_lock = getattr(args, "_writes_lock", False)
    reads = [("the configuration", str(cfg.path))]
    tokenizers: list[tuple[str, str]] = []
    for key, value in cfg.files:
        if key == "lock" and writes_lock:
            continue
        is_tokenizer = key == "tokenizer" or key.startswith("tokenizers.")  # (a folder reads its tokenizer.json)
        (tokenizers if is_tokenizer else reads).append((f"'{key}' in {cfg.path}", value))
    refuse_reading_outputs(args, reads, tokenizers=tokenizers)


# The optional extras: (module, extra, what it is), for one-line refusals before any work.
EXTRAS = {
    "llama": ("llama_cpp", "llama", "llama-cpp-python"),
    "hf": ("tokenizers", "vocab", "the Hugging Face tokenizers package"),
}


def require_extra(name: str, needed_by: str) -> None:
    """Refuse at once, on one line, when the optional extra `name` is not installed."""
    from ..errors import InputError

    module, extra, what = EXTRAS[name]
    if importlib.util.find_spec(module) is None:
        raise InputError(f"{needed_by} needs {what}, which is not installed; "
                         f"install the '{extra}' extra: pip install 'tmplkit[{extra}]'")


def require_tokenizers(specs, needed_by: str) -> None:
    """Refuse at once when any of the tokenizer `specs` needs an extra that is not installed
    (`TokenizerSpec.extra`)."""
    from ..tokens.tokenizers import TokenizerSpec

    for extra in sorted({TokenizerSpec.parse(s).extra for s in specs if s} - {""}):
        require_extra(extra, needed_by)


def positive(value, flag: str):
    from ..errors import InputError

    if value is not None and not 0 < value < float("inf"):  # also refuses nan; inf as the configuration does
        what = "a positive whole number" if isinstance(value, int) else "a positive finite number"
        raise InputError(f"{flag} must be {what}, got {value}")
    return value


def memory_mb(value, flag: str = "--memory"):
    """A worker's memory in MiB, within the workers' own range (`auditing.workers.check_memory`),
    refused naming the flag."""
    from ..auditing.workers import MAX_MEMORY_MB, MIN_MEMORY_MB
    from ..errors import InputError

    value = positive(value, flag)
    if value is not None and not MIN_MEMORY_MB <= value <= MAX_MEMORY_MB:
        raise InputError(f"{flag} is MiB a worker may allocate, at most {MAX_MEMORY_MB} (a petabyte) and at least "
                         f"{MIN_MEMORY_MB}, got {value}")
    return value


def refuse_worker_options_in_process(args) -> None:
    """--in-process runs no worker (render limits only): a -j, --timeout or --memory given with it
    was silently ignored; refused (the configuration's limits are for worker runs, and stay unused)."""
    from ..errors import InputError

    if not getattr(args, "in_process", False):
        return
    given = [flag for flag, dest in (("--jobs", "jobs"), ("--timeout", "timeout"), ("--memory", "memory"))
             if getattr(args, dest, None) is not None]
    if given:
        raise InputError(f"{', '.join(given)} with --in-process: it runs no worker (one template at a time, under the "
                         f"render limits only), so {'they' if len(given) > 1 else 'it'} would be ignored; leave "
                         f"{'them' if len(given) > 1 else 'it'} out or drop --in-process")


def at_least(value, minimum, flag: str):
    """Refuse `value` below `minimum` naming the flag (the library names its parameter)."""
    from ..errors import InputError

    if value is not None and not value >= minimum:
        raise InputError(f"{flag} must be at least {minimum}, got {value}")
    return value


# ---- llama.cpp's settings, as llama-server names them ---------------------------------------------------

# The option of each `PrefillSettings` field a command may offer, declared once (`prefill` offers
# them all, `replay` all but --checkpoints: it compares where its settings take them): the field,
# its flags and argparse's keywords. Defaults are the settings' own unless the command gives its
# own (`add_llama_options(..., n_ctx=65536)`).
_CHECKPOINTS = {"auto": None, "on": True, "off": False}
_LLAMA_OPTIONS: dict[str, tuple[tuple[str, ...], dict]] = {
    "n_ctx": (("-c", "--ctx-size"), {"type": int, "help": "context size in tokens, 1 to 2147483647 and what the machine's "
                                                          "memory holds (default {default})"}),
    "n_batch": (("-b", "--batch-size"), {"type": int, "help": "tokens a decode call takes at most, 1 to 2147483647; "
                                                             "cut to -c, as llama.cpp does (default {default})"}),
    "n_ubatch": (("-ub", "--ubatch-size"), {"type": int, "help": "tokens llama.cpp computes at once, 1 to 2147483647; "
                                                                "cut to -b (default {default})"}),
    "n_threads": (("-t", "--threads"), {"type": int, "help": "CPU threads, 1 to 512; 0: every core (the default)"}),
    "n_gpu_layers": (("-ngl", "--n-gpu-layers"), {"type": int, "help": "layers offloaded to a GPU; -1: every layer "
                                                                      "(default {default})"}),
    "flash_attn": (("-fa", "--flash-attn"), {"choices": "FLASH_ATTN", "help": "flash attention (default {default})"}),
    "cache_type_k": (("-ctk", "--cache-type-k"), {"metavar": "TYPE", "help": "the K cache's type: CACHE_TYPES (default {default})"}),
    "cache_type_v": (("-ctv", "--cache-type-v"), {"metavar": "TYPE", "help": "the V cache's type: CACHE_TYPES (default {default}); "
                                                                             "quantized only with flash attention"}),
    "swa_full": (("--swa-full",), {"action": "store_true", "help": "full-size sliding-window cache (can roll back: no checkpoints)"}),
    "repack": (("-nr", "--no-repack"), {"action": "store_true", "dest": "no_repack",
                                        "help": "do not repack weights (default: repack unless the CPU has AMX)"}),
    "poll": (("--poll",), {"type": int, "help": "threadpool polling level 0-100, as llama-server's (default {default})"}),
    "checkpoints": (("--checkpoints",), {"choices": list(_CHECKPOINTS), "help": "auto: exactly when the model cannot roll its memory back"}),
    "max_checkpoints": (("-ctxcp", "--ctx-checkpoints"), {"type": int, "help": "checkpoints kept at most, 0 to 2147483647 "
                                                                              "(0: none, --checkpoints off) (default "
                                                                              "{default}); not with --checkpoints off"}),
    "checkpoint_min_step": (("-cms", "--checkpoint-min-step"), {"type": int, "help": "tokens between two checkpoints at "
                                                                                    "least, 0 to 2147483647 (default "
                                                                                    "{default}); not with "
                                                                                    "--checkpoints off"}),
}
# The options that shape checkpoints: one given with --checkpoints off, which takes none, is
# refused rather than ignored.
_CHECKPOINT_SHAPE = ("max_checkpoints", "checkpoint_min_step")


def add_llama_options(parser, without=(), **defaults) -> None:
    """The group "llama.cpp settings (llama-server's names)" for every `PrefillSettings` field but
    those `without`, with `defaults` over the settings' own; `prefill_settings(args)` reads them back."""
    import dataclasses

    from ..server_rules import CACHE_TYPES, FLASH_ATTN, PrefillSettings

    own = {f.name: f.default for f in dataclasses.fields(PrefillSettings)}
    group = parser.add_argument_group("llama.cpp settings (llama-server's names)")
    names = tuple(n for n in _LLAMA_OPTIONS if n not in without)
    for name in names:
        flags, kwargs = _LLAMA_OPTIONS[name]
        kwargs = dict(kwargs)
        default = defaults.get(name, own[name])
        if name == "checkpoints":  # its choices name the settings' None, True, False
            default = next(k for k, v in _CHECKPOINTS.items() if v == default)
        if name == "repack":  # a flag that turns it off; without it, the settings' rule (prefill_settings)
            default = False
        if kwargs.get("choices") == "FLASH_ATTN":
            kwargs["choices"] = list(FLASH_ATTN)
        if "help" in kwargs:
            kwargs["help"] = kwargs["help"].format(default=default).replace("CACHE_TYPES", ", ".join(CACHE_TYPES))
        if name in _CHECKPOINT_SHAPE and "checkpoints" not in names:  # (replay: no such option)
            kwargs["help"] = (kwargs["help"].replace("; not with --checkpoints off", "")
                              .replace("0 to 2147483647 (0: none, --checkpoints off)", "1 to 2147483647"))
        group.add_argument(*flags, default=default, **({"dest": name} | kwargs))
    parser.set_defaults(_llama_options=names)


def _checkpoint_options(given: dict, typed) -> None:
    """--checkpoints, -ctxcp and -cms as `PrefillSettings` takes them, in `given`: `-ctxcp 0` is no
    checkpoints, as llama-server reads it (prefill's --checkpoints off; replay, which compares where
    its settings take them, refuses it); a shape given where no checkpoints are taken is refused,
    not ignored. `typed`: the options the command line gave."""
    from ..errors import InputError
    from ..server_rules import PrefillSettings

    cap = given.get("max_checkpoints")
    if "checkpoints" not in given:  # (replay)
        if cap == 0:
            raise InputError("-ctxcp/--ctx-checkpoints 0 takes no checkpoints (llama-server's meaning), and replay "
                             "compares where its settings take them; give at least 1")
        return
    if cap is not None and cap < 0:
        raise InputError(f"-ctxcp/--ctx-checkpoints must be at least 0 (0: no checkpoints), got {cap}")
    given["checkpoints"] = _CHECKPOINTS[given["checkpoints"]]
    off = "--checkpoints off"
    if cap == 0:
        if given["checkpoints"] is True:
            raise InputError("-ctxcp 0 takes no checkpoints and --checkpoints on takes them; give one of the two")
        # (each option that takes none is named: dropping one of two would leave the other)
        off = "-ctxcp 0 and --checkpoints off" if given["checkpoints"] is False and "checkpoints" in typed else "-ctxcp 0"
        given["checkpoints"], given["max_checkpoints"] = False, PrefillSettings.max_checkpoints
    shaped = [name for name in _CHECKPOINT_SHAPE if name in given and name in typed and not (cap == 0 and name == "max_checkpoints")]
    if given["checkpoints"] is False and shaped:
        flags = " and ".join(_LLAMA_OPTIONS[n][0][0] for n in shaped)
        raise InputError(f"{flags} shape{'s' if len(shaped) == 1 else ''} the checkpoints, and {off} "
                         f"take{'' if ' and ' in off else 's'} none; leave {'it' if len(shaped) == 1 else 'them'} out "
                         f"or drop {off}")


def prefill_settings(args):
    """The `PrefillSettings` of the llama.cpp options `add_llama_options` added (the others: the
    settings' defaults)."""
    from ..errors import InputError
    from ..server_rules import PrefillSettings

    given = {name: getattr(args, name) for name in args._llama_options if name != "repack"}
    _checkpoint_options(given, getattr(args, "_given", {}))  # (the options on the command line: _once.remember_value)
    if "repack" in args._llama_options:
        given["repack"] = False if args.no_repack else None  # -nr: off; else the settings' rule (off on AMX CPUs)
    try:
        return PrefillSettings(**given)
    except InputError as exc:  # "n_batch must be ...": say it with the flag the user typed
        field, _, rest = str(exc).partition(" ")
        if field not in _LLAMA_OPTIONS:
            raise
        raise InputError(f"{'/'.join(_LLAMA_OPTIONS[field][0])} {rest}") from None


# ---- one vocabulary of options, declared once ------------------------------------------------------------

# Each thing a command takes has one spelling in every command that takes it (docs/cli.md lists
# this table; tests/test_cli_vocabulary.py holds every command's --help to it). An old spelling
# still works for a release, with a one-line note on stderr (`deprecated`).
VOCABULARY: dict[str, tuple[str, str]] = {
    "template": ("SOURCE", "the chat template: a .gguf, .jinja, tokenizer_config.json, chat_template.json, folder, "
                           "hf:org/name[@rev], corpus:NAME or -; the positional SOURCE where templates are what the "
                           "command reads, --template SOURCE where it reads a model or a log (prefill, replay, server log)"),
    "name": ("--name NAME", "which template of a source (a GGUF's 'tool_use', ...)"),
    "session": ("--session FILE", "the conversation or agent session: messages JSON (a list, or {messages, tools}; "
                                  "or the Responses API or Anthropic Messages body an agent sends), - for standard "
                                  "input"),
    "tokenizer": ("--tokenizer PATH|auto", "a .gguf (vocab-only is enough), tokenizer.json or its folder, vocab:NAME "
                                           "or hf:org/name; auto: the template's own GGUF or the corpus vocabulary "
                                           "paired with its name"),
    "format": ("--format FORMAT", "named for what it writes: text (for a person, in every command; where that is a markdown "
                               "table, text names it; summary: the audit on one screen), markdown, json, csv, junit, github"),
    "output": ("-o/--output FILE", "write the output to FILE instead of stdout"),
    "report": ("--report FORMAT:FILE", "also write the output in FORMAT to FILE, from the same run (repeatable)"),
    "timeout": ("--timeout SECONDS", "wall-clock seconds per template"),
    "memory": ("--memory MB", "MiB a template's worker may allocate beyond its start-up footprint"),
    "settings": ("--settings LIST", "the serving settings to simulate (turns), replay on a model (replay) or prefill "
                                   "(prefill), comma-separated: llama-server, tmplkit, divergence-aware (and in replay none, "
                                   "every-user-start; the full-attention bound is always there); prefill's are its batch "
                                   "policies: none, every-user-start, gated, divergence-aware"),
    "generation prompt": ("--generation-prompt / --no-generation-prompt",
                          "render with (or without) the generation prompt that asks for the next turn"),
    "global": ("-q/--quiet, -v/--verbose, --color, --config, --no-config",
               "before or after any command and subcommand"),
}

_REMOVED_IN = "0.4"


def deprecation_note(old: str, new: str) -> None:
    """The one line on stderr an old spelling of an option prints (said once the work is done where
    `tmplkit` runs it: `_once.hold_notes`)."""
    say_note(f"tmplkit: note: {old} is deprecated (it goes in {_REMOVED_IN}); use {new}")


def deprecated(parser, *flags: str, new: str, dest: str, convert=None, append: bool = False, **kwargs) -> None:
    """An old spelling of an option: accepted, hidden from --help, and noted on stderr when used.
    `convert(value)` makes the value the new option's (e.g. a FILE into ("json", FILE))."""
    import argparse

    class _Old(argparse.Action):
        def __call__(self, parser_, namespace, values, option_string=None):
            deprecation_note(option_string or flags[0], new)
            value = self.const if self.nargs == 0 else values
            value = convert(value) if convert is not None else value
            if not append:  # (given with the new spelling too, another value is refused: cli._once)
                from ._once import remember_value

                remember_value(self, namespace, value, option_string, flag=self.nargs == 0)
            if append:  # an old spelling of a repeatable option (--json FILE of --report FORMAT:FILE)
                setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), value])
            else:
                setattr(namespace, self.dest, value)

    if kwargs.get("action") == "store_true":
        kwargs.pop("action")
        kwargs.update(nargs=0, const=True)
    parser.add_argument(*flags, dest=dest, action=_Old, help=argparse.SUPPRESS, **kwargs)


def add_template_option(parser, *, required: bool = False, what: str = "the chat template") -> None:
    """--template SOURCE, for commands whose positional argument is a model or a log."""
    parser.add_argument("--template", metavar="SOURCE", required=required,
                        help=f"{what}: a .gguf, .jinja, tokenizer_config.json, folder or hf:org/name")


def add_template_argument(parser, *, old_template: bool = False) -> None:
    """The positional SOURCE of a one-template command; `old_template`: the command used to take
    --template SOURCE and its conversation positionally (see `template_and_session`)."""
    parser.add_argument("source", metavar="SOURCE", nargs="?" if old_template else None,
                        help="the chat template: a .gguf, .jinja, tokenizer_config.json, folder, hf:org/name or -")
    if old_template:
        parser.add_argument("--template", dest="old_template", metavar="SOURCE", help=_suppress())
        parser.needed_positionals = ("SOURCE",)  # (optional only for the old spelling's sake)


def _suppress():
    import argparse

    return argparse.SUPPRESS


def add_session_option(parser, *, required: bool = False, what: str = "the conversation",
                       old_positional: str | None = None) -> None:
    """--session FILE; `old_positional` (a metavar): the command used to take it positionally,
    which still works with a note."""
    parser.add_argument("--session", metavar="FILE", default=None,
                        help=f"{what}: messages JSON (a list, or {{messages, tools}}; or the Responses API or "
                             "Anthropic Messages body an agent sends, read as llama-server converts it), - for "
                             "standard input"
                             + ("" if required or old_positional else "; optional"))
    if old_positional:
        parser.add_argument("old_session", metavar=old_positional, nargs="?", help=_suppress())
    parser.set_defaults(_session_required=required)


def session_of(args, command: str) -> str | None:
    """--session, or the old positional conversation (noted on stderr); an InputError when the
    command needs one and none was given."""
    from ..errors import InputError

    old = getattr(args, "old_session", None)
    if old is not None:
        if args.session is not None:
            raise InputError(f"give the conversation once: --session {args.session} (not also {old})")
        deprecation_note(f"the conversation as a positional argument ({old})", f"--session {old}")
        args.session = old
    if args.session is None and getattr(args, "_session_required", False):
        raise InputError(f"tmplkit {command} needs --session FILE (the conversation: messages JSON)")
    return args.session


def template_and_session(args, command: str) -> tuple[str, str | None]:
    """SOURCE and --session of a command that used to take `--template SOURCE CONVERSATION`:
    the old form still works, noted on stderr."""
    from ..errors import InputError

    if getattr(args, "old_template", None) is not None:
        deprecation_note(f"tmplkit {command} --template SOURCE CONVERSATION",
                         f"tmplkit {command} SOURCE --session CONVERSATION")
        if args.source is not None and args.session is None:
            args.session = args.source  # the old positional was the conversation
        elif args.source is not None:
            raise InputError(f"give the template once: SOURCE or --template {args.old_template}")
        args.source = args.old_template
    if args.source is None:
        raise InputError(f"tmplkit {command} needs SOURCE, the chat template")
    if args.session is None and getattr(args, "_session_required", False):
        raise InputError(f"tmplkit {command} needs --session FILE (the conversation: messages JSON)")
    return args.source, args.session


def template_conversation_tokenizer(args, command: str, *, conversation: bool = True, check=None):
    """SOURCE, --session and --tokenizer of a command that renders one conversation in a worker
    (mask, spans, request), read in the order that fails fastest: the arguments (`check(session)`
    for a command's own rules), the tokenizer's extra, the conversation, the template, the
    tokenizer. (template, conversation or None, portable tokenizer)."""
    from ..session import load_conversation
    from ..sources.templates import load_one

    source, session = template_and_session(args, command)
    if check is not None:
        check(session)
    if args.tokenizer != "auto":
        require_tokenizers([args.tokenizer], f"tmplkit {command} --tokenizer " + args.tokenizer)  # before any work
    loaded = load_conversation(session) if conversation else None
    template = load_one(source, args.name)
    return template, loaded, worker_tokenizer(args, template, command)


def add_tokenizer(parser, *, required: bool = False, what: str = "the model's vocabulary") -> None:
    """--tokenizer PATH|auto."""
    parser.add_argument("--tokenizer", metavar="PATH|auto", required=required,
                        help=f"{what}: a .gguf (vocab-only is enough), tokenizer.json or its folder, vocab:NAME or "
                             "hf:org/name; auto: the template's own GGUF or the corpus vocabulary paired with its name")


def worker_tokenizer(args, template, command: str):
    """--tokenizer for `template` (`auto` resolved), checked for its extra, loaded, and made
    portable to the worker the template renders in (tmplkit.auditing.contained)."""
    from ..auditing.contained import portable_tokenizer
    from ..tokens.tokenizers import load_tokenizer

    spec = tokenizer_spec(args.tokenizer, template, args)
    require_tokenizers([spec], f"tmplkit {command} --tokenizer " + str(spec))
    return portable_tokenizer(load_tokenizer(spec), spec)


def tokenizer_spec(spec: str, template, args=None) -> str:
    """The tokenizer --tokenizer names for `template` (`auto` resolved: the configuration's pairing
    for its name, as the audit's, where `args` are given; else its GGUF or corpus vocabulary); an
    InputError when auto finds none."""
    from ..errors import InputError

    if spec != "auto":
        return spec
    from ..auditing import tokenizer_for

    pairing = config_of(args).tokenizers if args is not None else {}
    found = tokenizer_for(template.name, template.source, "auto", pairing)
    if found is not None and template.name in pairing:
        from ..tokens.tokenizers import locate_tokenizer
        from .config import from_config

        with from_config(config_of(args).path, f"tokenizers.{template.name}"):
            locate_tokenizer(found)
    if found is None:
        raise InputError(f"--tokenizer auto: no tokenizer known for template '{template.name}' (it is not from a .gguf "
                         "and no corpus vocabulary is paired with its name); give --tokenizer PATH, or pair it under "
                         "[tokenizers] in the configuration")
    if args is not None:  # (the file auto chose is an input the output must not replace, as a named one)
        from ._outputs import refuse_reading_outputs

        refuse_reading_outputs(args, [], tokenizers=[("the tokenizer --tokenizer auto chose", found)])
    return found


def add_limits(parser, *, timeout: float | None, memory: int | None) -> None:
    """--timeout SECONDS and --memory MB, the worker limits of a command that renders templates in
    workers; a None default is shown as the configuration's or tmplkit's."""
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help=f"wall-clock seconds per template (default {timeout:g})" if timeout else
                        "wall-clock seconds per template")
    parser.add_argument("--memory", type=int, default=None, metavar="MB",
                        help=f"MiB a worker may allocate beyond its start-up footprint (default {memory})" if memory else
                        "MiB a worker may allocate beyond its start-up footprint")


def add_generation_prompt(parser, *, default: bool, old: str | None = None) -> None:
    """--generation-prompt / --no-generation-prompt (both given: refused); `old`: an old flag that
    meant --generation-prompt."""
    parser.add_argument("--generation-prompt", dest="add_generation_prompt", default=default, action=BooleanOnce,
                        help="render with the generation prompt that asks for the next turn, or not "
                             f"(default: {'with' if default else 'without'})")
    if old:
        deprecated(parser, old, new="--generation-prompt", dest="add_generation_prompt", action="store_true")


def add_report_option(parser, formats, *, old_json: bool = False) -> None:
    """--report FORMAT:FILE (repeatable); `old_json`: the command's old --json FILE, kept as
    --report json:FILE with a note."""
    text = " or text" if text_names_markdown(formats) else ""
    parser.add_argument("--report", action="append", metavar="FORMAT:FILE", default=None,
                        help=f"also write the output in FORMAT ({', '.join(formats)}{text}) to FILE, from the same run "
                             "(repeatable)")
    if old_json:
        deprecated(parser, "--json", new="--report json:FILE", dest="report", metavar="FILE",
                   convert=lambda path: f"json:{path}", append=True)
    parser.set_defaults(_report_formats=tuple(formats))


def reports_of(args) -> list[tuple[str, str]]:
    """--report FORMAT:FILE, each (format, file), checked before any work."""
    from ..errors import InputError

    formats = getattr(args, "_report_formats", ())
    out = []
    for spec in args.report or ():
        fmt, sep, path = spec.partition(":")
        named = text_names_markdown(formats)
        fmt = text_is_markdown(fmt) if named else fmt
        if not sep or not path or fmt not in formats:
            raise InputError(f"--report {spec}: give FORMAT:FILE, FORMAT one of {', '.join(formats)}{' (or text)' if named else ''}")
        out.append((fmt, path))
    return out


def model_run_outputs(args) -> list[tuple[str, str]]:
    """The --report files of a command that runs a model (prefill, replay), with --output and
    --plot refused before the run, not after it (a path that cannot be written, no matplotlib)."""
    from ..atomic import check_writable
    from ..prefill.plot import require_matplotlib

    reports = reports_of(args)
    for out in (args.output, args.plot, *(path for _, path in reports)):
        if out:
            check_writable(out)
    if args.plot:
        require_matplotlib()
    return reports


def emit_model_run(result, args, reports: list[tuple[str, str]], png) -> None:
    """`result` to each --report file, `png(result)` (its plot, as PNG bytes) to --plot, and
    `result` to --output or stdout: the files all or none (`emit_all`), so that a report that
    cannot be written leaves the old plot as it was too."""
    plot: list[tuple[str | bytes, str | None]] = [(png(result), args.plot)] if args.plot else []
    emit_all([*plot, *((result_text(result, fmt), path) for fmt, path in [*reports, (args.format, args.output)])])


def add_format_aliases(parser, aliases: dict[str, str]) -> None:
    """Old names of --format values (e.g. table -> markdown), accepted with a note."""
    parser.set_defaults(_format_aliases=aliases)


def format_of(args) -> str:
    """--format, an old name of a value replaced by the new one (noted on stderr)."""
    fmt = args.format
    new = getattr(args, "_format_aliases", {}).get(fmt)
    if new is not None:
        deprecation_note(f"--format {fmt}", f"--format {new}")
        args.format = fmt = new
    return fmt


def add_settings_option(parser, known, default, note: str = "") -> None:
    """`--settings LIST` (VOCABULARY): comma-separated names among `known`."""
    parser.add_argument("--settings", metavar="LIST", default=",".join(default),
                        help=f"comma-separated, among {', '.join(known)} (default: {', '.join(default)}){note}")


def settings_of(args, known) -> tuple[str, ...]:
    """`--settings` (comma-separated names among `known`), checked: one vocabulary for the turns
    study and the replay."""
    from ..turns.cost import check_settings

    names = check_settings([n.strip() for n in args.settings.split(",") if n.strip()], known, "--settings")
    assert names is not None
    return tuple(dict.fromkeys(names))  # (a name given twice is run once)
