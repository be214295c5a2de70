"""Loading chat templates from GGUF files, Hugging Face repos, .jinja/JSON files and folders.

`load(source)` accepts:
  - `model.gguf`: `tokenizer.chat_template` and every `tokenizer.chat_template.<name>`;
  - `hf:org/name[@revision]`: a Hub repo through huggingface_hub (honours HF_HUB_OFFLINE and the cache);
  - `template.jinja`, `tokenizer_config.json`, `chat_template.json`;
  - a model folder (with tokenizer_config.json / chat_template.json / chat_template.jinja), or a
    folder of `*.jinja`, `*.j2` or `*.jinja2` files (one template each);
  - `corpus:llama.cpp`: the pinned llama.cpp template corpus in the cache;
  - `corpus:hub`: the development half of the pinned Hub template corpus in the cache.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import GGUFError, SourceError
from ..jsonio import json_kind, parse_json, read_json, read_text, stdin
from . import corpus
from .gguf_meta import Keys, read_metadata

__all__ = ["COMMON_SPECIAL_TOKENS", "ChatTemplate", "family_special_tokens", "folder_reads", "gguf_special_tokens",
           "is_model_folder", "load", "load_dir", "load_gguf", "load_hf", "load_jinja", "load_json", "load_many", "load_one",
           "require_template", "select_named", "watching_loads"]


# Characters that break or rewrite a report's line: the C0 and C1 controls, Unicode's line and
# paragraph separators.
_LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class ChatTemplate:
    """One chat template and where it came from.

    `name` identifies the template in reports (e.g. "Qwen3-Coder" or "model:tool_use");
    `source` is the origin as the user gave it; bos/eos are the token strings templates see.
    `error`: why the file could not be read, for one file of a folder (empty, not UTF-8): the
    folder's other templates are still audited, and this one's analysis is that error.
    """

    text: str
    name: str
    source: str
    bos_token: str | None = None
    eos_token: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        # A name is one line of every report (a file named `a\n::error::x.jinja` printed a second line,
        # which GitHub Actions runs as a workflow command): what no line shows is written escaped.
        if isinstance(self.name, str) and _LINE_BREAKING.search(self.name):
            object.__setattr__(self, "name", _LINE_BREAKING.sub(lambda m: ascii(m.group(0))[1:-1], self.name))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "text": self.text,
        }


def require_template(template) -> ChatTemplate:
    """`template`, where it is a ChatTemplate; else a TypeError that says how to make one (a string
    may be a template's text or a path to one: which, only the caller can say)."""
    if isinstance(template, ChatTemplate):
        return template
    raise TypeError(f"expected a ChatTemplate, got {type(template).__name__}: give tmplkit.load_one(PATH) (a file, a "
                    "folder, a .gguf or hf:org/name) or tmplkit.ChatTemplate(text=TEXT, name=NAME, source=WHERE)")


# BOS/EOS strings of common model families, each with markup that names the family in a template;
# a template whose source gives no tokens is also proved with its family's (`<s>`/`</s>` by default),
# since a delimiter derived with empty tokens must hold with the real ones.
COMMON_SPECIAL_TOKENS = (("<s>", "</s>"), ("<|begin_of_text|>", "<|eot_id|>"),
                         ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"), ("<bos>", "<eos>"))
_FAMILY_MARKUP = (("<|start_header_id|>", 1), ("<｜", 2), ("<start_of_turn>", 3))


def family_special_tokens(template: ChatTemplate) -> dict:
    """The common BOS/EOS pair of the template's family as render variables, where the template
    reads them and its source gives none; else {}. The analysis proves its delimiters with them, and
    a session's requests are rendered with them (a bare .jinja of a Mistral-style template that
    writes `eos_token` after each reply renders no conversation without one).

    >>> family_special_tokens(ChatTemplate("{{ bos_token }}<start_of_turn>user", "g", "-"))
    {'bos_token': '<bos>', 'eos_token': '<eos>'}
    """
    t = template
    if t.bos_token is not None or t.eos_token is not None or ("bos_token" not in t.text and "eos_token" not in t.text):
        return {}
    bos, eos = COMMON_SPECIAL_TOKENS[next((i for markup, i in _FAMILY_MARKUP if markup in t.text), 0)]
    return {"bos_token": bos, "eos_token": eos}


# A model folder's own files: one of them in a folder makes it one model's folder (`is_model_folder`).
MODEL_FILES = ("tokenizer_config.json", "chat_template.json", "chat_template.jinja")
_HF_PATTERNS = [*MODEL_FILES, "additional_chat_templates/*.jinja", "special_tokens_map.json"]


# Callbacks that see every source loaded, with its templates (`watching_loads`).
_WATCHERS: list[Callable[[str, list[ChatTemplate]], None]] = []


@contextlib.contextmanager
def watching_loads(callback: Callable[[str, list[ChatTemplate]], None]):
    """Call `callback(source, templates)` after each source is loaded in the block: the command line
    refuses an output that is a file a source read (a model folder's `additional_chat_templates/`,
    a corpus file, a configuration's source), which only loading shows."""
    _WATCHERS.append(callback)
    try:
        yield
    finally:
        _WATCHERS.remove(callback)


def load(source: str | os.PathLike) -> list[ChatTemplate]:
    """Load every chat template a source holds, in a stable order.

    >>> load("fixtures/templates/chatml.jinja")[0].name
    'chatml'
    """
    templates = _load(source)
    for watcher in list(_WATCHERS):
        watcher(str(source), templates)
    return templates


def _load(source: str | os.PathLike) -> list[ChatTemplate]:
    text = str(source)
    if not text:  # (Path("") is the current folder: an unset variable would load all of it)
        raise SourceError(f"source {text!r} is empty; give a .gguf, .jinja, tokenizer_config.json, chat_template.json, "
                          "a folder (\".\" for the current one), hf:org/name, corpus:llama.cpp or corpus:hub")
    if text == "-":
        return _load_stdin()
    if text.startswith("hf:"):
        return load_hf(text[3:])
    if text.startswith("corpus:"):
        return _load_corpus(text[len("corpus:"):])
    path = Path(source)
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except OSError as exc:  # e.g. a name too long for the file system
        raise SourceError(f"{text[:200]}: cannot use this path ({exc.strerror or exc}); check the path") from None
    if is_dir:
        return load_dir(path)
    if not exists:
        raise SourceError(
            f"{path}: no such file or folder; give a .gguf, .jinja, tokenizer_config.json, "
            "chat_template.json, a folder, hf:org/name, corpus:llama.cpp or corpus:hub"
        )
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return load_gguf(path)
    if suffix == ".json":
        return load_json(path)
    if suffix in (".jinja", ".j2", ".jinja2", ".txt") or not path.is_file():
        # (a pipe, whatever its name: `audit <(curl ...)` is /dev/fd/63; the reader refuses it as one)
        return [load_jinja(path)]
    raise SourceError(
        f"{path}: unknown kind of template source (suffix '{path.suffix}'); "
        "give a .gguf, .jinja or .json file, a folder, or hf:org/name"
    )


def load_many(sources) -> list[ChatTemplate]:
    """Load several sources, concatenated in order."""
    out: list[ChatTemplate] = []
    for s in sources:
        out.extend(load(s))
    return out


def names_of(templates: Sequence, most: int = 10) -> str:
    """The names of `templates` (anything with a .name) for a message: the first `most`, then an ellipsis."""
    return ", ".join(t.name for t in templates[:most]) + (", ..." if len(templates) > most else "")


def select_named(templates: list[ChatTemplate], name: str | None, sources=()) -> list[ChatTemplate]:
    """The templates named `name` (as `load_one` matches a name), all of them when `name` is None;
    SourceError listing the names there are when none is named so."""
    if name is None:
        return templates
    picked = [t for t in templates if t.name == name or t.name.rsplit(":", 1)[-1] == name]
    if not picked:
        where = ", ".join(str(s) for s in sources) or "the sources"
        raise SourceError(f"{where}: no template named '{name}'; there are: {names_of(templates, 20)}")
    return picked


def load_one(source: str | os.PathLike, name: str | None = None) -> ChatTemplate:
    """The template named `name` from a source, or its default: its one template, or the one the
    others are named after (a GGUF's `tokenizer.chat_template`, a model folder's, a list's
    "default", as transformers and llama.cpp pick it). A source of several templates and no
    default (a folder of templates, a list with no "default") is an error: picking one of them
    would be a guess (`diff old/ new/` compared the first file of each and said "no change")."""
    return choose_one(load(source), source, name)


def default_of(templates: Sequence[ChatTemplate]) -> ChatTemplate | None:
    """The template the others of a source are named after (`load_one`'s default); None where
    there is none, or it is alone."""
    defaults = [t for t in templates if all(u is t or u.name.startswith(t.name + ":") for u in templates)]
    return defaults[0] if len(defaults) == 1 else None


def choose_one(templates: Sequence[ChatTemplate], source, name: str | None = None) -> ChatTemplate:
    """`load_one` of templates already loaded from `source`."""
    if name is None and len(templates) > 1:
        default = default_of(templates)
        if default is None:
            raise SourceError(f"{source}: holds {len(templates)} templates and none is the default ({names_of(templates)}); "
                              "give --name NAME for one of them, or that template's own file")
        templates = [default]
    for t in templates:
        if name is None or t.name == name or t.name.rsplit(":", 1)[-1] == name:
            if t.error:  # one template asked for: the file it could not read is the error
                raise SourceError(t.error)
            return t
    raise SourceError(f"{source}: no template named '{name}'; it has: {names_of(templates, 20)}")


def load_jinja(path: Path, name: str | None = None, bos: str | None = None, eos: str | None = None) -> ChatTemplate:
    return ChatTemplate(_read_text(path), name or path.stem, str(path), bos, eos)


def _read_text(path: Path) -> str:
    return read_text(path, what="a chat template", error=SourceError, stdin_ok=True)


def _read_json(path: Path):
    # A byte-order mark is refused (reported as not valid JSON), as transformers' json.load refuses it.
    return read_json(path, what="a tokenizer config", error=SourceError, strip_bom=False, stdin_ok=True)


def _token_str(value, path: Path, key: str) -> str | None:
    # tokenizer_config.json stores special tokens as a string or a serialized AddedToken.
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise SourceError(f"{path}: '{key}' should be a string or {{\"content\": ...}}, got {json_kind(value)}")


def _templates_from_value(value, path: Path, base: str, bos, eos, key: str = "chat_template") -> list[ChatTemplate]:
    """A `chat_template` value: a string, or a list of {"name": ..., "template": ...}."""
    if isinstance(value, str):
        if not value.strip():
            raise SourceError(f"{path}: '{key}' is empty; give a chat template")
        return [ChatTemplate(value, base, str(path), bos, eos)]
    if isinstance(value, list):
        out: list[ChatTemplate] = []
        for i, item in enumerate(value):
            if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)):
                raise SourceError(
                    f"{path}: '{key}' item {i} must be {{\"name\": str, \"template\": str}}; fix the named-template list"
                )
            if any(c < " " or c == "\x7f" for c in item["name"]):  # (a newline would break every report's rows)
                raise SourceError(f"{path}: '{key}' item {i} has a name with a control character ({item['name']!r}); "
                                  "give it a plain name")
            name = base if item["name"] == "default" else f"{base}:{item['name']}"
            if any(t.name == name for t in out):  # (--name could not tell the two apart)
                raise SourceError(f"{path}: '{key}' names two templates '{item['name']}'; give each its own name")
            out.append(ChatTemplate(item["template"], name, str(path), bos, eos))
        if not out:
            raise SourceError(f"{path}: '{key}' is an empty list; give at least one template")
        return out
    raise SourceError(f"{path}: '{key}' must be a string or a list of named templates, got {json_kind(value)}")


