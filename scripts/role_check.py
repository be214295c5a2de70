"""An independent full-role check of a template's delimiters, written apart from tmplkit's analysis.

It renders one mixed agent conversation with transformers (not tmplkit's sandbox; with the
agent's next steps right after tool results besides an answer, a call and a user message, where
the template takes them; with its system message, and again without it where the template renders
that too), splits each render with the delimiters under test by a splitter of its own (at each
position the earliest match wins, the longest among those), and requires:

1. every rendered message's content in a span of its own role (reasoning markers open no message:
   reasoning and reasoning_end delimiters are not used to split); a system message may also lie
   before the first delimiter (a preamble) or inside a user message's span (folded into its turn);
2. no span of the user role that holds no message content, from the first message's span on (a
   user start where no user message starts: a server ends a batch there, a trainer sees a user
   turn), and no user or tool span after the last message (inside the generation prompt); a
   system, tool or assistant start that matches where no message starts moves no message's
   content (1 holds) and misleads no consumer of the roles: it is reported apart (`strays`), not
   failed;
3. each user message in a span of its own.

One exception to 1: an answer that follows tool results with no markup between them (`...result]`
then the answer: the template writes no start for it, so no delimiter can exist) may lie in the span
of the result before it.

Where no delimiter can exist it says so instead of a verdict: the conversation renders the same
with every message of one role given another (tool as user, system as user, tool as system, an
answer as a user message), the template renders no conversation, or it drops the user messages'
content.

Used by scripts/bench_hub.py and tests/test_hub_roles.py; nothing here imports tmplkit.
"""

from __future__ import annotations

import json
import re
import signal
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["RoleCheck", "check_roles", "conversation_variants"]

SPLITTING_ROLES = ("system", "user", "assistant", "tool")
TOOL_NAME = "get_weather"
TOOLS = [{"type": "function", "function": {
    "name": TOOL_NAME, "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _c(tag: str) -> str:
    # Letters and digits only: no template escapes or splits them.
    return f"Wq{tag}Jv"


def _call(i: int, as_string: bool) -> dict:
    args = {"city": _c(f"arg{i}")}
    return {"id": f"call{i:05d}x", "type": "function",
            "function": {"name": TOOL_NAME, "arguments": json.dumps(args) if as_string else args}}


def _agent(system: bool, as_string: bool, parallel: bool, steps: bool = True) -> list[dict]:
    """`steps`: the agent's next steps right after tool results besides an answer: a call (with no
    text, as the other calls here), and a user message (a user who interjects while tools run)."""
    calls = [_call(1, as_string)] + ([_call(2, as_string)] if parallel else [])
    msgs = [{"role": "system", "content": _c("sys")}] if system else []
    msgs += [
        {"role": "user", "content": _c("user1")},
        {"role": "assistant", "content": _c("asst1")},
        {"role": "user", "content": _c("user2")},
        {"role": "assistant", "content": "", "tool_calls": calls},
    ]
    msgs += [{"role": "tool", "tool_call_id": c["id"], "name": TOOL_NAME, "content": _c(f"tool{i + 1}")}
             for i, c in enumerate(calls)]
    # A second round of calls, after a user message again.
    third = _call(3, as_string)
    msgs += [
        {"role": "assistant", "content": _c("asst3")},
        {"role": "user", "content": _c("user3")},
        {"role": "assistant", "content": "", "tool_calls": [third]},
        {"role": "tool", "tool_call_id": third["id"], "name": TOOL_NAME, "content": _c("tool3")},
    ]
    if steps:
        fourth, fifth = _call(4, as_string), _call(5, as_string)
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [fourth]},
            {"role": "tool", "tool_call_id": fourth["id"], "name": TOOL_NAME, "content": _c("tool4")},
        ]
    msgs += [
        {"role": "assistant", "content": _c("asst4")},
        {"role": "user", "content": _c("user4")},
    ]
    if steps:
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [fifth]},
            {"role": "tool", "tool_call_id": fifth["id"], "name": TOOL_NAME, "content": _c("tool5")},
            {"role": "user", "content": _c("user5")},
        ]
    return msgs


