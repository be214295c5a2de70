"""The files a command will write, checked before it works: `-o/--output`, audit's `--report
FORMAT:FILE`, prefill's and replay's `--json` and `--plot`, lock's `--lock`. A missing folder, a
read-only file or a folder given as a file is refused on one line at once, not after the whole
analysis; so is an output that is one of the command's inputs (it would be replaced by what was read
from it; standard input redirected from it too), an output given twice (one of the two would be lost), standard input given twice, and an
output that is no template where a folder source would read it as one the next run."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import one_line

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

__all__ = ["BROKE", "REFUSED", "check_outputs", "error_line", "output_paths", "printable", "refuse_found_configuration",
           "refuse_loaded_outputs", "refuse_reading_outputs"]

# The options whose value is a file the command writes (argparse's dest names); `lock` where the
# command writes the lock (set_defaults(_writes_lock=True)), else it is read.
_FILE_OPTIONS = ("output", "json", "plot")
# The arguments that name template sources (argparse's dest names: SOURCE, --template, diff's A and
# B): a folder among them reads the files `sources.templates.folder_reads` says, new ones too.
_TEMPLATE_SOURCES = ("source", "sources", "template", "old_template", "old", "new")


# The files of a model folder that hold its templates as JSON (`sources.templates`' model folder).
_MODEL_JSON = ("tokenizer_config.json", "chat_template.json")


def _output_options(args) -> tuple[str, ...]:
    return _FILE_OPTIONS + (("lock",) if getattr(args, "_writes_lock", False) else ())


def output_paths(args) -> list[str]:
    """The paths `args` asks a command to write."""
    paths = [getattr(args, name, None) for name in _output_options(args)]
    for spec in getattr(args, "report", None) or ():  # audit's FORMAT:FILE (a bad spec is audit's to refuse)
        if isinstance(spec, str):
            paths.append(spec.partition(":")[2])
    return [p for p in paths if isinstance(p, str) and p]


def check_outputs(args) -> None:
    """Raise InputError (one line) for the first path of `output_paths(args)` that cannot be
    written, that is also an input, or that is given twice; and for standard input given twice.
    `-o -` is standard output (args.output becomes None)."""
    from ..atomic import check_writable
    from ..errors import InputError

    if getattr(args, "output", None) == "-":  # the usual spelling of standard output, not a file named "-"
        args.output = None
    if getattr(args, "output", None) == "":
        # (-o is required where a command writes a file only, as annotate does: `-o -` is its standard output)
        stdout = "-o -" if getattr(args, "_output_required", False) else "leave -o out"
        raise InputError(f"-o '': the path is empty; give a file path, or {stdout} to print to standard output")
    outputs = output_paths(args)
    if "-" in outputs:  # (only -o means standard output; elsewhere a file named "-" would be created)
        dash = next((name for name in _output_options(args) if getattr(args, name, None) == "-"), None)
        if dash == "lock":
            raise InputError("--lock -: a lock is a file the audit reads back; give a file path")
        option = f"{_flag(dash, args)} " if dash else "--report FORMAT:"
        raise InputError(f"{option}-: standard output is -o's (the main output); give a file path")
    for path in outputs:
        check_writable(path)
    _refuse_clashes(args, outputs)
    lock = getattr(args, "lock", None) if getattr(args, "_writes_lock", False) else None
    for path in outputs:
        if path != lock:  # (the lock `lock` writes says itself what it replaces: `require_replaceable`)
            refuse_binary(path, png=path == getattr(args, "plot", None))


# What a file that is no text begins with, by its first bytes: a model or an image, never a report.
_BINARY_KINDS = ((b"GGUF", "a GGUF model"), (b"\x89PNG", "a PNG image"), (b"PK\x03\x04", "a zip archive"))


def refuse_binary(path: str, *, png: bool = False) -> None:
    """InputError where `path` is a file that holds no text (a GGUF model, a PNG where the output is
    no plot, any file with a NUL byte in its first 4 KiB): a report written over it was never meant
    (`-o model.gguf` replaced a 25 MB model with a page of text). A plot (`png`) replaces a PNG."""
    import os
    import stat

    from ..errors import InputError

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return  # (check_writable says what is wrong with a path it cannot write)
    kind = next((what for magic, what in _BINARY_KINDS if head.startswith(magic)), None if b"\0" not in head else
                "a binary file")
    if kind is None or (png and kind == "a PNG image"):
        return
    raise InputError(f"{path}: {kind}, not an output of this command; give the output a path of its own (a new file), "
                     "or remove this one first")


def _refuse_clashes(args, outputs: list[str]) -> None:
    from ..errors import InputError

    inputs = _input_values(args)
    if sum(value == "-" for _, value in inputs) > 1:
        raise InputError("standard input (-) is given twice; give one of the two as a file")
    stdin = _stdin_key() if any(value == "-" for _, value in inputs) else None
    seen: dict = {}
    for out in outputs:
        key = _file_key(out)
        if key is None:  # a device or FIFO (/dev/null): written into, never replaced, so never clobbered
            continue
        if stdin is not None and key == stdin:
            raise InputError(f"{out}: it is also what the command reads (standard input, -, is redirected from it); "
                             "writing it would replace it: give another path for the output")
        if key in seen and seen[key] != out:
            raise InputError(f"{out}: given as two outputs (also as {seen[key]}); one would replace the other: "
                             "give each its own file")
        if key in seen:
            raise InputError(f"{out}: given as two outputs; one would replace the other: give each its own file")
        seen[key] = out
        for option, value in inputs:
            if _reads(value, out, key, tokenizer=option == "tokenizer"):
                raise InputError(f"{out}: it is also what the command reads ({_flag(option, args)} {value}); writing it "
                                 "would replace it: give another path for the output")
            if option in _TEMPLATE_SOURCES:
                _refuse_read_later(args, f"{_flag(option, args)} {value}", value, out)
        _refuse_making_model_folder(out)


def _refuse_making_model_folder(out: str) -> None:
    """Raise InputError where `out`, a new file named as a model folder's own (chat_template.jinja),
    would be written into a folder of templates: the folder would become one model's folder, read
    for that file alone by every later run over it (an audit's configured sources, CI's), its
    templates no more, whether this command reads the folder or one file of it."""
    from ..errors import InputError
    from ..sources.templates import FOLDER_SUFFIXES, MODEL_FILES, is_model_folder

    name = os.path.basename(out)
    folder = os.path.dirname(os.path.abspath(out))
    try:
        if name not in MODEL_FILES or os.path.exists(out) or is_model_folder(folder):
            return
        templates = sorted(e for e in os.listdir(folder) if os.path.splitext(e)[1].lower() in FOLDER_SUFFIXES)
    except (OSError, ValueError):  # (a folder that cannot be listed is check_writable's; a NUL in the path too)
        return
    if templates:
        some = ", ".join(templates[:3]) + (", ..." if len(templates) > 3 else "")
        raise InputError(f"{out}: a {name} in {folder}, a folder of {len(templates)} template"
                         f"{'s' if len(templates) > 1 else ''} ({some}), would make it one model's folder: a run over "
                         "the folder would read that file alone, its templates no more; give the output another name, "
                         "or a path outside that folder")


def refuse_reading_outputs(args, reads, tokenizers=()) -> None:
    """Raise InputError where a file the command reads that the command line does not name (`reads`:
    (what, path) pairs: a configuration's settings, the files a source loaded, such as a model
    folder's `additional_chat_templates/` or a corpus's; `tokenizers`: the same for tokenizer specs,
    a folder reading its tokenizer.json) is one of its outputs: writing the output would replace it,
    as `_refuse_clashes` refuses for the command line's own inputs."""
    from ..errors import InputError

    outputs = [(out, _file_key(out)) for out in output_paths(args)]
    outputs = [(out, key) for out, key in outputs if key is not None]
    if not outputs:
        return
    for what, path, tokenizer in [(w, p, False) for w, p in reads] + [(w, p, True) for w, p in tokenizers]:
        for out, key in outputs:
            if isinstance(path, str) and path and path != "-" and _reads(path, out, key, tokenizer=tokenizer):
                raise InputError(f"{out}: it is also what the command reads ({what}: {path}); writing it would "
                                 "replace it: give another path for the output")


