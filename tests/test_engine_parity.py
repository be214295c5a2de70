"""Engine parity on a handful of corpus templates: llama-server's own renderer (/apply-template,
--jinja --chat-template-file) against tmplkit's, byte for byte, and the round trip on llama.cpp's
render. Needs the llama-server binary scripts/build_llama_server.sh builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.errors import ModelError, TmplkitError
from tmplkit.server.parity import _SERVER_ARGS, EngineComparison, engine_parity, format_parity_table, parity_failures
from tmplkit.server.process import llama_server_binary
from tmplkit.sources import corpus, load_one

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engine"

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.corpus]


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("llama_cpp")
    binary = llama_server_binary()
    if binary is None:
        pytest.skip("llama-server is not built: run `bash scripts/build_llama_server.sh` "
                    "(one CMake target from the pinned sdist) or set TMPLKIT_LLAMA_SERVER")
    from tmplkit.prefill import tiny_model_path

    return binary, tiny_model_path("qwen35")


def _rows(server, name):
    path = corpus.templates_dir() / f"{name}.jinja" if "/" not in name else name
    return {r.variant: r for r in engine_parity(load_one(str(path)), *server)}


def _server_prompt(server, tmp_path, path, body) -> str:
    """The prompt the pinned llama-server's /apply-template renders of `body` with the template at `path`."""
    from tmplkit.server.process import start_with_template

    srv = start_with_template(*server, _SERVER_ARGS, path, log=tmp_path / "server.log")
    try:
        return srv.post_for("/apply-template", body, "prompt", timeout=60)
    finally:
        srv.stop()


def test_identical_renders(server):
    for name in ("Qwen3.5-4B", "meta-llama-Llama-3.2-3B-Instruct"):  # the latter prints today's date
        rows = _rows(server, name)
        assert set(rows) == {"round trip", "generation prompt"}
        assert all(r.status == "identical" and r.round_trip for r in rows.values()), rows


def test_a_difference_is_located(server):
    # A tool list joining a `|safe` string and a tool's JSON with `+` (functionary v3.1's way): in
    # transformers' Jinja the result is markup, its quotes HTML entities; llama.cpp's writes them plain.
    rows = _rows(server, str(FIXTURES / "safe-plus-tojson.jinja"))
    r = rows["round trip"]
    assert r.status == "differs" and r.at is not None
    assert "&#34;" in r.ours and "&#34;" not in r.theirs and r.ours[:40] == r.theirs[:40]
    assert r.round_trip  # the delimiters hold on both renders


def test_round_trip_fails_where_llama_cpp_renders_the_turns_otherwise(server):
    # The turns' opening tags are joined from a `|safe` string: transformers' Jinja writes their
    # closing quote as an entity, llama.cpp's plainly, so tmplkit's delimiters do not split its render.
    rows = _rows(server, str(FIXTURES / "safe-plus-role.jinja"))
    assert rows["round trip"].status == "differs" and rows["round trip"].round_trip is False
    assert "&#34;" in rows["round trip"].ours and "&#34;" not in rows["round trip"].theirs


def test_gemma_4s_older_template_renders_as_llama_server_renders_it(server):
    # It rendered tool results as turns of their own, where llama-server's Gemma 4 handler gives
    # them to the model turn (`tool_responses`): the delimiters did not hold on the server's render.
    rows = _rows(server, "google-gemma-4-31B-it-interleaved")
    assert all(r.status == "identical" and r.round_trip for r in rows.values()), rows


