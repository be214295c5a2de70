"""The next renders made ahead, on a second core: a forked child renders each request's follow-ups
(`session.requests.follow_up_renders`, what the divergence-aware setting predicts from) while this
process renders, tokenizes and splits the requests. On a long agent session those renders are about
half of the study; they depend only on the conversation, each request's turn and its time, which
are known before any request is rendered.

The child sends one frame a request, in order, each render as the length it shares with the render
sent before it and the rest (a request's follow-ups share all but their ends with each other and
with the next request's), so a 90k-token session's renders cross to this process as a few kilobytes each.
Where this process will read a request's follow-ups off short renders (`requests.FollowUpPlan`: a
long history, on a template the probes trust), the child makes those short renders instead of the
whole ones and this process splices them onto the request's text: rendered whole, a 294k-token
session's follow-ups took the child 8.7 s, spliced here 1.2 s.
Where the child cannot be made (no `fork`, one core) or stops early (killed, out of memory, or
sending nothing for `STALL` seconds: a lock another thread held at the fork stays held in the
child), the renders it did not send are made here: the result is the same either way.

    >>> ahead = NextRendersAhead.start(conversation)              # doctest: +SKIP
    >>> texts = ahead.collect(requests)    # (or ahead.renders(requests): one request's at a time)  # doctest: +SKIP
    >>> ahead.close()                                             # doctest: +SKIP
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import threading
import time

from .._interrupt import die_with_parent
from ..markup import lcp
from ..sandbox import PINNED_NOW
from ..session.requests import (
    DEFAULT_INTERVAL,
    FollowUpPlan,
    follow_up_renders,
    long_history_turns,
    may_splice,
    request_points,
    short_follow_ups,
    spliced_follow_ups,
)

__all__ = ["NextRendersAhead", "can_fork"]

_LENGTH = struct.Struct(">Q")
_REFUSED = object()  # a frame: the request's own short render refused (its follow-ups rendered whole)
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Seconds of silence from the child (since its last frame, or since it started) after which this
# process makes the rest itself: a child that sends nothing for that long is stuck (a lock another
# thread held when it was forked stays held in it) or far slower than its parent would be. Counted
# from the child's last frame, not from when this process asks: a child stuck since the fork costs no
# wait after the requests are rendered (the study's worker is stopped a short grace after them).
STALL = 30.0


def can_fork() -> bool:
    """Whether a forked child can render beside this process: `fork` exists and a second core is
    there for it."""
    if not hasattr(os, "fork"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores >= 2


class NextRendersAhead:
    """The child rendering `conversation`'s follow-ups ahead, and what it has sent so far."""

    def __init__(self, conversation, pid: int, channel: socket.socket, template=None) -> None:
        self._conversation = conversation
        self._template = template
        self._messages = list(conversation.messages)
        self._pid: int | None = pid
        # (a socket, not a pipe: `_stop` wakes the reader by shutting it down, where a pipe's reader
        # waits for every copy of its write end to close, one a fork elsewhere may hold on to)
        self._channel = channel
        self._stream = channel.makefile("rb")
        self._bodies: list[bytes] = []  # the frames as sent, drained from the socket by `_reader`
        self._done = False  # the child has sent all it will
        self._heard = time.monotonic()  # when the child last sent a frame (or started)
        self._arrived = threading.Condition()
        # the frames read, per request index: the renders, the short ones (`_REFUSED`: the request's
        # own short render refused), or None once given out
        self._frames: list = []
        self._prev = ""
        # (a thread here reads the socket as the child writes: its buffer is small, and the child
        # would wait on a full one while this process renders)
        self._reader = threading.Thread(target=self._read, name="tmplkit-next-renders", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, conversation, *, start=PINNED_NOW, interval=DEFAULT_INTERVAL, template=None) -> NextRendersAhead | None:
        """The child started on `conversation` (a `ServerConversation`, each request at `start` +
        k * `interval`, as `iter_requests` times them); None where `can_fork` says no. `template`:
        the conversation's, for the follow-ups read off short renders (without: all rendered whole)."""
        if not can_fork():
            return None
        points = request_points(list(conversation.messages))
        ours, theirs = socket.socketpair()
        parent = os.getpid()  # (read here: a child run late may find its parent gone already)
        # Ctrl-C and SIGTERM blocked across the fork and until this object exists, which can stop the
        # child: the child sets its own before it takes any, and this process gets those that came
        # meanwhile once they are let through again.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        pid, ahead = None, None
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child (its work is checked through what it sends)
                ours.close()
                _child(theirs.detach(), conversation, template, points, start, interval, old, parent)
            theirs.close()
            ahead = cls(conversation, pid, ours, template)
        except BaseException as exc:
            _abandon(pid, ours, theirs)
            # (no memory, process or thread left for a child: the renders are made here)
            if isinstance(exc, (OSError, RuntimeError)):
                return None
            raise
        finally:
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            except BaseException:  # (a signal that came meanwhile, raised as it is let through)
                if ahead is not None:
                    ahead.close()
                raise
        return ahead

    def collect(self, requests) -> tuple[tuple[str, ...], ...]:
        """`next_renders(conversation, template, requests)`: the child's frames, and those it did
        not send made here."""
        return tuple(self.renders(requests))

    def renders(self, requests):
        """`collect` one request's at a time, in order; a frame given out is not kept here (a
        study that tokenizes each request's and lets them go holds one request's renders)."""
        plan = FollowUpPlan.of(self._conversation, self._template, requests) if self._template is not None else None
        for r in requests:
            if not r.generated:
                yield ()
                continue
            sent = self._frame(r.index)
            if sent is not None:
                # (read once: only the text of the last, `_prev`, is needed after; read again, it is
                # made here)
                self._frames[r.index] = None
            yield self._texts(r, sent, plan)

    def _texts(self, r, sent, plan: FollowUpPlan | None) -> tuple[str, ...]:
        """Request `r`'s follow-ups from the child's frame `sent` (None: not sent), as
        `plan.renders(r)` gives them."""
        if isinstance(sent, tuple):
            return sent
        if plan is not None and plan.splices(r) and sent is not _REFUSED:
            texts = spliced_follow_ups(self._conversation, self._messages, r, sent)  # (sent: short, or None: made here)
            if texts is not None:
                return texts
        return follow_up_renders(self._conversation, self._messages, r.turn, r.time)

    def _read(self) -> None:
        try:
            while True:
                head = self._stream.read(_LENGTH.size)
                size = _LENGTH.unpack(head)[0] if len(head) == _LENGTH.size else -1
                body = self._stream.read(size) if size > 0 else b""
                if len(body) != size:
                    break  # (the child ended, or was stopped mid-frame: the rest is made here)
                with self._arrived:
                    self._bodies.append(body)
                    self._heard = time.monotonic()
                    self._arrived.notify()
        except (OSError, ValueError):  # (the stream closed under it by `close`)
            pass
        finally:
            with self._arrived:
                self._done = True
                self._arrived.notify()

    def _frame(self, k: int) -> tuple[str, ...] | None:
        while len(self._frames) <= k:
            with self._arrived:
                if not self._wait_for_frame():
                    self._stop()  # (stuck: the reader ends, the rest is made here)
                    self._arrived.wait_for(lambda: self._done)
                if len(self._bodies) <= len(self._frames):
                    return None
                body, self._bodies[len(self._frames)] = self._bodies[len(self._frames)], b""  # (read once)
            kind, sent = pickle.loads(body)
            if kind == "short":
                self._frames.append(sent if sent is not None else _REFUSED)
                continue
            texts = []
            for shared, rest in sent:
                self._prev = self._prev[:shared] + rest
                texts.append(self._prev)
            self._frames.append(tuple(texts))
        return self._frames[k]

    def _wait_for_frame(self) -> bool:
        """Whether a frame not yet read came, or the child is done, before it was silent for `STALL`
        seconds (held: `_arrived`)."""
        while not (len(self._bodies) > len(self._frames) or self._done):
            left = self._heard + STALL - time.monotonic()
            if left <= 0:
                return False
            self._arrived.wait(left)
        return True

    def close(self) -> None:
        """Stop the child (it may still be rendering what is no longer needed) and reap it."""
        self._stop()
        self._reader.join()
        self._stream.close()
        self._channel.close()

    def _stop(self) -> None:
        """Kill and reap the child, and end the reader (what it had not read is made here)."""
        _reap(self._pid)
        self._pid = None
        try:
            self._channel.shutdown(socket.SHUT_RDWR)  # (wakes the reader: it meets the end)
        except OSError:  # (shut down already)
            pass

    def __enter__(self) -> NextRendersAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reap(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):  # (reaped already: SIGCHLD ignored, say)
            pass


