"""Agent sessions: the seeded generator, reading sessions written by agents, and their validation."""

from __future__ import annotations

import json

import pytest

from tmplkit.errors import InputError
from tmplkit.session import Session, generate_session, load_session, messages_for, next_user_turn, save_session, session_from_json
from tmplkit.sources import ChatTemplate, corpus


def test_generator_is_seeded_and_deterministic():
    a = generate_session(4000, seed=7)
    b = generate_session(4000, seed=7)
    c = generate_session(4000, seed=8)
    assert a.to_dict() == b.to_dict()
    assert a.to_dict() != c.to_dict()


def test_tool_role_session_looks_like_an_agent():
    s = generate_session(6000, seed=1, style="tool-role")
    roles = s.roles
    assert roles[0] == "system" and roles[1] == "user"
    assert roles[-1] == "tool"  # the prompt an agent sends for its next step
    calls = {c["id"]: c["function"]["name"] for m in s.messages if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    results = [m for m in s.messages if m["role"] == "tool"]
    assert len(results) >= 10 and all(m["tool_call_id"] in calls for m in results)
    for m in s.messages:
        for c in m.get("tool_calls", []):
            json.loads(c["function"]["arguments"])  # OpenAI style: a JSON string
    text = "\n".join(m["content"] for m in results)
    assert "def " in text and "passed" in text  # file contents and test output
    assert {t["function"]["name"] for t in s.tools} >= {"read_file", "grep", "run"}


def test_user_turns_session_sends_tool_results_as_user_messages():
    s = generate_session(4000, seed=2, style="user-turns")
    roles = s.roles
    assert "tool" not in roles and "system" not in roles
    assert roles[0] == "user" and roles[-1] == "user"
    assert all(a != b for a, b in zip(roles, roles[1:]))  # alternates, as Gemma's template demands
    assert sum(m["content"].startswith("Tool result") for m in s.messages) >= 10


def test_agent_session_has_reasoning_parallel_calls_long_outputs_and_several_requests():
    s = generate_session(20000, seed=1, style="agent", requests=3)
    roles = s.roles
    assert roles[0] == "system" and roles.count("user") == 3 and roles[-1] == "tool"
    assistants = [m for m in s.messages if m["role"] == "assistant"]
    assert all(m["reasoning_content"] for m in assistants)
    assert max(len(m.get("tool_calls") or ()) for m in assistants) >= 3  # parallel tool calls
    assert max(len(m["content"].splitlines()) for m in s.messages if m["role"] == "tool") >= 40  # long outputs
    # each later user request follows the agent's answer to the previous one
    for i, role in enumerate(roles):
        if role == "user" and i > 1:
            assert roles[i - 1] == "assistant" and not s.messages[i - 1].get("tool_calls")


def test_agent_style_leaves_the_other_styles_as_they_were():
    # the benchmark's sessions are seeded: adding a style must not change theirs
    a = generate_session(3000, seed=1, style="tool-role")
    assert not any("reasoning_content" in m for m in a.messages)
    assert max(len(m.get("tool_calls") or ()) for m in a.messages if m["role"] == "assistant") <= 2


def test_target_length_is_met_with_a_real_measure():
    measure = lambda s: sum(len(m.get("content") or "") for m in s.messages) // 4  # noqa: E731
    s = generate_session(5000, seed=3, measure=measure)
    assert 5000 <= measure(s) < 5000 * 1.15


def test_requests_fix_the_number_of_user_requests():
    s = generate_session(1000, seed=4, style="tool-role", requests=3)
    assert s.roles.count("user") == 3


def test_save_and_load_round_trip(tmp_path):
    s = generate_session(3000, seed=5)
    path = tmp_path / "session.json"
    save_session(s, path)
    loaded = load_session(path)
    assert loaded.to_dict() == s.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"]


def test_next_user_turn_appends_answer_and_request():
    s = generate_session(2000, seed=6)
    t = next_user_turn(s)
    assert t.messages[: len(s.messages)] == s.messages
    assert t.roles[len(s.messages):] == ("assistant", "user")


def test_accepts_a_bare_list_and_content_parts():
    s = session_from_json([{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                           {"role": "assistant", "content": None,
                            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                           {"role": "tool", "tool_call_id": "1", "content": "ok"}])
    assert s.roles == ("user", "assistant", "tool") and s.tools == ()
    reads = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls | default([]) %}{{ c.function.arguments | tojson }}"
                         "{% endfor %}{% endfor %}", "objects", "-")
    assert messages_for(reads, s.messages)[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert s.messages[1]["tool_calls"][0]["function"]["arguments"] == "{\"a\": 1}"  # the session is not changed


@pytest.mark.parametrize("obj, msg", [
    ({"msgs": []}, "an object with 'messages'; the object has keys"),
    ("hello", "expected a list of messages or an object with 'messages', got a string"),
    ([], "the conversation has no messages"),
    ([["user", "hi"]], "[0] must be an object with 'role' and 'content', got a list"),
    ([{"role": "bot", "content": "x"}], "[0].role is 'bot'; known roles: system, user, assistant, tool"),
    ([{"content": "x"}], "[0] has no 'role'"),
    ([{"role": "user", "content": 5}], "[0].content must be a string or a list of text parts"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}], "tool_calls[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "all"}, "tools"),
])
def test_bad_sessions_are_one_line_input_errors(obj, msg):
    with pytest.raises(InputError) as exc:
        session_from_json(obj, "s.json")
    assert msg in str(exc.value) and "\n" not in str(exc.value)


def test_bad_files(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_session(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "user", "content": "hi"}')
    with pytest.raises(InputError, match=r"bad.json"):
        load_session(bad)


@pytest.mark.corpus
def test_sessions_render_with_their_templates():
    from tmplkit.session import render_conversation
    from tmplkit.sources import load_one

    qwen = load_one(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    text = render_conversation(qwen, generate_session(3000, seed=1, style="tool-role"))
    assert text.count("<|im_start|>user\n<tool_response>") >= 5
    if not corpus.is_hub_fetched():
        pytest.skip("the Hub corpus is not in the cache; run `tmplkit corpus fetch hub`")
    gemma = load_one(corpus.gemma_template_path())
    text = render_conversation(gemma, generate_session(3000, seed=1, style="user-turns"))
    assert text.count("<start_of_turn>user\nTool result") >= 5 and text.endswith("<start_of_turn>model\n")
    assert isinstance(Session(()), Session)