def refuse_found_configuration(args) -> None:
    """`refuse_reading_outputs` for the configuration found from the current folder, whichever
    command runs (one that does not read it would still replace the project's settings with its
    output). Looked for only where an output is named like one (a broken pyproject.toml elsewhere
    is no concern of a command that writes a report), unless --no-config."""
    import contextlib

    from ..errors import TmplkitError
    from .config import find_config

    if getattr(args, "no_config", False) or getattr(args, "config", None) is not None:
        return  # (a --config FILE given is read, and refused as an output, by config_of)
    if not any(os.path.basename(out) in ("tmplkit.toml", "pyproject.toml") for out in output_paths(args)):
        return
    found = None
    with contextlib.suppress(TmplkitError, OSError):
        found = find_config()
    if found is not None:
        refuse_reading_outputs(args, [("the configuration", str(found))])


def refuse_loaded_outputs(args, source: str, templates) -> None:
    """`refuse_reading_outputs` for a source just loaded (`sources.templates.watching_loads`): the
    source itself (a folder holds its templates) and each template's file; and an output a folder
    source would read next time (`_refuse_read_later`: a configuration's source, say)."""
    refuse_reading_outputs(args, [("a template source", source)] + [("a template it loads", t.source) for t in templates])
    for out in output_paths(args):
        _refuse_read_later(args, f"the template source {source}", source, out)


