"""llama.cpp issue 25213, as a test.

llama-server (since PR 24176) ends a prefill batch before every user-message start, found with two
delimiters, `<|im_start|>user` and `<|im_start|>assistant`, each tokenized on its own. Qwen-style
templates put tool responses inside a user turn, so on a resumed agent session every tool response
looks like a user start and the prompt is cut into hundreds of small batches. tmplkit's delimiter
set, turned into token ids in context, marks only the real user messages.
"""

from __future__ import annotations

import json

import pytest

from tmplkit.delimiters import ROLES, Delimiter, split_text, text_matches
from tmplkit.sources import corpus
from tmplkit.tokens.delimiter_ids import token_delimiters
from tmplkit.tokens.spans import SpanDetector

pytestmark = pytest.mark.corpus

TEMPLATES = ("Qwen3.5-4B", "Qwen3-Coder")

# llama-server's original pair (PR 24176), as it sends them to the tokenizer.
LLAMA_SERVER_DELIMITERS = (("user", "<|im_start|>user"), ("assistant", "<|im_start|>assistant"))

# What tmplkit derives for these templates (written out, so this test stands on its own).
TMPLKIT_DELIMITERS = {
    "Qwen3.5-4B": (
        Delimiter("tool", "<|im_start|>user\n<tool_response>\n"),
        Delimiter("tool", "\n</tool_response>\n<tool_response>\n"),
        Delimiter("system", "<|im_start|>system\n"),
        Delimiter("assistant", "<|im_start|>assistant\n"),
        Delimiter("user", "<|im_start|>user\n"),
    ),
    "Qwen3-Coder": (
        Delimiter("tool", "<|im_start|>user\n<tool_response>\n"),
        Delimiter("tool", "</tool_response>\n<tool_response>\n"),
        Delimiter("system", "<|im_start|>system\n"),
        Delimiter("assistant", "<|im_start|>assistant\n"),
        Delimiter("user", "<|im_start|>user\n"),
    ),
}