def _chat(system: bool) -> list[dict]:
    msgs = [{"role": "system", "content": _c("sys")}] if system else []
    return msgs + [{"role": "user", "content": _c("user1")}, {"role": "assistant", "content": _c("asst1")},
                   {"role": "user", "content": _c("user2")}, {"role": "assistant", "content": _c("asst2")},
                   {"role": "user", "content": _c("user3")}]


def _as_parts(messages: list[dict]) -> list[dict]:
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} if m.get("content") else m for m in messages]


def _flat(tools):
    return [t["function"] for t in tools]


def conversation_variants():
    """(label, messages, tools) in the order tried: the agent conversation first, then simpler ones;
    each with contents as strings, then as lists of text parts; tools wrapped, then flat."""
    for parts in (False, True):
        shape = _as_parts if parts else (lambda m: m)
        for steps in (True, False):  # (a template that refuses the agent's other next steps: without them)
            for system in (True, False):
                for as_string in (False, True):
                    for parallel in (True, False):
                        for flat in (False, True):
                            yield (f"agent system={system} string_arguments={as_string} parallel={parallel} flat_tools={flat} "
                                   f"parts={parts}" + ("" if steps else " steps=False"),
                                   shape(_agent(system, as_string, parallel, steps)), _flat(TOOLS) if flat else TOOLS)
        for system in (True, False):
            yield f"chat system={system} parts={parts}", shape(_chat(system)), None