def test_engine_parity_cli(server, tmp_path, capsys):
    src = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    binary, model = server
    assert main(["engine-parity", src, "--server", str(binary), "--model", str(model), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema_version"] == 1
    rows = data["rows"]
    assert [(r["template"], r["variant"], r["status"], r["round_trip"]) for r in rows] == [
        ("Qwen3.5-4B", "round trip", "identical", True), ("Qwen3.5-4B", "generation prompt", "identical", True)]
    out = tmp_path / "parity.md"
    assert main(["engine-parity", src, "--server", str(binary), "--model", str(model), "-o", str(out)]) == 0
    assert out.read_text().endswith("identical: 2; round trip holds on llama.cpp's render: 2 of 2\n")


def test_the_gate_fails_a_difference_then_what_was_not_compared(server, tmp_path, capsys):
    binary, model = server
    run = ["--no-config", "engine-parity", "--server", str(binary), "--model", str(model), "--format", "json"]
    differs = str(FIXTURES / "safe-plus-tojson.jinja")
    assert main([*run, differs]) == 0  # a report by default
    capsys.readouterr()
    assert main([*run, differs, "--fail-on", "differs"]) == 1
    assert json.loads(capsys.readouterr().out)["rows"][0]["status"] == "differs"  # the report all the same
    refused = tmp_path / "wordcount.jinja"  # (llama.cpp's engine has no `wordcount`: not compared)
    refused.write_text("{%- for m in messages -%}{{ m.content | wordcount }}{{ m.content }}\n{% endfor -%}")
    assert main([*run, str(refused), "--fail-on", "differs"]) == 0
    assert main([*run, str(refused), "--fail-on", "unchecked"]) == 1
    identical = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    assert main([*run, identical, "--fail-on", "unchecked"]) == 0


def test_the_gates_rows():
    rows = [EngineComparison("a", "round trip", "identical", round_trip=True),
            EngineComparison("b", "round trip", "differs", at=3), EngineComparison("c", "round trip", "refused"),
            EngineComparison("d", "round trip", "unrendered")]
    assert [r.template for r in parity_failures(rows, "differs")] == ["b"]
    assert [r.template for r in parity_failures(rows, "unchecked")] == ["b", "c", "d"]
    # the command offers what the library takes (named there so that its parser loads neither module)
    from tmplkit.cli._serve import GATE_CHOICES
    from tmplkit.server.delimiter_comparison import COMPARISON_FAIL_ON
    from tmplkit.server.parity import PARITY_FAIL_ON

    assert GATE_CHOICES == PARITY_FAIL_ON == COMPARISON_FAIL_ON


def test_a_template_llama_cpp_refuses_is_a_row_a_model_it_cannot_serve_is_an_error(server, tmp_path, capsys):
    binary, model = server
    # Jinja has a `wordcount` filter, llama.cpp's engine has not: the server will not start with it
    template = tmp_path / "wordcount.jinja"
    template.write_text("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content | wordcount }}{{ m.content }}"
                        "<|im_end|>\n{% endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
    (row,) = engine_parity(load_one(str(template)), binary, model)
    # its reason, from its log (the logged line may be lost when it exits at once: then its bare line)
    assert row.status == "refused" and ("Unknown (built-in) filter 'wordcount'" in row.error
                                        or "chat template is not supported" in row.error), row
    # a model it cannot load (its last tensor cut short): nothing was compared, so no row says "refused"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model.read_bytes()[:-4096])
    with pytest.raises(ModelError, match="exited with code 1 at start.*no template was checked"):
        engine_parity(load_one(str(template)), binary, broken)
    src = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    assert main(["--no-config", "engine-parity", src, "--server", str(binary), "--model", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tmplkit: error: ") and err.count("\n") == 1 and "refused" not in err, err
    # a vocabulary without weights: told before any template is analyzed, as `server delimiters` tells it
    vocab = corpus.vocab_path("qwen2")
    for command in (["engine-parity"], ["server", "delimiters"]):
        assert main(["--no-config", *command, src, "--server", str(binary), "--model", str(vocab)]) == 2
        assert "no weights" in capsys.readouterr().err


def test_table_format():
    from tmplkit.server.parity import EngineComparison

    rows = [EngineComparison("a", "round trip", "identical", round_trip=True),
            EngineComparison("b", "round trip", "differs", at=3, ours="x|\ny", theirs="x`z", round_trip=False),
            EngineComparison("c", "round trip", "refused", error="bad template")]
    table = format_parity_table(rows)
    assert "| b | round trip | differs | fail | at 3: `x\\|\\ny` / `x'z` |" in table
    assert "| c | round trip | refused | - | bad template |" in table
    assert table.endswith("differs: 1, identical: 1, refused: 1; round trip holds on llama.cpp's render: 1 of 3\n")


def _given(text: str) -> list:
    """The messages and tools the `messages-dump` fixture was given, read off its error's text."""
    decoder = json.JSONDecoder()
    messages, end = decoder.raw_decode(text, text.rfind("MESSAGES=[") + len("MESSAGES="))
    tools, _ = decoder.raw_decode(text, text.index(" TOOLS=", end) + len(" TOOLS="))
    return [messages, tools]


@pytest.mark.parametrize("session, endpoint", [("responses-api.json", "/v1/responses"),
                                               ("anthropic-messages.json", "/v1/messages"),
                                               # numbers the server writes its own way, a stamp in
                                               # UTF-8, images of a source it drops
                                               ("anthropic-edges.json", "/v1/messages"),
                                               (None, "/v1/chat/completions")])
def test_an_agents_body_reaches_the_template_as_llama_server_gives_it(server, tmp_path, session, endpoint):
    # Codex's Responses body and Claude Code's Messages body as the server converts them, and a chat
    # body's tools as it rewrites them (an OpenAI client's `strict` left out, a description added)
    import copy
    import urllib.error
    import urllib.request

    from tmplkit.errors import RenderError
    from tmplkit.server.process import start_with_template
    from tmplkit.session import for_server, session_from_json

    if session is None:
        body = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                            "parameters": {"type": "object", "properties": {}}}}]}
    else:
        body = json.loads((FIXTURES.parent / "sessions" / session).read_text(encoding="utf-8"))
    marked = copy.deepcopy(body)  # (the template tells its dump by a system message holding DUMP)
    if "input" in marked:
        marked["instructions"] = "DUMP " + marked["instructions"]
    elif "system" in marked:
        marked["system"] = [{"type": "text", "text": "DUMP "}, *marked["system"]]
    else:
        marked["messages"][0]["content"] = "DUMP " + marked["messages"][0]["content"]
    path = FIXTURES / "messages-dump.jinja"
    srv = start_with_template(*server, _SERVER_ARGS, path, log=tmp_path / "server.log")
    try:  # (read whole: the library's refusal keeps the first 500 characters of the server's reason)
        request = urllib.request.Request(srv.url + endpoint, data=json.dumps({**marked, "max_tokens": 1}).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        reason = json.loads(refused.value.read())["error"]["message"]
    finally:
        srv.stop()
    conversation = for_server(load_one(str(path)), session_from_json(marked))
    with pytest.raises(RenderError) as ours:
        conversation.render(list(conversation.messages), add_generation_prompt=True)
    theirs, mine = _given(reason), _given(str(ours.value))
    assert json.dumps(mine) == json.dumps(theirs)  # the same values, keys in the same order
    assert len(theirs[0]) >= (4 if session else 2)


@pytest.mark.parametrize("name", ["message-keys", "no-system", "parts-only"])
def test_the_server_setting_gives_messages_as_llama_server_does(server, tmp_path, name):
    # The session of tests/test_inputs.py (keys the server's message struct does not hold, empty
    # strings, object arguments, text parts, a system message): tmplkit's server setting renders it
    # as llama-server's /apply-template does, byte for byte, on templates that read each way.
    from test_inputs import KEYED

    from tmplkit.session import render_conversation, session_from_json

    path = FIXTURES / f"{name}.jinja"
    theirs = _server_prompt(server, tmp_path, path, {"messages": list(KEYED)})
    assert render_conversation(load_one(str(path)), session_from_json({"messages": list(KEYED)})) == theirs


# A null content in every role: llama-server takes it (`content: ""` for the template); tmplkit
# refused a user, system or tool message's null in one line, so no session holding one was studied.
NULLS = ({"role": "system", "content": None}, {"role": "user", "content": None}, {"role": "assistant", "content": None},
         {"role": "user", "content": "Again."},
         {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                "function": {"name": "ls", "arguments": {}}}]},
         {"role": "tool", "tool_call_id": "c1", "content": None}, {"role": "user", "content": "Thanks."})


