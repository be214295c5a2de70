"""Messages as the engine gives them: llama-server gives a null content as "", transformers drops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.cli import main
from tmplkit.errors import InputError, RenderError
from tmplkit.session import Session, for_server, given_messages, messages_for, render_conversation, session_from_json
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


def test_a_null_content_of_any_role_is_taken_as_each_engine_takes_it():
    """llama-server takes a null content from any role as ""; transformers drops the key. tmplkit
    refused it in one line for a user, system or tool message (a missing one stays refused)."""
    from test_engine_parity import NULLS

    session = session_from_json({"messages": list(NULLS)})
    assert [m["content"] for m in given_messages(session.messages, "server")] == ["", "", "", "Again.", "", "", "Thanks."]
    shown = [line.split("|")[1] for line in _rendered("message-keys", NULLS, "transformers").splitlines() if line.startswith("[")]
    assert shown == ["content=-", "content=-", "content=-", "content=Again.", "content=-", "content=-", "content=Thanks."]
    with pytest.raises(InputError, match=r"\[1\] \(user\) has no 'content'"):
        session_from_json({"messages": [{"role": "system", "content": "s"}, {"role": "user"}]})


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


def test_a_call_whose_arguments_are_null_renders_in_the_server_setting_as_its_engine_does():
    # llama-server parses `arguments: null` to none and its engine walks none's `items` as an empty
    # list (held against its /apply-template: tests/test_engine_parity.py); transformers refuses
    # it, in its own words, and its setting with it
    path = Path(__file__).parent.parent / "fixtures" / "engine" / "arguments-items.jinja"
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": None}}
    session = session_from_json({"messages": [MESSAGES[0], {**MESSAGES[1], "tool_calls": [call]}, *MESSAGES[2:]]})
    assert "<call ls></call>" in render_conversation(load_one(str(path)), for_server(load_one(str(path)), session))
    with pytest.raises(RenderError, match=r"\(line 4\): TypeError: Can only get item pairs from a mapping\.$"):
        render_conversation(load_one(str(path)), for_server(load_one(str(path)), session, inputs="transformers"))


def test_tool_parameters_llama_server_refuses_are_refused_in_the_server_setting(template, tmp_path, capsys):
    # (its schema builder refuses them for every template, HTTP 400 or 500; each rule held against
    # the server in tests/test_engine_parity.py; the session was studied as if it had been served)
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"a": 5}}}}]
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"messages": list(MESSAGES), "tools": tools}))
    assert main(["turns", str(FIX / "content-concat.jinja"), "--session", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"tmplkit: error: {path}: tools[0] (read_file): its parameters are a schema llama-server refuses "
                   "(\"JSON schema error at #/properties/a: schema must be an object\"); give a JSON Schema object, or "
                   "leave them out\n"), err
    assert for_server(template, session_from_json({"messages": list(MESSAGES), "tools": tools}), inputs="transformers")


ENGINE = Path(__file__).parent.parent / "fixtures" / "engine"
# A session as clients send it: keys llama-server's message struct does not hold (`extra`, `reasoning`,
# `thinking`, a call's `other`), empty strings it leaves out, an object for arguments, text parts.
KEYED = ({"role": "system", "content": "Be brief."},
         {"role": "user", "content": [{"type": "text", "text": "List"}, {"type": "text", "text": "the files."}],
          "extra": "x", "name": ""},
         {"role": "assistant", "content": None, "reasoning": "r1", "thinking": "t1", "reasoning_content": "",
          "tool_calls": [{"id": "c1", "type": "function", "other": 1,
                          "function": {"name": "ls", "arguments": {"path": ".", "all": True}}}]},
         {"role": "tool", "tool_call_id": "c1", "name": "ls", "content": "a.txt"},
         {"role": "assistant", "content": "One file.", "reasoning_content": "Counted."},
         {"role": "user", "content": "Thanks."})


def _rendered(name: str, messages=KEYED, inputs: str = "server") -> str:
    return render_conversation(load_one(str(ENGINE / f"{name}.jinja")), for_server(
        load_one(str(ENGINE / f"{name}.jinja")), session_from_json({"messages": list(messages)}), inputs=inputs))


def test_the_server_gives_only_what_its_message_struct_holds():
    # (what llama-server 0.3.36's /apply-template renders for the same session: tests/test_engine_parity.py)
    lines = _rendered("message-keys").splitlines()
    # (the text parts joined by a newline, which splits the line)
    assert lines[1:3] == ["[user|content=List", "the files.|reasoning_content=-|thinking=-|reasoning=-|extra=-|name=-|tool_call_id=-]"]
    call = next(line for line in lines if "|call" in line)
    assert call == ("[assistant|content=|reasoning_content=-|thinking=-|reasoning=-|extra=-|name=-|tool_call_id=-"
                    "|call id=c1 type=function other=- ls({\"path\":\".\",\"all\":true})]")
    assert "[tool|content=a.txt|reasoning_content=-|thinking=-|reasoning=-|extra=-|name=ls|tool_call_id=c1]" in lines
    assert "[assistant|content=One file.|reasoning_content=Counted.|thinking=-|" in "\n".join(lines)
    assert KEYED[2]["reasoning"] == "r1" and "extra" in KEYED[1]  # the caller's messages stay as they were


def test_transformers_gives_every_key_and_the_reasoning_under_both_names():
    text = _rendered("message-keys", inputs="transformers")
    # apply_chat_template (transformers 5.24, `_alias_reasoning_fields`): the first reasoning that is
    # not null (`""` is one) is copied to `reasoning_content`, and to `thinking` where that is unset
    assert "|reasoning_content=|thinking=t1|reasoning=r1|extra=-" in text and "extra=x|name=|" in text
    assert "call id=c1 type=function other=1 ls(an object)" in text
    aliased = given_messages([{"role": "assistant", "content": "ok", "reasoning": "why", "thinking": None}], "transformers")
    assert aliased[0]["reasoning_content"] == aliased[0]["thinking"] == "why"


@pytest.mark.parametrize(("message", "refusal"), [
    ({"role": "assistant", "content": "ok", "reasoning_content": None}, r"message 1 \(assistant\): 'reasoning_content' is null"),
    ({"role": "tool", "content": "ok", "tool_call_id": 7}, r"'tool_call_id' is int, which llama-server refuses"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]},
     r"tool_calls\[0\] has no 'type', which llama-server refuses"),
    ({"role": "assistant", "content": "", "tool_calls": [{"name": "ls", "arguments": "{}"}]},
     r"tool_calls\[0\] has no 'function'"),
    ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": None,
                                                          "function": {"name": "ls", "arguments": "{}"}}]},
     r"tool_calls\[0\] \(ls\): 'id' is null"),
    ({"role": "assistant", "reasoning_content": "thought"}, r"message 1 \(assistant\) has neither 'content' nor 'tool_calls'"),
])
def test_what_llama_server_refuses_to_read_is_refused_in_one_line(template, message, refusal):
    # each of these is a 400 or 500 from llama-server 0.3.36's /apply-template ("type must be string",
    # "Missing tool call type", "Assistant message must contain either 'content' or 'tool_calls'!")
    messages = ({"role": "user", "content": "hi"}, message, {"role": "user", "content": "and?"})
    with pytest.raises(InputError, match=refusal) as err:
        for_server(template, Session(messages, ()))
    assert "\n" not in str(err.value)
    assert for_server(template, Session(messages, ()), inputs="transformers")  # a trainer takes them


def test_a_template_without_a_system_role_gets_it_in_the_next_message_and_parts_joined():
    text = _rendered("no-system")
    assert text.startswith("<user>Be brief.\nList\nthe files.</user>\n<assistant></assistant>\n")
    with pytest.raises(Exception, match="System role not supported"):
        _rendered("no-system", inputs="transformers")


# An OpenAI-style client's instructions: a `developer` message first and one later in the session.
DEVELOPER = ({"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi."},
             {"role": "assistant", "content": "Hello."}, {"role": "developer", "content": "Use tools."},
             {"role": "user", "content": "Bye."})


def test_the_server_gives_a_developer_message_as_system_but_to_gpt_oss():
    # llama-server maps developer to system for every template without gpt-oss's `<|channel|>`
    # (common/chat.cpp, map_developer_role_to_system; held against its /apply-template in
    # tests/test_engine_parity.py); transformers gives the role as the client sent it
    roles = [line.split("|")[0] for line in _rendered("message-keys", DEVELOPER).splitlines() if line.startswith("[")]
    assert roles == ["[system", "[user", "[assistant", "[system", "[user"]
    roles = [line.split("|")[0] for line in _rendered("message-keys", DEVELOPER, "transformers").splitlines()
             if line.startswith("[")]
    assert roles == ["[developer", "[user", "[assistant", "[developer", "[user"]
    assert _rendered("channels", DEVELOPER[:3]).startswith("<|start|>developer<|message|>Be brief.<|end|>")
    # (mapped before the fold: a template without a system role gets the instructions in the next message)
    assert _rendered("no-system", DEVELOPER[:3]).startswith("<user>Be brief.\nHi.</user>")


def test_a_refusal_of_a_developer_message_given_as_system_says_so():
    # Qwen3.5's rule: one system message, first. A client's developer message after its system
    # prompt is a second one as the server gives it: the template's refusal names the message
    from tmplkit.sources import ChatTemplate

    t = ChatTemplate("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                     "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
                     "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}", "first-system", "-")
    messages = [{"role": "system", "content": "You code."}, *DEVELOPER[:2]]
    with pytest.raises(Exception, match=r"at the beginning\. \(message 1 is a developer message, which llama-server "
                                        r"gives as system\)$"):
        render_conversation(t, session_from_json({"messages": messages}))
    # (a refusal of the other messages says nothing of them; transformers gives the role as it is)
    with pytest.raises(Exception, match=r"at the beginning\.$"):
        render_conversation(t, session_from_json({"messages": [messages[0], {"role": "system", "content": "Two."}]}))
    assert "<|im_start|>developer" in for_server(t, session_from_json({"messages": messages}), inputs="transformers").render()


def test_a_template_that_reads_parts_only_gets_a_string_as_one_part():
    text = _rendered("parts-only")
    assert "<system>(Be brief.)</system>" in text and "<tool>(a.txt)</tool>" in text and "<user>(List)(the files.)</user>" in text


def test_gpt_oss_is_given_a_tool_call_turn_with_reasoning_without_its_content():
    # llama-server's gpt-oss handler (common/parsers/gpt-oss.cpp) copies the reasoning to `thinking`
    # and leaves out the content of such a turn: its template refuses both on a tool-call turn
    from tmplkit.sources import ChatTemplate

    src = ("{% for m in messages %}<|start|>{{ m.role }}{% if m.tool_calls is defined %}{% if m.content and m.thinking %}"
           "{{ raise_exception('Cannot pass both content and thinking') }}{% endif %}<|channel|>analysis"
           "<|message|>{{ m.thinking }}<|call|>{% else %}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}")
    t = ChatTemplate(src, "channels", "-")
    turn = {"role": "assistant", "content": "Looking.", "reasoning_content": "Need ls.", "tool_calls": [CALL]}
    messages = (MESSAGES[0], turn, MESSAGES[2])
    assert "<|channel|>analysis<|message|>Need ls.<|call|>" in render_conversation(t, Session(messages, ()))
    with pytest.raises(Exception, match="Cannot pass both"):  # transformers gives it both, as the client sent them
        for_server(t, Session(messages, ()), inputs="transformers").render()


def test_a_stepfun_template_is_given_its_contents_trimmed():
    # llama-server trims every content, text part and reasoning for a template with StepFun's tool
    # sentence (issue 24181; held against the server in tests/test_engine_parity.py)
    messages = [{"role": "user", "content": [{"type": "text", "text": " List "}, {"type": "text", "text": "them.\n"}]},
                {"role": "assistant", "content": "\n One file. ", "reasoning_content": "  counted \n"},
                {"role": "user", "content": "\tThanks "}]
    text = _rendered("trims", messages)
    assert "<user>[List\nthem.]</user>\n<assistant>[One file.](counted)</assistant>\n<user>[Thanks]</user>" in text
    assert "[\tThanks ]" in _rendered("trims", messages, inputs="transformers")


def test_a_probe_past_its_limits_stops_there_and_names_the_template(monkeypatch):
    # a template past its time or memory on a probe was tried on every probe in turn, each failure
    # taken for "does not read that" (a memory bomb ran out of memory six times, past the worker's
    # time limit); it now raises the template's own limit error at the first
    from tmplkit.errors import RenderLimitError
    from tmplkit.session import _workarounds, content_reads, object_arguments
    from tmplkit.sources import ChatTemplate

    renders = []
    real = _workarounds.render
    monkeypatch.setattr(_workarounds, "render", lambda *a, **k: renders.append(1) or real(*a, **k))
    bomb = ChatTemplate("{{ 'x' * 60000000 }}{% for m in messages %}{{ m.content }}{% endfor %}", "bomb", "-")
    with pytest.raises(RenderLimitError, match="template 'bomb' multiplied"):
        content_reads(bomb)
    assert renders == [1]
    with pytest.raises(RenderLimitError, match="template 'bomb' multiplied"):
        object_arguments(bomb)
    with pytest.raises(RenderLimitError, match="template 'bomb'"):
        for_server(bomb, Session(MESSAGES, ()))


def test_gemma_4s_older_templates_get_their_model_turns_whole_from_the_server():
    # The server's Gemma 4 handler makes a call, its results and the answer after them one model
    # turn (`tool_responses`), per list rendered: a request ending with the results keeps them in
    # the turn; the transformers setting gives the messages as they are.
    template = load_one(str(FIX.parent / "engine" / "tool-responses.jinja"))
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    body = {"messages": [{"role": "user", "content": "List it."}, {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "{\"count\": 1}"}]}
    server = render_conversation(template, session_from_json(body))
    assert "<|tool_response>response:ls{count:1}<tool_response|><turn|>\n<|turn>model\n" in server
    assert "<|turn>tool" not in server
    assert "<|turn>tool\n{\"count\": 1}<turn|>" in for_server(template, session_from_json(body), inputs="transformers").render()
    answered = {"messages": [*body["messages"], {"role": "assistant", "content": "One."}]}
    assert render_conversation(template, session_from_json(answered), add_generation_prompt=False).count("<|turn>model") == 1


def test_the_server_gives_its_date_variables_at_the_renders_time():
    # llama-server sets `datetime` and `date_string` in every render (common_chat_extra_context), at
    # the request's time; the request's own variables win; transformers sets neither.
    from datetime import datetime

    from tmplkit.sources import ChatTemplate

    t = ChatTemplate("{{ datetime | default('-') }}|{{ date_string | default('26 Jul 2024') }}|{{ messages[0].content }}",
                     "dates", "-")
    conv = session_from_json({"messages": [{"role": "user", "content": "hi"}]})
    at = datetime(2026, 12, 6, 23, 59)
    assert for_server(t, conv).render(clock=lambda: at) == "Dec 06 2026|06 Dec 2026|hi"
    assert for_server(t, conv).render() == "Jan 01 2025|01 Jan 2025|hi"  # (the sandbox's pinned time)
    assert for_server(t, conv, {"date_string": "today"}).render(clock=lambda: at) == "Dec 06 2026|today|hi"
    assert for_server(t, conv, inputs="transformers").render(clock=lambda: at) == "-|26 Jul 2024|hi"


def test_a_session_past_midnight_diverges_at_the_date_the_server_writes():
    # Requests six hours apart: the server's `date_string` moves to the next day, so the system
    # turn the server holds is rewritten (a `date or time` divergence); transformers' render keeps
    # the template's own date, and the session is stable there.
    from datetime import timedelta

    from tmplkit.session import generate_session

    template = load_one(str(FIX / "date-string.jinja"))
    session = generate_session(3000, seed=0, style="agent", requests=4)
    server = study_turns(template, session, interval=timedelta(hours=6))
    assert not server.stable and server.first.cause == "date or time"
    assert study_turns(template, session, interval=timedelta(hours=6), inputs="transformers").stable


def test_python_values_that_hold_themselves_are_one_line_not_a_hang_or_a_recursion_error(template):
    # (a conversation whose dict held itself looped without end in the surrogate check; a render of
    # one, or of a tool call that held itself, raised RecursionError from inside)
    from tmplkit.jsonio import shape_problem
    from tmplkit.masks import text_mask
    from tmplkit.sandbox import prepare_message, prepare_tools, render

    held = {"role": "user", "content": "hi"}
    held["self"] = held
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": {}}}
    call["function"]["arguments"]["me"] = call
    parts: list = [{"type": "text", "text": "hi"}]
    parts.append(parts)
    itself = r"holds itself, which no JSON value can; give"
    for msgs in ([held, *MESSAGES[1:]], [MESSAGES[0], {**MESSAGES[1], "tool_calls": [call]}, *MESSAGES[2:]],
                 [{"role": "user", "content": parts}, *MESSAGES[1:]]):
        for call_it in (lambda m: render(template, m), lambda m: for_server(template, m).render(),
                        lambda m: for_server(template, m, inputs="transformers").render(),
                        lambda m: study_turns(template, m), lambda m: text_mask(template, m)):
            with pytest.raises(InputError, match=itself):
                call_it(msgs)
    with pytest.raises(InputError, match="^a message holds a list or object that holds itself"):
        prepare_message(held)
    # inside a Session object: its tools, or a tool call's arguments (with the server's inputs too)
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}
    tool["function"]["parameters"]["properties"]["me"] = tool
    calls = [MESSAGES[0], {**MESSAGES[1], "tool_calls": [call]}, *MESSAGES[2:]]
    for convo in (Session(tuple(MESSAGES), (tool,)), Session(tuple(calls), ())):
        for call_it in (lambda c: study_turns(template, c), lambda c: for_server(template, c).render(), lambda c: text_mask(template, c)):
            with pytest.raises(InputError, match=itself):
                call_it(convo)
    with pytest.raises(InputError, match="^the tools hold a list or object that holds itself"):
        prepare_tools([tool])
    deep: list = []
    for _ in range(300):
        deep = [deep]
    assert shape_problem(deep) == "lists or objects nested deeper than 256 levels"
    shared = [1]
    assert shape_problem({"a": [shared, shared], "b": shared}) is None  # (a value held twice is no loop)
