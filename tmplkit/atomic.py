"""Atomic file writes: a reader sees the old file or the complete new one, never a partial one.

The new content goes to a temporary file in the target's folder, is flushed and fsync'ed, and
then renamed over the target (`os.replace`, atomic on POSIX and on Windows for same-volume
paths). If anything fails before the rename, the temporary file is removed and the target is
left untouched.

This is also the one place tmplkit writes what a user asked for (reports, tables, JSON results,
sessions, plots): `write_output` / `write_json` turn a failure into one InputError line, and
`check_writable` reports a path that cannot be written before any long work starts.

A path behaves as it does after a shell's `>`: a symlink is written through (its target is
replaced atomically, the link stays a link); a FIFO, a character or block device is written into,
never replaced (`-o /dev/null` as root must not replace /dev/null itself); a read-only regular
file is refused rather than silently replaced. Only regular files are written atomically.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "report.json"
>>> write_text_atomic(p, '{"ok": true}\\n')
>>> p.read_text()
'{"ok": true}\\n'
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ._interrupt import Terminated, hold_interrupts, unwind_on_sigterm
from .errors import InputError

__all__ = ["atomic_open", "check_writable", "write_bytes_atomic", "write_json", "write_output", "write_outputs",
           "write_text_atomic"]

_WRITABLE_HINT = "give a writable file path in an existing folder"


def _umask() -> int:
    # os.umask can only be read by setting it; do it once, at import time (single-threaded).
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike,
    mode: str = "w",
    *,
    encoding: str | None = "utf-8",
    newline: str | None = None,
    fsync: bool = True,
    permissions: int | None = None,
) -> Iterator[IO]:
    """Open `path` for writing so that it is replaced only when the `with` block succeeds.

    `mode` is "w" (text) or "wb" (bytes). The file gets `permissions` when given, else the
    permissions the existing target had, or the usual ones for a new file (0o666 less the umask).
    `fsync=False` skips flushing to disk (for caches, which may lose a file but never see half of one).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_open(p) as f:
    ...     _ = f.write("complete")
    >>> p.read_text()
    'complete'
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open mode must be 'w' or 'wb', not {mode!r}")
    if not _names_folder(path) and _is_special(path):
        # A FIFO, a device, a socket: write into it as `>` does; there is nothing to rename over.
        with os.fdopen(_open_special(path), mode, encoding=None if "b" in mode else encoding, newline=newline) as special:
            yield special
        return
    stage = _Staged(path, permissions)
    try:
        with stage.open(mode, encoding=encoding, newline=newline) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        stage.swap(keep_old=False)
    finally:
        stage.discard()
    if fsync:
        _fsync_dir(stage.target.parent)


def _names_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is spelled as a folder (it ends in '/', or its last part is '.' or '..'): a
    shell's `>` refuses it ('Is a directory', 'Not a directory'), where Path() would drop the
    slash and write the file before it (`-o t.jinja/` replaced t.jinja)."""
    raw = os.fspath(path)
    return raw.endswith(("/", os.sep)) or os.path.basename(raw) in (".", "..")


def _resolve(path: str | os.PathLike) -> Path:
    """The path a shell's `>` would write: a symlink's final target (which may not exist yet)."""
    target = Path(path)
    if target.is_symlink():
        real = Path(os.path.realpath(target))
        if not real.exists() and target.exists():
            # A link only the kernel can follow (`/dev/stdout` -> /proc/self/fd/1 -> `pipe:[...]`):
            # opened as named, it is the pipe or socket itself.
            return target
        return real
    return target


def _stat(target: Path) -> os.stat_result | None:
    try:
        return target.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _user_writable(target: Path, st: os.stat_result) -> bool:
    """Writable by this user, and not marked read-only (root's access() would say yes to a 0o444 file)."""
    return bool(st.st_mode & 0o222) and os.access(target, os.W_OK)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def write_text_atomic(path: str | os.PathLike, text: str, *, encoding: str = "utf-8", newline: str | None = None) -> None:
    """Write `text` to `path` atomically (see the module docstring)."""
    with atomic_open(path, "w", encoding=encoding, newline=newline) as f:
        f.write(text)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see the module docstring)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def write_output(path: str | os.PathLike, data: str | bytes) -> None:
    """Write an output file the user named (text as UTF-8) atomically; a failure is one InputError line.

    >>> import tempfile, pathlib
    >>> try:
    ...     write_output(pathlib.Path(tempfile.mkdtemp()) / "missing" / "out.txt", "x")
    ... except InputError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    cannot write the output file (No such file or directory); give a writable file path in an existing folder
    """
    write_outputs([(path, data)])