def load_json(path: Path, base: str | None = None) -> list[ChatTemplate]:
    """tokenizer_config.json or chat_template.json (any JSON object with a `chat_template`)."""
    return _json_templates(_read_json(path), path, base)


def _load_stdin() -> list[ChatTemplate]:
    """`-`: a Jinja template, or a tokenizer_config.json / chat_template.json, on standard input."""
    import re

    where = "<stdin>"
    text = read_text(stdin("the chat template", SourceError), what="a chat template", where=where, error=SourceError)
    if re.match(r'\s*\{\s*"', text):  # a Jinja template starts with text, {{ or {%
        return _json_templates(parse_json(text, what="a tokenizer config", where=where, error=SourceError),
                               Path(where), "stdin")
    listed = _json_list(text)
    if listed is not None:  # (a conversation given where a template is read: refused as its file would be)
        return _json_templates(listed, Path(where), "stdin")
    return [ChatTemplate(text, "stdin", where)]


def _json_list(text: str) -> list | None:
    """`text` read as a JSON list, or None where it is none (a template that starts with `[`:
    `[INST]`; or one nested past what the reader follows, which is no conversation either)."""
    import json

    if not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, list) else None


def _json_templates(data, path: Path, base: str | None) -> list[ChatTemplate]:
    if not isinstance(data, dict):
        raise SourceError(f"{path}: expected a JSON object with 'chat_template', got {json_kind(data)}")
    if "chat_template" not in data:
        raise SourceError(f"{path}: no 'chat_template' key; this model ships its template elsewhere (try the folder or the GGUF)")
    base = base or (path.parent.name if path.name in MODEL_FILES else path.stem) or path.stem
    bos = _token_str(data.get("bos_token"), path, "bos_token")
    eos = _token_str(data.get("eos_token"), path, "eos_token")
    return _templates_from_value(data["chat_template"], path, base, bos, eos)


