"""Messages as the engine gives them: llama-server gives a null content as "", transformers drops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.session import Session, for_server, given_messages, messages_for, render_conversation
from tmplkit.turns import study_turns

FIX = Path(__file__).parent.parent / "fixtures" / "turns"
CALL = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}
# An OpenAI-style agent's session: the tool-call turn is sent with `content: null`.
MESSAGES = ({"role": "user", "content": "List it."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
            {"role": "assistant", "content": "One file."})


@pytest.fixture()
def template():
    return load_one(str(FIX / "content-concat.jinja"))


def test_the_server_gives_a_null_content_as_an_empty_string(template):
    # llama-server: common_chat_msg::to_json_oaicompat writes `content: ""` for a message without one
    given = messages_for(template, MESSAGES)
    assert given[1]["content"] == "" and given[1]["tool_calls"]
    assert "content" not in given_messages([{"role": "assistant"}], "transformers")[0]
    assert given_messages([{"role": "assistant"}], "server")[0]["content"] == ""
    # the caller's messages stay as they were
    assert MESSAGES[1]["content"] is None


def test_a_session_with_a_null_content_renders_as_the_server_renders_it(template):
    session = Session(MESSAGES, ())
    text = render_conversation(template, session)
    assert "<|assistant|>\n<call>ls(" in text
    report = study_turns(template, session)
    assert not report.error and report.n_requests == 2
    assert report.inputs == "server" and report.to_dict()["inputs"] == "server"


def test_the_transformers_setting_drops_the_null_key_as_apply_chat_template_does(template):
    report = study_turns(template, Session(MESSAGES, ()), inputs="transformers")
    assert "has no attribute 'content'" in report.error
    assert report.to_dict()["inputs"] == "transformers" and "null-valued keys dropped" in report.to_dict()["inputs_note"]
    assert for_server(template, Session(MESSAGES, ()), inputs="transformers").messages[1]["content"] is None


def test_an_unknown_inputs_setting_is_a_one_line_error(template):
    with pytest.raises(InputError, match="unknown inputs 'vllm'"):
        study_turns(template, Session(MESSAGES, ()), inputs="vllm")


def test_turns_cli_chooses_the_inputs(template, tmp_path, capsys):
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"messages": list(MESSAGES)}))
    src = str(FIX / "content-concat.jinja")
    assert main(["turns", src, "--session", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["reports"][0]["inputs"] == "server"
    assert main(["turns", src, "--session", str(path), "--inputs", "transformers"]) == 2
    assert "has no attribute 'content'" in capsys.readouterr().err


def test_a_tool_call_without_arguments_is_the_sessions_fault_as_llama_server_says(template, tmp_path, capsys):
    # llama-server refuses such a request (common/chat.cpp: fc.at("arguments")); a template that
    # then fails on the missing key was blamed for it
    bare = {"id": "c1", "type": "function", "function": {"name": "ls"}}
    messages = [MESSAGES[0], {**MESSAGES[1], "tool_calls": [bare]}, *MESSAGES[2:]]
    with pytest.raises(InputError, match=r"message 1 \(assistant\): tool_calls\[0\] \(ls\) has no 'arguments'"):
        for_server(template, Session(tuple(messages), ()))
    assert for_server(template, Session(tuple(messages), ()), inputs="transformers")  # given as sent there
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"messages": messages}))
    assert main(["turns", str(FIX / "content-concat.jinja"), "--session", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tmplkit: error: {path}: message 1") and "llama-server refuses" in err and err.count("\n") == 1
