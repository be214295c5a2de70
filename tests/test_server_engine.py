"""llama-server's engine where it renders what transformers' sandbox refuses (`render(...,
engine="llama-server")`, the server setting's renders): a template's lists and dicts changed in
place, a filter's sequence given to `tojson`; still under the sandbox's limits and refusals, and
never changing the inputs a later render is given. (Byte for byte against the pinned llama-server:
tests/test_engine_parity.py.)"""

from __future__ import annotations

import pytest

from tmplkit.errors import RenderError, RenderLimitError
from tmplkit.sandbox import Limits, render
from tmplkit.session import for_server, load_conversation
from tmplkit.sources import ChatTemplate

# Kimi K2's way: each call's id queued in a list the template appends to, taken off by its result.
QUEUE = ChatTemplate(
    "{%- set q = namespace(ids=[]) -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}<call>"
    "{%- for c in m.tool_calls %}{% set _ = q.ids.append(c.function.name ~ ':' ~ loop.index) %}"
    "{{ c.function.name }}:{{ loop.index }};{% endfor %}</call>"
    "{%- elif m.role == 'tool' -%}<result {{ q.ids.pop(0) if q.ids else '?' }}>{{ m.content }}</result>"
    "{%- else -%}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{%- endif -%}"
    "{%- endfor -%}", "queue", "-")
CALLS = [{"role": "user", "content": "Look."},
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "a", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
             {"id": "b", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "a", "content": "x"}, {"role": "tool", "tool_call_id": "b", "content": "y"}]


def test_a_list_the_template_changes_in_place_renders_in_llama_servers_engine_only():
    assert render(QUEUE, CALLS, engine="llama-server") == (
        "<user>Look.</user><call>ls:1;cat:2;</call><result ls:1>x</result><result cat:2>y</result>")
    with pytest.raises(RenderError, match="'append' of 'list' object is unsafe"):
        render(QUEUE, CALLS)
    with pytest.raises(Exception, match="unknown engine"):
        render(QUEUE, CALLS, engine="minja")


def test_a_filters_sequence_is_json_in_llama_servers_engine_only():
    # llama.cpp's DeepSeek R1 template: `tools | map(attribute='function') | tojson(indent=2)`
    t = ChatTemplate("{{ tools | map(attribute='function') | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}", "r1", "-")
    tools = [{"type": "function", "function": {"name": "ls"}}]
    assert render(t, CALLS[:1], tools=tools, engine="llama-server") == '[{"name": "ls"}]Look.'
    with pytest.raises(RenderError, match="generator is not JSON serializable"):
        render(t, CALLS[:1], tools=tools)


def test_what_a_template_changes_is_its_own_copy():
    """A session's messages are prepared once and given to every render: a template that changes
    them (the message list, a message) changes the render's copy, and the next render is as the
    first (llama-server converts the messages anew for each render)."""
    t = ChatTemplate("{%- set _ = messages.append({'role': 'user', 'content': 'added'}) -%}"
                     "{%- set _ = messages[0].update({'content': 'changed'}) -%}"
                     "{%- for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", "changes", "-")
    server = for_server(t, load_conversation([{"role": "user", "content": "Hi"}]))
    first = server.render(add_generation_prompt=False)
    assert first == "<user>changed<user>added"
    assert server.render(add_generation_prompt=False) == first
    assert server.messages[0]["content"] == "Hi"
    with pytest.raises(RenderError, match="unsafe"):  # (the transformers setting: refused, as transformers refuses it)
        for_server(t, load_conversation([{"role": "user", "content": "Hi"}]), inputs="transformers").render()


def test_a_list_grown_without_end_stops_at_the_size_limit():
    t = ChatTemplate("{%- set q = namespace(ids=[]) -%}{%- for i in range(100000) -%}{%- for j in range(100000) -%}"
                     "{%- set _ = q.ids.append(j) -%}{%- endfor -%}{%- endfor -%}{{ q.ids | length }}", "grows", "-")
    with pytest.raises(RenderLimitError) as info:
        render(t, CALLS[:1], engine="llama-server", limits=Limits(seconds=30, max_output_chars=100_000))
    assert info.value.kind == "size" and "grew a list" in str(info.value)


def test_an_escape_is_still_refused_in_llama_servers_engine():
    t = ChatTemplate("{%- set q = namespace(ids=[]) -%}{%- set _ = q.ids.append(1) -%}{{ q.ids.__class__.__mro__ }}", "escape", "-")
    with pytest.raises(RenderLimitError) as info:
        render(t, CALLS[:1], engine="llama-server")
    assert info.value.kind == "unsafe"


def test_a_template_only_llama_servers_engine_renders_is_rendered_there_at_once_the_next_time(monkeypatch):
    """Refused once by transformers' sandbox, the template is rendered in llama-server's engine from
    then on, without the refused render first (a Kimi K2 session's every request paid for both)."""
    from tmplkit.sandbox import _rendering

    t = ChatTemplate(QUEUE.text + "{#- a text of its own -#}", "queue-again", "-")
    first = render(t, CALLS, engine="llama-server")
    calls = []
    real = _rendering._render_in
    monkeypatch.setattr(_rendering, "_render_in", lambda *a, **k: calls.append(k["server"]) or real(*a, **k))
    assert render(t, CALLS, engine="llama-server") == first and calls == [True]
    with pytest.raises(RenderError, match="unsafe"):  # (the transformers engine still refuses it)
        render(t, CALLS)
