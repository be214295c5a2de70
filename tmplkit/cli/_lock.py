"""The `lock` subcommand (write or update a behaviour lock), and the audit's checks of templates
against a lock (`--lock`, the configuration's `lock`) and of GGUFs against their upstream (the
configuration's `[upstream]`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from ._common import (
    add_name,
    config_of,
    configured_templates,
    memory_mb,
    positive,
    progress_printer,
    refuse_worker_options_in_process,
    verbosity,
)
from ._once import one_path
from ._outputs import check_outputs
from .config import from_config

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


class _OneLock(argparse.Action):
    """--lock, -o and --output name the one file lock writes: two different ones are refused (the
    last would win, the first be silently ignored); one file in two spellings (`x.json`,
    `./x.json`, a symlink to it) is one."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None and not _same_file(given, values):
            raise argparse.ArgumentError(self, f"the lock file is given twice ({given} and {values}); give one")
        setattr(namespace, self.dest, values)


def _same_file(a: str, b: str) -> bool:
    """Whether paths `a` and `b` name one file: one path as options compare them
    (`_once.one_path`), or a hard link to the same file."""
    if one_path(a) == one_path(b):
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except (OSError, ValueError):  # (a NUL in a path: check_outputs refuses it in one line)
        return False


def add_lock(sub) -> None:

    from ..behaviour import DEFAULT_LOCK

    p = sub.add_parser(
        "lock",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write or update a behaviour lock: per template, the verdict, every role's delimiter, the "
                    "generation prompt and reasoning markers under each thinking switch, the tool placement, the "
                    "prefix-stability verdict on the agent session, and a digest of each probe render. "
                    "`tmplkit audit --lock FILE` then fails when a template's behaviour differs from it. Entries of "
                    "templates not given are kept (--fresh: dropped).",
        epilog="Example:\n  tmplkit lock templates/ --lock tmplkit.lock.json\n"
               "  tmplkit audit templates/ --lock tmplkit.lock.json   # exit 1 when a behaviour changed")
    p.add_argument("sources", nargs="*", metavar="SOURCE", help="as for audit; default: the configuration's sources")
    p.add_argument("--lock", "-o", "--output", dest="lock", metavar="FILE", action=_OneLock,
                   help=f"the lock file to write, atomically (default: the configuration's lock, else {DEFAULT_LOCK})")
    p.add_argument("--fresh", action="store_true", help="write only the templates given (drop other entries; also "
                                                        "replaces a lock of another layout)")
    add_name(p, many=True)
    add_derive_options(p)
    p.set_defaults(func=_cmd_lock, _writes_lock=True)  # (the lock is an output: cli/_outputs.py)