@contextmanager
def _deadline(seconds: int):
    def stop(*_):
        raise TimeoutError(f"render took over {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def render(template: str, messages, tools, **kwargs) -> str:
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    messages = _normalize_chat_messages(messages)  # as apply_chat_template gives them (null keys dropped)

    kwargs.setdefault("bos_token", "")
    kwargs.setdefault("eos_token", "")
    with _deadline(20):
        out = render_jinja_template([messages], tools=tools, chat_template=template, add_generation_prompt=True, **kwargs)
    return out[0][0] if isinstance(out, tuple) else out[0]


def split(text: str, delimiters) -> list[tuple[str, int]]:
    """(role, start) of each span: the earliest match from the current position, the longest there."""
    delims = [(r, d) for r, d in delimiters if d and r in SPLITTING_ROLES]
    out, pos = [], 0
    while True:
        best = None
        for role, d in delims:
            at = text.find(d, pos)
            if at >= 0 and (best is None or at < best[1] or (at == best[1] and len(d) > len(best[2]))):
                best = (role, at, d)
        if best is None:
            return out
        out.append((best[0], best[1]))
        pos = best[1] + len(best[2])


def _needles(m: dict) -> list[str]:
    content = m.get("content")
    text = content[0]["text"] if isinstance(content, list) else content
    out = [text] if text else []
    out += [c["function"]["arguments"]["city"] if isinstance(c["function"]["arguments"], dict)
            else json.loads(c["function"]["arguments"])["city"] for c in m.get("tool_calls") or ()]
    return out


@dataclass
class RoleCheck:
    verdict: str  # 'pass', 'fail', 'impossible' (no delimiter can exist) or 'no render'
    problems: list[str] = field(default_factory=list)
    variant: str = ""
    strays: list[str] = field(default_factory=list)  # other starts where no message starts (rule 2)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "problems": self.problems, "variant": self.variant, "strays": self.strays}


def _first_render(template: str):
    errors = []
    for label, messages, tools in conversation_variants():
        try:
            text = render(template, messages, tools)
        except Exception as exc:  # noqa: BLE001 - any failure of an untrusted template: try the next shape
            errors.append(f"{label}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if all(_c(t) in text for t in ("user1", "user2", "user3")):
            return label, messages, tools, text
        errors.append(f"{label}: user content is not rendered")
    return None, None, None, "; ".join(errors[:2])


def _renders_as(template: str, messages, tools, text: str, role: str, other: str) -> bool:
    """Whether the render stays the same with every `role` message (answers: without tool calls)
    made an `other` message; only where the template renders those messages at all."""
    chosen = [m for m in messages if m["role"] == role and not m.get("tool_calls")]
    if not chosen or not all(_needles(m) and _needles(m)[0] in text for m in chosen):
        return False
    swapped = [{"role": other, "content": m["content"]} if any(m is c for c in chosen) else m for m in messages]
    try:
        return render(template, swapped, tools) == text
    except Exception:  # noqa: BLE001 - a template may refuse that shape: then it tells them apart
        return False


_MARKUP = re.compile(r"[A-Za-z0-9]|<[^<>]+>|\[[^\[\]]+\]")


def _unmarked_answer(text: str, messages, i: int) -> bool:
    """Message i is an answer right after a tool result, with no markup between the two contents."""
    if i == 0 or messages[i]["role"] != "assistant" or messages[i - 1]["role"] != "tool" or messages[i].get("tool_calls"):
        return False
    prev, cur = _needles(messages[i - 1]), _needles(messages[i])
    a, b = text.find(prev[0]) if prev else -1, text.find(cur[0]) if cur else -1
    return 0 <= a and a + len(prev[0]) <= b and not _MARKUP.search(text[a + len(prev[0]):b])


def check_roles(template: str, delimiters) -> RoleCheck:
    """The check of `delimiters` ([(role, text)]) on `template` (its Jinja text): the conversation as
    it renders, and the same without its system message where the template renders that too (the
    most common request has none, and a template may open a first user message otherwise then)."""
    label, messages, tools, text = _first_render(template)
    if messages is None:
        return RoleCheck("no render", [text])
    for role, other in (("tool", "user"), ("system", "user"), ("tool", "system"), ("assistant", "user")):
        if _renders_as(template, messages, tools, text, role, other):
            return RoleCheck("impossible", [f"{role} messages render exactly like {other} messages"], label)
    problems, strays = _placed(text, messages, delimiters)
    if messages[0]["role"] == "system":
        bare = messages[1:]
        try:
            other = render(template, bare, tools)
        except Exception:  # noqa: BLE001 - a template that wants its system message: nothing more to check
            other = None
        if other is not None and all(_c(t) in other for t in ("user1", "user2", "user3")):
            more, more_strays = _placed(other, bare, delimiters)
            problems += [f"without a system message: {p}" for p in more]
            strays += [f"without a system message: {p}" for p in more_strays]
    return RoleCheck("fail" if problems else "pass", problems, label, strays)


def _placed(text: str, messages, delimiters) -> tuple[list[str], list[str]]:
    """(problems, strays) of `text`, the render of `messages`, split by `delimiters` (rules 1-3)."""
    spans = split(text, delimiters)
    starts = [s for _, s in spans]

    def span_of(pos: int) -> int:
        k = -1
        for i, s in enumerate(starts):
            if s <= pos:
                k = i
        return k

    problems: list[str] = []
    strays: list[str] = []
    owned: dict[int, list[int]] = {}
    where: dict[int, list[int]] = {}
    for i, m in enumerate(messages):
        for needle in _needles(m):
            pos = text.find(needle)
            if pos < 0:
                continue  # the template drops it
            k = span_of(pos)
            where.setdefault(i, []).append(k)
            owned.setdefault(k, []).append(i)
    user_spans = [where[i][0] for i, m in enumerate(messages) if m["role"] == "user" and i in where]
    for i, ks in where.items():
        role = messages[i]["role"]
        for k in ks:
            got = spans[k][0] if k >= 0 else None
            if role == "system" and (k < 0 or got == "system" or k in user_spans):
                continue
            if got == "tool" and _unmarked_answer(text, messages, i):
                continue
            if got != role:
                problems.append(f"message {i} ({role}) lies in {'no span' if got is None else f'a {got} span'}")
    if owned:
        first, last = min(k for k in owned if k >= 0) if any(k >= 0 for k in owned) else 0, max(owned)
        for k, (role, at) in enumerate(spans):
            if k < first or k in owned:
                continue
            if k > last and role in ("user", "tool"):
                problems.append(f"a {role} delimiter matches in the generation prompt (character {at})")
            elif k <= last and role == "user":
                problems.append(f"a {role} delimiter matches where no message starts (character {at})")
            elif k <= last:
                strays.append(f"a {role} delimiter matches where no message starts (character {at})")
    if len(set(user_spans)) < len(user_spans):
        problems.append("two user messages share one span")
    return problems, strays
