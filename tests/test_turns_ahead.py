"""The next renders made ahead in a forked child (`tmplkit.turns.ahead`): the same renders as made in
this process, from the child where it runs, and made here where the child stops early; nothing is
printed, nothing is left running."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.session import for_server, generate_session
from tmplkit.session.requests import next_renders, session_requests
from tmplkit.turns import ahead as ahead_module
from tmplkit.turns import study_turns
from tmplkit.turns.ahead import NextRendersAhead, can_fork

FIX = Path(__file__).parent.parent / "fixtures" / "turns"

forking = pytest.mark.skipif(not can_fork(), reason="no fork here, or one core")


@pytest.fixture(scope="module")
def case():
    # a template that rewrites the history (the next renders diverge) and one that keeps it
    session = generate_session(12000, seed=3, style="agent", requests=3)
    out = []
    for name in ("strict-alternation", "drops-reasoning"):
        template = load_one(str(FIX / f"{name}.jinja"))
        conversation = for_server(template, session)
        reqs = session_requests(conversation, template)
        out.append((conversation, reqs, next_renders(conversation, template, reqs)))
    return out


def _gone(pid: int) -> bool:
    """The process has ended (a zombie no one has reaped yet, as a container's first process may
    leave an orphan, has ended too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _parent_with_a_stuck_child(*, then: str, before: str = "") -> str:
    """A script whose process starts the next renders' child, which gets stuck in its first render
    (a template's long C call), prints the child's pid, then runs `then`; `before`: lines run
    before the start."""
    return f"""
import os, sys, threading, time
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from tmplkit import load_one
from tmplkit.session import for_server, generate_session
from tmplkit.turns import ahead
me = os.getpid()
real = ahead.follow_up_renders
def stuck(*a):
    if os.getpid() != me:
        threading.Event().wait()
    return real(*a)
ahead.follow_up_renders = stuck
{before}t = load_one({str(FIX / "strict-alternation.jinja")!r})
a = ahead.NextRendersAhead.start(for_server(t, generate_session(3000, seed=3, style="agent", requests=2)))
print(a._pid, flush=True)
{then}
"""


@forking
def test_the_childs_renders_are_the_ones_made_here(case, monkeypatch):
    for conversation, reqs, want in case:
        ahead = NextRendersAhead.start(conversation)
        assert ahead is not None
        pid = ahead._pid
        # from here on this process cannot make a follow-up: what comes back is the child's
        monkeypatch.setattr(ahead_module, "follow_up_renders", lambda *a: pytest.fail("made here, not in the child"))
        try:
            assert ahead.collect(reqs) == want and any(want)
        finally:
            ahead.close()
            monkeypatch.undo()
        assert _gone(pid)


@forking
def test_the_childs_renders_one_request_at_a_time_are_not_kept_once_given(case):
    conversation, reqs, want = case[1]
    with NextRendersAhead.start(conversation) as ahead:
        given = []
        for texts in ahead.renders(reqs):
            given.append(texts)
            assert not any(ahead._frames[:len(given)])  # (a study holds one request's renders, not the session's)
        assert tuple(given) == want and any(want)
        # read again, the renders given out are made here (not given as none)
        assert ahead.collect(reqs) == want


@forking
def test_a_child_stopped_early_leaves_the_rest_to_this_process_and_prints_nothing(case, capfd):
    from tmplkit._interrupt import _interrupted

    conversation, reqs, want = case[0]
    for signum in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM):  # (Ctrl-C to the process group reaches it too)
        # the command's own Ctrl-C handler (one line, exit 130) is not the child's to run
        old = signal.signal(signal.SIGINT, _interrupted)
        try:
            ahead = NextRendersAhead.start(conversation)
        finally:
            signal.signal(signal.SIGINT, old)
        os.kill(ahead._pid, signum)
        try:
            assert ahead.collect(reqs) == want
        finally:
            ahead.close()
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


@forking
def test_a_study_that_needs_fewer_requests_stops_the_child(case):
    conversation, reqs, want = case[0]
    with NextRendersAhead.start(conversation) as ahead:
        pid = ahead._pid
        assert ahead.collect(reqs[:1]) == want[:1]
    assert _gone(pid) and not any(t.name == "tmplkit-next-renders" for t in threading.enumerate())


