"""Worker-process analysis: limits, crashes, ordering, and the host process staying small.

The targets below stand in for `analyze()` (a worker imports them by name): each misbehaves in
one way a hostile template can make an analysis misbehave.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from _kept import held_out

from tmplkit.analysis import Analysis
from tmplkit.auditing.isolate import analysis_from_exception, analyze_isolated, scan_only
from tmplkit.errors import InputError, RenderLimitError
from tmplkit.sources import ChatTemplate


def _ok(template):
    return Analysis(name=template.name, source=template.source, status="pass",
                    warnings=(f"pid {os.getpid()}",))


def _by_name(template):
    """Misbehaves according to the template's name (one target for a mixed batch)."""
    kind = template.name.split("-")[0]
    if kind == "sleep":
        time.sleep(3600)
    if kind == "nap":
        time.sleep(float(template.text))
    if kind == "alloc":
        return Analysis(name="x" * (10 ** 10), source="", status="pass")
    if kind == "grow":
        chunks = []
        while True:
            chunks.append(bytearray(16 << 20))
    if kind == "segv":
        import ctypes

        ctypes.string_at(0)
    if kind == "exit":
        os._exit(3)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "security":
        from jinja2.exceptions import SecurityError

        raise SecurityError("access to attribute '__class__' of 'str' object is unsafe.")
    if kind == "limit":
        raise RenderLimitError("render took too long", kind=template.text)
    if kind == "bigmsg":
        raise ValueError("boom\n" + "x" * 10 ** 7)
    if kind == "notanalysis":
        return 42
    if kind == "unpicklable":
        return Analysis(name=template.name, source="", status="pass", capabilities={"f": lambda: 0})
    if kind == "recursion":
        def f(n):
            return f(n + 1)
        f(0)
    return _ok(template)


def _hint_of_worker(template):
    """Reports how a limit hint reads inside the worker."""
    from tmplkit.sandbox import hint

    return Analysis(name=template.name, source=template.source, status="pass", warnings=(hint("seconds"),))


def T(name, text="{{ messages }}"):
    return ChatTemplate(text=text, name=name, source=f"test:{name}")


def _statuses(results):
    return [a.status for a in results]


def test_results_in_input_order_with_parallel_jobs():
    # Later templates finish first; results still come back in the input order.
    templates = [T(f"nap-{i}", str(0.3 - 0.1 * i)) for i in range(3)] + [T("ok-3")]
    results = analyze_isolated(templates, jobs=2, target=_by_name)
    assert [a.name for a in results] == [t.name for t in templates]
    assert _statuses(results) == ["pass"] * 4
    # Two workers, reused.
    assert len({a.warnings[0] for a in results}) == 2
    fresh = analyze_isolated(templates, jobs=2, target=_by_name, max_tasks_per_worker=1)
    assert len({a.warnings[0] for a in fresh}) == 4  # a fresh process for every template


def test_workers_are_replaced_after_a_crash_or_memory_exhaustion():
    names = ["ok-0", "ok-1", "alloc-2", "ok-3", "segv-4", "ok-5"]
    results = analyze_isolated([T(n) for n in names], jobs=1, memory_mb=256, target=_by_name)
    assert _statuses(results) == ["pass", "pass", "memory", "pass", "error", "pass"]
    pids = [a.warnings[0] for a in results if a.status == "pass"]
    assert pids[0] == pids[1] and len({pids[1], pids[2], pids[3]}) == 3


def test_timeout_kills_the_worker_and_the_run_goes_on():
    t0 = time.monotonic()
    results = analyze_isolated([T("ok-a"), T("sleep-b"), T("ok-c")], jobs=2, timeout=0.5, target=_by_name)
    elapsed = time.monotonic() - t0
    assert _statuses(results) == ["pass", "timeout", "pass"]
    assert "longer than 0.5 s" in results[1].errors[0]
    assert "If the template is legitimately slow, raise the timeout argument" in results[1].errors[0]
    assert 0.5 <= results[1].seconds < 3
    assert elapsed < 10
    assert not [p for p in psutil.Process().children(recursive=True) if p.name().startswith("tmplkit-analyze")]


@pytest.mark.parametrize("kind,status,reason", [
    ("alloc", "memory", "MemoryError"),
    ("grow", "memory", "MemoryError"),
    ("segv", "error", "crashed (SIGSEGV)"),
    ("exit", "error", "exited with code 3 without a result"),
    ("sigkill", "memory", "killed by SIGKILL"),
    ("security", "unsafe", "unsafe"),
    ("recursion", "error", "recursed too deeply"),
    ("notanalysis", "error", "returned int, not an Analysis"),
    ("unpicklable", "error", "could not be sent back"),
])
def test_each_failure_becomes_a_verdict(kind, status, reason):
    (a,) = analyze_isolated([T(f"{kind}-x")], timeout=20, memory_mb=256, target=_by_name)
    assert a.status == status, a.errors
    assert reason in a.errors[0]
    assert a.name == f"{kind}-x" and a.source == f"test:{kind}-x"
    assert "\n" not in a.errors[0] and "Traceback" not in a.errors[0]