def load_dir(path: Path) -> list[ChatTemplate]:
    """A model folder (Hugging Face layout) or a folder of .jinja templates."""
    if is_model_folder(path):
        return _load_model_dir(path, path.name)
    # every entry named as a template but a folder: a broken link or a pipe is that template's error
    # row (_load_folder_file), never silently left out of an audit that then passes
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in FOLDER_SUFFIXES and not p.is_dir())
    if not files:
        raise SourceError(f"{path}: no templates here (no tokenizer_config.json, chat_template.json, *.jinja, *.j2 "
                          "or *.jinja2); give another folder")
    names = folder_names(files)
    return [_load_folder_file(p, names[p]) for p in files]


# The template files a folder is read for (as the pre-commit hook's `files` pattern names them).
FOLDER_SUFFIXES = (".jinja", ".j2", ".jinja2")


def is_model_folder(folder: str | os.PathLike) -> bool:
    """Whether `load_dir(folder)` reads it as a model folder (one of its own files is there)."""
    return any((Path(folder) / f).is_file() for f in MODEL_FILES)


def folder_reads(folder: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether `load_dir(folder)` reads the file `path`, there now or written there later: a
    template file of a folder of templates; a model folder's own files (one of them written into a
    folder of templates makes it a model folder) and its `additional_chat_templates/*.jinja`.

    >>> folder_reads("fixtures/templates", "fixtures/templates/new.j2")
    True
    >>> folder_reads("fixtures/templates", "fixtures/templates/report.md")
    False
    """
    folder = Path(os.path.realpath(folder))
    where, name = Path(os.path.realpath(os.path.dirname(os.path.abspath(path)))), Path(path).name
    model = is_model_folder(folder)
    if where == folder:
        return name in MODEL_FILES or (not model and Path(name).suffix.lower() in FOLDER_SUFFIXES)
    return model and where == folder / "additional_chat_templates" and Path(name).suffix == ".jinja"


def folder_names(files) -> dict:
    """Each file's template name: its stem, or its whole file name where two files share the stem
    (`x.j2` and `x.jinja2` are two templates, and an expected-failures entry names one of them).

    >>> sorted(folder_names([Path("x.j2"), Path("x.jinja2"), Path("y.jinja")]).values())
    ['x.j2', 'x.jinja2', 'y']
    """
    stems: dict[str, int] = {}
    for p in files:
        stems[p.stem] = stems.get(p.stem, 0) + 1
    return {p: p.name if stems[p.stem] > 1 else p.stem for p in files}


def _load_folder_file(path: Path, name: str | None = None) -> ChatTemplate:
    """One template file of a folder; a file that cannot be read is that template's result, not the folder's end
    (as a syntax error is), so that one stray file does not hide every other template's report."""
    try:
        return load_jinja(path, name)
    except SourceError as exc:
        return ChatTemplate("", name or path.stem, str(path), error=str(exc))


