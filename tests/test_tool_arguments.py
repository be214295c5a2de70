"""Tool-call arguments reach each template as llama-server gives them: objects only where it reads them."""

from __future__ import annotations

from pathlib import Path

from tmplkit.session import generate_session, messages_for, object_arguments, server_object_arguments
from tmplkit.sources import ChatTemplate
from tmplkit.turns import session_requests

_LOOP = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
         "{% for c in m.tool_calls | default([]) %}{CALL}{% endfor %}\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# Qwen3.5's shape: iterates the arguments as a mapping (fails on a string).
ITEMS = ChatTemplate(_LOOP.replace("{CALL}", "{% for k, v in c.function.arguments | items %}<{{ k }}>{{ v }}{% endfor %}"), "items", "-")
# functionary v3.2's shape: concatenates the arguments as a string (fails on a mapping).
CONCAT = ChatTemplate(_LOOP.replace("{CALL}", "{{ '>>>' + c.function.name + '\\n' + c.function.arguments }}"), "concat", "-")
# Qwen3's shape: takes either, tojson for a mapping.
EITHER = ChatTemplate(_LOOP.replace("{CALL}", "{% if c.function.arguments is string %}{{ c.function.arguments }}"
                                              "{% else %}{{ c.function.arguments | tojson }}{% endif %}"), "either", "-")
# Reads nothing of the arguments.
IGNORES = ChatTemplate(_LOOP.replace("{CALL}", "<call>{{ c.function.name }}</call>"), "ignores", "-")


def test_templates_that_read_arguments_as_objects_get_objects():
    assert object_arguments(ITEMS) and object_arguments(EITHER)
    assert not object_arguments(CONCAT) and not object_arguments(IGNORES)


def test_messages_keep_string_arguments_for_a_template_that_concatenates_them():
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                    "function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    assert messages_for(CONCAT, msgs)[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert messages_for(ITEMS, msgs)[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # the caller's messages are not changed


def test_a_session_renders_on_both_kinds_of_template():
    session = generate_session(3000, seed=0, style="agent", requests=2)
    for template in (ITEMS, CONCAT):
        reqs = session_requests(session, template)
        assert reqs and all(r.text for r in reqs)
    # The string form is printed verbatim where the template concatenates it.
    call = next(m for m in session.messages if m.get("tool_calls"))["tool_calls"][0]["function"]
    assert any(call["arguments"] in r.text for r in session_requests(session, CONCAT))


def test_a_template_that_refuses_the_probe_for_another_reason_keeps_objects():
    # Needs a system message first (so both probes fail): the parsed form is kept, as it always was.
    needs_system = ChatTemplate("{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
                                + ITEMS.text, "needs-system", "-")
    assert object_arguments(needs_system)


def test_parsing_arguments_leaves_the_callers_messages_as_they_were():
    import copy

    from tmplkit.session import template_messages

    given = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, 2]}'}, "extra": {"k": [1]}}]}]
    before = copy.deepcopy(given)
    (out,) = template_messages(given)
    assert given == before  # (the call and its function are copied where they change)
    call = out["tool_calls"][0]
    assert call["function"]["arguments"] == {"a": [1, 2]} and call["extra"] == {"k": [1]} and call["id"] == "c1"


USER_LAST_CONCAT = ChatTemplate((Path(__file__).parent.parent / "fixtures" / "engine" / "user-last-concat.jinja").read_text(),
                                "user-last-concat", "-")


def test_the_server_setting_decides_on_llama_cpps_own_probe():
    # The template renders only a conversation that ends with a user message and concatenates the
    # arguments: llama.cpp's check (a call, its result, an answer, a user message) finds strings;
    # the one-call probe ending with the result fails either way, so the transformers setting keeps
    # the parsed form. The server setting gives the string, and the request renders as the server's.
    assert not server_object_arguments(USER_LAST_CONCAT) and object_arguments(USER_LAST_CONCAT)
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                    "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "ok"}, {"role": "user", "content": "and?"}]
    assert messages_for(USER_LAST_CONCAT, msgs, "server")[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert messages_for(USER_LAST_CONCAT, msgs, "transformers")[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_the_server_setting_gives_strings_where_llama_cpps_probe_fails():
    # The C++ check's default: a template that fails its probe for a reason of its own gets strings.
    needs_system = ChatTemplate("{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
                                + ITEMS.text, "needs-system", "-")
    assert not server_object_arguments(needs_system)
    assert server_object_arguments(ITEMS) and server_object_arguments(EITHER)
    assert not server_object_arguments(CONCAT) and not server_object_arguments(IGNORES)


def test_a_probe_failing_on_what_only_pythons_engine_refuses_keeps_the_parsed_form():
    # `append` on a list: the sandbox refuses it, llama.cpp's engine renders on (Kimi K2's shape).
    appends = ChatTemplate("{% set seen = [] %}{% for m in messages %}{% set _ = seen.append(m.role) %}{% endfor %}"
                           + ITEMS.text, "appends", "-")
    assert server_object_arguments(appends)
