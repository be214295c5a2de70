"""The generated turn asked for alone: what the model writes after a request, read off two short
renders (the session's leading system messages and the newest user message, with the turn and
without it) in place of the render of the whole conversation up to the turn's end.

Each request of a long session cost two whole renders (`requests.iter_requests`): the request,
and the conversation ending with its turn, to read what the model generated; asked for alone, the
turn costs two renders of a few messages. It is taken only where it is known to give what the
whole render gives:

- per template (message preparation and variables), once: on probe conversations of our own (a
  chat with a system message; two user requests with rounds of calls, parallel ones among them,
  with reasoning, with and without a system message) every request's generated turn is the same
  both ways (`path_trust`, kept for the process); the same with a message asked twice says
  whether a copy of a message earlier matters (`EarlierCopies`);
- per session: the last request's turn, after the longest history (where a template that counts
  calls or turns writes its largest number), the same both ways;
- per request: the template renders the short conversations, and the next request starts with
  what the server then holds (else that request's turn is read from the whole render: a template
  that writes the history otherwise once the turn exists, a loop guard marking a repeated call,
  shows it there, where neither the probes nor the last turn may).

The turn is read off the short renders as off the whole ones (`requests._generated_turn`: the
rest of the render after the request where it keeps its prefix, else the turn located). The short
request's generation prompt may be another than the request's (DeepSeek V3.2 writes one after
tool results, another after a user message): the turn after either is the same where the
template is trusted, whose probes ask for turns after both.

A template whose turn depends on the history before its newest user message (a call numbered
across the conversation, a turn counter) fails the first check and keeps the whole renders.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["read_once_per_template", "trusted_by_probes"]  # (the rest is `requests.iter_requests`'s)

# The short path pays where the requests' histories are long: two short renders cost about two
# renders' fixed part (a tool list, the variables), one whole render that and every message. It is
# decided at the first request with a history of LONG_HISTORY messages, and taken where the turns'
# histories from there on come to MIN_HISTORY messages in all (proving the short path on the probes
# and the last turn costs about that).
LONG_HISTORY = 64
MIN_HISTORY = 1000

_TRUSTED: dict = {}  # (short path, with copies) -> `trusted_by_probes`' cache
_TRUSTED_MAX = 64  # facts kept per cache (`read_once_per_template`)

T = TypeVar("T")


def context_of(messages: Sequence[dict], n: int) -> list[dict] | None:
    """The short history the turn after messages[:n] is asked for after: the leading system
    messages and the newest user message before n (None where there is none)."""
    found = since_user(messages, n)
    return found[0] + [messages[found[1]]] if found is not None else None


class EarlierCopies:
    """Where each message of a conversation first appears, by value. A template that compares
    messages by value renders one otherwise once a copy of it comes later (Mistral Nemo writes its
    tool list before every user message equal to the newest one), which a short render, without
    the copy before it, does not see: where the template does not agree on the probes with copies
    (`path_trust`), a short path is not taken where a copy lies before."""

    def __init__(self, messages: Sequence[dict]) -> None:
        self._keys = [_key(m) for m in messages]
        self._first: dict[str, int] = {}
        for i, k in enumerate(self._keys):
            self._first.setdefault(k, i)

    def before(self, indices, at: int, extra: Sequence[dict] = ()) -> bool:
        """Whether any message at `indices`, or any of `extra`, has a copy before message `at`."""
        return (any(self._first[self._keys[i]] < at for i in indices)
                or any(self._first.get(_key(m), at) < at for m in extra))


def _key(message: dict) -> str:
    return json.dumps(message, sort_keys=True, default=repr)


def since_user(messages: Sequence[dict], n: int) -> tuple[list[dict], int] | None:
    """(the leading system messages, the index of the newest user message before n), or None where
    no user message follows them before n."""
    lead = []
    for m in messages:
        if m.get("role") != "system":
            break
        lead.append(m)
    for i in range(n - 1, len(lead) - 1, -1):
        if messages[i].get("role") == "user":
            return lead, i
    return None


def path_trust(path: str, conversation, agree: Callable[[object], bool | None]) -> tuple[bool, bool]:
    """(whether the short path `path` may serve `conversation`'s template, whether it may where a
    message has a copy earlier too): `agree(probe)` says, for each of `probes()` (then
    `copy_probes()`), whether the path reads what the whole renders read (`trusted_by_probes`,
    kept per path)."""
    if not trusted_by_probes(_TRUSTED.setdefault((path, False), {}), conversation, agree, probes):
        return False, False
    return True, trusted_by_probes(_TRUSTED.setdefault((path, True), {}), conversation, agree, copy_probes)


def trusted_by_probes(cache: dict, conversation, agree: Callable[[object], bool | None], probes: Callable[[], list]) -> bool:
    """Whether a fast path may serve `conversation`'s template: `agree(probe)` says, for each of
    `probes()`, whether the fast path found what its proof finds (None: the probe does not apply);
    true where none disagrees and one agrees. Read once per template, message preparation and
    variables (`read_once_per_template`)."""
    def verdict() -> bool:
        verdicts = [agree(p) for p in probes()]
        return False not in verdicts and True in verdicts

    return read_once_per_template(cache, conversation, verdict)


def read_once_per_template(cache: dict, conversation, read: Callable[[], T], extra: tuple = (),
                           tools: bool = False) -> T:
    """`read()`, a fact of `conversation`'s template (a `ServerConversation`), computed once per
    template, message preparation and variables (and its `tools`, where `read` renders with them;
    and `extra`: what else it depends on) and kept in `cache` (the 64 newest) for the process; read
    each time where the template or variables cannot be a key."""
    try:
        given = [conversation.kwargs, conversation.tools] if tools else conversation.kwargs
        key = (conversation.template, conversation.inputs, json.dumps(given, sort_keys=True, default=repr), *extra)
        hash(key)
    except (TypeError, AttributeError):
        return read()
    if key not in cache:
        if len(cache) >= _TRUSTED_MAX:
            cache.pop(next(iter(cache)))
        cache[key] = read()
    return cache[key]


def probes(copies: bool = False) -> list:
    """The probe conversations the short paths are held against the whole renders on, per template;
    `copies`: with a message that comes again (a user message asked twice, an answer given twice),
    which a template that compares messages by value writes otherwise (`EarlierCopies`)."""
    from ._conversation import load_conversation
    from ._generator import TOOLS

    def call(i, name, args):
        return {"id": f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    def result(i, name, text):
        return {"role": "tool", "tool_call_id": f"call{i:05d}", "name": name, "content": text}

    def thought(text, calls=None, reasoning=None):
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {}),
                **({"reasoning_content": reasoning} if reasoning else {})}

    system = {"role": "system", "content": "Be brief."}
    first = {"role": "user", "content": "Where is load_worker used?"}
    plain = [{"role": "user", "content": "Hi"}, thought("Hello."), {"role": "user", "content": "Again"},
             thought("Hello again."), {"role": "user", "content": "Bye" if not copies else "Hi"},
             thought("Goodbye." if not copies else "Hello.")]
    # Two user requests, each with rounds of calls (parallel ones among them) before its answer:
    # what a counter of calls or turns across the conversation writes differs on the second.
    agent = [system, first,
             thought("Searching.", [call(1, "grep", {"pattern": "load_worker"})], "Grep first."),
             result(1, "grep", "src/a.py:3: load_worker()"),
             thought("Reading both.", [call(2, "read_file", {"path": "src/a.py"}), call(3, "read_file", {"path": "src/b.py"})],
                     "Two files to read."),
             result(2, "read_file", "def load_worker(): ..."), result(3, "read_file", "import a"),
             thought("In src/a.py.", reasoning="Found it."),
             first if copies else {"role": "user", "content": "Rename it."},
             thought("Renaming.", [call(4, "grep", {"pattern": "load_worker", "path": "src"})], "Callers first."),
             result(4, "grep", "src/b.py:1: a.load_worker()"),
             thought("Done.", reasoning="One caller.")]
    return [load_conversation([system] + plain), load_conversation({"messages": agent, "tools": list(TOOLS)}),
            load_conversation(agent[1:])]


def copy_probes() -> list:
    return probes(copies=True)