def write_outputs(outputs: list[tuple[str | os.PathLike, str | bytes]]) -> None:
    """`write_output` of several (path, data), all or none: every regular file is written to its
    temporary file and synced first; then each is renamed over its target, with Ctrl-C and SIGTERM
    held until the last rename, and a failed rename puts back the targets renamed before it; a
    SIGTERM while they are written removes them before it ends the process (its default ended it
    there, a temporary file left beside its target, half written). So a
    later one failing (a full disk, a busy file) leaves every target as it was. A FIFO or device is
    written into, which cannot be taken back: those come after the regular files are written and
    synced, before the renames (a device that refuses, `/dev/full`, leaves every target as it was;
    a rename that fails then, after the checks made before any work, cannot take the write back).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> try:
    ...     write_outputs([(d / "a.txt", "a"), (d / "missing" / "b.txt", "b")])
    ... except InputError:
    ...     print(sorted(p.name for p in d.iterdir()))
    []
    """
    encoded = [(path, data.encode("utf-8") if isinstance(data, str) else data) for path, data in outputs]
    default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    try:
        with unwind_on_sigterm():
            _write_all(encoded, outputs)
    except Terminated:
        if default:  # (SIGTERM's own end, as asked, once nothing of the write is left beside the targets)
            os.kill(os.getpid(), signal.SIGTERM)
        raise


def _write_all(encoded: list[tuple[str | os.PathLike, bytes]], outputs: list) -> None:
    """`write_outputs`' work: SIGTERM unwinds through it (the caller's `unwind_on_sigterm`)."""
    path: str | os.PathLike = ""
    staged: list[_Staged] = []
    done = False
    try:
        for path, data in encoded:
            if not _is_special(path):
                staged.append(_Staged(path))
                staged[-1].write(data)  # (a full disk says so here, at write or at fsync, before any rename)
        for path, data in encoded:
            if _is_special(path):
                with atomic_open(path, "wb") as f:  # (written into: nothing to rename, nothing to take back)
                    f.write(data)
                    f.flush()  # (/dev/full says so here)
        # (a Ctrl-C or SIGTERM held until the block ends finds every file written, or none, and
        # nothing of the write left beside them: the handler may end the process there)
        with hold_interrupts():
            try:
                for stage in staged:
                    path = stage.path
                    stage.swap()
            except BaseException:
                _undo(staged)
                _discard(staged)
                raise
            _discard(staged)  # (the old files kept for `undo`)
            done = True
        for folder in {stage.target.parent for stage in staged}:
            _fsync_dir(folder)
    except OSError as exc:
        _undo(staged)
        where = path or exc.filename or ", ".join(str(p) for p, _ in outputs)
        raise InputError(f"{where}: cannot write the output file ({exc.strerror or exc}); {_WRITABLE_HINT}") from None
    except BaseException:
        if not done:
            _undo(staged)
        raise
    finally:
        _discard(staged)


def _discard(staged: list[_Staged]) -> None:
    for stage in staged:
        stage.discard()


def _open_special(path: str | os.PathLike) -> int:
    """A FIFO or device opened for writing. A FIFO no program reads is refused in one line: opened
    as `>` does, the command waited for a reader forever once its work was done."""
    target = _resolve(path)
    st = _stat(target)
    if st is None or not stat.S_ISFIFO(st.st_mode):
        return os.open(target, os.O_WRONLY)
    deadline = time.monotonic() + _FIFO_READER_S
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() > deadline:
                raise InputError(f"{path}: a FIFO that no program reads; start its reader first, or give a file") from None
            time.sleep(0.05)  # (a reader started beside the command may open it a moment later)
    os.set_blocking(fd, True)  # (a reader is there: write as into any pipe)
    return fd


_FIFO_READER_S = 2.0  # how long a FIFO's writer waits for its reader to open it


def _is_special(path: str | os.PathLike) -> bool:
    st = _stat(_resolve(path))
    return st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode)


def _undo(staged: list[_Staged]) -> None:
    """Put back, last first, each target renamed over (a rename that failed after them)."""
    for stage in reversed(staged):
        with contextlib.suppress(OSError):
            stage.undo()


