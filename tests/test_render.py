"""The sandboxed renderer: transformers' environment and input handling, pinned clock, limits."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tmplkit.errors import InputError, RenderError, RenderLimitError
from tmplkit.sandbox import PINNED_NOW, Limits, compile_template, render, system_clock
from tmplkit.sources import ChatTemplate

HI = [{"role": "user", "content": "hi"}]


def T(text: str, bos: str | None = None, eos: str | None = None) -> ChatTemplate:
    return ChatTemplate(text=text, name="t", source="test", bos_token=bos, eos_token=eos)


def test_renders_messages_and_generation_prompt():
    t = T("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    assert render(t, HI) == "<user>hi"
    assert render(t, HI, add_generation_prompt=True) == "<user>hi<assistant>"


def test_bos_and_eos_come_from_the_template_and_extra_context_overrides_them():
    t = T("{{ bos_token }}|{{ eos_token }}|{{ flag }}", bos="<s>", eos="</s>")
    assert render(t, HI, flag=1) == "<s>|</s>|1"
    assert render(t, HI, bos_token="B") == "B|</s>|"
    # Missing special tokens are undefined, as with a tokenizer that has none.
    assert render(T("{{ bos_token is defined }}"), HI) == "False"


def test_trim_blocks_lstrip_blocks_and_no_trailing_newline_kept():
    t = T("  {% if true %}\nA\n  {% endif %}\nB\n")
    assert render(t, HI) == "A\nB"


def test_tojson_does_not_escape_html_or_non_ascii_and_takes_positional_options():
    t = T("{{ messages[0] | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(false, 2, none, true) }}")
    out = render(t, [{"role": "user", "content": "<é & ü>"}])
    assert out.startswith('{"role": "user", "content": "<é & ü>"}|')
    assert out.endswith('{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}')


def test_inputs_are_prepared_as_transformers_does():
    t = T("{% for m in messages %}{{ m | tojson }}{% endfor %}")
    out = render(t, [{"role": "assistant", "content": None, "reasoning_content": "why", "tool_calls": None}])
    # None-valued keys dropped (as apply_chat_template drops them), and no key added: a template is
    # given its reasoning under the keys the caller used (a session as the server gives it:
    # tmplkit.session.reasoning_for).
    assert out == '{"role": "assistant", "reasoning_content": "why"}'
    out = render(T("{{ messages[0].content }}"), [{"role": "user", "content": ("a", 1)}])
    assert out == "('a', 1)"


def test_raise_exception_keeps_the_template_message():
    with pytest.raises(RenderError) as info:
        render(T("{{ raise_exception('Roles must alternate') }}"), HI)
    assert info.value.template_message == "Roles must alternate"
    assert info.value.template_raised is True
    assert "Roles must alternate" in str(info.value) and "line 1" in str(info.value)


def test_template_bugs_are_render_errors_not_raised_on_purpose():
    with pytest.raises(RenderError) as info:
        render(T("{{ messages[0].content + 1 }}"), HI)
    assert info.value.template_raised is False
    assert "TypeError" in str(info.value)


def test_syntax_error_is_one_line_render_error():
    with pytest.raises(RenderError, match=r"does not compile: .*\(line 1\)"):
        render(T("{% for %}"), HI)


def test_generation_tag_loop_controls_dict_and_namespace():
    t = T(
        "{% generation %}G{% endgeneration %}"
        "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
        "{{ dict(a=1) | tojson }}{{ dict.fromkeys(['x']) | tojson }}"
        "{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 2 %}{{ ns.n }}"
    )
    assert render(t, HI) == 'G02{"a": 1}{"x": null}2'


def test_sandbox_refuses_internals_and_mutation():
    with pytest.raises(RenderError):
        render(T("{{ messages.__class__.__mro__ }}"), HI)
    with pytest.raises(RenderError, match="unsafe"):
        render(T("{% set x = [] %}{{ x.append(1) }}"), HI)
    with pytest.raises(RenderError, match="underscore"):
        render(T("{% set ns = namespace(_x=1) %}"), HI)


def test_strftime_now_is_pinned_unless_a_clock_is_given():
    t = T("{{ strftime_now('%Y-%m-%d') }}")
    assert render(t, HI) == PINNED_NOW.strftime("%Y-%m-%d")
    assert render(t, HI, clock=lambda: datetime(2030, 5, 6)) == "2030-05-06"
    assert render(t, HI, clock=system_clock) == datetime.now().strftime("%Y-%m-%d")


def test_bad_inputs_are_input_errors():
    t = T("x")
    with pytest.raises(InputError, match="empty conversation"):
        render(t, [])
    with pytest.raises(InputError):
        render(t, ["not a dict"])
    with pytest.raises(InputError, match="JSON-schema"):
        render(t, HI, tools=[len])
    with pytest.raises(InputError, match="documents"):
        render(t, HI, documents=["text"])
    for bad in (5, "tools", {"type": "function"}):
        with pytest.raises(InputError, match="must be a list of"):
            render(t, HI, tools=bad)
    with pytest.raises(InputError, match="documents must be a list"):
        render(t, HI, documents=5)


def test_compiled_templates_are_cached():
    t = T("{{ messages | length }} cached")
    assert compile_template(t) is compile_template(t)


# --- limits ---------------------------------------------------------------------------------------

QUICK = Limits(seconds=0.3, max_output_chars=100_000)


@pytest.mark.parametrize("body", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(100000) %}{{ '' if i < 0 }}{% endfor %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
])
def test_endless_loops_stop_with_a_timeout(body):
    start = time.perf_counter()
    with pytest.raises(RenderLimitError) as info:
        render(T(body), HI, limits=QUICK)
    assert info.value.kind == "timeout"
    assert "took longer than 0.3 s" in str(info.value)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("body", [
    "{% for i in range(100000) %}{% for j in range(100) %}xx{% endfor %}{% endfor %}",
    "{{ 'a' * 10000000000 }}",
    "{{ ['a'] * 10000000000 }}",
    "{{ 'a' | center(10000000000) }}",
    "{{ 'a\\nb' | indent(10000000000) }}",
    "{{ '%99999999999d' % 1 }}",
    "{{ 'x'.ljust(10000000000) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x') }}",
    "{{ 7 ** 100000000 }}",
])
def test_huge_output_or_values_stop_with_a_size_error(body):
    with pytest.raises(RenderLimitError) as info:
        render(T(body), HI, limits=QUICK)
    assert info.value.kind == "size"


def test_recursion_without_end_is_a_render_error():
    with pytest.raises(RenderError, match="recursed too deeply"):
        render(T("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"), HI, limits=QUICK)


def test_limits_can_be_turned_off_and_are_validated():
    out = render(T("{% for i in range(300) %}x{% endfor %}"), HI, limits=Limits(seconds=None, max_output_chars=None))
    assert out == "x" * 300
    with pytest.raises(RenderLimitError):
        render(T("{% for i in range(300) %}x{% endfor %}"), HI, limits=Limits(max_output_chars=299))
    with pytest.raises(InputError):
        Limits(seconds=0)
    with pytest.raises(InputError):
        Limits(max_output_chars=-1)
    with pytest.raises(InputError, match="must be a number"):
        Limits(seconds="2")
    with pytest.raises(InputError, match="must be a number"):
        Limits(max_output_chars=True)
    assert Limits().to_dict() == {"seconds": 2.0, "max_output_chars": 10_000_000}


def test_limit_messages_name_what_the_user_can_change_where_they_are():
    from tmplkit.sandbox import hint_place, hints_for

    endless = T("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    with pytest.raises(RenderLimitError) as info:
        render(endless, HI, limits=QUICK)
    assert "If it is legitimately slow, raise Limits(seconds=...)" in str(info.value)
    with pytest.raises(RenderLimitError, match=r"legitimately that long, raise Limits\(max_output_chars=\.\.\.\)"):
        render(T("{{ 'x' * 200000 }}"), HI, limits=QUICK)
    with hints_for("cli"):
        assert hint_place() == "cli"
        with pytest.raises(RenderLimitError) as info:
            render(endless, HI, limits=QUICK)
        # No flag sets one render's limit: the command line says where it can be changed instead.
        assert "not a command-line option" in str(info.value) and "\n" not in str(info.value)
    assert hint_place() == "library"
    with pytest.raises(ValueError):
        with hints_for("gui"):
            pass


# One operation that would build about a gigabyte from small parts: each is refused by the render's
# size limit before it allocates (the limit was checked only once the value was built, and in a
# caller's own process, with no worker's memory limit, that was the machine's memory).
_ONE_STEP_BOMBS = {
    "join filter": "{{ (['x' * 1000000] * 1000) | join }}",
    "join filter's separator": "{{ (['x'] * 1000000) | join('y' * 1000) }}",
    "str.join": "{{ ''.join(['x' * 1000000] * 1000) }}",
    "bytes repeated": "{{ ('x' * 1000).encode() * 1000000 }}",
    "sum of lists": "{{ ([['x'] * 1000000] * 1000) | sum(start=[]) | length }}",
    "a list's text": "{{ (['x' * 1000000] * 1000) | string | length }}",
    "a list's JSON": "{{ (['x' * 1000000] * 1000) | tojson | length }}",
    "a list %-formatted": "{{ '%s' % ((['x' * 1000000] * 1000),) }}",
    "str.translate": "{{ ('x' * 1000000).translate({120: 'y' * 1000}) | length }}",
    "str.replace": "{{ ('x' * 1000).replace('x', 'y' * 1000000) | length }}",
    "urlencode": "{{ ('\u00e9' * 9000000) | urlencode | length }}",
    # walked item by item in Python: a gigabyte and 30 to 70 s past a 2 s limit, each
    "sort of a long string": "{{ ('x' * 9000000) | sort | length }}",
    "a filter mapped over a long string": "{{ ('x' * 9000000) | map('upper') | list | length }}",
    "batches of one": "{{ ('x' * 9000000) | batch(1) | list | length }}",
    # `{% set %}` is no hook: each step tenfold, the last built whole before anything looked at it
    "a chain of ~": "{% set a = 'x' * 100000 %}{% set b = a~a~a~a~a~a~a~a~a~a %}{% set c = b~b~b~b~b~b~b~b~b~b %}"
                    "{% set d = c~c~c~c~c~c~c~c~c~c %}{{ d | length }}",
    "a chain of +": "{% set a = 'x' * 100000 %}{% set b = a+a+a+a+a+a+a+a+a+a %}{% set c = b+b+b+b+b+b+b+b+b+b %}"
                    "{% set d = c+c+c+c+c+c+c+c+c+c %}{{ d | length }}",
    "one long sum": "{% set a = 'x' * 5000000 %}{{ (a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a) | length }}",
}


@pytest.mark.parametrize("name", sorted(_ONE_STEP_BOMBS))
def test_a_value_built_in_one_step_is_refused_before_it_is_built(name):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitError) as info:
            render(ChatTemplate(_ONE_STEP_BOMBS[name], "bomb", "-"), [{"role": "user", "content": "hi"}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.kind == "size" and "over the limit" in str(info.value)
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the refusal"


def test_lists_added_in_a_chain_are_refused_before_they_are_built():
    import tracemalloc

    # (items count one each against the limit, as `*` counts them: a smaller limit keeps the test small)
    t = ChatTemplate("{% set a = ['x'] * 100000 %}{% set b = a+a+a+a+a+a+a+a+a+a %}{% set c = b+b+b+b+b+b+b+b+b+b %}"
                     "{% set d = c+c+c+c+c+c+c+c+c+c %}{{ d | length }}", "bomb", "-")
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitError, match="concatenated a value"):
            render(t, HI, limits=Limits(seconds=10, max_output_chars=1_000_000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the refusal"


def test_sums_and_concatenations_render_as_before():
    t = ChatTemplate("{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 1 + 2 }}|{{ 1.5 + 2 }}|{{ (1,) + (2,) }}|"
                     "{{ 'x' + ('y' + ('z' + 'v') + 'u') + 'w' }}|{% macro m(a, b='q' + 'r') %}{{ a + b }}{% endmacro %}"
                     "{{ m('p') }}|{% for i in range(3) %}{{ i + loop.index }}{% endfor %}|{{ true + 1 }}|"
                     "{{ 'a' ~ 1 ~ [1, 'x'] ~ none ~ {'k': 2} }}", "ok", "-")
    assert render(t, HI) == "ab|[1, 2]|3|3.5|(1, 2)|xyzvuw|pqr|135|2|a1[1, 'x']None{'k': 2}"
    with pytest.raises(RenderError, match="can only concatenate str"):
        render(ChatTemplate("{{ 'a' + 1 }}", "bad", "-"), HI)


def test_a_filter_that_walks_items_names_itself_when_refused():
    with pytest.raises(RenderLimitError, match=r"gave the filter 'sort' 9000000 items") as info:
        render(ChatTemplate("{{ ('x' * 9000000) | sort | length }}", "bomb", "-"), HI)
    assert info.value.kind == "size" and "\n" not in str(info.value)
    # a long conversation's messages walked by the same filters: far inside the limit
    t = ChatTemplate("{{ messages | selectattr('role', 'eq', 'user') | map(attribute='content') | list | length }}"
                     "|{{ messages | map(attribute='role') | unique | sort | join(',') }}", "ok", "-")
    many = [{"role": ("user", "assistant")[i % 2], "content": str(i)} for i in range(100000)]
    assert render(t, many) == "50000|assistant,user"


def test_replace_and_urlencode_are_estimated_exactly():
    # The estimates refuse only what would be built: the same results as before, within the limit.
    t = ChatTemplate("{{ 'a b'.replace(' ', '--') }}|{{ 'a b' | replace(' ', '--') }}|{{ 'aaa'.replace('a', 'bb', 2) }}|"
                     "{{ 'é a/b~' | urlencode }}", "ok", "-")
    assert render(t, HI) == "a--b|a--b|bbbba|%C3%A9%20a/b~"
    from tmplkit.sandbox._jinja import _replace_size, _urlencoded_size

    for text, old, new in (("a b c", " ", "--"), ("abc", "", "-"), ("aaa", "aa", "")):
        assert _replace_size((text, old, new), {}) == len(text.replace(old, new))
    assert _urlencoded_size(("x y\u00e9\U0001f600/",), {}) == len("x%20y%C3%A9%F0%9F%98%80/")


def test_the_text_of_ordinary_values_is_not_refused():
    # tools and arguments printed as JSON or text, a join of the messages: far inside the limit
    t = ChatTemplate("{{ tools | tojson }}{{ messages | map(attribute='content') | join('\\n') }}{{ '%s' % (tools,) }}"
                     "{{ tools | string | length }}", "ok", "-")
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(50)]
    out = render(t, [{"role": "user", "content": "a" * 100000}, {"role": "assistant", "content": "b"}], tools=tools)
    assert "f49" in out and "a" * 100000 in out


def test_loop_namespace_and_macro_lookups_answer_as_jinjas_sandbox():
    # The sandbox answers these without its safety checks (they cost a fifth of a long render):
    # every answer must stay what Jinja's own sandbox gives, its refusals included.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    text = ("{% macro m(x, y='d') %}[{{ x }}{{ y }}{{ caller() if caller else '' }}]{% endmacro %}"
            "{% set ns = namespace(n=0, s='a', l=[1], d={'k': 1}, z=none) %}"
            "{% for i in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
            "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.depth }}{{ loop.depth0 }}"
            "{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('x', 'y') }}{{ loop.changed(i) }}"
            "{% set ns.n = ns.n + 1 %}{{ m(i) }}{{ m(i, y=loop.index) }}{% call m(i) %}c{% endcall %}{% endfor %}"
            "{{ ns.n }}{{ ns.s }}{{ ns.l }}{{ ns.d.k }}{{ ns.z }}{{ ns.missing is defined }}{{ loop is defined }}")
    want = ImmutableSandboxedEnvironment().from_string(text).render(messages=HI)
    assert render(T(text), HI) == want
    with pytest.raises(RenderError):
        render(T("{% set ns = namespace(n=1) %}{{ ns._Namespace__attrs }}"), HI)
    with pytest.raises(RenderError):
        render(T("{% for i in [1] %}{{ loop._iterator }}{% endfor %}"), HI)


def test_a_junit_report_stays_xml_whatever_a_template_says(tmp_path):
    # (control characters in a raise_exception message made the JUnit report invalid XML)
    import xml.dom.minidom

    from tmplkit.auditing import audit, format_junit

    t = ChatTemplate('{{ raise_exception("bad \x01\x1b[31m end") }}', "ctl\x02name", "-")
    doc = xml.dom.minidom.parseString(format_junit(audit([t], jobs=1)))
    case = doc.getElementsByTagName("testcase")[0]
    assert case.getAttribute("name") == "ctl\\x02name"
    assert "bad \\x01\\x1b[31m end" in case.getElementsByTagName("failure")[0].getAttribute("message")
