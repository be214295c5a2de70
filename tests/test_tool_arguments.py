"""Tool-call arguments reach each template as llama-server gives them: objects only where it reads them."""

from __future__ import annotations

from tmplkit.session import generate_session, messages_for, object_arguments
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