def _stuck_child(monkeypatch, stall: float) -> None:
    """The next child made to wait forever at its first render (a lock another thread held when it
    was forked stays held in it), this process's own renders as before; STALL set to `stall`."""
    me = os.getpid()
    real = ahead_module.follow_up_renders

    def stuck_in_the_child(*args):
        if os.getpid() != me:
            threading.Event().wait()
        return real(*args)

    monkeypatch.setattr(ahead_module, "follow_up_renders", stuck_in_the_child)
    monkeypatch.setattr(ahead_module, "STALL", stall)


@forking
def test_a_child_that_sends_nothing_for_too_long_is_stopped_and_the_rest_made_here(case, monkeypatch):
    conversation, reqs, want = case[0]
    _stuck_child(monkeypatch, 0.5)
    start = time.monotonic()
    with NextRendersAhead.start(conversation) as ahead:
        pid = ahead._pid
        assert ahead.collect(reqs) == want
    assert time.monotonic() - start < 30 and _gone(pid)


@forking
def test_a_child_silent_since_the_fork_costs_no_wait_once_the_requests_are_made(case, monkeypatch):
    # the silence is counted from the child's last frame: one stuck since the fork, asked after the
    # parent's own rendering took longer than STALL, was waited for a whole STALL more (the turns
    # worker is stopped a grace of a tenth of its time limit after it)
    conversation, reqs, want = case[0]
    _stuck_child(monkeypatch, 3.0)
    with NextRendersAhead.start(conversation) as ahead:
        time.sleep(3.5)  # (the parent renders its requests meanwhile)
        asked = time.monotonic()
        assert ahead.collect(reqs) == want
        assert time.monotonic() - asked < 2.0  # (not another STALL: the child was stopped at once)


@forking
def test_the_study_made_ahead_is_the_study(qwen35):
    template = load_one(str(FIX / "strict-alternation.jinja"))
    session = generate_session(12000, seed=3, style="agent", requests=3)
    here = study_turns(template, session, tokenizer=qwen35, switches=False)
    start = time.monotonic()
    ahead = study_turns(template, session, tokenizer=qwen35, switches=False, ahead=True)
    assert time.monotonic() - start < 60
    assert ahead.to_dict() == here.to_dict() and here.cost.requests["divergence-aware"]


@forking
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the parent-death signal is Linux's")
def test_a_child_ends_with_its_parent_even_in_the_middle_of_a_render(tmp_path):
    # A worker killed at its time limit while its child is inside a template's long render: the
    # child would have gone on rendering, unseen, long after the command ended.
    import subprocess
    import sys

    script = _parent_with_a_stuck_child(then="threading.Event().wait()")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert not _gone(child)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_no_child_where_none_can_be_made(case, monkeypatch, qwen35):
    # (a process near its memory limit, or out of processes: fork fails, the renders are made here)
    conversation, reqs, want = case[0]
    template = load_one(str(FIX / "strict-alternation.jinja"))
    here = study_turns(template, conversation.conversation, tokenizer=qwen35, switches=False)

    def refuse():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    assert NextRendersAhead.start(conversation) is None
    assert study_turns(template, conversation.conversation, tokenizer=qwen35, switches=False, ahead=True).to_dict() == here.to_dict()