def _load_model_dir(path: Path, base: str) -> list[ChatTemplate]:
    """Hugging Face layout, in transformers' precedence: chat_template.jinja, chat_template.json,
    then tokenizer_config.json; additional_chat_templates/*.jinja add named templates."""
    bos = eos = None
    config = path / "tokenizer_config.json"
    config_data = None
    if config.is_file():
        config_data = _read_json(config)
        if not isinstance(config_data, dict):
            raise SourceError(f"{config}: expected a JSON object, got {json_kind(config_data)}; fix the file")
        bos = _token_str(config_data.get("bos_token"), config, "bos_token")
        eos = _token_str(config_data.get("eos_token"), config, "eos_token")
    templates: list[ChatTemplate] = []
    if (path / "chat_template.jinja").is_file():
        templates.append(load_jinja(path / "chat_template.jinja", base, bos, eos))
    elif (path / "chat_template.json").is_file():
        data = _read_json(path / "chat_template.json")
        if not isinstance(data, dict) or "chat_template" not in data:
            raise SourceError(f"{path / 'chat_template.json'}: expected an object with 'chat_template'; fix the file")
        templates.extend(_templates_from_value(data["chat_template"], path / "chat_template.json", base, bos, eos))
    elif config_data is not None and "chat_template" in config_data:
        templates.extend(_templates_from_value(config_data["chat_template"], config, base, bos, eos))
    extra = path / "additional_chat_templates"
    if extra.is_dir():
        for p in sorted(extra.glob("*.jinja")):
            templates.append(load_jinja(p, f"{base}:{p.stem}", bos, eos))
    if not templates:
        raise SourceError(f"{path}: this model folder has no chat template (none in chat_template.jinja/.json or tokenizer_config.json)")
    return templates