def _refuse_read_later(args, what: str, source: str, out: str) -> None:
    """Raise InputError where `out`, a file not there yet, is one the folder `source` would read
    as a template the next time (`sources.templates.folder_reads`): a lock, a table or a report
    written there would be read as a template, or make the folder a model folder. A command that
    writes a template (annotate, `_writes_template`) may add one to a folder it reads, not a
    model folder's JSON file."""
    from ..errors import InputError

    if not isinstance(source, str) or not source or source == "-" or os.path.exists(out):
        return  # (an output that is there is an input or not: `_reads`)
    try:
        json_file = os.path.basename(source) in _MODEL_JSON and os.path.isfile(source)
        if not json_file and not os.path.isdir(source):
            return
    except ValueError:  # (a NUL in the path)
        return
    if json_file:
        if getattr(args, "_writes_template", False):
            # (a model folder's JSON given alone: transformers, and the folder, read the new
            # chat_template.jinja beside it first all the same)
            _refuse_hiding_json_templates(args, os.path.dirname(source) or ".", out)
        return
    from ..sources.templates import FOLDER_SUFFIXES, folder_reads, is_model_folder

    if not folder_reads(source, out):
        return
    template = os.path.splitext(out)[1].lower() in FOLDER_SUFFIXES
    if getattr(args, "_writes_template", False):
        # (chat_template.jinja in a folder of templates makes it a model folder: the next run would
        # read that one template alone, the others no more)
        if template and is_model_folder(source):
            _refuse_hiding_json_templates(args, source, out)
            return
        if template and os.path.basename(out) != "chat_template.jinja":
            return
        raise InputError(f"{out}: {what} is a folder the command reads templates from, and the next run would read "
                         "this template as the folder's model configuration; give it another .jinja name, or a path "
                         "outside that folder")
    raise InputError(f"{out}: {what} is a folder the command reads templates from, and the next run would read this "
                     "output, which is no template, as one of its files; give a path outside that folder, or a name it "
                     "does not read (not *.jinja, *.j2, *.jinja2, tokenizer_config.json or chat_template.json)")


def _refuse_hiding_json_templates(args, folder: str, out: str) -> None:
    """Raise InputError where `out`, a new chat_template.jinja of the model folder `folder`, would
    take the place of the templates its JSON files hold (transformers reads that file first): the
    next run would read the annotated copy as the folder's default and the JSON's others no more.
    It may replace the one template they hold, annotated (the copy renders the same)."""
    from ..errors import InputError, TmplkitError
    from ..sources.templates import load_dir

    if os.path.basename(out) != "chat_template.jinja" or os.path.realpath(os.path.dirname(os.path.abspath(out))) != os.path.realpath(folder):
        return
    try:
        templates = load_dir(Path(folder))
    except TmplkitError:
        return  # (the folder's own error is the command's to report, as it reads the source)
    extra = os.path.join(os.path.realpath(folder), "additional_chat_templates") + os.sep
    own = [t.name for t in templates if not os.path.realpath(t.source).startswith(extra)]
    chosen = getattr(args, "name", None) or (templates[0].name if templates else None)
    if own and (len(own) > 1 or chosen != own[0]):
        raise InputError(f"{out}: a chat_template.jinja in the model folder {folder} takes the place of the "
                         f"template{'s' if len(own) > 1 else ''} its JSON files hold ({', '.join(own)}): the next run "
                         "would read this copy as the folder's default and those no more; give it another name "
                         "(additional_chat_templates/NAME.jinja), or a path outside that folder")


