"""Project configuration: `[tool.tmplkit]` in pyproject.toml, or a `tmplkit.toml`; and the
expected-failures file an audit is given (`load_expected_failures`).

The configuration is found by walking up from the current folder: the first folder with a
`tmplkit.toml`, or a `pyproject.toml` that has a `[tool.tmplkit]` table, wins (`tmplkit.toml`
first when a folder has both). Paths in it are relative to the file's folder. Flags given on the
command line override it. Unknown keys and bad values are errors naming the file and the key.

    sources = ["templates", "corpus:llama.cpp"]   # what `tmplkit audit` / `table` read when given none
    fail-on = "fail"                              # or "warning": warnings fail the audit too
    tokenizer = "auto"                            # token round trip: auto, a .gguf, tokenizer.json, vocab:NAME
    expected-failures = "expected.json"           # a JSON file {name: reason}, or a table of them
    prefix-stability = "report"                   # off (default), report, or fail: unstable templates fail
    lock = "tmplkit.lock.json"                    # the behaviour lock the audit checks templates against
    [limits]                                      # [tool.tmplkit.limits] in pyproject.toml
    timeout = 10                                  # wall-clock seconds per template
    memory = 1024                                 # MiB a worker may allocate
    jobs = 2                                      # worker processes
    [tokenizers]                                  # tokenizer pairing: template name -> tokenizer
    "Qwen3-Coder" = "vocab:qwen35"
    [upstream]                                    # a GGUF or template file -> its upstream: the audit reports drift
    "models/chat-7b.Q4_K_M.gguf" = "hf:acme/chat-7b"

>>> cfg = parse_config({"fail-on": "warning", "limits": {"timeout": 5}}, Path("tmplkit.toml"))
>>> cfg.fail_on, cfg.timeout
('warning', 5.0)
"""

from __future__ import annotations

import contextlib
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..auditing._choices import EXPECTED_KINDS, FAIL_ON, PREFIX_STABILITY, is_expected_failures
from ..errors import InputError, TmplkitError
from ..jsonio import number_problem, read_json, stdin

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

__all__ = ["EXPECTED_KINDS", "FAIL_ON", "PREFIX_STABILITY", "Config", "find_config", "from_config", "is_expected_failures",
           "load_config", "load_expected_failures", "parse_config"]

_TOP_KEYS = ("sources", "fail-on", "tokenizer", "expected-failures", "prefix-stability", "limits", "tokenizers", "lock",
             "upstream")
_LIMIT_KEYS = ("timeout", "memory", "jobs")
# Sources and tokenizer specs that are not paths, so not relative to the configuration file.
_NOT_PATHS = ("hf:", "corpus:", "vocab:")


@dataclass(frozen=True)
class Config:
    """The settings of one configuration file; None (or empty) where the file says nothing."""

    path: Path | None = None
    sources: tuple[str, ...] = ()
    fail_on: str | None = None
    tokenizer: str | None = None
    tokenizers: dict[str, str] = field(default_factory=dict)
    expected_failures: dict[str, str | dict[str, str]] | None = None
    prefix_stability: str | None = None
    timeout: float | None = None
    memory: int | None = None
    jobs: int | None = None
    # The behaviour lock the audit checks against, and each GGUF's upstream source (both resolved).
    lock: str | None = None
    upstream: dict[str, str] = field(default_factory=dict)
    expected_failures_file: str | None = None  # the file `expected_failures` was read from (resolved)

    @property
    def files(self) -> tuple[tuple[str, str], ...]:
        """(setting, path) of each file the settings name that a command may read: an output may
        not replace one (cli._outputs.refuse_reading_outputs)."""
        files = [("expected-failures", self.expected_failures_file)] if self.expected_failures_file else []
        files += [("lock", self.lock)] if self.lock else []
        files += [(f"upstream.{k}", f) for k, v in self.upstream.items() for f in (k, v)]
        files += [("tokenizer", self.tokenizer)] if self.tokenizer else []
        files += [(f"tokenizers.{name}", spec) for name, spec in self.tokenizers.items()]
        return tuple(files)

    def to_dict(self) -> dict:
        return {
            "path": str(self.path) if self.path else None, "sources": list(self.sources), "fail_on": self.fail_on,
            "tokenizer": self.tokenizer, "tokenizers": dict(self.tokenizers),
            "expected_failures": self.expected_failures, "prefix_stability": self.prefix_stability, "timeout": self.timeout, "memory": self.memory,
            "jobs": self.jobs, "lock": self.lock, "upstream": dict(self.upstream),
        }