@pytest.mark.parametrize("kind,status", [("timeout", "timeout"), ("memory", "memory"), ("size", "memory"),
                                         ("unsafe", "unsafe")])
def test_render_limit_kinds_map_to_statuses(kind, status):
    a = analysis_from_exception(T("t"), RenderLimitError("x", kind=kind), 1.0)
    assert a.status == status and a.seconds == 1.0


def test_huge_messages_are_bounded_and_one_line():
    (a,) = analyze_isolated([T("bigmsg-x")], target=_by_name)
    assert a.status == "error"
    assert len(a.errors[0]) < 2200 and "\n" not in a.errors[0]
    assert a.errors[0].endswith("more characters)")


def test_a_template_message_on_several_lines_is_one_line_in_process_as_in_a_worker():
    from tmplkit.analysis import analyze

    t = ChatTemplate(text="{{ raise_exception('bad\\nline two') }}", name="nl", source="-")
    in_process, (isolated,) = analyze(t), analyze_isolated([t])
    assert in_process.errors == isolated.errors == ("cannot render a one-message chat: bad line two",)


def test_mixed_batch_survives_everything():
    names = ["ok-0", "segv-1", "sleep-2", "alloc-3", "exit-4", "ok-5", "security-6", "ok-7"]
    results = analyze_isolated([T(n) for n in names], jobs=2, timeout=1.0, memory_mb=256, target=_by_name)
    assert _statuses(results) == ["pass", "error", "timeout", "memory", "error", "pass", "unsafe", "pass"]


def test_scan_warnings_come_back_even_when_the_worker_is_killed():
    hostile = "{{ ''.__class__.__mro__ }}"
    ok, slow = analyze_isolated([T("ok-1", hostile), T("sleep-2", hostile)], timeout=0.5, target=_by_name)
    for a in (ok, slow):
        assert any("'__class__'" in w for w in a.warnings), a.warnings
    assert slow.status == "timeout"
    (clean,) = analyze_isolated([T("x", "{{ messages[0].content }}")], target=scan_only)
    assert clean.warnings == ()


def test_progress_is_reported():
    seen = []
    analyze_isolated([T(f"ok-{i}") for i in range(4)], jobs=2, target=_by_name,
                     progress=lambda done, total, a: seen.append((done, total, a.name)))
    assert [d for d, _, _ in seen] == [1, 2, 3, 4]
    assert {n for _, _, n in seen} == {f"ok-{i}" for i in range(4)}
    assert all(t == 4 for _, t, _ in seen)


def test_host_memory_stays_bounded():
    proc = psutil.Process()
    before = proc.memory_info().rss
    analyze_isolated([T(f"alloc-{i}") for i in range(3)] + [T("grow-3")], jobs=2, memory_mb=256, target=_by_name)
    assert proc.memory_info().rss - before < 50 * 2 ** 20


def test_bad_arguments():
    assert analyze_isolated([], target=_by_name) == []
    with pytest.raises(InputError, match="jobs"):
        analyze_isolated([T("a")], jobs=0)
    with pytest.raises(InputError, match="timeout"):
        analyze_isolated([T("a")], timeout=0)
    with pytest.raises(InputError, match="memory"):
        analyze_isolated([T("a")], memory_mb=1)
    with pytest.raises(InputError, match="module-level function"):
        analyze_isolated([T("a")], target=lambda t: t)
    with pytest.raises(InputError, match="max_tasks_per_worker"):
        analyze_isolated([T("a")], max_tasks_per_worker=0)