def _input_values(args) -> list[tuple[str, str]]:
    """(option, value) for each string argument that is not an output: the paths among them are
    the command's inputs (a value that names no file is harmless here)."""
    skip = set(_output_options(args)) | {"report", "func", "command"}
    out = []
    for name, value in vars(args).items():
        if name.startswith("_") or name in skip:
            continue
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, str) and v:
                out.append((name, v))
    return out


def _stdin_key():
    """`_file_key` of the regular file standard input is redirected from (`- < FILE`), else None."""
    try:
        return _inode(os.fstat(0))
    except (OSError, ValueError):
        return None


def _file_key(path: str):
    """What makes two paths the same file: the inode of an existing regular file (a symlink or
    another spelling of it is the same), the resolved path of one to be created; None for a device
    or FIFO."""
    try:
        st = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return _inode(st)


def _inode(st: os.stat_result):
    """(device, inode) of a regular file's `st`; None for anything else (a device, a FIFO)."""
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _reads(value: str, out: str, key, *, tokenizer: bool = False) -> bool:
    """Whether input `value` reads the file `out` (whose `_file_key` is `key`): it is that file,
    or a folder that holds it as a template; a `tokenizer` spec, also the file it names (a folder's
    tokenizer.json or its one .gguf, `~/tok.json`)."""
    if tokenizer and isinstance(key, tuple) and _tokenizer_reads(value, key):
        return True
    try:
        st = os.stat(value)
    except (OSError, ValueError):
        return False
    if stat.S_ISREG(st.st_mode):
        return (st.st_dev, st.st_ino) == key
    if stat.S_ISDIR(st.st_mode) and isinstance(key, tuple):
        from ..sources.templates import folder_reads

        return folder_reads(value, out)
    return False


def _tokenizer_reads(spec: str, key) -> bool:
    """Whether the tokenizer `spec` loads the file whose `_file_key` is `key`, where it names a
    folder, a path starting with ~, or a cached file (vocab:NAME, hf:org/name, a bare org/name the
    Hub cache holds); a file spelled as given is `_reads`' inode check."""
    try:
        if os.path.isfile(spec) and not spec.startswith("~"):
            return False
    except ValueError:  # (a NUL in the path)
        return False
    from ..errors import TmplkitError
    from ..tokens.tokenizers import locate_tokenizer

    try:
        _, path, _ = locate_tokenizer(spec)
    except TmplkitError:
        return False  # (the command's own check of its tokenizer says what is wrong)
    return _file_key(str(path)) == key


def _flag(dest: str, args=None) -> str:
    """An argument as the help shows it: a positional by its metavar (`diff A B`, `server log LOG`),
    an option by its long spelling (`--memory-model`, whose dest is `memory`), as the parser
    records them (`cli._Subcommands.load`)."""
    positional = (getattr(args, "_positionals", None) or {}).get(dest)
    if positional is not None:
        return positional
    spelled = [o for o in (getattr(args, "_options", None) or {}).get(dest, ()) if o.startswith("--")]
    if spelled:
        return spelled[0]
    return "SOURCE" if dest in ("source", "sources") else "--" + dest.replace("_", "-")


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


_LINE_HEAD, _LINE_TAIL = 1500, 500  # characters of an error line kept before and after a cut


# What to do where an error says only what the template said: its own check (raise_exception)
# refused the user's conversation.
REFUSED = "the template's own check refuses this conversation (give one it takes)"
# ... or where the template broke on it (content given as parts to one that adds it to a string).
BROKE = ("the template fails on this conversation (give one it renders: each content as the template reads it, a string "
         "or a list of text parts, and the keys its messages read)")


def error_line(text: str) -> str:
    r"""`text` as one line of a terminal: line breaks escaped, and a message longer than about 2,000
    characters (a template's `raise_exception` of megabytes) cut in the middle, its end kept (where
    the hint is).

    >>> error_line("a\nb"), error_line("\x1b[2J"), len(error_line("x" * 10**6)) < 2100
    ('a\\nb', '\\x1b[2J', True)
    """
    text = one_line(text)  # (an escape sequence a template wrote is shown, not run)
    if len(text) <= _LINE_HEAD + _LINE_TAIL + 64:
        return text
    cut = len(text) - _LINE_HEAD - _LINE_TAIL
    return f"{text[:_LINE_HEAD]} [... {cut} characters left out ...] {text[-_LINE_TAIL:]}"