def _abandon(pid: int | None, *channel: socket.socket) -> None:
    """Undo a start that did not finish: the child, if made, killed and reaped; both ends closed."""
    _reap(pid)
    for end in channel:
        end.close()


def _child(fd: int, conversation, template, points, start, interval, mask, parent: int) -> None:  # pragma: no cover - runs in the child
    """Render each request's follow-ups and send them, a frame a request, while `parent` (the pid
    that forked it) is there to read them: whole, or short where `_spliced` says; never return
    (`os._exit`: no `finally`, `atexit` or buffer of the parent's runs twice)."""
    try:
        for signum in _SIGNALS:  # (the parent's handlers would print its line and exit as it does)
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _die_with(parent)
        messages = list(conversation.messages)
        short = _spliced(conversation, template, points)
        prev = ""
        with os.fdopen(fd, "wb") as channel:
            for k, (n, end) in enumerate(points):
                if os.getppid() != parent:  # (the parent is gone: nobody reads)
                    break
                if k in short:
                    frame: tuple = ("short", short_follow_ups(conversation, messages, (n, end), start + k * interval))
                else:
                    texts = follow_up_renders(conversation, messages, (n, end), start + k * interval) if end > n else ()
                    deltas = []
                    for text in texts:
                        shared = lcp(prev, text)
                        deltas.append((shared, text[shared:]))
                        prev = text
                    frame = ("whole", deltas)
                body = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
                channel.write(_LENGTH.pack(len(body)) + body)
                channel.flush()
    except BaseException:  # noqa: BLE001 - whatever stops the child, the parent makes the rest
        pass
    os._exit(0)



def _spliced(conversation, template, points) -> frozenset[int]:  # pragma: no cover - runs in the child
    """The requests (by index) whose follow-ups the parent will likely read off short renders
    (`FollowUpPlan.of`, as far as it can be told before the requests are rendered): their short
    renders are sent instead of the whole ones. Where the parent's plan says otherwise after all, it
    renders those whole itself."""
    late = long_history_turns(points)  # (a request's point is the turn it generates)
    if template is None or not late or not may_splice(conversation, template, [points[k][0] for k in late]):
        return frozenset()
    return frozenset(late)


def _die_with(parent: int) -> None:  # pragma: no cover - runs in the child
    """End this child when its parent ends, even in the middle of a render (a worker killed at its
    time limit while the child is inside a template's long C call would leave it running)."""
    die_with_parent()
    if os.getppid() != parent:  # (the parent ended before the signal was asked for)
        os._exit(0)
