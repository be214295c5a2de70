"""A session sent request by request through a running llama-server's chat endpoint, and what
the server's log says it did with each request.

Request k is the session's messages up to where the model speaks (after a user message, or after
all the tool results of a turn: `tmplkit.session.requests.request_points`), sent to
`/v1/chat/completions` exactly as a client sends them (tool-call arguments as the session has
them, the session's tools), with `cache_prompt`, a fixed seed and a few `max_tokens`. The server
renders each request with its own chat template and keeps its memory between requests, so each
result says what a real agent session costs on it: the batches it ran, the checkpoints it created
and restored, the tokens it reused and recomputed, and whether it re-processed the whole prompt.

The server must be one tmplkit started (`LlamaServer`: its log is read); run it with `-lv 4` or
more for every batch and checkpoint (at the default verbosity only the counts are logged):

    >>> with LlamaServer(binary, model, ["--jinja", "-lv", "4"], log=Path("s.log")) as srv:   # doctest: +SKIP
    ...     results = drive_session(srv, generate_session(8000, style="agent"))
    >>> [(r.n_reused, r.n_processed, r.prefill.checkpoints_restored) for r in results][:2]    # doctest: +SKIP
    [(0, 634, ()), (634, 872, ())]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import InputError, ModelError
from ..session import Session, session_from_json
from ..session.requests import request_points
from .log import TaskPrefill, read_server_log

__all__ = ["ServedRequest", "drive_session"]


@dataclass(frozen=True)
class ServedRequest:
    """One request of a session as llama-server served it: the counts from its answer
    (`n_prompt`, `n_reused`, `n_processed`) and its task as the log tells it (`prefill`)."""

    index: int
    n_messages: int
    n_prompt: int
    n_reused: int
    n_processed: int
    prefill: TaskPrefill

    def to_dict(self) -> dict:
        p = self.prefill
        return {"index": self.index, "n_messages": self.n_messages, "n_prompt": self.n_prompt,
                "n_reused": self.n_reused, "n_processed": self.n_processed, "task": p.task,
                "decode_calls": p.decode_calls, "batch_starts": list(p.batch_starts), "early_ends": list(p.early_ends),
                "checkpoints_created": None if p.checkpoints_created is None else list(p.checkpoints_created),
                "checkpoints_restored": None if p.checkpoints_restored is None else list(p.checkpoints_restored),
                "full_reprocess": p.full_reprocess, "pattern": p.pattern}


def drive_session(server, session, *, max_tokens: int = 2, seed: int = 0, cache_prompt: bool = True,
                  start: int = 0, requests: int | None = None, extra: dict | None = None,
                  log_wait_s: float = 30) -> tuple[ServedRequest, ...]:
    """Send `session` (a `Session`, or anything `session_from_json` takes) request by request to
    `server` (a running `LlamaServer`) and read each request's task from its log.

    `start`: begin at request `start` (a negative one counts from the end: -1 sends the whole
    session once, as a client resuming it on a fresh server does); `requests`: at most that many;
    `extra`: more fields for every request body (e.g. `{"chat_template_kwargs": {...}}`). Raises ModelError when the server refuses a request or
    its log does not show the task.
    """
    if not isinstance(session, Session):
        session = session_from_json(session)
    if max_tokens < 1:
        raise InputError(f"max_tokens must be 1 or more, got {max_tokens}")
    messages = [dict(m) for m in session.messages]
    points = request_points(messages)
    if not points:
        raise InputError(f"{session.source or 'session'}: no request in the session: the model speaks after a user "
                         "message or tool results; add a user message")
    head = server.log_text()  # the server's start lines: n_batch, n_ubatch, checkpoint settings
    out = []
    first = start if start >= 0 else max(0, len(points) + start)
    chosen = list(enumerate(points))[first:]
    for k, (n, _) in chosen[:requests]:
        body = {"messages": messages[:n], "max_tokens": max_tokens, "cache_prompt": cache_prompt, "seed": seed,
                "stream": False, **(extra or {})}
        if session.tools:
            body["tools"] = [dict(t) for t in session.tools]
        mark = len(server.log_text())
        answer = server.post("/v1/chat/completions", body)
        segment = _task_lines(server, mark, log_wait_s)
        log = read_server_log(head + segment, f"{server.log} (request {k})")
        task = log.tasks[-1]
        usage, timings = answer.get("usage") or {}, answer.get("timings") or {}
        out.append(ServedRequest(k, n, int(usage.get("prompt_tokens", task.n_prompt or 0)),
                                 int(timings.get("cache_n", task.n_reused or 0)),
                                 int(timings.get("prompt_n", task.n_processed or 0)), task))
    return tuple(out)


def _task_lines(server, mark: int, wait_s: float) -> str:
    """The log written since `mark`, once it holds a whole task (llama.cpp writes its log from a
    thread of its own, so the last lines may come after the answer)."""
    deadline = time.monotonic() + wait_s
    while True:
        segment = server.log_text()[mark:]
        start = segment.rfind("| processing task")  # the slot's line (at -lv 5 the queue has one too)
        if start >= 0 and "| stop processing" in segment[start:]:
            return segment
        if time.monotonic() > deadline:
            note = server.log_note() if hasattr(server, "log_note") else f"its log: {server.log}"
            raise ModelError(f"llama-server's log does not show the request's task within {wait_s:.0f} s (is it "
                             f"llama-server, logging at -lv 4 or more?); {note}")
        time.sleep(0.05)
