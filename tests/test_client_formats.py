"""A session saved as a coding agent sends it to llama-server's other endpoints (a Responses API body,
as Codex sends it; an Anthropic Messages body, as Claude Code sends it) is read as the pinned
server converts it; the same conversions held against the server itself in test_engine_parity.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit.errors import InputError
from tmplkit.session import body_format, given_tools, load_conversation, load_session

SESSIONS = Path(__file__).resolve().parent.parent / "fixtures" / "sessions"


def _body(name: str) -> dict:
    return json.loads((SESSIONS / name).read_text(encoding="utf-8"))


def test_a_responses_body_is_read_as_the_server_converts_it():
    s = load_session(SESSIONS / "responses-api.json")
    assert s.roles == ("system", "developer", "user", "user", "assistant", "tool", "assistant", "tool", "assistant",
                       "user", "assistant", "tool", "assistant", "user")
    assert s.messages[0] == {"role": "system", "content": "You are a coding agent running in a terminal. Keep answers short."}
    assert s.messages[1]["content"] == [{"text": "<permissions>Commands run in a sandbox; the network is off.</permissions>",
                                         "type": "text"}]
    # a reasoning item opens the assistant message; the function call after it joins it
    call = s.messages[4]
    assert call["reasoning_content"] == "I should run the tests first." and call["content"] == []
    assert call["tool_calls"] == [{"function": {"arguments": '{"command":["make","test"],"workdir":"/src/app"}',
                                                "name": "shell"}, "id": "call_1", "type": "function"}]
    assert s.messages[5] == {"content": "FAILED tests/test_io.py::test_read - KeyError: 'path'\n1 failed, 41 passed",
                             "role": "tool", "tool_call_id": "call_1"}
    assert s.messages[7]["content"] == [{"type": "text", "text": "def read(cfg):\n    return open(cfg['path']).read()\n"}]
    # two assistant messages in a row are one, their parts in order; a string content is a part
    assert [p["text"] for p in s.messages[8]["content"]] == [
        "`read` indexes cfg['path'], but the test passes 'file'.", "Shall I rename the key?"]
    assert s.messages[9]["content"] == [{"text": "Yes, please.", "type": "text"}]
    # function tools only, `strict` true unless given
    assert [(t["function"]["name"], t["function"]["strict"]) for t in s.tools] == [("shell", True), ("apply_patch", False)]


def test_an_anthropic_body_is_read_as_the_server_converts_it():
    s = load_session(SESSIONS / "anthropic-messages.json")
    assert s.roles == ("system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant", "user",
                       "assistant", "user", "tool", "assistant", "user")
    # the system blocks joined, the per-request stamp written as the server writes it
    assert s.messages[0]["content"] == ("x-anthropic-billing-header: cc_version=2.0.14.a1b; cc_entrypoint=cli; "
                                        "cch=fffff;You are an interactive CLI coding assistant.")
    turn = s.messages[2]
    assert turn["reasoning_content"] == "Run the tests first."
    assert turn["content"] == [{"type": "text", "text": "Let me run the tests."}]
    assert turn["tool_calls"] == [{"id": "toolu_01", "type": "function", "function": {
        "name": "Bash", "arguments": '{"command":"make test","description":"Run the tests"}'}}]  # compact, in order
    # text blocks of a tool result joined; two results, two tool messages
    assert [m["content"] for m in s.messages[5:7]] == ["def read(cfg):\n    return open(cfg['path']).read()\n", "app/io.py:2"]
    # a tool call with no text: content ""; a redacted thinking block dropped
    assert s.messages[9]["content"] == "" and "reasoning_content" not in s.messages[9]
    assert s.messages[9]["tool_calls"][0]["id"] == "toolu_04"
    # a user message's text before the results it holds, as the server orders them
    assert s.messages[10]["content"] == [{"type": "text", "text": "<system-reminder>Keep it short.</system-reminder>"}]
    assert s.messages[8]["content"] == "Yes." and s.messages[11]["tool_call_id"] == "toolu_04"
    assert s.tools[0] == {"type": "function", "function": {"name": "Bash", "description": "Run a command.",
                                                           "parameters": _body("anthropic-messages.json")["tools"][0]["input_schema"]}}


def test_an_anthropic_bodys_messages_saved_alone_are_read_as_the_body_would_be():
    body = _body("anthropic-messages.json")
    alone = load_conversation(body["messages"])
    whole = load_conversation({"messages": body["messages"]})
    assert alone.messages == whole.messages and alone.roles[:3] == ("user", "assistant", "tool")


def test_a_list_with_a_bare_image_part_is_a_chat_and_its_image_refused():
    # (transformers' multimodal part, `{"type": "image"}`: read as an Anthropic body's messages, whose
    # converter drops an image with no source and then the message left empty, silently)
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "image"}]},
            {"role": "assistant", "content": "ok"}]
    assert body_format({"messages": chat}) == "chat"
    with pytest.raises(InputError, match=r"\[1\]\.content\[0\] is a 'image' part; only text parts"):
        load_conversation(chat)
    with_source = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    assert body_format({"messages": [{"role": "user", "content": [with_source]}]}) == "anthropic"


def test_a_chat_body_is_taken_as_it_is():
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "model": "m"}
    assert body_format(chat) == "chat"
    assert load_conversation(chat).messages == ({"role": "user", "content": [{"type": "text", "text": "hi"}]},)
    assert body_format({"input": "hi"}) == "responses"
    assert body_format({"system": "s", "messages": []}) == "anthropic"
    assert body_format({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1"}]}]}) == "anthropic"
    assert body_format({"messages": [], "tools": [{"name": "f", "input_schema": {}}]}) == "anthropic"


@pytest.mark.parametrize("body, match", [
    ({"input": "hi", "previous_response_id": "resp_1"}, r"previous_response_id: the body continues a stored response, "
                                                         r"which llama-server refuses; give the whole conversation"),
    # Codex's reasoning item with only its summary and encrypted content: the server needs its text
    ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": [], "content": None,
                                                     "encrypted_content": "gAAA"}]},
     r"input\[1\]\.content: a reasoning item without its text"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     r"input\[0\]\.content\[0\] is an image; only text is supported"),
    ({"input": [{"role": "assistant", "content": "hi"}]}, r"input\[0\]: its type cannot be told"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, r"a file part"),
    ({"input": 3}, r"input: it is neither a string nor a list"),
    ({"input": "hi", "tools": {}}, r"tools: it is not a list"),
    ({"system": "s", "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "u"}}]}]},
     r"messages\[0\]\.content\[0\] is an image"),
    ({"system": "s", "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1", "content": [
        {"type": "image", "source": {"type": "base64", "data": ""}}]}]}]}, r"messages\[0\]\.content\[0\] holds an image"),
    # named by the user's own place in the body (the list made has the system message first)
    ({"system": "s", "messages": [{"role": "human", "content": "hi"}]}, r"session.json: messages\[0\]\.role is 'human'"),
    ({"system": "s", "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1"}]},
                                  {"role": 5, "content": [{"type": "text", "text": "x"}]}]},
     r"messages\[1\]\.role must be a string"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}, r"input\[0\]\.content\[0\]\.text must be"),
    ({"input": "x", "tools": [{"type": "web_search"}, {"type": "function", "description": "no name"}]},
     r"tools\[1\]: a function tool without a name, which llama-server refuses; give \{\"type\": \"function\", \"name\""),
    ({"system": "s", "messages": [], "tools": [{"description": "d", "input_schema": {}}]},
     r"tools\[0\] has no name; give \{\"name\": ..., \"description\""),
])
def test_what_the_server_refuses_is_one_line_naming_the_item(tmp_path, body, match):
    path = tmp_path / "session.json"
    path.write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(InputError, match=match) as info:
        load_session(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_what_the_server_drops_or_writes_its_own_way():
    # an image of a source the server does not read is dropped (the results' text then as parts);
    # a tool_use input in the server's JSON (an integer past 64 bits, a float from 1e15: exponents);
    # the stamp replaced on the UTF-8 bytes, as the server does
    s = load_conversation({"system": "x-anthropic-billing-header: cch=\u00e9123;rest", "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}},
                                     {"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {"b": 1e15, "n": 18446744073709551616, "u": 18446744073709551615}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "text", "text": "a"}, {"type": "image", "source": {"type": "file"}}]}]}]})
    assert s.messages[0]["content"] == "x-anthropic-billing-header: cch=fffff;rest"
    assert s.messages[1]["content"] == [{"type": "text", "text": "hi"}]
    assert s.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"b":1e+15,"n":1.8446744073709552e+19,"u":18446744073709551615}'
    assert s.messages[3]["content"] == [{"type": "text", "text": "a"}]


def test_what_the_server_refuses_in_tools_and_numbers_is_one_line(tmp_path):
    # (a number past a double raised OverflowError; a tool not in the server's shape, or with a
    # description that is no string, rendered where the server refuses it)
    from tmplkit.session import for_server
    from tmplkit.sources import load_one

    chatml = load_one(str(SESSIONS.parent / "templates" / "chatml.jinja"))
    huge = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": 10**400}}}]}]}
    with pytest.raises(InputError, match=r"s.json: message 1 \(assistant\): its tool call's arguments hold a number of "
                                         r"401 digits, more than llama-server's JSON reader takes"):
        for_server(chatml, load_conversation(huge, source="s.json"))
    with pytest.raises(InputError, match=r"a.json: messages\[0\].content\[0\].input: a number of 401 digits"):
        load_conversation({"messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "1", "name": "f", "input": {"a": 10**400}}]}]}, source="a.json")
    hi = [{"role": "user", "content": "hi"}]
    for tools, said in (([{"name": "f", "parameters": {}}], r"tools\[0\] is not \{\"type\": \"function\""),
                        ([{"type": "function", "function": {"name": "f", "description": None}}],
                         r"tools\[0\] \(f\): its description is not a string, which llama-server refuses")):
        conversation = load_conversation({"messages": hi, "tools": tools}, source="t.json")
        with pytest.raises(InputError, match=said):
            for_server(chatml, conversation)
        assert for_server(chatml, conversation, inputs="transformers").tools == tuple(tools)  # (as given there)


def test_tools_as_each_engine_gives_them():
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "b": 1, "a": 2},
                                               "strict": True}},)
    (server,) = given_tools(tools, "server")
    assert server == {"type": "function", "function": {"name": "f", "description": "", "parameters": tools[0]["function"]["parameters"]}}
    assert list(server["function"]["parameters"]) == ["type", "b", "a"]
    assert given_tools(tools, "transformers") == tools
    assert given_tools((), "server") is None and given_tools(None, "transformers") is None
