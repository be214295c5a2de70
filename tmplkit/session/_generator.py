"""The session generator: seeded coding-agent sessions, OpenAI-style messages with tools.

A session file is JSON: either `{"messages": [...], "tools": [...]}` or a bare list of messages.
Messages have a `role` (system, user, assistant, tool) and `content` (a string, null, or a list of
`{"type": "text", "text": ...}` parts); assistant messages may carry `tool_calls`
(`{"id", "type": "function", "function": {"name", "arguments"}}`, arguments a JSON string or an
object) and tool messages a `tool_call_id`. That is what agents that speak the OpenAI chat API
send, so their logs can be used as they are (`load_session`).

`generate_session()` writes a realistic one, seeded: user requests, assistant tool calls, and tool
results that look like file contents, grep output, test runs and diffs, at a target length.

    >>> s = generate_session(target_tokens=3000, seed=1)
    >>> s.messages[0]["role"], s.messages[1]["role"]
    ('system', 'user')
    >>> sum(m["role"] == "tool" for m in s.messages) > 5
    True

Two styles: "tool-role" (tool results as `tool` messages, tool calls as `tool_calls`, for
templates with tool support such as Qwen's) and "user-turns" (for templates without tool support,
such as Gemma's: the assistant writes its tool call in its text and the agent sends each result
back as a user turn; no system message, since those templates reject one). A third, "agent", is
what a reasoning coding agent sends: "tool-role" plus `reasoning_content` on every assistant turn,
up to three parallel tool calls, long file reads and test logs, and an answer at the end of each
user request (for studying how templates rewrite history from one request to the next).

    >>> a = generate_session(target_tokens=3000, seed=1, style="agent")
    >>> all(m.get("reasoning_content") for m in a.messages if m["role"] == "assistant")
    True
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from ._conversation import Session

__all__ = ["STYLES", "TOOLS", "generate_session", "next_user_turn"]

STYLES = ("tool-role", "user-turns", "agent")


TOOLS = (
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "Path relative to the repository root."},
                    "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "grep", "description": "Search the repository with a regular expression.",
     "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern"]}}},
    {"type": "function", "function": {"name": "run", "description": "Run a shell command in the repository and return its output.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "edit_file", "description": "Replace an exact string in a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["path", "old", "new"]}}},
    {"type": "function", "function": {"name": "list_dir", "description": "List a directory.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
)

_SYSTEM = ("You are a coding agent working in the repository `{repo}`. Use the tools to inspect and change the code. "
           "Read before you edit, keep changes small, run the tests after each change, and explain what you did.")

_NOUNS = ["config", "cache", "session", "token", "parser", "request", "schema", "batch", "report", "client", "index",
          "worker", "queue", "store", "record", "plugin", "layout", "metric", "policy", "window", "buffer", "route"]
_VERBS = ["load", "parse", "build", "merge", "resolve", "flush", "render", "validate", "split", "collect", "fetch",
          "encode", "decode", "update", "apply", "normalize", "register", "compute", "select", "format"]
_PKGS = ["core", "io", "net", "util", "cli", "storage", "api", "engine"]
_REQUESTS = [
    "The test `{test}` fails since the last merge. Find out why and fix it without changing the test.",
    "Add a `--{flag}` option to the command line that is passed through to `{func}`; update the docs and add a test.",
    "`{func}` is slow on large inputs (we saw 40 s on a 200 MB file). Profile it and make it linear.",
    "Rename `{func}` to `{func2}` everywhere, keeping a deprecated alias for one release.",
    "There is a race in `{mod}` when two workers flush at once. Add a lock and a test that reproduces it.",
    "Please review the error handling in `{mod}`: errors should name the file and the cause on one line.",
    "Make `{func}` accept a path or an open file, and add type hints to the module.",
    "The CI job on Python 3.13 fails with a DeprecationWarning in `{mod}`. Fix the warning.",
    "Write tests for `{func}` covering empty input, unicode, and very long lines.",
    "Now update the changelog and summarize what changed in this session.",
]


class _Repo:
    """A made-up repository the session is about, seeded so files read twice look the same."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.name = rng.choice(["quill", "harbor", "lattice", "ember", "tessera", "marten"])
        self.modules = []
        for pkg in _PKGS:
            for noun in rng.sample(_NOUNS, 3):
                self.modules.append(f"src/{self.name}/{pkg}/{noun}.py")
        self.funcs = {m: [f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}" for _ in range(rng.randint(4, 9))] for m in self.modules}

    def func(self) -> tuple[str, str]:
        m = self.rng.choice(self.modules)
        return m, self.rng.choice(self.funcs[m])

    def test_path(self, mod: str) -> str:
        return "tests/test_" + Path(mod).stem + ".py"

    def source(self, mod: str, lines: int) -> str:
        r = random.Random(f"{self.name}:{mod}")
        noun = Path(mod).stem
        out = [f'"""{noun.capitalize()} handling for {self.name}: {r.choice(_VERBS)} and {r.choice(_VERBS)} {noun}s."""',
               "", "from __future__ import annotations", "", "import logging", "import os",
               "from dataclasses import dataclass, field", "from typing import Iterable", "",
               f"from ..util.errors import {noun.capitalize()}Error", "", "log = logging.getLogger(__name__)", "",
               f"DEFAULT_{noun.upper()}_LIMIT = {r.choice([64, 256, 1024, 4096])}", "", "",
               "@dataclass", f"class {noun.capitalize()}:", f'    """One {noun} and its state."""', "",
               "    name: str", "    size: int = 0", "    tags: list[str] = field(default_factory=list)", ""]
        for fn in self.funcs[mod]:
            arg = r.choice(_NOUNS)
            out += ["", f"def {fn}({arg}s: Iterable[{noun.capitalize()}], limit: int = DEFAULT_{noun.upper()}_LIMIT) -> list[{noun.capitalize()}]:",
                    f'    """{fn.replace("_", " ").capitalize()} from `{arg}s`, at most `limit` of them."""',
                    "    out = []"]
            for _ in range(r.randint(3, 8)):
                out.append(r.choice([
                    f"    for item in {arg}s:",
                    "        if item.size > limit:",
                    f"            raise {noun.capitalize()}Error(f\"{{item.name}}: size {{item.size}} over the limit {{limit}}\")",
                    "        out.append(item)",
                    f"    log.debug(\"{fn}: %d {arg}s\", len(out))",
                    "    if not out:",
                    "        return []",
                    "    out.sort(key=lambda x: (x.size, x.name))",
                    f"    path = os.path.join(os.environ.get(\"{self.name.upper()}_HOME\", \".\"), \"{noun}s\")",
                ]))
            out.append("    return out[:limit]")
        text = "\n".join(out)
        all_lines = text.splitlines()
        start = 0 if len(all_lines) <= lines else r.randint(0, len(all_lines) - lines)
        return "\n".join(f"{i + 1:>4}  {line}" for i, line in enumerate(all_lines[start:start + lines], start=start))


def _tool_step(repo: _Repo, rng: random.Random, mod: str, func: str, kind: str, long: bool = False) -> tuple[str, dict, str]:
    """One tool call: (thought, {name, arguments}, result text); `long`: whole-file reads."""
    test = repo.test_path(mod)
    if kind == "read_file":
        n = rng.choice([40, 60, 90, 120] if long else [4, 6, 8, 10, 12, 16, 24])
        return (f"Let me read `{mod}`.", {"name": "read_file", "arguments": {"path": mod}}, repo.source(mod, n))
    if kind == "grep":
        hits = []
        for _ in range(rng.randint(1, 6)):
            m = rng.choice(repo.modules)
            hits.append(f"{m}:{rng.randint(5, 300)}:    result = {func}({rng.choice(_NOUNS)}s, limit=limit)")
        return (f"Where is `{func}` used?", {"name": "grep", "arguments": {"pattern": rf"\b{func}\(", "path": "src"}}, "\n".join(hits))
    if kind == "test":
        n_pass = rng.randint(20, 300)
        fail = rng.random() < 0.4
        if not fail and rng.random() < 0.6:
            return ("Running the tests.", {"name": "run", "arguments": {"command": f"python -m pytest -q {test}"}},
                    "." * rng.randint(10, 60) + f"\n{n_pass} passed in {rng.uniform(0.5, 9):.2f}s")
        lines = ["============================= test session starts ==============================",
                 "platform linux -- Python 3.12.3, pytest-8.3.2, pluggy-1.5.0",
                 f"rootdir: /work/{repo.name}", f"collected {n_pass + fail} items", ""]
        for t in rng.sample(repo.modules, rng.randint(1, 3)):
            lines.append(f"{repo.test_path(t)} " + "." * rng.randint(5, 40))
        if fail:
            lines += ["", "=================================== FAILURES ===================================",
                      f"__________________________ test_{func}_limit __________________________", "",
                      f"    def test_{func}_limit():", f">       assert len({func}(make_items(10), limit=3)) == 3",
                      "E       AssertionError: assert 10 == 3", "E        +  where 10 = len([...])", "",
                      f"{test}:{rng.randint(10, 200)}: AssertionError",
                      "=========================== short test summary info ============================",
                      f"FAILED {test}::test_{func}_limit - AssertionError: assert 10 == 3",
                      f"========================= 1 failed, {n_pass} passed in {rng.uniform(0.5, 9):.2f}s ========================="]
        else:
            lines.append(f"============================== {n_pass} passed in {rng.uniform(0.5, 9):.2f}s ==============================")
        return ("Running the tests.", {"name": "run", "arguments": {"command": f"python -m pytest -q {test if rng.random() < .5 else 'tests'}"}},
                "\n".join(lines))
    if kind == "edit":
        return (f"I'll fix `{func}` to honour the limit.",
                {"name": "edit_file", "arguments": {"path": mod, "old": "    return out", "new": "    return out[:limit]"}},
                f"Edited {mod}: 1 replacement.")
    if kind == "diff":
        lines = [f"diff --git a/{mod} b/{mod}", f"--- a/{mod}", f"+++ b/{mod}",
                 f"@@ -{rng.randint(10, 90)},7 +{rng.randint(10, 90)},8 @@ def {func}("]
        for _ in range(rng.randint(3, 8)):
            sign = rng.choice([" ", " ", "-", "+"])
            lines.append(f"{sign}    {rng.choice(_VERBS)}_{rng.choice(_NOUNS)}(out, limit)")
        return ("Let me look at the diff so far.", {"name": "run", "arguments": {"command": "git diff"}}, "\n".join(lines))
    listing = "\n".join(sorted({Path(m).name for m in repo.modules if rng.random() < 0.6} | {"__init__.py"}))
    d = str(Path(mod).parent)
    return (f"What else is in `{d}`?", {"name": "list_dir", "arguments": {"path": d}}, listing)


_MUSINGS = [
    "The limit is applied after sorting, so the first items are the smallest; that matches the docstring.",
    "If `{func}` is called with an empty iterable it returns early, which the caller in `{mod}` does not expect.",
    "The test builds ten items and asks for three, so the slice must happen before the return.",
    "Reading the whole module first is cheaper than guessing from the grep hits.",
    "The error message should name the item and the limit; it already does.",
    "There may be a second caller that relies on the old behaviour, so I should grep before editing.",
    "Running only the one test file keeps the loop short; the full suite comes at the end.",
    "The log line uses %-formatting, which is fine for the logging module.",
]


def _reasoning(rng: random.Random, thought: str, func: str, mod: str) -> str:
    """A few sentences of an assistant turn's reasoning, seeded."""
    picks = rng.sample(_MUSINGS, rng.randint(2, 4))
    return " ".join([thought.replace("`", "'")] + [m.format(func=func, mod=mod) for m in picks])


class _Length:
    """A growing session's length as the generator checks it: the real count (`measure`) of the
    messages when last measured, plus the estimate of those after, a third of the characters of
    their JSON (without `measure`, the whole session is estimated so). The characters are summed as
    messages come (each is complete by the next look): a step costs its own messages, not the whole
    session again."""

    def __init__(self, measure: Callable[[Session], int] | None):
        self.measure = measure
        self.measured = 0  # the count of the messages up to the last measure
        self.seen = self.chars = self.chars_after = 0  # messages summed; their characters, all and since the measure

    def now(self, msgs: list[dict]) -> int:
        """The measured count and the estimate of the messages after it."""
        for m in msgs[self.seen:]:
            n = len(json.dumps(m, ensure_ascii=False))
            self.chars, self.chars_after = self.chars + n, self.chars_after + n
        self.seen = len(msgs)
        return self.measured + self.chars_after // 3

    def measured_now(self, msgs: list[dict]) -> int:
        """Measure the whole session (after `now`): `measure`, else a third of all the characters."""
        self.measured = self.measure(Session(tuple(msgs), TOOLS)) if self.measure else self.chars // 3
        self.chars_after = 0
        return self.measured


def _append_tool_calls(msgs: list[dict], calls, call_id: int, reasoning_rng: random.Random | None,
                       func: str, mod: str) -> int:
    """One assistant message with OpenAI `tool_calls` (reasoning when `reasoning_rng` is given), then
    one `tool` message per call; returns the last call id used."""
    thought = calls[0][0]
    tcs = []
    for _, call, _ in calls:
        call_id += 1
        tcs.append({"id": f"call_{call_id:04d}", "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}})
    msgs.append({"role": "assistant", "content": thought, "tool_calls": tcs})
    if reasoning_rng is not None:
        msgs[-1]["reasoning_content"] = _reasoning(reasoning_rng, thought, func, mod)
    for tc, (_, call, result) in zip(tcs, calls):
        msgs.append({"role": "tool", "tool_call_id": tc["id"], "name": call["name"], "content": result})
    return call_id


def _append_user_turn_call(msgs: list[dict], step) -> None:
    """The call written in the assistant's text and its result sent back as a user turn (templates
    without tools)."""
    thought, call, result = step
    msgs.append({"role": "assistant", "content": f"{thought}\n```tool_call\n{json.dumps(call, ensure_ascii=False)}\n```"})
    msgs.append({"role": "user", "content": f"Tool result ({call['name']}):\n```\n{result}\n```"})


# How long a generated session may be: 2 million tokens (about 6 MB of JSON) is past any context a
# session is replayed in, 200 agent-style requests about as long (`tmplkit session generate` says the same).
MIN_TOKENS, MAX_TOKENS, MAX_REQUESTS = 200, 2_000_000, 200


def _check_size(target_tokens, requests) -> None:
    """Refuse a length the generator would not end for (or end far past any use of)."""
    if isinstance(target_tokens, bool) or not isinstance(target_tokens, int) or not MIN_TOKENS <= target_tokens <= MAX_TOKENS:
        raise InputError(f"target_tokens must be a whole number from {MIN_TOKENS} to {MAX_TOKENS}, got {target_tokens!r}")
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, int) or not 1 <= requests <= MAX_REQUESTS):
        raise InputError(f"requests must be a whole number from 1 to {MAX_REQUESTS} or None, got {requests!r}")


def generate_session(target_tokens: int = 16000, seed: int = 0, style: str = "tool-role",
                     measure: Callable[[Session], int] | None = None, requests: int | None = None) -> Session:
    """A seeded coding-agent session of about `target_tokens` tokens.

    `measure(session)` returns the session's real token count (render + tokenize with the
    template and tokenizer it will be run with); without it a character estimate is used. The
    session grows by tool steps (6 to 12 per user request) until it reaches the target, and
    always ends with a tool result (the prompt an agent sends to get its next step).
    `requests` fixes the number of user requests instead (then the length follows).
    """
    if style not in STYLES:
        raise InputError(f"unknown session style {style!r}; styles are {', '.join(STYLES)}")
    _check_size(target_tokens, requests)
    rng = random.Random(seed)
    repo = _Repo(rng)
    system = _SYSTEM.format(repo=repo.name)
    msgs: list[dict] = [{"role": "system", "content": system}] if style != "user-turns" else []
    call_id, n_req = 0, 0
    length = _Length(measure)

    def done() -> bool:
        if requests is not None:
            return False
        if length.now(msgs) < target_tokens * 0.97:
            return False
        return length.measured_now(msgs) >= target_tokens

    while requests is None or n_req < requests:
        mod, func = _add_request(msgs, rng, repo, style, system if n_req == 0 else None)
        n_req += 1
        call_id, finished = _add_tool_steps(msgs, rng, repo, style, call_id, mod, func, done)
        if finished:
            break
    return Session(tuple(msgs), TOOLS, f"generated:seed={seed},style={style},target={target_tokens}")


def _add_request(msgs: list[dict], rng: random.Random, repo: _Repo, style: str, first: str | None) -> tuple[str, str]:
    """A user request appended to `msgs` (after the agent's answer to the one before; `first`: the
    system prompt, on the first request, which a user-turns session writes into it); the module and
    function it is about."""
    mod, func = repo.func()
    _, func2 = repo.func()
    req = rng.choice(_REQUESTS).format(test=f"{repo.test_path(mod)}::test_{func}_limit", flag=rng.choice(_NOUNS) + "-limit",
                                       func=func, func2=func2 + "_v2", mod=mod)
    if first is not None and style == "user-turns":
        req = first + "\n\n" + req
    if first is None:
        msgs.append({"role": "assistant", "content": rng.choice([
            "Done. The change is in place and the tests pass.",
            f"I changed `{func}` and added a test; all tests pass now.",
            "Finished: the fix is small and covered by a new test. Anything else?"])})
        if style == "agent":
            msgs[-1]["reasoning_content"] = _reasoning(rng, "The tests pass, so I can report back.", func, mod)
    msgs.append({"role": "user", "content": req})
    return mod, func


_STEP_KINDS = ("read_file", "grep", "read_file", "test", "edit", "test", "diff", "list_dir", "read_file", "grep", "test", "read_file")


def _add_tool_steps(msgs: list[dict], rng: random.Random, repo: _Repo, style: str, call_id: int, mod: str, func: str,
                    done: Callable[[], bool]) -> tuple[int, bool]:
    """The agent's 6 to 12 tool steps on a request appended to `msgs` (an agent's reads in parallel
    at times), until `done()`; (the next call id, whether `done()` ended them)."""
    agent, kinds = style == "agent", list(_STEP_KINDS)
    for k in range(rng.randint(6, 12)):
        kind = kinds[k] if rng.random() < 0.7 else rng.choice(kinds)
        if rng.random() < 0.3:
            mod, func = repo.func()
        if agent:
            parallel = rng.choice([1, 2, 3]) if kind in ("read_file", "grep", "list_dir") else 1
        else:
            parallel = 2 if (style == "tool-role" and kind in ("read_file", "grep") and rng.random() < 0.25) else 1
        calls = [_tool_step(repo, rng, mod if p == 0 else repo.func()[0], func, kind, agent) for p in range(parallel)]
        if style != "user-turns":
            call_id = _append_tool_calls(msgs, calls, call_id, rng if agent else None, func, mod)
        else:
            _append_user_turn_call(msgs, calls[0])
        if done():
            return call_id, True
    return call_id, False


def next_user_turn(session: Session, seed: int = 0) -> Session:
    """The session after the agent's answer and a new user request (for resume experiments)."""
    rng = random.Random(seed)
    extra = [{"role": "assistant", "content": "Done. The tests pass now; the fix is in place."},
             {"role": "user", "content": rng.choice(_REQUESTS[:-1]).format(test="tests/test_cli.py::test_help", flag="verbose",
                                                                          func="main", func2="main_v2", mod="src/cli.py")}]
    return session.with_messages(extra)
