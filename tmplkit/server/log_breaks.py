"""A llama-server log's breaks placed on the session it served: for each task, the request it was,
and the message each early batch end, checkpoint and restore fell on (`locate_breaks`). The log
itself is read by `tmplkit.server.log`, which knows nothing of sessions; this module joins the two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..analysis import analyze
from ..delimiters import split_text
from ..errors import InputError
from ..session import Session, load_session, messages_for, session_from_json
from ..session.requests import session_requests
from .log import ServerLog

__all__ = ["BreakPlace", "TaskLocation", "locate_breaks"]


@dataclass(frozen=True)
class BreakPlace:
    """A position of a task's prompt (`what`: 'break', 'checkpoint' or 'restored') and the message
    it fell on: at its start (within its delimiter, before its content) or inside it."""

    what: str
    pos: int
    message: int | None
    role: str | None
    at_start: bool
    span_role: str | None = None  # the role of tmplkit's span there (a tool result inside a user turn: 'tool')
    past_end: bool = False  # beyond the request's tokens (a task matched to no request): on no message

    def describe(self) -> str:
        if self.past_end:
            return f"{self.what} at {self.pos}: past the end of the request it is read on (no message)"
        if self.message is None:
            return f"{self.what} at {self.pos}: before the first message"
        where = "the start of" if self.at_start else "inside"
        role = self.role if self.role != "tool" else "tool result"
        return f"{self.what} at {self.pos}: {where} message {self.message} ({role})"

    def to_dict(self) -> dict:
        return {"what": self.what, "pos": self.pos, "message": self.message, "role": self.role,
                "at_start": self.at_start, "span_role": self.span_role, "past_end": self.past_end}


@dataclass(frozen=True)
class TaskLocation:
    """Where a task's breaks fell in the session: the request it was (`request`, its
    `n_messages`), whether the tokens matched the log's prompt length, and each place."""

    task: int
    request: int | None
    n_messages: int | None
    tokens_match: bool
    places: tuple[BreakPlace, ...]

    def counts(self) -> dict[str, int]:
        """Early batch ends at message starts, by the role of the message."""
        out: dict[str, int] = {}
        for p in self.places:
            if p.what == "break" and p.at_start and p.role:
                out[p.role] = out.get(p.role, 0) + 1
        return out

    def to_dict(self) -> dict:
        return {"task": self.task, "request": self.request, "n_messages": self.n_messages,
                "tokens_match": self.tokens_match, "breaks_at_message_starts": self.counts(),
                "places": [p.to_dict() for p in self.places]}


def locate_breaks(log: ServerLog, template, session, tokenizer, *, analysis=None) -> ServerLog:
    """`log` with, for each task, the session request it was and the message each early batch
    end, checkpoint and restore fell on (`ServerLog.locations`).

    `session` is what the client sent (a `Session`, a conversation file or parsed JSON); request k
    is its render up to where the model speaks (`tmplkit.turns.session_requests`), tokenized as
    llama-server tokenizes a prompt (with the vocabulary's BOS). A task is matched to the first
    request (from the last one matched on) whose token count is its prompt length; when none
    matches, its places are read on the longest request (`tokens_match` False: approximate). A task
    whose positions count from its first processed token (`TaskPrefill.relative`) is not placed.
    """
    if not isinstance(session, Session):
        session = session_from_json(session) if not isinstance(session, str) else _load_session(session)
    if analysis is None:
        analysis = analyze(template)
    if not analysis.delimiters:
        raise InputError(f"template '{getattr(template, 'name', '')}': tmplkit derives no delimiters for it, so "
                         "messages cannot be told apart in its render")
    requests = session_requests(session, template)
    messages = messages_for(template, session.messages)
    cache: dict[int, tuple] = {}

    def prepared(k: int):
        if k not in cache:
            text = requests[k].text
            ids, offsets = tokenizer.tokenize_with_offsets(text)
            bos = len(tokenizer.tokenize(text, add_bos=True)) - len(ids)  # the server's add_special
            cache[k] = (text, len(ids) + bos, bos, offsets, split_text(text, analysis.delimiters))
        return cache[k]

    _refuse_another_session(log, requests, prepared)
    out = []
    next_k = 0
    for task in log.tasks:
        if task.relative:  # (its positions count from a token the log does not place: none is on a message)
            continue
        k_found = None
        if task.n_prompt is not None:
            for k in range(next_k, len(requests)):
                if prepared(k)[1] == task.n_prompt:
                    k_found = k
                    break
        k = k_found if k_found is not None else len(requests) - 1
        if k_found is not None:
            next_k = k_found + 1
        text, n, bos, offsets, spans = prepared(k)
        n_msgs = requests[k].n_messages
        owners = _span_owners(text, spans, messages[:n_msgs])
        places = []
        wanted = [("break", p) for p in task.early_ends] + [("checkpoint", p) for p in task.checkpoints_created or ()] + \
                 [("restored", p) for p in task.checkpoints_restored or ()]
        for what, pos in wanted:
            places.append(_place(what, pos, bos, offsets, spans, owners, messages))
        out.append(TaskLocation(task.task, k, n_msgs, k_found is not None, tuple(places)))
    return replace(log, locations=tuple(out))


