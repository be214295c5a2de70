"""The behaviour lock: one JSON file of behaviour records, keyed by template name.

`{"schema_version": 1, "tmplkit_version": ..., "templates": {name: record}}`, written with sorted
keys and two-space indents so that a change reviews as a small diff, and atomically (a reader
sees the old lock or the whole new one, never half of it). `read_lock` refuses a lock of another
layout, a corrupt one and a record that is not one, each on one line saying what to do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._version import __version__
from ..atomic import write_output
from ..auditing._formats import show
from ..errors import InputError
from ..jsonio import lone_surrogate, read_json
from ..sources.templates import names_of
from ._compare import compare
from ._record import BehaviourRecord

__all__ = ["DEFAULT_LOCK", "LOCK_SCHEMA_VERSION", "BehaviourLock", "LockCheck", "check_lock", "listed_names", "read_lock", "require_entries",
           "require_replaceable",
           "write_lock"]

# The lock's layout; raised when a field is removed or changes meaning.
LOCK_SCHEMA_VERSION = 1
DEFAULT_LOCK = "tmplkit.lock.json"


@dataclass(frozen=True)
class BehaviourLock:
    records: dict = field(default_factory=dict)  # name -> BehaviourRecord
    tmplkit_version: str = __version__

    def to_dict(self) -> dict:
        return {"schema_version": LOCK_SCHEMA_VERSION, "tmplkit_version": self.tmplkit_version,
                "templates": {name: self.records[name].to_dict() for name in sorted(self.records)}}

    def updated(self, records, fresh: bool = False) -> BehaviourLock:
        """This lock with `records` written over their names' entries (`fresh`: only `records`);
        InputError when two of `records` share a name."""
        seen: dict[str, BehaviourRecord] = {}
        for r in records:
            if r.name in seen:
                raise InputError(f"two templates are named '{r.name}' ({seen[r.name].source}, {r.source}); a lock keys "
                                 "templates by name: lock them in separate lock files, or give one --name")
            seen[r.name] = r
        return BehaviourLock({**({} if fresh else self.records), **seen}, __version__)


_LOCK_KEYS = frozenset({"schema_version", "tmplkit_version", "templates"})


def read_lock(path, *, updating: bool = False) -> BehaviourLock:
    """The lock in `path`; one-line InputErrors for a missing, corrupt or other-version lock.
    `updating`: read by `tmplkit lock` to update it (a file that is no lock is replaced with --fresh)."""
    try:
        data = read_json(path, what="a behaviour lock (written by `tmplkit lock`)")
    except InputError:
        # (`lock -o template.jinja` or onto any other file that is no JSON: "fix the JSON" or "save it
        # as UTF-8" would be wrong; a broken .json lock is to fix)
        if updating and Path(path).suffix.lower() != ".json" and Path(path).is_file():
            raise InputError(f"{path}: not a behaviour lock (not JSON); `tmplkit lock` would write the lock over it: "
                             "give the lock a path of its own (a new .json file)") from None
        raise
    if updating and not _lock_shaped(data):  # (JSON of another kind: a session, a list of expected failures)
        raise InputError(f"{path}: not a behaviour lock (it holds other JSON); `tmplkit lock` would write the lock over "
                         "it: give the lock a path of its own (a new .json file)")
    if not isinstance(data, dict) or not isinstance(data.get("templates"), dict):
        fix = f"--lock {path}" + (" --fresh" if updating else "")
        raise InputError(f"{path}: not a behaviour lock (no 'templates' object); write it with `tmplkit lock SOURCE... {fix}`")
    if extra := [k for k in data if k not in _LOCK_KEYS]:
        raise InputError(f"{path}: {extra[0]!r} is no key of a behaviour lock (its keys: schema_version, tmplkit_version, "
                         f"templates); remove it, or write the lock again with `tmplkit lock SOURCE... --lock {path} --fresh`")
    version = data.get("schema_version")
    if type(version) is not int or version != LOCK_SCHEMA_VERSION:  # (`true` equals 1)
        raise InputError(f"{path}: a lock of layout {version!r} (tmplkit {data.get('tmplkit_version', '?')}); this tmplkit "
                         f"reads layout {LOCK_SCHEMA_VERSION}: write it again with `tmplkit lock SOURCE... --lock {path} --fresh`")
    records = {}
    # (a plain `tmplkit lock` reads the lock it updates, so it would refuse the same entry again)
    fix = f"write it again with `tmplkit lock SOURCE... --lock {path} --fresh`"
    for name, entry in data["templates"].items():
        if not isinstance(entry, dict):
            raise InputError(f"{path}: the entry of '{name}' is not an object; {fix}")
        records[name] = BehaviourRecord.from_dict(entry, where=f"{path}: '{name}'", fix=fix)
    return BehaviourLock(records, str(data.get("tmplkit_version", "")))


def _lock_shaped(data) -> bool:
    """Whether JSON `data` is a lock's, of any layout: an object with one of a lock's keys."""
    return isinstance(data, dict) and bool(_LOCK_KEYS & set(data))


def require_replaceable(path) -> None:
    """InputError where `lock --fresh` would write over a file that is no lock: JSON of another
    kind (a session, expected failures), or a file not named .json (a text file, a template, `-o`
    slipped onto another file) that holds no lock's JSON. A .json file that is no JSON at all is
    taken for a damaged lock, and replaced."""
    try:  # (read_json's bounds: a large file named by mistake is not read whole)
        data = read_json(path, what="a behaviour lock")
    except InputError:
        if Path(path).suffix.lower() == ".json":
            return
        data = None
    if not _lock_shaped(data):
        why = "it holds other JSON" if data is not None else "no lock's JSON"
        raise InputError(f"{path}: not a behaviour lock ({why}); --fresh replaces a lock, not any file: give the lock "
                         "a path of its own (a new .json file)")


def write_lock(path, lock: BehaviourLock) -> None:
    """Write `lock` to `path` atomically, keys sorted; a record holding a lone surrogate (a file
    name's byte that is no UTF-8, a template writing half a UTF-16 pair), which UTF-8 JSON cannot
    hold as it is, is refused in one line, nothing written."""
    lock = replace(lock, records={n: replace(r, source=_beside(path, r.source)) for n, r in lock.records.items()})
    text = json.dumps(lock.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        name = next(n for n, r in lock.records.items() if lone_surrogate([n, r.to_dict()]) is not None)
        shown = name.encode("utf-8", "backslashreplace").decode("utf-8")
        where, fix = (("its name (a file name's byte that is no UTF-8)", "rename the file") if lone_surrogate(name) else
                      ("its source (a folder's or file's name with a byte that is no UTF-8)", "rename it")
                      if lone_surrogate(str(lock.records[name].source)) else
                      ("its behaviour (a delimiter or a prompt the template writes)", "fix the template"))
        raise InputError(f"{path}: the record of '{shown}' cannot be locked: {where} holds half of a UTF-16 pair, no "
                         f"character, which a lock (UTF-8 JSON) cannot hold; {fix}") from None
    write_output(path, text)


def _beside(lock_path, source: str) -> str:
    """A record's source as the lock holds it: a file or folder under the lock's folder as a path
    from there (the lock reads the same from any folder it is written in, on any machine), any
    other source as it was given."""
    try:
        if source.startswith(("hf:", "corpus:")) or source in ("", "-") or not os.path.exists(source):
            return source
        base = os.path.dirname(os.path.abspath(lock_path))
        found = os.path.abspath(source)
        return os.path.relpath(found, base) if os.path.commonpath([base, found]) == base else source
    except (OSError, ValueError):  # (a NUL, or two drives: as given)
        return source


@dataclass(frozen=True)
class LockCheck:
    """Each template checked against its locked record: (name, source, BehaviourDiff)."""

    lock_path: str
    diffs: tuple = ()
    unchecked: tuple = ()  # (name, source, reason) of templates whose behaviour was not derived
    # The lock's entries no template of this audit has (a subset audited, or a template removed from
    # the sources: kept, not a failure; the summary names them so a stale entry does not go unseen)
    unaudited: tuple = ()

    @property
    def changed(self) -> list:
        return [(name, source, d) for name, source, d in self.diffs if not d.same]

    @property
    def ok(self) -> bool:
        return not self.changed and not self.unchecked

    def summary(self) -> str:
        n, bad = len(self.diffs), len(self.changed)
        lost = f", {len(self.unchecked)} not derived (a limit stopped it)" if self.unchecked else ""
        if self.unchecked:
            verdict = "FAILED; raise --timeout or --memory"
        elif self.changed:
            verdict = f"FAILED; after an intended change: tmplkit lock SOURCE... --lock {self.lock_path}"
        else:
            verdict = "ok"
        line = f"lock {self.lock_path}: {n} template{'s' if n != 1 else ''} checked, {bad} changed behaviour{lost} -> {verdict}"
        if self.unaudited:
            k, names = len(self.unaudited), listed_names(self.unaudited)
            line += (f"; {k} entr{'y' if k == 1 else 'ies'} of the lock not audited here, kept: {names} (of a template "
                     f"removed from the sources: `tmplkit lock SOURCE... --lock {self.lock_path} --fresh` drops {'it' if k == 1 else 'them'})")
        return line


def listed_names(names, most: int | None = 5) -> str:
    """Template names for a summary line: the first `most` (None: all), each shown escaped (a name is a
    file's: a line break in it would end the line, an escape sequence act on the terminal), then an
    ellipsis."""
    shown = names if most is None else names[:most]
    return ", ".join(map(show, shown)) + (", ..." if len(shown) < len(names) else "")


def require_entries(lock: BehaviourLock, templates, lock_path) -> None:
    """InputError (one line) naming the templates (anything with .name and .source) the lock lacks."""
    missing = [t for t in templates if t.name not in lock.records]
    if missing:
        raise InputError(f"{lock_path}: no entry for {names_of(missing, 5)}; add {'it' if len(missing) == 1 else 'them'} with "
                         f"`tmplkit lock {missing[0].source} --lock {lock_path}`")


def check_lock(lock: BehaviourLock, records, lock_path) -> LockCheck:
    """Compare each record with its name's entry in `lock` (`require_entries` first)."""
    require_entries(lock, records, lock_path)
    diffs = tuple((r.name, r.source, compare(lock.records[r.name], r)) for r in records if r.derived)
    unchecked = tuple((r.name, r.source, r.reason or r.verdict) for r in records if not r.derived)
    unaudited = tuple(sorted(set(lock.records) - {r.name for r in records}))
    return LockCheck(str(lock_path), diffs, unchecked, unaudited)