@contextlib.contextmanager
def from_config(path: Path | None, key: str, given: bool = True):
    """An error of a value the configuration at `path` gave (`given`) names the file and the key:
    the user did not type that value, and may not know where it came from."""
    try:
        yield
    except TmplkitError as exc:
        if given and path is not None:
            exc.args = (f"{exc} (from '{key}' in {path})",)
        raise


_MAX_CONFIG_BYTES = 1024 * 1024  # far above any configuration (a 15 MB list of sources took 46 s to check); /dev/zero-like files end here


def find_config(start: str | os.PathLike | None = None) -> Path | None:
    """The configuration file that applies in `start` (default: the current folder), or None."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        own = folder / "tmplkit.toml"
        if own.exists():  # (not is_file: a pipe or folder by that name is refused, not skipped)
            return own
        pyproject = folder / "pyproject.toml"
        if pyproject.exists() and _may_have_ours(pyproject) and "tmplkit" in _tool_table(_read_toml(pyproject), pyproject):
            return pyproject
    return None


def _may_have_ours(pyproject: Path) -> bool:
    """False for a regular pyproject.toml over the configuration's size limit that never writes
    `tmplkit` (another project's large file, read in chunks): it is no configuration, and refusing it
    would stop every command run below it. True otherwise: `_read_toml` then reads or refuses it."""
    import stat

    try:
        st = pyproject.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size <= _MAX_CONFIG_BYTES:
            return True
        with pyproject.open("rb") as f:
            tail = b""
            while chunk := f.read(1 << 20):
                if b"tmplkit" in tail + chunk:
                    return True
                tail = chunk[-len(b"tmplkit"):]
    except OSError:
        return True
    return False


def load_config(path: str | os.PathLike | None = None) -> Config:
    """The configuration in `path` (a tmplkit.toml or a pyproject.toml), or the one `find_config`
    finds when `path` is None; an empty Config when there is none."""
    found = Path(path) if path is not None else find_config()
    if found is None:
        return Config()
    data = _read_toml(found)
    if found.name == "pyproject.toml":
        tool = _tool_table(data, found)
        if path is not None and "tmplkit" not in tool:  # (--config names it: its settings are expected)
            raise InputError(f"{found}: no [tool.tmplkit] table; add one, or give --config a file that has it")
        data = tool.get("tmplkit", {})
        if not isinstance(data, dict):
            raise InputError(f"{found}: [tool.tmplkit] must be a table")
    return parse_config(data, found)


def _tool_table(data: dict, path: Path) -> dict:
    """A pyproject's [tool] table; InputError where `tool` is no table (TOML allows `tool = 5`)."""
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise InputError(f"{path}: 'tool' is {type(tool).__name__}, not a table; [tool] must be a table of tools' settings")
    return tool


def parse_config(data: dict[str, Any], path: Path) -> Config:
    """Check and convert the settings table `data` read from `path`."""
    table = "[tool.tmplkit]" if path.name == "pyproject.toml" else "the file"
    _no_unknown_keys(data, _TOP_KEYS, path, table, "")
    base = path.parent
    limits = data.get("limits", {})
    if not isinstance(limits, dict):
        raise _bad(path, "limits", "must be a table of timeout, memory and jobs", limits)
    _no_unknown_keys(limits, _LIMIT_KEYS, path, "[limits]", "limits.")
    pairing = data.get("tokenizers", {})
    if not isinstance(pairing, dict) or not all(isinstance(v, str) and v for v in pairing.values()):
        raise _bad(path, "tokenizers", "must be a table of template name = tokenizer", pairing)
    for name, spec in pairing.items():
        if spec == "auto":  # 'auto' chooses per template; a pairing names the tokenizer itself
            raise _bad(path, f"tokenizers.{name}", "must name a tokenizer (a .gguf, a tokenizer.json, vocab:NAME)", spec)
    _no_standard_input(data, path)
    expected = data.get("expected-failures")
    return Config(
        path=path,
        sources=tuple(_resolve(s, base) for s in _strings(data, "sources", path)),
        fail_on=_choice(data, "fail-on", FAIL_ON, path),
        tokenizer=_tokenizer(data.get("tokenizer"), base, path, "tokenizer"),
        tokenizers={name: _tokenizer_spec(spec, base) for name, spec in pairing.items()},
        expected_failures=_expected_failures(data.get("expected-failures"), base, path),
        prefix_stability=_choice(data, "prefix-stability", PREFIX_STABILITY, path),
        timeout=_number(limits, "timeout", path, float),
        memory=_number(limits, "memory", path, int),
        jobs=_number(limits, "jobs", path, int),
        lock=_resolve(_path_string(data, "lock", path), base) if data.get("lock") is not None else None,
        upstream=_upstream(data.get("upstream", {}), base, path),
        expected_failures_file=_resolve(expected, base) if isinstance(expected, str) else None,
    )


def _no_standard_input(data: dict, path: Path) -> None:
    """A file setting may not be `-`: the configuration is read by every command, and each would
    wait on standard input for it (`show` and `diff`, which use no expected failures, too)."""
    sources = data.get("sources")
    named = [("sources", v) for v in sources] if isinstance(sources, list) else []  # (other shapes: said below)
    named += [(key, data.get(key)) for key in ("expected-failures", "lock", "tokenizer")]
    for table in ("upstream", "tokenizers"):
        value = data.get(table)
        if isinstance(value, dict):
            named += [(f"{table}.{k}", k) for k in value] + [(f"{table}.{k}", v) for k, v in value.items()]
    for key, value in named:
        if value == "-":
            raise InputError(f"{path}: '{key}' names standard input (-), which a configuration cannot give: every "
                             "command would wait on it; give a file")


def _path_string(data: dict, key: str, path: Path) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(path, key, "must be a file name", value)
    return value


def _upstream(value: object, base: Path, path: Path) -> dict[str, str]:
    """{GGUF or template path: upstream source}, both relative to the configuration's folder."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()):
        raise _bad(path, "upstream", "must be a table of GGUF or template path = template source (hf:org/name[@rev], a file)", value)
    return {_resolve(k, base): _resolve(v, base) for k, v in value.items()}


def _read_toml(path: Path) -> dict[str, Any]:
    """A configuration file's TOML; one line for a file that is no regular file (a pipe would block,
    /dev/zero never end), too big, not UTF-8, not TOML or nested past the parser's depth."""
    import stat

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: not a regular file (a pipe, device or folder); give the configuration as a file")
        if st.st_size > _MAX_CONFIG_BYTES:
            raise InputError(f"{path}: {st.st_size} bytes, too big for a configuration (at most {_MAX_CONFIG_BYTES}); "
                             "check the path")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the configuration ({exc.strerror or exc}); check the path") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        if data.startswith(b"\xef\xbb\xbf"):  # (Windows editors save one; TOML allows none)
            raise InputError(f"{path}: starts with a byte order mark (BOM), which TOML does not allow; save it as UTF-8 "
                             "without one") from None
        raise InputError(f"{path}: not valid TOML ({exc}); fix the file") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); save the configuration as UTF-8") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deep to be a configuration; fix the file") from None
    except ValueError as exc:  # (an integer of more digits than Python converts)
        raise InputError(f"{path}: {number_problem(exc)}; fix the file") from None


