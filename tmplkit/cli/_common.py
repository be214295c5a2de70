"""Helpers the subcommands share: loading sources, progress, writing output, checking options,
the global options (verbosity, colour, configuration) and the optional extras a command needs."""

from __future__ import annotations

import importlib.util
import sys

from ..environment import no_color, terminal_is_dumb


def load_templates(sources_: list[str], name: str | None = None):
    """The templates of `sources_`; with `name` (--name), only those of that name."""
    from ..sources.templates import load_many, select_named

    return select_named(load_many(sources_), name, sources_)


# ---- options every command that has them declares alike -----------------------------------------------

def add_format(parser, choices, default: str, what: str = "the output") -> None:
    """--format, its choices and default shown in --help."""
    parser.add_argument("--format", choices=list(choices), default=default,
                        help=f"{what}'s format: {', '.join(choices)} (default: {default})")


def add_output(parser, what: str = "the output") -> None:
    """-o/--output FILE, written atomically."""
    parser.add_argument("-o", "--output", metavar="FILE", help=f"write {what} to FILE (atomically) instead of stdout")


def add_name(parser, many: bool = False) -> None:
    """--name: which template of the source (one-template commands) or which templates of the sources."""
    parser.add_argument("--name", help="only the templates of this name (e.g. a GGUF's 'tool_use')" if many
                        else "which template of the source (default: the first)")


def progress_printer(enabled: bool):
    """A progress callback for the audit on stderr, or None. Where the terminal cannot move the
    cursor (TERM=dumb) each step is a line of its own; elsewhere one line is rewritten."""
    if not enabled:
        return None
    rewrite = not terminal_is_dumb()

    def report(done: int, total: int, analysis) -> None:
        print(progress_text(done, total, analysis.name, rewrite=rewrite), end="\n" if done == total or not rewrite else "",
              file=sys.stderr, flush=True)

    return report


def progress_text(done: int, total: int, name: str, *, rewrite: bool) -> str:
    """'[done/total] name', with the escapes that clear the line before it when `rewrite`."""
    return ("\r\x1b[2K" if rewrite else "") + f"[{done}/{total}] {name[:60]}"


def emit(text: str, output: str | None) -> None:
    """Print, or write the file atomically (the old file stays whole if we are interrupted)."""
    from ._outputs import printable

    if output:
        from ..atomic import write_output

        write_output(output, printable(text))
    else:
        sys.stdout.write(printable(text))


def model_template(args, model):
    """The template --template and --name give for a model (None: the model GGUF's default own one)."""
    from ..sources.templates import load_one

    if args.template is None and args.name is None:
        return None
    return load_one(args.template or model, args.name)


def emit_result(result, fmt: str, output: str | None) -> None:
    """A result with `to_markdown()` and `to_dict()`, as markdown or JSON (`emit`)."""
    import json

    text = result.to_markdown() if fmt == "markdown" else json.dumps(result.to_dict(), indent=2, ensure_ascii=False) + "\n"
    emit(text, output)


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
    return args._config


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

    if value is not None and not value > 0:  # also refuses nan
        raise InputError(f"{flag} must be positive, got {value}")
    return value


def at_least(value, minimum, flag: str):
    """Refuse `value` below `minimum` naming the flag (the library names its parameter)."""
    from ..errors import InputError

    if value is not None and not value >= minimum:
        raise InputError(f"{flag} must be at least {minimum}, got {value}")
    return value


# ---- llama.cpp's settings, as llama-server names them ---------------------------------------------------

# The option of each `PrefillSettings` field a command may offer, declared once (`prefill` offers
# them all, `replay` some): the field, its flags and argparse's keywords. Defaults are the
# settings' own unless the command gives its own (`add_llama_options(..., n_ctx=65536)`).
_CHECKPOINTS = {"auto": None, "on": True, "off": False}
_LLAMA_OPTIONS: dict[str, tuple[tuple[str, ...], dict]] = {
    "n_ctx": (("-c", "--ctx-size"), {"type": int}),
    "n_batch": (("-b", "--batch-size"), {"type": int}),
    "n_ubatch": (("-ub", "--ubatch-size"), {"type": int}),
    "n_threads": (("-t", "--threads"), {"type": int}),
    "n_gpu_layers": (("-ngl", "--n-gpu-layers"), {"type": int}),
    "flash_attn": (("-fa", "--flash-attn"), {"choices": "FLASH_ATTN"}),
    "cache_type_k": (("-ctk", "--cache-type-k"), {}),
    "cache_type_v": (("-ctv", "--cache-type-v"), {}),
    "swa_full": (("--swa-full",), {"action": "store_true", "help": "full-size sliding-window cache (can roll back: no checkpoints)"}),
    "repack": (("-nr", "--no-repack"), {"action": "store_true", "dest": "no_repack",
                                        "help": "do not repack weights (default: repack unless the CPU has AMX)"}),
    "poll": (("--poll",), {"type": int, "help": "threadpool polling level 0-100, as llama-server's (default {default})"}),
    "checkpoints": (("--checkpoints",), {"choices": list(_CHECKPOINTS), "help": "auto: exactly when the model cannot roll its memory back"}),
    "max_checkpoints": (("-ctxcp", "--ctx-checkpoints"), {"type": int}),
    "checkpoint_min_step": (("-cms", "--checkpoint-min-step"), {"type": int}),
}


def add_llama_options(parser, names=None, **defaults) -> None:
    """The group "llama.cpp settings (llama-server's names)" for the `PrefillSettings` fields `names`
    (default: all), with `defaults` over the settings' own; `prefill_settings(args)` reads them back."""
    import dataclasses

    from ..server_rules import FLASH_ATTN, PrefillSettings

    own = {f.name: f.default for f in dataclasses.fields(PrefillSettings)}
    group = parser.add_argument_group("llama.cpp settings (llama-server's names)")
    for name in names or _LLAMA_OPTIONS:
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
            kwargs["help"] = kwargs["help"].format(default=default)
        group.add_argument(*flags, default=default, **({"dest": name} | kwargs))
    parser.set_defaults(_llama_options=tuple(names or _LLAMA_OPTIONS))


def prefill_settings(args):
    """The `PrefillSettings` of the llama.cpp options `add_llama_options` added (the others: the
    settings' defaults)."""
    from ..errors import InputError
    from ..server_rules import PrefillSettings

    given = {name: getattr(args, name) for name in args._llama_options if name != "repack"}
    if "checkpoints" in given:
        given["checkpoints"] = _CHECKPOINTS[given["checkpoints"]]
    if "repack" in args._llama_options:
        given["repack"] = False if args.no_repack else None  # -nr: off; else the settings' rule (off on AMX CPUs)
    try:
        return PrefillSettings(**given)
    except InputError as exc:  # "n_batch must be ...": say it with the flag the user typed
        field, _, rest = str(exc).partition(" ")
        if field not in _LLAMA_OPTIONS:
            raise
        raise InputError(f"{'/'.join(_LLAMA_OPTIONS[field][0])} {rest}") from None