@pytest.mark.parametrize("name", ["message-keys", "no-system", "parts-only"])
def test_the_server_setting_gives_null_contents_of_every_role_as_llama_server_does(server, tmp_path, name):
    from tmplkit.session import render_conversation, session_from_json

    path = FIXTURES / f"{name}.jinja"
    theirs = _server_prompt(server, tmp_path, path, {"messages": list(NULLS)})
    assert render_conversation(load_one(str(path)), session_from_json({"messages": list(NULLS)})) == theirs


@pytest.mark.parametrize("name,n", [("message-keys", 5), ("no-system", 3), ("channels", 3)])
def test_the_server_setting_gives_a_developer_message_as_llama_server_does(server, tmp_path, name, n):
    # As system (before the fold of a leading one, where the template has no system role), but to
    # gpt-oss's template (`<|channel|>`), which is given it as it is
    from test_inputs import DEVELOPER

    from tmplkit.session import render_conversation, session_from_json

    path, body = FIXTURES / f"{name}.jinja", {"messages": list(DEVELOPER[:n])}
    theirs = _server_prompt(server, tmp_path, path, body)
    assert render_conversation(load_one(str(path)), session_from_json(body)) == theirs


_CALL = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}
_CALL2 = {"id": "c2", "type": "function", "function": {"name": "cat", "arguments": "{\"path\": \"a.txt\"}"}}
# Sessions for the server's handler-specific edits: StepFun's trim (whitespace around contents, text
# parts and reasoning), gpt-oss's (a tool-call turn's content left out beside its reasoning),
# Ministral 3's (contents made blocks) and DeepSeek V4's (tool results in the order of the calls).
_HANDLED = {
    "trims": {"messages": [{"role": "system", "content": "  Be brief.\n"},
                           {"role": "user", "content": [{"type": "text", "text": " List "}, {"type": "text", "text": "them.\n"}]},
                           {"role": "assistant", "content": "\n One file. ", "reasoning_content": "  counted \n"},
                           {"role": "user", "content": "\tThanks "}],
              "tools": [{"type": "function", "function": {"name": "ls", "description": "List",
                                                          "parameters": {"type": "object", "properties": {}}}}]},
    "channels": {"messages": [{"role": "user", "content": "List it."},
                              {"role": "assistant", "content": "Looking.", "reasoning_content": "Need ls.", "tool_calls": [_CALL]},
                              {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]},
    # Ministral 3's blocks: reasoning as a thinking block before the text, on assistant messages
    # (one with calls and no content) and the system message, not on user or tool messages
    "thinking-blocks": {"messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "List it."},
                                     {"role": "assistant", "content": None, "reasoning_content": "Need ls.", "tool_calls": [_CALL]},
                                     {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                                     {"role": "assistant", "content": "One file.", "reasoning_content": "Counted."},
                                     {"role": "user", "content": "Thanks."}]},
    # DeepSeek V4's order: results answered out of order, a user message among them, then a
    # result for an id no call has; the next tool-call turn's order applies after it
    "ordered-results": {"messages": [{"role": "user", "content": "List both."},
                                     {"role": "assistant", "content": "", "tool_calls": [_CALL, _CALL2]},
                                     {"role": "tool", "tool_call_id": "c2", "content": "second"},
                                     {"role": "user", "content": "And?"},
                                     {"role": "tool", "tool_call_id": "c1", "content": "first"},
                                     {"role": "tool", "tool_call_id": "none", "content": "stray"},
                                     {"role": "assistant", "content": "", "tool_calls": [_CALL2, _CALL]},
                                     {"role": "tool", "tool_call_id": "c1", "content": "first again"},
                                     {"role": "tool", "tool_call_id": "c2", "content": "second again"}]},
}


@pytest.mark.parametrize("name", sorted(_HANDLED))
def test_the_server_setting_makes_the_servers_edits_for_a_family(server, tmp_path, name):
    from tmplkit.session import render_conversation, session_from_json

    path, body = FIXTURES / f"{name}.jinja", _HANDLED[name]
    theirs = _server_prompt(server, tmp_path, path, body)
    assert render_conversation(load_one(str(path)), session_from_json(body)) == theirs


_REASONED = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
             {"role": "user", "content": "Bye."}]