def _first_line(exc: BaseException) -> str:
    """An exception's first line (the Hub's errors run on with advice of their own)."""
    return (str(exc).splitlines() or [""])[0]


def load_hf(spec: str) -> list[ChatTemplate]:
    """`org/name[@revision]` from the Hugging Face Hub, or its local cache when HF_HUB_OFFLINE=1."""
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise SourceError(f"hf:{spec}: a Hub source is hf:org/name[@revision]")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hf_errors

    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        folder = snapshot_download(repo, revision=revision or None, allow_patterns=_HF_PATTERNS, local_files_only=offline)
    except hf_errors.RevisionNotFoundError:
        raise SourceError(f"hf:{spec}: revision '{revision}' does not exist; check the branch, tag or commit") from None
    except hf_errors.RepositoryNotFoundError:
        raise SourceError(f"hf:{spec}: no such repository (or it is private); check the name or log in") from None
    except hf_errors.GatedRepoError:
        raise SourceError(f"hf:{spec}: the repository is gated; accept its terms on the Hub and log in") from None
    except hf_errors.LocalEntryNotFoundError:
        if offline:
            raise SourceError(f"hf:{spec}: the repository is not in the local cache and HF_HUB_OFFLINE is set; "
                              "download it once online or unset HF_HUB_OFFLINE") from None
        raise SourceError(f"hf:{spec}: the Hub could not be reached and the repository is not in the local cache; "
                          "check the network (or a proxy), or download it once online") from None
    except getattr(hf_errors, "HFValidationError", ()) as exc:  # (a name the Hub cannot have: `hf:a/b c`)
        raise SourceError(f"hf:{spec}: not a Hub repository name ({_first_line(exc)}); "
                          "give hf:org/name[@revision]") from None
    except (hf_errors.HfHubHTTPError, OSError, ValueError) as exc:
        raise SourceError(f"hf:{spec}: could not fetch from the Hub ({type(exc).__name__}: {_first_line(exc)})") from None
    templates = _load_model_dir(Path(folder), repo.split("/")[1])
    source = f"hf:{spec}"
    return [ChatTemplate(t.text, t.name, source, t.bos_token, t.eos_token) for t in templates]


