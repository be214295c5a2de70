"""Conversation and session JSON: accepted forms, and a clear one-line InputError for the rest."""

from __future__ import annotations

import io
import json
import os

import pytest

from tmplkit.errors import InputError, TmplkitError
from tmplkit.session import Conversation, load_conversation

MSGS = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}]},
    {"role": "tool", "content": "a.txt", "tool_call_id": "1"},
    {"role": "assistant", "content": "done", "reasoning_content": "easy"},
]
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def _write(tmp_path, data, name="conv.json"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return p


def test_list_of_messages(tmp_path):
    c = load_conversation(_write(tmp_path, MSGS))
    assert c.roles == ("system", "user", "assistant", "tool", "assistant")
    assert c.tools is None
    assert c.messages[4]["reasoning_content"] == "easy"
    assert c.source.endswith("conv.json")


def test_object_with_messages_and_tools(tmp_path):
    c = load_conversation(_write(tmp_path, {"messages": MSGS, "tools": TOOLS, "model": "x", "meta": {}}))
    assert len(c.messages) == 5 and c.tools[0]["function"]["name"] == "ls"
    assert c.to_dict() == {"messages": MSGS, "tools": TOOLS}
    assert load_conversation(c.to_dict()) == Conversation(c.messages, c.tools, "<conversation>")


def test_python_objects_and_files():
    assert load_conversation(MSGS).roles[0] == "system"
    assert load_conversation(io.StringIO(json.dumps(MSGS))).roles[1] == "user"
    c = load_conversation(MSGS)
    assert load_conversation(c).messages == c.messages


def test_a_developer_message_is_taken_as_the_client_sent_it():
    # (what each engine then gives the template: tests/test_inputs.py)
    c = load_conversation([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert c.messages[0] == {"role": "developer", "content": "Be brief."}


def test_bom_is_accepted(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(MSGS[:2]).encode())
    assert load_conversation(p).roles == ("system", "user")


def test_text_parts_kept_and_flattened():
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    c = load_conversation([{"role": "user", "content": parts}])
    assert c.messages[0]["content"] == parts  # passed as is, as transformers does
    assert c.flattened().messages[0]["content"] == "hello world"


def test_renders_through_render_when_available():
    render = pytest.importorskip("tmplkit.sandbox")
    from tmplkit.sources import ChatTemplate

    t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}"
                     "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}", "t", "-")
    c = load_conversation([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert render.render(t, c.messages) == "<user>ab"


BAD = [
    ("not json", "{oops", "not valid JSON (line 1, column 2"),
    ("jsonl", '{"role": "user", "content": "a"}\n{"role": "user", "content": "b"}', "JSON Lines is not supported"),
    ("empty file", "   ", "empty file"),
    ("a string", '"hello"', "expected a list of messages or an object with 'messages', got a string"),
    ("a number", "42", "got a number"),
    ("object without messages", {"msgs": []}, "the object has keys {'msgs'}"),
    ("sharegpt", {"conversations": [{"from": "human", "value": "hi"}]}, "ShareGPT"),
    ("messages not a list", {"messages": {"role": "user"}}, "'messages' must be a list of messages, got an object"),
    ("no messages", [], "no messages"),
    ("message not object", ["hi"], "[0] must be an object with 'role' and 'content', got a string"),
    ("no role", [{"content": "x"}], "[0] has no 'role'"),
    ("sharegpt message", [{"from": "human", "value": "x"}], "ShareGPT 'from'/'value'"),
    ("role not string", [{"role": 1, "content": "x"}], "[0].role must be a string, got a number"),
    ("unknown role", [{"role": "narrator", "content": "x"}], "[0].role is 'narrator'; known roles: system, user, assistant, tool"),
    ("function role", [{"role": "function", "content": "x"}], "use 'tool'"),
    ("role with newline", [{"role": "us\ner", "content": "x"}], "'us\\ner'"),
    ("no content", [{"role": "user"}], "[0] (user) has no 'content'"),
    ("assistant empty", [{"role": "assistant"}], "only assistant messages with tool_calls may omit it"),
    ("content number", [{"role": "user", "content": 3}], "[0].content must be a string or a list of text parts, got a number"),
    ("content object", [{"role": "user", "content": {"text": "x"}}], "got an object"),
    ("image part", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "[0].content[0] is a 'image_url' part; only text parts"),
    ("untyped part", [{"role": "user", "content": [{"text": "x"}]}], "a part without 'type'"),
    ("string part", [{"role": "user", "content": ["x"]}], "[0].content[0] must be an object, got a string"),
    ("text not string", [{"role": "user", "content": [{"type": "text", "text": 5}]}], "[0].content[0].text must be a string"),
    ("tool_calls on user", [{"role": "user", "content": "x", "tool_calls": []}], "only assistant messages make tool calls"),
    ("tool_calls not list", [{"role": "assistant", "tool_calls": {"name": "x"}}], "tool_calls must be a list"),
    ("call without name", [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}], "has no function name"),
    ("call bad args", [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}],
     "arguments must be an object or a JSON string"),
    ("tools not list", {"messages": MSGS, "tools": {"name": "x"}}, "'tools' must be a list of tool definitions"),
    ("tool without name", {"messages": MSGS, "tools": [{"type": "function", "function": {}}]}, "tools[0] has no name"),
    ("tool not object", {"messages": MSGS, "tools": ["ls"]}, "tools[0] must be an object"),
    ("deep nesting", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize("data,expected", [(d, e) for _, d, e in BAD], ids=[n for n, _, _ in BAD])
def test_bad_conversations(tmp_path, data, expected):
    p = _write(tmp_path, data)
    with pytest.raises(InputError) as info:
        load_conversation(p)
    message = str(info.value)
    assert expected in message
    assert message.startswith(str(p) + ": ")
    assert "\n" not in message
    assert isinstance(info.value, TmplkitError) and info.value.exit_code == 2


def test_bad_file_errors(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_conversation(tmp_path / "missing.json")
    with pytest.raises(InputError, match="is a folder"):
        load_conversation(tmp_path)
    p = tmp_path / "latin1.json"
    p.write_bytes(b'[{"role": "user", "content": "caf\xe9"}]')
    with pytest.raises(InputError, match="not valid UTF-8 at byte 33"):
        load_conversation(p)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_conversation(fifo)  # must not wait for a writer
    deep = _write(tmp_path, [{"role": "user", "content": "x", "meta": [[[[[["..."]]]]]]}], "deep.json")
    assert load_conversation(deep).messages[0]["meta"]  # ordinary nesting is fine
    too_deep = _write(tmp_path, "[" * 300 + "]" * 300, "too-deep.json")  # under Python's limit, over tmplkit's
    with pytest.raises(InputError, match=r"nested too deeply for a conversation .*\(more than 256 levels\)"):
        load_conversation(too_deep)


def test_object_errors_name_the_source():
    with pytest.raises(InputError, match=r"^<conversation>: \[0\]\.role"):
        load_conversation([{"role": "x", "content": ""}])
    with pytest.raises(InputError, match=r"^session\.json: messages\[1\]"):
        load_conversation({"messages": [{"role": "user", "content": "a"}, {"role": "x", "content": ""}]},
                          source="session.json")