class _Staged:
    """A regular file's new content in a temporary file beside its target (with the target's
    permissions, or `permissions`), until `swap` renames it over the target; for `write_outputs`
    the old target is kept under a second name (a hard link, or a copy where the filesystem has
    none) until `discard`, so that `undo` can put it back."""

    def __init__(self, path: str | os.PathLike, permissions: int | None = None) -> None:
        if _names_folder(path):
            raise IsADirectoryError(errno.EISDIR, "the path names a folder, not a file", os.fspath(path))
        self.path, self.target = path, _resolve(path)
        st = _stat(self.target)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(self.target))
        if st is not None and not _user_writable(self.target, st):
            raise OSError(errno.EACCES, "the file is read-only", str(self.target))
        self.existed = st is not None
        fd, name = tempfile.mkstemp(dir=self.target.parent, prefix=f".{self.target.name}.", suffix=".tmp")
        self.fd: int | None = fd
        self.tmp: Path | None = Path(name)
        self.backup: Path | None = None
        self.swapped = False
        if permissions is None:
            permissions = st.st_mode & 0o7777 if st is not None else 0o666 & ~_UMASK
        try:
            os.chmod(fd, permissions)
        except BaseException:  # (no object is returned to discard it: the temporary file goes now)
            self.discard()
            raise

    def open(self, mode: str, *, encoding: str | None = "utf-8", newline: str | None = None) -> IO:
        """The temporary file, open for writing (once)."""
        assert self.fd is not None
        fd, self.fd = self.fd, None
        if "b" in mode:
            return os.fdopen(fd, "wb")
        return os.fdopen(fd, "w", encoding=encoding, newline=newline)

    def write(self, data: bytes) -> None:
        with self.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def swap(self, *, keep_old: bool = True) -> None:
        assert self.tmp is not None
        if self.existed and keep_old:
            self.backup = self.tmp.with_name(self.tmp.name[:-len(".tmp")] + ".old")
            try:
                os.link(self.target, self.backup)
            except OSError:
                shutil.copy2(self.target, self.backup)
        os.replace(self.tmp, self.target)
        self.tmp, self.swapped = None, True

    def undo(self) -> None:
        if not self.swapped:
            return
        if self.backup is not None:
            os.replace(self.backup, self.target)
            self.backup = None
        else:
            os.unlink(self.target)
        self.swapped = False

    def discard(self) -> None:
        """Remove the temporary file and the old target kept for `undo`: a swap done is final then
        (`undo` after it would remove the new target, having no old one to put back)."""
        self.swapped = False
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        for leftover in (self.tmp, self.backup):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    leftover.unlink()
        self.tmp = self.backup = None


def write_json(path: str | os.PathLike, obj, *, indent: int | None = 2) -> None:
    """`write_output` of `obj` as JSON (UTF-8, not ASCII-escaped, one final newline)."""
    write_output(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def check_writable(path: str | os.PathLike) -> None:
    """Raise InputError now if `path` cannot be written later, judged as a shell's `>` would.

    A folder, a missing or read-only folder (for a file to be created or replaced atomically), a
    read-only file, or a FIFO or device this user may not write into are refused; so is a path the
    system cannot look up (a symlink loop, a name too long).
    """
    try:
        _check_writable(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot write the file here ({exc.strerror or exc}); {_WRITABLE_HINT}") from None


def _check_writable(path: str | os.PathLike) -> None:
    if _names_folder(path):
        raise InputError(f"{path}: cannot write the file here; the path names a folder (it ends in "
                         f"'{os.path.basename(os.fspath(path)) or '/'}'): {_WRITABLE_HINT}")
    target = _resolve(path)
    st = _stat(target)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: cannot write the file here; it is a folder: {_WRITABLE_HINT}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not os.access(target, os.W_OK):
            raise InputError(f"{path}: cannot write into it (permission denied); {_WRITABLE_HINT}")
        return
    if st is not None and not _user_writable(target, st):
        raise InputError(f"{path}: the file is read-only; make it writable or {_WRITABLE_HINT}")
    folder = target.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{path}: cannot write the file here; {_WRITABLE_HINT}")
    # Permission bits do not tell all (root may write anywhere by them, yet not into /sys or a
    # read-only mount): the file the write will go through is made now, and removed.
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    os.unlink(name)
