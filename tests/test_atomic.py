"""Atomic writes: an interrupted write leaves the old file or the complete new one."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys

import pytest

from tmplkit import atomic
from tmplkit.atomic import atomic_open, write_bytes_atomic, write_text_atomic


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_text_and_bytes(tmp_path):
    p = tmp_path / "a.json"
    write_text_atomic(p, "héllo\n")
    assert p.read_text(encoding="utf-8") == "héllo\n"
    write_bytes_atomic(p, b"\x00\xff")
    assert p.read_bytes() == b"\x00\xff"
    assert _leftovers(tmp_path) == []


def test_failure_mid_write_keeps_old_file(tmp_path):
    p = tmp_path / "report.json"
    p.write_text("OLD", encoding="utf-8")
    with pytest.raises(RuntimeError):
        with atomic_open(p) as f:
            f.write("NEW " * 1000)
            f.flush()
            raise RuntimeError("disk on fire")
    assert p.read_text(encoding="utf-8") == "OLD"
    assert _leftovers(tmp_path) == []


def test_keyboard_interrupt_mid_write_keeps_old_file(tmp_path):
    p = tmp_path / "report.md"
    p.write_text("OLD", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(p, "wb") as f:
            f.write(b"half")
            raise KeyboardInterrupt
    assert p.read_text(encoding="utf-8") == "OLD"
    assert _leftovers(tmp_path) == []


def test_failed_rename_keeps_old_file(tmp_path, monkeypatch):
    p = tmp_path / "out.txt"
    p.write_text("OLD", encoding="utf-8")

    def boom(src, dst):
        raise OSError("simulated rename failure")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        write_text_atomic(p, "NEW")
    assert p.read_text(encoding="utf-8") == "OLD"
    assert _leftovers(tmp_path) == []


def test_new_file_absent_after_failure(tmp_path):
    p = tmp_path / "new.txt"
    with pytest.raises(ValueError):
        with atomic_open(p) as f:
            f.write("x")
            raise ValueError
    assert not p.exists()


def test_permissions_kept(tmp_path):
    p = tmp_path / "script.sh"
    p.write_text("old")
    os.chmod(p, 0o751)
    write_text_atomic(p, "new")
    assert stat.S_IMODE(p.stat().st_mode) == 0o751


def test_bad_mode_rejected(tmp_path):
    with pytest.raises(ValueError):
        with atomic_open(tmp_path / "x", "a"):
            pass


_WRITER = r"""
import sys, time
from tmplkit.atomic import atomic_open
with atomic_open(sys.argv[1]) as f:
    for i in range(10**6):
        f.write("NEW-%07d\n" % i)
        if i == 1000:
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
"""


def test_killed_process_leaves_old_file(tmp_path):
    """A process killed mid-write (no cleanup runs at all) leaves the old file intact."""
    p = tmp_path / "report.json"
    p.write_text("OLD", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert p.read_text(encoding="utf-8") == "OLD"
    # The only trace is a hidden temporary file next to the target, never a partial target.
    assert all(name.startswith(".report.json.") for name in _leftovers(tmp_path))


def test_concurrent_reader_never_sees_partial(tmp_path):
    import threading

    p = tmp_path / "big.txt"
    old, new = "A" * 200_000, "B" * 200_000
    write_text_atomic(p, old)
    seen: set[str] = set()
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(p.read_text())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(30):
            write_text_atomic(p, new if i % 2 else old)
    finally:
        stop.set()
        t.join()
    assert seen and seen <= {old, new}


# --- the one output writer: write_output / write_json / check_writable ---------------------------


def test_write_output_and_json(tmp_path):
    from tmplkit.atomic import write_json, write_output

    p = tmp_path / "out.json"
    write_output(p, "héllo\n")
    assert p.read_bytes() == "héllo\n".encode()  # UTF-8 whatever the locale, no newline translation
    write_json(p, {"a": "é", "b": [1]})
    assert p.read_text(encoding="utf-8") == '{\n  "a": "é",\n  "b": [\n    1\n  ]\n}\n'
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["missing/out.txt", "."])
def test_write_output_failure_is_one_input_error(tmp_path, where):
    from tmplkit.atomic import write_output
    from tmplkit.errors import InputError

    target = tmp_path / where
    with pytest.raises(InputError) as info:
        write_output(target, "x")
    message = str(info.value)
    assert message.startswith(f"{target}: cannot write the output file (") and "\n" not in message
    assert "give a writable file path in an existing folder" in message
    assert not list(tmp_path.rglob("*.tmp"))


def test_check_writable_reports_early(tmp_path):
    from tmplkit.atomic import check_writable
    from tmplkit.errors import InputError

    check_writable(tmp_path / "new.json")
    for bad in (tmp_path / "missing" / "x.json", tmp_path):
        with pytest.raises(InputError, match="cannot write the file here; (it is a folder: )?give a writable file path"):
            check_writable(bad)
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(InputError):
            check_writable(ro / "x.json")


def test_check_writable_tries_the_folder_where_permission_bits_do_not_tell(tmp_path, monkeypatch):
    # (root passes every access check, so /sys/kernel/x was found unwritable only after the work)
    import errno

    from tmplkit import atomic
    from tmplkit.errors import InputError

    def read_only(**_):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    with pytest.raises(InputError, match=r"x.json: cannot write the file here \(Read-only file system\)"):
        atomic.check_writable(tmp_path / "x.json")
    monkeypatch.undo()
    if os.geteuid() == 0 and os.path.isdir("/sys/kernel"):
        with pytest.raises(InputError, match="cannot write the file here"):
            atomic.check_writable("/sys/kernel/tmplkit-probe.json")
    atomic.check_writable(tmp_path / "x.json")
    assert list(tmp_path.iterdir()) == []  # (the file tried is gone)


def test_check_writable_refuses_a_path_the_system_cannot_look_up(tmp_path):
    # (a symlink loop, a name too long: the OSError reached the command's catch-all, whose line
    # pointed at the cache folder)
    from tmplkit.atomic import check_writable
    from tmplkit.errors import InputError

    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    for bad, why in ((loop, "Too many levels of symbolic links"), (tmp_path / ("a" * 300), "File name too long")):
        with pytest.raises(InputError, match=f"cannot write the file here \\({why}\\); give a writable file path"):
            check_writable(bad)


def test_other_writers_are_this_one():
    from tmplkit.prefill import report

    assert report.write_atomic is atomic.write_output
    assert report.write_json is atomic.write_json and report.check_writable is atomic.check_writable


# ---- a user's -o behaves as a shell's `>` ---------------------------------------------------------


def test_symlink_is_written_through_and_stays_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("OLD", encoding="utf-8")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    atomic.write_output(link, "NEW")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text(encoding="utf-8") == "NEW"


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    atomic.write_output(link, "NEW")
    assert link.is_symlink() and (tmp_path / "made.json").read_text(encoding="utf-8") == "NEW"


def test_fifo_is_written_into_not_replaced(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic.write_output(fifo, "through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_no_program_reads_is_refused_not_waited_on(tmp_path, capsys):
    # (`audit -o pipe` with no reader waited forever once its work was done)
    import time

    from tmplkit.cli import main

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(atomic.InputError, match="a FIFO that no program reads; start its reader first"):
        atomic.write_output(fifo, "nobody reads this")
    assert time.monotonic() - start < 10 and stat.S_ISFIFO(fifo.lstat().st_mode)
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}")
    assert main(["audit", str(template), "-o", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a FIFO that no program reads" in err


def test_character_device_is_written_into_not_replaced(tmp_path):
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers, in our own folder
    except (PermissionError, OSError):
        pytest.skip("cannot make a device node here")
    atomic.write_output(dev, "discarded")
    atomic.write_json(dev, {"x": 1})
    assert stat.S_ISCHR(dev.lstat().st_mode)
    atomic.check_writable(dev)


def test_read_only_file_is_refused_not_replaced(tmp_path):
    from tmplkit.errors import InputError

    ro = tmp_path / "ro.json"
    ro.write_text("KEEP", encoding="utf-8")
    ro.chmod(0o444)
    with pytest.raises(InputError, match="read-only"):
        atomic.check_writable(ro)
    with pytest.raises(InputError, match="read-only"):
        atomic.write_output(ro, "NEW")
    assert ro.read_text(encoding="utf-8") == "KEEP"


def test_cli_output_into_device_and_through_symlink(tmp_path):
    """`tmplkit audit ... -o PATH` end to end: the device stays a device, the link stays a link."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        dev = None
    real = tmp_path / "report.json"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    fixture = os.path.join(os.path.dirname(__file__), "..", "fixtures", "templates", "chatml.jinja")
    for out in [link] + ([dev] if dev else []):
        run = subprocess.run([sys.executable, "-m", "tmplkit", "audit", fixture, "--format", "json", "-o", str(out)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    assert link.is_symlink() and '"schema_version"' in real.read_text(encoding="utf-8")
    if dev:
        assert stat.S_ISCHR(dev.lstat().st_mode)


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="/dev/stdout as Linux links it")
@pytest.mark.parametrize("where", ["/dev/stdout", "/proc/self/fd/1"])
def test_cli_output_into_its_own_standard_output_when_that_is_a_pipe(where):
    # /dev/stdout -> /proc/self/fd/1 -> `pipe:[...]`, a link only the kernel follows: the output was
    # taken for a new file in /proc/self/fd and failed after the work ("No such file or directory")
    fixture = os.path.join(os.path.dirname(__file__), "..", "fixtures", "templates", "chatml.jinja")
    run = subprocess.run([sys.executable, "-m", "tmplkit", "audit", fixture, "--format", "json", "-o", where],
                         capture_output=True, text=True, timeout=120)  # (standard output a pipe)
    assert run.returncode == 0, run.stderr
    assert '"schema_version"' in run.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("failing", ["/dev/full", "missing/c.txt"])
def test_several_outputs_are_written_all_or_none(tmp_path, failing):
    (tmp_path / "a.txt").write_text("old a", encoding="utf-8")
    outputs = [(tmp_path / "a.txt", "new a"), (tmp_path / "b.txt", b"new b"),
               (failing if failing.startswith("/") else tmp_path / failing, "c")]
    with pytest.raises(atomic.InputError, match="cannot write the output file"):
        atomic.write_outputs(outputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]  # (nor a temporary file left)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "old a"
    atomic.write_outputs(outputs[:2] + [("/dev/null", "c")])
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "new a" and (tmp_path / "b.txt").read_bytes() == b"new b"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_among_several_outputs_is_written_only_after_every_file_was(tmp_path):
    # (what is written into a pipe cannot be taken back: a pipe listed first still waits for the
    # regular files, and gets nothing where one of them fails)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # (so that opening it to write does not block)
    try:
        with pytest.raises(atomic.InputError, match="cannot write the output file"):
            atomic.write_outputs([(fifo, "into the pipe"), (tmp_path / "missing" / "b.txt", "b")])
        assert os.read(reader, 100) == b""
        atomic.write_outputs([(fifo, "into the pipe"), (tmp_path / "b.txt", "b")])
        assert os.read(reader, 100) == b"into the pipe" and (tmp_path / "b.txt").read_text(encoding="utf-8") == "b"
    finally:
        os.close(reader)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_several_outputs_stay_none_where_a_file_fails_only_at_fsync(tmp_path, monkeypatch):
    # (NFS or a quota reports a full disk at fsync: no target may be renamed before each is on disk)
    fsync = os.fsync

    def failing(fd):
        if "/.a.txt." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", failing)
    with pytest.raises(atomic.InputError, match=r"a\.txt: cannot write the output file \(No space left"):
        atomic.write_outputs([(tmp_path / "a.txt", "new a"), (tmp_path / "b.txt", "new b")])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_several_outputs_name_the_target_whose_rename_failed(tmp_path, monkeypatch):
    replace = os.replace

    def failing(src, dst):
        if str(dst).endswith("b.txt"):  # (a file mounted on its own: EBUSY)
            raise OSError(errno.EBUSY, "Device or resource busy", str(src), None, str(dst))
        replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing)
    with pytest.raises(atomic.InputError) as exc:
        atomic.write_outputs([(tmp_path / "a.txt", "a"), (tmp_path / "b.txt", "b")])
    assert str(exc.value).startswith(f"{tmp_path / 'b.txt'}: cannot write the output file (Device or resource busy)")
    assert _leftovers(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # (a.txt, renamed first, is taken back)


def test_a_failed_rename_puts_back_the_files_renamed_before_it(tmp_path, monkeypatch):
    replace = os.replace
    (tmp_path / "a.txt").write_text("old a", encoding="utf-8")
    os.chmod(tmp_path / "a.txt", 0o640)
    (tmp_path / "b.txt").write_text("old b", encoding="utf-8")

    def failing(src, dst):
        if str(dst).endswith("b.txt") and str(src).endswith(".tmp"):
            raise OSError(errno.EBUSY, "Device or resource busy", str(src), None, str(dst))
        replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing)
    for order in ([0, 1, 2], [2, 1, 0]):  # (whichever the write renames first, it is put back)
        outputs = [(tmp_path / "a.txt", "new a"), (tmp_path / "b.txt", "new b"), (tmp_path / "c.txt", "new c")]
        with pytest.raises(atomic.InputError, match=r"b\.txt: cannot write the output file"):
            atomic.write_outputs([outputs[i] for i in order])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # (c.txt, new, removed; no copies)
        assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "old a"
        assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640
        assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "old b"