_ORPHAN = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from test_isolate import T, _by_name
from tmplkit.auditing.isolate import analyze_isolated
print("start", flush=True)
analyze_isolated([T("sleep-1"), T("sleep-2")], jobs=2, timeout=600, target=_by_name)
"""


def test_workers_die_with_the_auditing_process():
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN, os.path.dirname(__file__)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "start"
        parent = psutil.Process(proc.pid)
        workers = []
        for _ in range(100):
            workers = parent.children(recursive=True)
            if len(workers) >= 3:  # the forkserver and two workers
                break
            time.sleep(0.1)
        assert len(workers) >= 3
        proc.kill()
        proc.wait(10)
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, alive
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()


def test_a_worker_that_cannot_start_is_a_verdict(monkeypatch):
    import itertools

    import tmplkit.auditing.workers as iso

    real = iso._context()
    starts = itertools.count()

    class FailingSecondStart:
        Pipe = staticmethod(real.Pipe)
        get_start_method = staticmethod(real.get_start_method)

        def Process(self, *args, **kwargs):
            proc = real.Process(*args, **kwargs)
            if next(starts) == 1:
                def fail():
                    raise OSError(24, "Too many open files")
                proc.start = fail
            return proc

    monkeypatch.setattr(iso, "_context", lambda: FailingSecondStart())
    results = analyze_isolated([T("ok-0"), T("ok-1"), T("ok-2")], jobs=1, target=_by_name, max_tasks_per_worker=1)
    assert _statuses(results) == ["pass", "error", "pass"]
    assert "could not start a worker process (OSError" in results[1].errors[0]


def _comparable(results):
    out = []
    for a in results:
        d = a.to_dict()
        d.pop("seconds")
        out.append(d)
    return out


@pytest.mark.corpus
@pytest.mark.slow
def test_corpus_same_results_with_any_number_of_jobs():
    """The corpus templates the tests use (`_kept`): jobs=2 gives what jobs=1 gives, and both what
    analyze() gives in process."""
    from tmplkit.analysis import analyze
    from tmplkit.sources import load

    templates = [t for t in load("corpus:llama.cpp") if not held_out(t.name)]
    assert len(templates) == 43
    one = analyze_isolated(templates, jobs=1)
    two = analyze_isolated(templates, jobs=2)
    assert [a.name for a in two] == [t.name for t in templates]
    assert _comparable(two) == _comparable(one)
    assert _comparable(one) == _comparable([analyze(t) for t in templates])


def test_hints_follow_the_caller_into_the_workers():
    from tmplkit.sandbox import hints_for

    (library,) = analyze_isolated([T("ok-1")], target=_hint_of_worker)
    assert library.warnings == ("raise Limits(seconds=...)",)
    with hints_for("cli"):
        ok, slow = analyze_isolated([T("ok-1"), T("sleep-2")], jobs=2, timeout=0.5, target=_by_name)
        (cli,) = analyze_isolated([T("ok-1")], target=_hint_of_worker)
    assert "not a command-line option" in cli.warnings[0]
    assert slow.status == "timeout" and slow.errors[0].endswith("If the template is legitimately slow, raise --timeout")


def test_the_command_line_names_its_flags(tmp_path, capsys):
    from tmplkit.cli import main

    hang = tmp_path / "hang.jinja"
    hang.write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    assert main(["audit", "--timeout", "0.5", str(hang)]) == 1
    out = capsys.readouterr().out
    assert "raise --timeout" in out and "timeout argument" not in out


def test_what_native_code_prints_as_a_worker_dies_stays_out_of_the_output():
    """A worker's native crash printed two dozen lines (llama.cpp's `terminate called`, ggml's
    backtrace through gdb, on both outputs) before the one line that says how the worker ended."""
    code = ("import os\n"
            "from tmplkit.auditing.contained import run_contained\n"
            "from tmplkit.errors import TmplkitError\n"
            "try:\n"
            "    run_contained(os.system, 'echo native-noise; echo native-noise >&2; kill -ABRT $PPID', what='t')\n"
            "except TmplkitError as exc:\n"
            "    print('error:', exc)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": root})
    assert "native-noise" not in proc.stdout + proc.stderr
    assert proc.stdout.startswith("error: t: the worker aborted (SIGABRT)") and proc.stdout.count("\n") == 1


@pytest.mark.parametrize("memory_mb", [8, 1 << 43])
def test_every_pool_refuses_a_memory_no_worker_can_be_given(memory_mb):
    # (past 2**43 MiB the worker's setrlimit overflowed: a traceback in the worker, for every contained command)
    import os as _os

    from tmplkit.auditing.contained import run_contained

    with pytest.raises(InputError, match="memory limit must be at least 16 MiB and at most 1073741824"):
        run_contained(_os.getpid, what="t", memory_mb=memory_mb)


def _echo(item, note):
    return item


def _prelude_raises(item):
    if item == "deep":
        raise RecursionError("maximum recursion depth exceeded")
    return None


def _refuse_here():
    raise ValueError("this item does not load in a worker")


class _Unreadable:
    """Pickles here; unpickling it (in the worker) raises."""

    def __reduce__(self):
        return (_refuse_here, ())


def test_a_worker_that_fails_before_its_work_says_why():
    # Its own output goes nowhere (native crash noise stays off the terminal), so a Python error
    # before the work (the prelude's, or an item that does not load there) comes through the pipe,
    # not as "the worker exited with code 1 without a result".
    from tmplkit.auditing.workers import Lost, run_in_workers

    out = run_in_workers(["deep", _Unreadable(), "plain"], _echo, lost=lambda item, lost: lost, prelude=_prelude_raises,
                         jobs=1, timeout=60)
    assert isinstance(out[0], Lost) and out[0].kind == "raised" and "RecursionError: maximum recursion" in out[0].error
    assert isinstance(out[1], Lost) and out[1].kind == "raised"
    assert "could not read its item: ValueError: this item does not load in a worker" in out[1].error
    assert out[2] == "plain"  # the same worker goes on


class _SetupRaises:
    def __enter__(self):
        raise OSError(28, "No space left on device")

    def __exit__(self, *exc_info):
        return False


def test_a_worker_whose_setup_fails_says_why_for_each_item():
    # the worker's context (the hint wording) raising on entry used to end the worker with its error
    # going nowhere: the items came back as "exited with code 1"
    from tmplkit.auditing.workers import Lost, run_in_workers

    out = run_in_workers(["a", "b"], _echo, lost=lambda item, lost: lost, setup=_SetupRaises, jobs=1, timeout=60)
    for lost in out:
        assert isinstance(lost, Lost) and lost.kind == "raised", lost
        assert lost.error == "the worker could not start: OSError: [Errno 28] No space left on device"