def gguf_special_tokens(path: str | os.PathLike) -> tuple[str | None, str | None]:
    """The BOS and EOS token strings of a GGUF's vocabulary (None where it has none), read whether
    or not it carries a chat template (a server's model may not)."""
    _, bos, eos = _gguf_metadata(Path(path), lambda key: False)
    return bos, eos


def _is_template(key: str) -> bool:  # not tk.CHAT_TEMPLATES, a list of the names
    tk = Keys.Tokenizer
    return key == tk.CHAT_TEMPLATE or key.startswith(tk.CHAT_TEMPLATE_N.format(name=""))


def _gguf_metadata(p: Path, wanted) -> tuple[dict, str | None, str | None]:
    """The keys `wanted` picks from a GGUF's header, and its BOS and EOS token strings."""
    tk = Keys.Tokenizer
    md = read_metadata(
        p,
        lambda k: wanted(k) or k in (tk.BOS_ID, tk.EOS_ID, tk.LIST),
        pick={tk.LIST: lambda m: {v for v in (m.get(tk.BOS_ID), m.get(tk.EOS_ID)) if isinstance(v, int)}},
    )
    tokens = md.get(tk.LIST)
    if not isinstance(tokens, dict):  # absent, or corrupted into another type: BOS/EOS unknown
        tokens = {}

    def token(key: str) -> str | None:
        idx = md.get(key)
        raw = tokens.get(idx) if isinstance(idx, int) else None
        return raw.decode("utf-8", errors="replace") if raw is not None else None

    return md, token(tk.BOS_ID), token(tk.EOS_ID)


def load_gguf(path: str | os.PathLike) -> list[ChatTemplate]:
    """The chat templates in a GGUF's metadata, with the BOS/EOS token strings of its vocabulary.

    Reads the key/value header only (never the tensors), so large models load quickly.
    """
    p = Path(path)
    tk = Keys.Tokenizer
    md, bos, eos = _gguf_metadata(p, _is_template)
    named = tk.CHAT_TEMPLATE_N.format(name="")
    base = p.stem
    out: list[ChatTemplate] = []
    # The default template first, then the named ones in name order.
    keys = sorted(filter(_is_template, md), key=lambda k: (k != tk.CHAT_TEMPLATE, k))
    for key in keys:
        raw = md[key]
        if not isinstance(raw, bytes):
            raise GGUFError(f"{p}: '{key}' is not a string; the file's metadata is corrupted")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError(f"{p}: '{key}' is not valid UTF-8 at byte {exc.start}; re-convert the model with a fixed template") from None
        name = base if key == tk.CHAT_TEMPLATE else f"{base}:{key[len(named):]}"
        if any(c < " " or c == "\x7f" for c in key):  # (a newline would break every report's rows, as in JSON's names)
            raise GGUFError(f"{p}: the template key {key!r} has a control character in its name; the file's metadata "
                            "is corrupted or forged: give the template another way")
        out.append(ChatTemplate(text, name, str(p), bos, eos))
    if not out:
        raise SourceError(
            f"{p}: this GGUF has no chat template (no {Keys.Tokenizer.CHAT_TEMPLATE} key); "
            "give the template another way: a .jinja file, a tokenizer_config.json or hf:org/name"
        )
    return out


_CORPORA = ("llama.cpp", "llama-cpp", "hub")  # what `corpus:NAME` names (llama-cpp: llama.cpp's, spelt otherwise)


def _load_corpus(name: str) -> list[ChatTemplate]:
    corpus_name, _, template = name.partition("/")
    if template and corpus_name in _CORPORA:  # (one template of it, written as hf:org/name is)
        raise SourceError(f"corpus:{name}: a corpus source names no template; give corpus:{corpus_name} --name {template}")
    if name not in _CORPORA:
        what = "no corpus named" if not name else "unknown corpus"
        raise SourceError(f"corpus:{name}: {what}; give corpus:llama.cpp or corpus:hub")
    if name == "hub":
        # (the listed half only: a cache extracted from a longer list keeps files the list has left)
        listed = set(corpus.hub_dev_names())
        return [t for t in load_dir(corpus.hub_templates_dir()) if t.name in listed]
    return load_dir(corpus.templates_dir())