def _bad(path: Path, key: str, what: str, value: object) -> InputError:
    return InputError(f"{path}: '{key}' {what}, got {value!r}")


def _no_unknown_keys(data: dict, known: tuple[str, ...], path: Path, table: str, prefix: str) -> None:
    for key in data:
        if key not in known:
            raise InputError(f"{path}: unknown key '{prefix}{key}' in {table}; known keys: {', '.join(known)}")


def _resolve(spec: str, base: Path) -> str:
    """A path of the configuration file relative to its folder (shown relative to the current one)."""
    if spec == "-" or spec.startswith(_NOT_PATHS) or Path(spec).is_absolute():
        return spec
    full = (base / spec).resolve()
    try:
        return str(full.relative_to(Path.cwd()))
    except ValueError:
        return str(full)


def _strings(data: dict, key: str, path: Path) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _bad(path, key, "must be a list of strings", value)
    return value


def _choice(data: dict, key: str, choices: tuple[str, ...], path: Path) -> str | None:
    value = data.get(key)
    if value is not None and value not in choices:
        raise _bad(path, key, f"must be one of {', '.join(choices)}", value)
    return value


def _tokenizer(value: object, base: Path, path: Path, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(path, key, "must be a tokenizer: auto, a .gguf, a tokenizer.json, vocab:NAME or hf:ORG/NAME", value)
    return _tokenizer_spec(value, base)


def _tokenizer_spec(spec: str, base: Path) -> str:
    """A tokenizer spec with its path, if it names one, relative to the configuration's folder."""
    from ..tokens.tokenizers import TokenizerSpec

    return _resolve(spec, base) if spec != "auto" and TokenizerSpec.parse(spec).is_path else spec


def load_expected_failures(path) -> dict:
    """A JSON object {template name: reason} (the template is expected to fail), where a reason may
    also be an object {"fail": reason, "unstable": reason} (either key or both; "unstable": its
    prefix is expected to be unstable under the prefix-stability gate). `-` reads standard input."""
    what = "an expected-failures file (a JSON object of template name -> reason)"
    if str(path) == "-":
        path = "<stdin>"
        data = read_json(stdin(what), what=what, where=path)
    else:
        data = read_json(path, what=what, stdin_ok=True)
    if not is_expected_failures(data):
        raise InputError(f"{path}: the expected-failures file must be a JSON object of template name -> reason "
                         f"(or -> {{{', '.join(f'{k!r}: reason' for k in EXPECTED_KINDS)}}})".replace("'", '"'))
    return data


def _expected_failures(value: object, base: Path, path: Path) -> dict[str, str | dict[str, str]] | None:
    if value is None:
        return None
    if isinstance(value, str):
        with from_config(path, "expected-failures"):
            return load_expected_failures(_resolve(value, base))
    if isinstance(value, dict) and is_expected_failures(value):
        return {k: dict(v) if isinstance(v, dict) else v for k, v in value.items()}
    raise _bad(path, "expected-failures", "must be a JSON file name or a table of template name = reason "
               f"(or = {{{' | '.join(EXPECTED_KINDS)} = reason}})", value)


def _number(limits: dict, key: str, path: Path, kind: type) -> Any:
    value = limits.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if kind is int:
        ok = ok and isinstance(value, int)
    if not ok:
        what = "a positive whole number" if kind is int else "a positive number"
        raise _bad(path, f"limits.{key}", f"must be {what}", value)
    if key == "memory":
        from ..auditing.workers import MAX_MEMORY_MB, MIN_MEMORY_MB  # (the workers' own range)

        if not MIN_MEMORY_MB <= value <= MAX_MEMORY_MB:
            raise _bad(path, "limits.memory", f"must be {MIN_MEMORY_MB} to {MAX_MEMORY_MB} (MiB)", value)
    return kind(value)