def test_ctrl_c_during_the_renames_waits_for_the_last_one(tmp_path, monkeypatch):
    # (a Ctrl-C between two renames left one file new and one old)
    replace = os.replace
    calls = []

    def interrupted(src, dst):
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)
        calls.append(dst)
        replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    (tmp_path / "b.txt").write_text("old b", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        atomic.write_outputs([(tmp_path / "a.txt", "new a"), (tmp_path / "b.txt", "new b")])
    assert len(calls) == 2 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "new a"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "new b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_temporary_file_whose_permissions_cannot_be_set_is_removed(tmp_path, monkeypatch):
    def refused(fd, mode):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "chmod", refused)
    with pytest.raises(atomic.InputError, match=r"a\.txt: cannot write the output file \(Operation not permitted\)"):
        atomic.write_outputs([(tmp_path / "a.txt", "a")])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="needs POSIX signals")
def test_sigterm_during_the_renames_ends_the_process_after_the_last_one(tmp_path):
    # (SIGTERM's default handler ended the process between two renames: one file new, one old)
    script = f"""
import os, signal
from tmplkit import atomic
replace, calls = os.replace, []
def terminated(src, dst):
    calls.append(dst)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    replace(src, dst)
atomic.os.replace = terminated
folder = {str(tmp_path)!r}
atomic.write_outputs([(os.path.join(folder, n), "new " + n) for n in ("a.txt", "b.txt", "c.txt")])
"""
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text("old", encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGTERM, run.stderr
    assert [(tmp_path / n).read_text(encoding="utf-8") for n in ("a.txt", "b.txt", "c.txt")] == \
        ["new a.txt", "new b.txt", "new c.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "c.txt"]


def test_a_swap_whose_old_file_was_let_go_cannot_be_taken_back(tmp_path):
    # `write_outputs` lets the old files go once every rename is done; an `undo` after that (its
    # error path) removed the new file, having no old one to put back
    target = tmp_path / "report.json"
    target.write_text("old")
    stage = atomic._Staged(target)
    stage.write(b"new")
    stage.swap()
    stage.discard()
    stage.undo()
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_sigterm_while_an_output_is_written_leaves_no_temporary_file(tmp_path):
    # (SIGTERM's default ended the process inside the write: a half-written `.m.json.XXXX.tmp` was
    # left beside the old m.json, about one run in five of `mask -o m.json` so stopped)
    (tmp_path / "m.json").write_text("OLD", encoding="utf-8")
    script = (
        "import os, signal, sys\n"
        "from tmplkit import atomic\n"
        "write = atomic._Staged.write\n"
        "def halfway(self, data):  # (its temporary file made, nothing in it yet)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    write(self, data)\n"
        "atomic._Staged.write = halfway\n"
        "atomic.write_outputs([(sys.argv[1], 'NEW' * 1000)])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m.json")], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr  # (ended by the signal, as asked, once cleaned up)
    assert (tmp_path / "m.json").read_text(encoding="utf-8") == "OLD"
    assert _leftovers(tmp_path) == []