def add_derive_options(p) -> None:
    from ..behaviour import DEFAULT_TIMEOUT

    p.add_argument("--jobs", "-j", type=int, default=None, help="worker processes (default: the machine's cores)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"wall-clock seconds per template: its analysis and agent session (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--memory", type=int, default=None, metavar="MB", help="MiB a worker may allocate beyond its start-up footprint (default 1024)")
    p.add_argument("--in-process", action="store_true", help="derive in this process (no workers; render limits only)")


def derive(args, templates, cfg=None):
    """The behaviour records of `templates` under the command's limits (flags, then configuration)."""
    from ..behaviour import DEFAULT_TIMEOUT, derive_records

    cfg = cfg or config_of(args)
    jobs = positive(args.jobs if args.jobs is not None else cfg.jobs, "--jobs")
    timeout = positive(next(v for v in (args.timeout, cfg.timeout, DEFAULT_TIMEOUT) if v is not None), "--timeout")
    memory = memory_mb(next(v for v in (args.memory, cfg.memory, 1024) if v is not None))
    progress = progress_printer(sys.stderr.isatty() and verbosity(args) >= 0)
    return derive_records(templates, jobs=jobs, timeout=timeout, memory_mb=memory,
                          in_process=getattr(args, "in_process", False), progress=progress)


def _cmd_lock(args) -> int:
    from ..atomic import check_writable
    from ..behaviour import (
        DEFAULT_LOCK,
        BehaviourLock,
        compare,
        listed_names,
        read_lock,
        require_derived,
        require_replaceable,
        write_lock,
    )

    refuse_worker_options_in_process(args)  # (before the lock is read)
    cfg = config_of(args)
    if args.lock is None:
        # The lock the configuration (or the default) names is the output as --lock's is: an input,
        # or a file a folder source reads as a template, is refused alike (cli._outputs).
        args.lock = cfg.lock or DEFAULT_LOCK
        with from_config(cfg.path, "lock", cfg.lock is not None):
            check_outputs(args)
    path = args.lock
    # A lock to update is a file; a device or pipe (`-o /dev/null`) is written into, with nothing to keep.
    keeps = not args.fresh and os.path.isfile(path)
    old = read_lock(path, updating=True) if keeps else BehaviourLock()  # a bad lock: before any work
    if args.fresh and os.path.isfile(path):
        require_replaceable(path)  # (--fresh replaces a lock of any layout, never a file that is no lock)
    check_writable(path)
    records = derive(args, configured_templates(args, cfg), cfg)
    require_derived(records, f"{path} was not written (a lock holds behaviour, not where a limit or the sandbox stopped it)")
    with _folder_held(path):  # another lock run on the same file keeps its entries: read again, merge, write
        if keeps and os.path.isfile(path):
            old = read_lock(path, updating=True)
        before = _replaced(path) if args.fresh else old  # (what the summary compares with: --fresh too)
        lock = old.updated(records, fresh=args.fresh)
        write_lock(path, lock)
    new = [r for r in records if r.name not in before.records]
    diffs = {r.name: compare(before.records[r.name], r) for r in records if r.name in before.records}
    changed = [name for name, d in diffs.items() if not d.same]
    text_only = [name for name, d in diffs.items() if d.same and d.text_change]
    dropped = sorted(set(before.records) - set(lock.records))
    if verbosity(args) >= 0:
        n = len(records)
        said = f"{len(new)} new, {len(changed)} changed behaviour" + (f": {listed_names(changed, None)}" if changed else "")
        if text_only:
            said += f", {len(text_only)} text only: {listed_names(text_only, None)}"
        if dropped:
            said += f", {len(dropped)} dropped: {listed_names(dropped)}"
        print(f"tmplkit: wrote {path}: {n} template{'s' if n != 1 else ''} locked ({said}); {len(lock.records)} in the lock",
              file=sys.stderr)
    return 0


def _replaced(path: str):
    """The lock `lock --fresh` writes over, for its summary to compare with (an empty one where the
    file is no lock, or is not there: --fresh replaces it whatever it holds)."""
    from ..behaviour import BehaviourLock, read_lock
    from ..errors import InputError

    if not os.path.isfile(path):
        return BehaviourLock()
    try:
        return read_lock(path, updating=True)
    except InputError:
        return BehaviourLock()


@contextlib.contextmanager
def _folder_held(path: str):
    """An exclusive flock on the lock file's folder for the block (no file of its own to leave
    behind; the lock file itself is replaced, so it cannot hold one); nothing where flock is missing."""
    try:
        import fcntl
    except ImportError:  # (not POSIX)
        yield
        return
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the flock)


# ---- the audit's checks ----------------------------------------------------------------------------

def lock_for(args, cfg):
    """(path, BehaviourLock) the audit checks against (--lock, else the configuration's), or None;
    a missing, corrupt or other-layout lock is refused here, before any work."""
    from ..behaviour import read_lock
    from ..errors import InputError

    path = getattr(args, "lock", None) or cfg.lock
    if path is None:
        return None
    typed = bool(getattr(args, "lock", None))
    with from_config(cfg.path, "lock", not typed):
        if path == "-":  # (its advice would be a command that is refused)
            raise InputError(f"{'--lock' if typed else 'lock'} -: a lock is a file the audit reads; give its path")
        if not os.path.exists(path):
            raise InputError(f"{path}: no such lock; write it with `tmplkit lock SOURCE... --lock {path}`")
        return path, read_lock(path)


def precheck(lock, templates) -> None:
    """A template the lock does not hold is refused before the long work."""
    from ..behaviour import require_entries

    require_entries(lock[1], templates, lock[0])


def upstreams_for(cfg, templates) -> list:
    """[(gguf template, its upstream template)] for every GGUF the configuration's [upstream] names;
    each upstream is loaded here (an uncached offline Hub source: one line, before any work)."""
    from ..errors import InputError
    from ..sources.templates import load_one

    if not cfg.upstream:
        return []
    declared = {Path(k).resolve(): v for k, v in cfg.upstream.items()}
    for key in cfg.upstream:
        if not (gguf := Path(key).resolve()).is_file():  # (a typo would leave that GGUF's drift unchecked, without a word)
            with from_config(cfg.path, f"upstream.{key}"):  # (named as every configured value's error is)
                raise InputError(f"[upstream] names {gguf}, which is not a file; fix the path")
    pairs = []
    for t in templates:
        # (any template file: a GGUF's embedded template, or a .jinja kept beside its upstream; a
        # .jinja key was passed over without a word, its drift unchecked)
        spec = declared.get(Path(t.source).resolve()) if not t.source.startswith(("hf:", "corpus:", "-")) else None
        if spec is not None:
            name = t.name.split(":", 1)[1] if ":" in t.name and t.source.lower().endswith(".gguf") else None
            with from_config(cfg.path, f"upstream.{t.source}"):
                pairs.append((t, load_one(spec, name)))
    return pairs


def run_checks(args, cfg, templates, lock, pairs) -> list[tuple[str, str, str, str]]:
    """The lock check and the upstream drift check: their findings, each (kind, name, source,
    message) with kind LOCK, DRIFT (each fails the audit), TEXT (a text-only edit: no change in
    behaviour, said apart) or "" (a summary line)."""
    from ..auditing import show
    from ..behaviour import check_lock, compare, render_line

    if not lock and not pairs:
        return []
    n = len(templates)
    records = derive(args, list(templates) + [u for _, u in pairs], cfg)
    out: list[tuple[str, str, str, str]] = []
    if lock:
        check = check_lock(lock[1], records[:n], lock[0])
        out += [("LOCK", name, source, f"not checked: its behaviour was not derived: {reason}")
                for name, source, reason in check.unchecked]
        for name, source, d in check.diffs:
            out += [("LOCK", name, source, c.message) for c in d.changes]
            if d.changes and d.first_render:
                out.append(("LOCK", name, source, "first differing render: " + render_line(d.first_render)))
            if d.same and d.text_change and verbosity(args) >= 0:  # said apart, not a failure
                out.append(("TEXT", name, source, d.headline))
        if not check.ok or verbosity(args) >= 0:
            out.append(("", "", "", check.summary()))
    index = {id(t): i for i, t in enumerate(templates)}
    for (t, _), up in zip(pairs, records[n:]):
        lost = next((r for r in (up, records[index[id(t)]]) if not r.derived), None)
        if lost is not None:
            out.append(("DRIFT", t.name, t.source, f"not checked against its upstream {up.source}: the behaviour of "
                                                   f"{lost.source} was not derived: {lost.reason or lost.verdict}"))
            continue
        d = compare(up, records[index[id(t)]])
        if not d.same:
            out += [("DRIFT", t.name, t.source, f"from its upstream {up.source}: {c.message}") for c in d.changes]
        elif verbosity(args) >= 0:
            out.append(("", "", "", f"upstream {up.source} -> {show(t.name)}: {d.headline}"))
    return out


def print_checks(findings, fmt: str, output: str | None) -> None:
    """The checks' findings: after a text report on stdout, as annotations in github format (on the
    template's file), else on stderr."""
    if not findings:
        return
    from ..auditing import show
    if fmt == "github" and not output:
        for kind, name, source, message in findings:
            if kind == "TEXT":
                print(f"::notice file={_escape(source, True)},title=tmplkit lock%3A {_escape(name, True)}::{name}: {_escape(message)}")
            elif kind:
                print(f"::error file={_escape(source, True)},title=tmplkit {kind.lower()}%3A {_escape(name, True)}::"
                      f"{name}: {_escape(message)}")
            else:
                print(message)
        return
    # (a template's name is a file's: shown escaped, a line break in it would start a line of its own)
    text = "\n".join(f"{kind:<5} {show(name)}: {message}" if kind else message for kind, name, source, message in findings)
    print(text, file=sys.stdout if fmt == "text" and not output else sys.stderr)


def _escape(text: str, prop: bool = False) -> str:
    """GitHub workflow-command escaping (a property also escapes ':' and ',')."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text