def _refuse_another_session(log: ServerLog, requests, prepared) -> None:
    """InputError where no task's prompt length is any request's token count and some prompt is
    longer than every request: the log served another session (or another template or tokenizer),
    and every place read on this one would be made up."""
    lengths = [t.n_prompt for t in log.tasks if t.n_prompt is not None]
    if not lengths or not requests:
        return
    counts = [prepared(k)[1] for k in range(len(requests))]
    if set(lengths) & set(counts) or max(lengths) <= max(counts):
        return
    raise InputError(f"the log's prompts ({min(lengths)}..{max(lengths)} tokens) are none of this session's requests "
                     f"({min(counts)}..{max(counts)} tokens with this template and tokenizer): give the session the "
                     "server was sent, with its template (--template) and tokenizer (--tokenizer)")


def _load_session(path: str):
    return load_session(path)


def _span_owners(text: str, spans, messages) -> list[int | None]:
    """The message each span holds: the first message whose content is found in it (contents
    looked for in message order, each after the last found)."""
    import bisect

    starts = [s.start for s in spans]
    owner: list[int | None] = [None] * len(spans)
    at = 0
    for i, m in enumerate(messages):
        needle = _needle(m)
        if not needle:
            continue
        found = text.find(needle, at)
        if found < 0:
            continue
        at = found + len(needle)
        k = bisect.bisect_right(starts, found) - 1
        if k >= 0 and owner[k] is None:
            owner[k] = i
    # a span with no content of its own (an empty assistant turn) belongs to the message before it
    last = None
    for k in range(len(owner)):
        if owner[k] is None:
            owner[k] = last
        last = owner[k]
    return owner


def _needle(message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(content, str) and content.strip():
        return content.strip()[:200]
    for tc in message.get("tool_calls") or ():
        name = (tc.get("function") or {}).get("name")
        if name:
            return name
    return ""


def _place(what: str, pos: int, bos: int, offsets, spans, owners, messages) -> BreakPlace:
    import bisect

    i = pos - bos
    if i < 0 or not offsets:
        return BreakPlace(what, pos, None, None, False)
    if i > len(offsets):  # (at len(offsets): the generation's start, the end of the last message)
        return BreakPlace(what, pos, None, None, False, past_end=True)
    c = offsets[min(i, len(offsets) - 1)][0] if i < len(offsets) else offsets[-1][1]
    starts = [s.start for s in spans]
    k = bisect.bisect_right(starts, c) - 1
    if k < 0:
        # within the first delimiter's opening tokens (a token may begin before it)
        if spans and i + 1 < len(offsets) and offsets[i][1] > spans[0].start:
            k = 0
        else:
            return BreakPlace(what, pos, None, None, False)
    span = spans[k]
    # a break at a span's opening: its token starts the span, or is the last one before it
    at_start = c == span.start or (k + 1 < len(spans) and i < len(offsets) and offsets[i][1] > spans[k + 1].start)
    if at_start and k + 1 < len(spans) and c != span.start:
        span, k = spans[k + 1], k + 1
    msg = owners[k] if k < len(owners) else None
    role = messages[msg]["role"] if msg is not None else None
    return BreakPlace(what, pos, msg, role, bool(at_start), span.role)