@pytest.mark.parametrize("kwargs", [None, {"preserve_reasoning": False}, {"preserve_reasoning": False, "preserve_thinking": True}])
def test_the_server_setting_sets_the_servers_reasoning_switches(server, tmp_path, kwargs):
    # The pinned server sets preserve_reasoning by default, and with it the four switches templates
    # read to keep earlier reasoning; a request's own variables win. tmplkit renders alike.
    from tmplkit.session import render_conversation, session_from_json

    path, body = FIXTURES / "reasoning-switches.jinja", {"messages": _REASONED}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    theirs = _server_prompt(server, tmp_path, path, body)
    assert render_conversation(load_one(str(path)), session_from_json({"messages": _REASONED}), kwargs=kwargs) == theirs
    assert ("<think>Greet.</think>" in theirs) == (kwargs != {"preserve_reasoning": False})


# A tool-call turn with text, two results (one JSON, one text), an answer, then a turn of calls alone.
_MODEL_TURNS = {"messages": [{"role": "user", "content": "List it."},
                             {"role": "assistant", "content": "Looking.", "tool_calls": [_CALL, _CALL2]},
                             {"role": "tool", "tool_call_id": "c1", "content": "{\"count\": 1}"},
                             {"role": "tool", "tool_call_id": "c2", "content": "hello"},
                             {"role": "assistant", "content": "One file, a.txt."},
                             {"role": "user", "content": "Thanks."},
                             {"role": "assistant", "content": "", "tool_calls": [_CALL]}]}