@forking
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the parent-death signal is Linux's")
def test_a_child_run_late_still_ends_with_its_parent(tmp_path):
    # The child's first lines run a second late, after its parent was killed: it read its parent's
    # pid then (the reaper's by that time), missed that the parent was gone, and rendered on.
    import subprocess
    import sys

    # (the child's first step, which sets its signals, a second late)
    late = ("real_signal = ahead.signal.signal\n"
            "def late(*a):\n"
            "    if os.getpid() != me:\n"
            "        time.sleep(1.0)\n"
            "    return real_signal(*a)\n"
            "ahead.signal.signal = late\n")
    script = _parent_with_a_stuck_child(before=late, then="os._exit(0)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    proc.wait()
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _gone(child)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


@forking
def test_a_ctrl_c_during_the_fork_leaves_no_child_nor_socket(case, monkeypatch):
    # Held across the fork, it is raised as it is let through: start() raised it before the object
    # that stops the child existed, and the child and its socket were left to the process's end.
    conversation = case[0][0]
    real_fork, made = os.fork, []

    def fork_then_ctrl_c():
        pid = real_fork()
        if pid:
            made.append(pid)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # (held: blocked here)
        return pid

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    fds = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    monkeypatch.setattr(os, "fork", fork_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            NextRendersAhead.start(conversation)
    finally:
        signal.signal(signal.SIGINT, old)
        monkeypatch.undo()
    assert made and _gone(made[0])
    assert not any(t.name == "tmplkit-next-renders" for t in threading.enumerate())
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds


@forking
def test_close_does_not_wait_on_a_copy_of_the_childs_end_held_elsewhere(case, monkeypatch):
    # Another thread's fork (multiprocessing's, say) between the socket's making and this process
    # closing the child's end keeps a copy of it open: close() waited for that process to end.
    import socket

    conversation, reqs, want = case[0]
    real, copies = socket.socketpair, []

    def socketpair_with_a_copy():
        ours, theirs = real()
        copies.append(os.dup(theirs.fileno()))
        return ours, theirs

    monkeypatch.setattr(socket, "socketpair", socketpair_with_a_copy)
    ahead = NextRendersAhead.start(conversation)
    monkeypatch.undo()
    assert copies  # (the child's channel is the socket pair this test holds a copy of)
    try:
        assert ahead.collect(reqs[:1]) == want[:1]
        closing = threading.Thread(target=ahead.close)
        closing.start()
        closing.join(30)  # (a hang guard: close() takes milliseconds)
        assert not closing.is_alive()
    finally:
        for fd in copies:
            os.close(fd)


def _ahead_parts(conversation, template, reqs, monkeypatch) -> tuple[tuple, list, list]:
    """The child's renders of `reqs` collected (the template given: short renders where the study
    splices), the kinds of frames it sent, and the follow-ups this process rendered whole itself."""
    me, real, made_here = os.getpid(), ahead_module.follow_up_renders, []
    monkeypatch.setattr(ahead_module, "follow_up_renders", lambda *a: (made_here.append(a[2]) if os.getpid() == me else None) or real(*a))
    with NextRendersAhead.start(conversation, template=template) as ahead:
        ahead._frame(len(reqs) - 1)  # (every frame read: their kinds seen before they are given out)
        kinds = [type(f).__name__ for f in ahead._frames]
        return ahead.collect(reqs), kinds, made_here


@forking
@pytest.mark.corpus
def test_follow_ups_the_study_splices_are_sent_as_short_renders_and_spliced_here(corpus_template, monkeypatch):
    """On a long session (Qwen3.5 drops earlier reasoning inside what is spliced) the child sends the
    short renders of the requests with long histories, not their whole renders (8.7 s in the child
    for a 294k-token session, 1.2 s spliced), and this process splices them: the same follow-ups."""
    t = corpus_template("Qwen3.5-4B")
    conversation = for_server(t, generate_session(60000, seed=11, style="agent"))
    reqs = session_requests(conversation, t)
    got, kinds, made_here = _ahead_parts(conversation, t, reqs, monkeypatch)
    assert got == next_renders(conversation, t, reqs)
    late = [r for r in reqs if r.generated and r.n_messages >= 64]
    assert kinds.count("ShortFollowUps") == len(late) > 10 and "tuple" in kinds
    assert made_here == []


@forking
def test_short_renders_the_study_does_not_splice_are_rendered_whole_here(monkeypatch):
    """The template marks every user message equal to the newest one: the probes trust splicing, so
    the child sends short renders, but the requests whose messages have an earlier copy are read
    whole here (`EarlierCopies`): the same follow-ups as made in this process."""
    from tmplkit.session import load_conversation

    turns = []
    for i in range(160):
        turns += [{"role": "user", "content": f"Question {i % 7 if i < 150 else i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
    t = load_one(str(FIX / "marks-copies-of-newest.jinja"))
    conversation = for_server(t, load_conversation([{"role": "system", "content": "Be brief."}] + turns))
    reqs = session_requests(conversation, t)
    got, kinds, made_here = _ahead_parts(conversation, t, reqs, monkeypatch)
    assert got == next_renders(conversation, t, reqs)
    assert "ShortFollowUps" in kinds and made_here
