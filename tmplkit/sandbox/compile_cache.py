"""Compiled templates kept between runs, in the cache folder.

Compiling a template (Jinja's parser and code generator, then Python's compiler) is most of an
analysis's time, and for the same template text, Jinja, Python and sandbox it always gives the
same module code. So the sandbox keeps that code, marshalled as Jinja's own bytecode cache keeps
it, in `<cache folder>/compiled/` ($TMPLKIT_CACHE, else ~/.cache/tmplkit; see corpus.cache_root),
and a later run loads it in well under a millisecond instead of compiling it again. The audit's
static scan, which parses each template once more, keeps its warnings there too (`cached_by_text`),
and so does the sandbox what a template reads of the clock (`_jinja._time_reads`).

- The key is a hash of the template text and of everything the value depends on: tmplkit's
  version, the source of the module that defines the environment (its sandbox hooks are compiled
  into the code) or the scan, Jinja's version and bytecode format, and Python's bytecode format.
  A changed template, tmplkit, Jinja or Python simply misses.
- The sandbox is the same either way: the code makes the same calls into the same environment
  (attribute access, calls, operators are checked there, at render time).
- A file that is truncated, corrupted or of another format fails its magic or its checksum and
  is ignored (then compiled and written again); the cache never turns into an error. Writing is
  best effort (a read-only or full disk only costs the time).
- Loaded code runs in this process, so only files this user alone can write are trusted: the
  folder is created private (0700), and a folder or file that another user owns or may write is
  not used (as Jinja's FileSystemBytecodeCache does for its default folder).
- `TMPLKIT_NO_CACHE=1` turns it off; deleting the folder at any time is safe.

>>> import jinja2
>>> compile_template_cached(jinja2.Environment(), "{{ 1 + 1 }}").render()
'2'
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import TypeVar

import jinja2
import jinja2.bccache

from .. import _version
from ..atomic import atomic_open
from ..environment import compile_cache_enabled
from ..sources.corpus import cache_root

__all__ = ["cache_dir", "cached_by_text", "compile_template_cached", "enabled"]

# Bumped when the file layout below changes.
_FORMAT = b"tmplkit-compiled-1\n"
_DIGEST = 32  # sha256 of the payload, after the magic
T = TypeVar("T")


def enabled() -> bool:
    """False when TMPLKIT_NO_CACHE is set (to anything but '' or '0')."""
    return compile_cache_enabled()


def cache_dir() -> Path:
    """Where compiled templates are kept: `compiled/` in the cache folder."""
    return cache_root() / "compiled"


def compile_template_cached(env: jinja2.Environment, text: str) -> jinja2.Template:
    """`env.from_string(text)`, loading the compiled code from the cache when it is there.

    Raises what compiling raises (TemplateSyntaxError, ...); never an error of the cache itself.
    """
    if not enabled():
        return env.from_string(text)
    kind = type(env)
    path = _entry(_fingerprint(f"code:{kind.__qualname__}", kind.__module__), text, ".bin")
    code = _code(_read_entry(path)) if path is not None else None
    if code is not None:
        try:
            return env.template_class.from_code(env, code, env.make_globals(None), None)
        except Exception:  # a file that passed the checks but is not code this environment made
            pass
    code = env.compile(text)
    if path is not None:
        _write_entry(path, marshal.dumps(code))
    return env.template_class.from_code(env, code, env.make_globals(None), None)


def cached_by_text(compute: Callable[[str], T], text: str) -> T:
    """`compute(text)`, kept in the cache folder as JSON, for a function of the template text alone.

    The key covers the text and the source of the module that defines `compute`; a result that is
    not JSON data is returned without being kept. (The static scan's warnings are kept this way: a
    warm audit would otherwise still parse every template once for them.)

    >>> from tmplkit.sandbox.static_scan import scan
    >>> cached_by_text(scan, "{{ x.__class__ }}") == scan("{{ x.__class__ }}")
    True
    """
    if not enabled():
        return compute(text)
    path = _entry(_fingerprint(f"json:{compute.__qualname__}", compute.__module__), text, ".json")
    payload = _read_entry(path) if path is not None else None
    if payload is not None:
        try:
            return json.loads(payload)
        except ValueError:  # passed the checksum, yet not JSON: compute it again
            pass
    result = compute(text)
    if path is not None:
        try:
            _write_entry(path, json.dumps(result).encode("utf-8"))
        except (TypeError, ValueError):
            pass
    return result


# --- keys --------------------------------------------------------------------------------------------

_FINGERPRINTS: dict[tuple[str, str], bytes] = {}


def _fingerprint(kind: str, module: str) -> bytes:
    """Everything besides the template text a kept value depends on (computed once per kind)."""
    if (kind, module) not in _FINGERPRINTS:
        h = hashlib.sha256()
        for part in (_FORMAT, kind.encode(), _version.__version__.encode(), jinja2.__version__.encode(), jinja2.bccache.bc_magic,
                     importlib.util.MAGIC_NUMBER, _module_source(module)):
            h.update(len(part).to_bytes(8, "big") + part)
        _FINGERPRINTS[kind, module] = h.digest()
    return _FINGERPRINTS[kind, module]


def _module_source(module: str) -> bytes:
    path = getattr(sys.modules.get(module), "__file__", None)
    try:
        return Path(path).read_bytes() if path else b"?"
    except OSError:
        return b"?"


def _entry(fingerprint: bytes, text: str, suffix: str) -> Path | None:
    """The file for `text`, or None when no private cache folder can be had."""
    try:
        folder = cache_dir()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(os.lstat(folder), want_dir=True):
            return None
    except (OSError, RuntimeError):  # RuntimeError: no home folder to put the cache in
        return None
    key = hashlib.sha256(fingerprint + text.encode("utf-8", "surrogatepass")).hexdigest()
    return folder / f"{key}{suffix}"


def _private(info: os.stat_result, want_dir: bool) -> bool:
    """A folder or regular file (never a link) of this user that no one else may write."""
    kind_ok = stat.S_ISDIR(info.st_mode) if want_dir else stat.S_ISREG(info.st_mode)
    if not kind_ok:
        return False
    if not hasattr(os, "getuid"):  # Windows: the folder is the user's own profile
        return True
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


# --- files ---------------------------------------------------------------------------------------


def _read_entry(path: Path) -> bytes | None:
    """The payload of a cache file, or None: missing, not private, a link, or failing its magic or checksum."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # not there yet (or a link, which O_NOFOLLOW refuses)
        return None
    try:
        if not _private(os.fstat(fd), want_dir=False):
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = f.read()
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    start = len(_FORMAT) + _DIGEST
    if data[:len(_FORMAT)] != _FORMAT or hashlib.sha256(data[start:]).digest() != data[len(_FORMAT):start]:
        return None
    return data[start:]


def _code(payload: bytes | None) -> CodeType | None:
    if payload is None:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _write_entry(path: Path, payload: bytes) -> None:
    try:
        # No fsync: a cache file lost in a crash is made again; the rename keeps it whole.
        with atomic_open(path, "wb", fsync=False, permissions=0o600) as f:
            f.write(_FORMAT + hashlib.sha256(payload).digest() + payload)
    except OSError:
        pass