def test_the_server_setting_gives_gemma_4s_older_templates_their_model_turns(server, tmp_path):
    # llama-server's Gemma 4 handler makes a call, its results and the answer after them one model
    # turn with `tool_responses`, and starts the model's turn after a prompt ending with a closed
    # one; tmplkit's server setting renders the prompt alike, with and without a generation prompt.
    from tmplkit.server.parity import _SERVER_ARGS
    from tmplkit.server.process import start_with_template
    from tmplkit.session import render_conversation, session_from_json

    path = FIXTURES / "tool-responses.jinja"
    srv = start_with_template(*server, _SERVER_ARGS, path, log=tmp_path / "server.log")
    try:
        theirs = [srv.post_for("/apply-template", {**_MODEL_TURNS, "add_generation_prompt": gp}, "prompt", timeout=60)
                  for gp in (True, False)]
    finally:
        srv.stop()
    ours = [render_conversation(load_one(str(path)), session_from_json(_MODEL_TURNS), add_generation_prompt=gp)
            for gp in (True, False)]
    assert ours == theirs
    assert "<|tool_response>response:ls{count:1}<tool_response|>" in theirs[0] and theirs[0].endswith("<turn|>\n<|turn>model\n")


def test_gemma_4s_requests_render_as_llama_servers_prompts(server, tmp_path):
    # The official Gemma 4 template writes a turn's text after its tool results and closes the
    # turn: the request then ends with `<turn|>\n`, and the server's handler starts the model's
    # turn. Requests of the generated agent session, byte for byte (the server's BOS/EOS and date).
    from datetime import datetime

    from tmplkit.server.parity import _SERVER_ARGS
    from tmplkit.server.process import start_with_template
    from tmplkit.session import Conversation, generate_session, render_conversation
    from tmplkit.sources.templates import ChatTemplate, gguf_special_tokens

    path = corpus.templates_dir() / "google-gemma-4-31B-it.jinja"
    loaded, (bos, eos) = load_one(str(path)), gguf_special_tokens(server[1])
    template = ChatTemplate(loaded.text, loaded.name, loaded.source, bos, eos)
    session = generate_session(40000, seed=0, style="agent")
    srv = start_with_template(*server, _SERVER_ARGS, path, log=tmp_path / "server.log")
    prompts = []
    try:
        for n in (4, 6, 9):
            messages, tools = list(session.messages[:n]), list(session.tools or ())
            theirs = srv.post_for("/apply-template", {"messages": messages, "tools": tools}, "prompt", timeout=60)
            ours = render_conversation(template, Conversation(tuple(messages), tuple(tools)), clock=datetime.now)
            assert ours == theirs, n
            prompts.append(ours)
    finally:
        srv.stop()
    assert prompts[0].endswith("<turn|>\n<|turn>model\n") and prompts[2].endswith("<|tool_response>")


def test_the_server_setting_writes_the_servers_date(server, tmp_path):
    # llama-server sets `date_string` (and `datetime`) to the day of each request; the server
    # setting renders a request at its own time with the same (here: now, as the server renders).
    from datetime import datetime

    from tmplkit.session import for_server, session_from_json

    path = Path(__file__).parent.parent / "fixtures" / "turns" / "date-string.jinja"
    body = {"messages": [{"role": "user", "content": "What day is it?"}]}
    theirs = _server_prompt(server, tmp_path, path, body)
    now = datetime.now()
    assert for_server(load_one(str(path)), session_from_json(body)).render(clock=lambda: now) == theirs
    assert f"Today Date: {now:%d %b %Y}" in theirs