TOOLS = [{"type": "function", "function": {
    "name": "run", "description": "Run a shell command in the repository.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]


def agent_conversation(rounds: int = 60, users_every: int = 15) -> list[dict]:
    """A resumed coding-agent session: many tool round trips, a few real user messages."""
    msgs: list[dict] = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                        {"role": "user", "content": "The tests in tests/test_io.py fail; fix them."}]
    for r in range(rounds):
        n_calls = 1 + (r % 3 == 0)  # every third step runs two tools at once
        calls = [{"type": "function", "function": {"name": "run", "arguments": {"cmd": f"pytest -q -k case_{r}_{k}"}}}
                 for k in range(n_calls)]
        msgs.append({"role": "assistant", "content": f"Step {r}: checking.", "tool_calls": calls})
        for k in range(n_calls):
            msgs.append({"role": "tool", "content": f"FAILED tests/test_io.py::case_{r}_{k} - assert {r} == {r + 1}\n1 failed in 0.0{k}s"})
        if (r + 1) % users_every == 0:
            msgs.append({"role": "assistant", "content": f"Fixed {r + 1} cases so far."})
            msgs.append({"role": "user", "content": f"Good. Keep going ({r + 1})."})
    msgs.append({"role": "assistant", "content": "All tests pass now."})
    return msgs


def _render(name: str, messages: list[dict]) -> str:
    path = corpus.templates_dir() / f"{name}.jinja"
    try:
        from tmplkit.sandbox import render
        from tmplkit.sources import load_one
    except ImportError:
        return _render_plain(path, messages)
    return render(load_one(path), messages, tools=TOOLS)


def _render_plain(path, messages):  # until tmplkit.render is part of every checkout
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)

    def raise_exception(msg):
        raise jinja2.TemplateError(msg)

    return env.from_string(path.read_text()).render(messages=messages, tools=TOOLS, raise_exception=raise_exception,
                                                    add_generation_prompt=False)


def _analysis(name, delimiters, rendered):
    from tmplkit.analysis import Analysis, RoundTrip

    roles = tuple(s.role for s in split_text(rendered, delimiters))
    return Analysis(name=name, source=name, status="pass", delimiters=tuple(delimiters),
                    round_trip=RoundTrip(True, roles, roles, rendered=rendered))


def _derived_delimiters(name):
    """The delimiters tmplkit.analyze derives, or None while analyze is not available."""
    try:
        from tmplkit.analysis import analyze
        from tmplkit.sources import load_one

        a = analyze(load_one(corpus.templates_dir() / f"{name}.jinja"))
    except (ImportError, NotImplementedError):
        return None
    return a


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("delimiter_set", ["written", "derived"])
def test_only_real_user_messages_are_user_starts(qwen35, name, delimiter_set):
    messages = agent_conversation()
    rendered = _render(name, messages)
    n_tool = sum(m["role"] == "tool" for m in messages)
    n_user = sum(m["role"] == "user" for m in messages)
    # tool responses of one step share a user turn
    n_tool_turns = sum(1 for i, m in enumerate(messages) if m["role"] == "tool" and messages[i - 1]["role"] != "tool")
    assert n_tool >= 80 and n_user == 5

    ids, offsets = qwen35.tokenize_with_offsets(rendered)
    assert len(ids) > 5000

    # llama-server: the two delimiters, tokenized on their own.
    server = SpanDetector(LLAMA_SERVER_DELIMITERS, tokenizer=qwen35).split(ids)
    server_user_starts = server.starts("user")
    assert len(server_user_starts) == n_user + n_tool_turns  # every tool turn looks like a user start

    # tmplkit: the full delimiter set, as token ids derived in context.
    if delimiter_set == "written":
        analysis = _analysis(name, TMPLKIT_DELIMITERS[name], rendered)
    else:
        derived = _derived_delimiters(name)
        if derived is None:
            pytest.skip("tmplkit.analyze is not available in this checkout")
        if derived.round_trip is None or not derived.round_trip.passed:
            pytest.skip(f"the analysis of {name} does not pass its own round trip ({derived.status}); the audit reports it")
        analysis = _analysis(name, derived.delimiters, rendered)
    td = token_delimiters(analysis, qwen35)
    assert td.passed, td.problems
    spans = SpanDetector(td).split(ids)

    # where the real user messages start, read off the text
    real_user_chars = [pos for pos, d in text_matches(rendered, analysis.delimiters) if d.role == "user"]
    assert len(real_user_chars) == n_user
    token_at = {s: i for i, (s, _) in enumerate(offsets)}
    real_user_tokens = [token_at[c] for c in real_user_chars]

    assert spans.starts("user") == real_user_tokens
    assert spans.last_user_start() == real_user_tokens[-1]
    tool_starts = spans.starts("tool")
    assert len(tool_starts) == n_tool  # every tool response, the first of a turn and those after it
    assert not any(spans.is_user_start(p) for p in tool_starts)
    # each of llama-server's extra "user starts" is a tool response start for tmplkit
    assert set(server_user_starts) - set(real_user_tokens) <= set(tool_starts)
    # the roles of the token spans follow the conversation (consecutive tool messages each get one);
    # a reasoning span (where the analysis derives reasoning delimiters) lies inside an assistant turn
    expected = [m["role"] for m in messages]
    roles = list(spans.roles)
    assert [r for r in roles if r in ROLES] == expected
    assert all(roles[i - 1] in ("assistant", "reasoning") for i, r in enumerate(roles) if r not in ROLES)


def test_standalone_tokenization_of_the_tool_delimiter_misses(qwen35):
    """`<|im_start|>user\\n<tool_response>` tokenized alone ends in `>`; in context the `>` merges."""
    rendered = _render("Qwen3.5-4B", agent_conversation(rounds=3))
    ids = qwen35.tokenize(rendered)
    alone = SpanDetector([("tool", "<|im_start|>user\n<tool_response>"), ("user", "<|im_start|>user")],
                         tokenizer=qwen35).split(ids)
    assert alone.starts("tool") == []
    td = token_delimiters(_analysis("Qwen3.5-4B", (Delimiter("tool", "<|im_start|>user\n<tool_response>"),
                                                   Delimiter("user", "<|im_start|>user")), rendered), qwen35)
    assert td.passed, td.problems
    assert len(SpanDetector(td).split(ids).starts("tool")) == 3