def test_the_server_setting_gives_arguments_as_llama_server_decides(server, tmp_path):
    # A template that renders only a conversation ending with a user message and concatenates the
    # arguments: llama-server gives it the client's string (its check's probe ends with a user
    # message); tmplkit's server setting renders the same prompt.
    from tmplkit.server.parity import _SERVER_ARGS
    from tmplkit.server.process import start_with_template
    from tmplkit.session import render_conversation, session_from_json

    body = {"messages": [{"role": "user", "content": "List it."},
                         {"role": "assistant", "content": None, "tool_calls": [_CALL]},
                         {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                         {"role": "user", "content": "Thanks."}]}
    path = FIXTURES / "user-last-concat.jinja"
    srv = start_with_template(*server, _SERVER_ARGS, path, log=tmp_path / "server.log")
    try:
        theirs = srv.post_for("/apply-template", body, "prompt", timeout=60)
        caps = srv.get("/props")["chat_template_caps"]
    finally:
        srv.stop()
    assert caps["supports_object_arguments"] is False
    assert render_conversation(load_one(str(path)), session_from_json(body)) == theirs
    assert '<call>ls {"path": "."}</call>' in theirs


def test_a_call_whose_arguments_are_null_renders_as_llama_server_renders_it(server, tmp_path):
    # (OpenAI-style clients may send `arguments: null`: the server parses them to none, and its
    # engine walks none's `items` as an empty list; transformers' refused it, and tmplkit with it,
    # blaming the template: "Can only get item pairs from a mapping")
    from tmplkit.session import render_conversation, session_from_json

    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": None}}
    body = {"messages": [{"role": "user", "content": "List it."}, {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "user", "content": "Thanks."}]}
    path = FIXTURES / "arguments-items.jinja"
    theirs = _server_prompt(server, tmp_path, path, body)
    assert "<call ls></call>" in theirs and render_conversation(load_one(str(path)), session_from_json(body)) == theirs


# Tool parameters llama-server's schema builder takes and refuses (common/json-schema.cpp), written to
# reach each of its rules; a session with one it refuses was studied as if the server had served it.
SCHEMAS = (5, "str", None, [], {}, {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
           {"type": "object", "properties": 5}, {"type": "object", "properties": {"a": 5}}, {"type": "objekt"},
           {"type": "object", "required": 5}, {"type": "string", "enum": []}, {"enum": [1, "a"]}, {"const": 5},
           {"$ref": "#/defs/x"}, {"$ref": "#/$defs/x", "$defs": {"x": {"type": "integer", "minimum": "0"}}},
           {"$ref": "#/$defs/x", "$defs": {"x": {"type": "object", "properties": {"n": {"$ref": "#/$defs/x"}}}}},
           {"$ref": "http://x/y"}, {"$ref": 5}, {"type": "object", "additionalProperties": 5},
           {"type": "object", "additionalProperties": {"type": "number"}}, {"anyOf": []}, {"oneOf": [{"type": "null"}, 5]},
           {"type": ["string", 5]}, {"type": []}, {"type": ["string", "null"], "maxLength": 3},
           {"type": "array", "items": {"type": "boolean"}, "minItems": -1}, {"type": "array", "prefixItems": [5]},
           {"type": "array", "items": [{"type": "string"}], "minItems": "x"}, {"pattern": 5}, {"format": 5},
           {"type": "string", "format": "uuid4", "maxLength": 1.5}, {"allOf": 5}, {"type": "object", "allOf": []},
           {"type": "integer", "exclusiveMaximum": True}, {"type": 5}, {"properties": {}, "type": "object", "x": 1})


def test_tool_parameters_are_refused_where_llama_servers_schema_builder_refuses_them(server, tmp_path):
    from tmplkit.server.process import start_with_template
    from tmplkit.session._tool_schema import schema_problem

    srv = start_with_template(*server, _SERVER_ARGS, FIXTURES / "arguments-items.jinja", log=tmp_path / "server.log")
    try:
        for schema in SCHEMAS:
            body = {"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
            try:
                srv.post_for("/apply-template", body, "prompt", timeout=60)
                theirs = None
            except TmplkitError as exc:
                theirs = str(exc)
            mine = schema_problem(schema) if schema is not None else None  # (null: taken, as none is)
            assert (mine is None) == (theirs is None) and (mine is None or mine in theirs), (schema, mine, theirs)
    finally:
        srv.stop()


def test_the_server_setting_reads_templates_as_llama_servers_capability_check(server, tmp_path):
    # llama-server decides its workarounds (content joined or made into parts, a system message
    # folded) by its own check (/props: chat_template_caps); tmplkit's probe renders decide alike on
    # templates that read content each way, never read a system message, or fail on a name the
    # probe does not set (ours: the last three)
    from tmplkit.server.parity import _SERVER_ARGS
    from tmplkit.server.process import start_with_template
    from tmplkit.session import content_reads, server_object_arguments

    names = ("Qwen3.5-4B", "LFM2-8B-A1B", "meta-llama-Llama-3.2-3B-Instruct")
    paths = [corpus.templates_dir() / f"{n}.jinja" for n in names] + [
        FIXTURES / f"{n}.jinja" for n in ("no-system", "parts-only", "undefined-name")]
    for path in paths:
        name = path.stem
        srv = start_with_template(*server, _SERVER_ARGS, path, log=tmp_path / "server.log")
        try:
            caps = srv.get("/props")["chat_template_caps"]
        finally:
            srv.stop()
        template = load_one(str(path))
        reads = content_reads(template)
        assert (reads.string, reads.typed, reads.system, server_object_arguments(template)) == (
            caps["supports_string_content"], caps["supports_typed_content"], caps["supports_system_role"],
            caps["supports_object_arguments"]), name


@pytest.mark.parametrize("name, thinks", [("thinking-on", True), ("thinking-off", False)])
def test_the_server_setting_passes_enable_thinking_as_llama_server_does(server, tmp_path, name, thinks):
    # llama-server passes enable_thinking in every render: true where it finds the template reasons
    # (its differential autoparser, here by the reasoning a reply renders between tags), false
    # elsewhere. Ours: one reads an unset switch as false where the server passes true, one asks for
    # no reasoning where the server passes false; tmplkit's server setting renders both prompts alike.
    from tmplkit.session import render_conversation, server_thinking, session_from_json

    path = FIXTURES / f"{name}.jinja"
    theirs = _server_prompt(server, tmp_path, path, {"messages": _REASONED})
    template = load_one(str(path))
    assert server_thinking(template) is thinks
    assert render_conversation(template, session_from_json({"messages": _REASONED})) == theirs
    assert theirs.endswith("<|im_start|>assistant\n<think>\n") is thinks and ("/no_think" in theirs) is not thinks


_TINY_TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct", "llama-cpp-deepseek-r1"])
def test_what_only_llama_servers_engine_renders_is_rendered_as_it_renders_it(server, tmp_path, name):
    """Kimi K2 queues its call ids in a list it appends to, llama.cpp's DeepSeek R1 writes
    `tools | map(attribute='function') | tojson`: transformers' sandbox refuses both, llama-server's
    engine renders them, and so does the server setting, byte for byte (an agent session with tool
    calls and results, the request and the conversation ending with a turn)."""
    from tmplkit.errors import RenderError
    from tmplkit.session import for_server, generate_session, render_conversation, session_from_json

    session = generate_session(2500, seed=1, style="agent", requests=1)
    path = corpus.templates_dir() / f"{name}.jinja"
    for n in (len(session.messages), len(session.messages) - 1):
        body = {"messages": list(session.messages[:n]), "tools": list(session.tools)}
        theirs = _server_prompt(server, tmp_path, path, body)
        # (the BOS and EOS the server passes are its loaded model's, the tiny qwen35 model's)
        ours = render_conversation(load_one(str(path)), session_from_json(body), kwargs=_TINY_TOKENS)
        assert ours == theirs
    with pytest.raises(RenderError, match="'append' of 'list' object is unsafe|generator is not JSON serializable"):
        for_server(load_one(str(path)), session_from_json(body), inputs="transformers").render()
