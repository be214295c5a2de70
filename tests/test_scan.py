"""The static escape-route scanner: flags what hostile templates reach for, and nothing in the real corpus."""

from __future__ import annotations

import pytest
from _kept import kept_paths

from tmplkit.sandbox.static_scan import MAX_WARNINGS, scan

FLAGGED = [
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "'__class__'"),
    ("{{ x['__globals__'] }}", "'__globals__'"),
    ("{% set ns = namespace() %}{% set ns.__class__ = 1 %}", "'__class__'"),
    ("{{ self._TemplateReference__context }}", "'_TemplateReference__context'"),
    ("{{ self }}", "reads 'self'"),
    ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "'__init__'"),
    ("{{ joiner.__init__.__globals__ }}", "'__globals__'"),
    ("{{ lipsum.__globals__['os'] }}", "'__globals__'"),
    ("{{ namespace.__init__.__globals__ }}", "'__globals__'"),
    ("{{ messages|attr('__class__') }}", "'__class__'"),
    ("{{ messages|attr('__cla' ~ 'ss__') }}", "|attr() with a computed name"),
    ("{% set a = '__class__' %}{{ messages|attr(a) }}", "|attr() with a computed name"),
    ("{{ messages|map(attribute='__class__')|list }}", "'__class__'"),
    ("{{ messages|selectattr('content.__class__')|list }}", "'__class__'"),
    ("{{ messages|groupby('__class__') }}", "'__class__'"),
    ("{{ messages|sort(attribute='role.__doc__') }}", "'__doc__'"),
    ("{{ messages|map('attr', '__class__')|list }}", "'__class__'"),
    ("{{ '{0.__class__}'.format(x) }}", "format string field {0.__class__}"),
    ("{{ '{0[os]}'.format(x) }}", "format string field {0[os]}"),
    ("{{ '{x.y}'.format_map(d) }}", "format string field {x.y}"),
    ("{% set f = '{0.' ~ 'a}' %}{{ f.format(x) }}", "computed format string"),
    ("{{ (messages|map('string')).gi_frame.f_globals }}", "'gi_frame'"),
    ("{{ x.mro() }}", "'mro'"),
    ("{{ config.items() }}", "reads 'config'"),
    ("{{ request.environ }}", "reads 'request'"),
    ("{{ os.system('id') }}", "reads 'os'"),
    ("{% include '/etc/passwd' %}", "{% include %}"),
    ("{% import 'x' as y %}", "{% import %}"),
    ("{% from 'x' import y %}", "{% from ... import %}"),
    ("{% extends 'base' %}", "{% extends %}"),
    ("{% generation %}{{ x.__class__ }}{% endgeneration %}", "'__class__'"),
    ("{% for x in y %}{% break %}{{ loop.__class__ }}{% endfor %}", "'__class__'"),
]


@pytest.mark.parametrize("text,expected", FLAGGED)
def test_flags_escape_routes(text, expected):
    warnings = scan(text)
    assert any(expected in w for w in warnings), warnings
    assert all("\n" not in w for w in warnings)


CLEAN = [
    "{{ messages[0].content }}",
    "{% for m in messages %}{{ '<|' ~ m.role ~ '|>' }}{{ m.content|trim }}{% endfor %}",
    "{{ 'The __init__ method' }} __class__ in plain text is fine",
    "{% raw %}{{ x.__class__ }}{% endraw %}",
    "{{ '<tok{}>'.format(n) }}{{ '{:>4}'.format(1) }}",
    "{% set ns = namespace(found=false) %}{% set ns.found = true %}{{ ns.found }}",
    "{% set _ = ns.items.append(1) %}",
    "{% macro config(x) %}{{ x }}{% endmacro %}{{ config(1) }}",  # a name the template defines itself
    "{% set request = 'x' %}{{ request }}",
    "{{ messages|map(attribute='content')|join }}",
    "{{ tools|tojson(indent=2) }}{{ raise_exception('no') if false }}{{ strftime_now('%Y') }}",
]


@pytest.mark.parametrize("text", CLEAN)
def test_no_false_positives(text):
    assert scan(text) == []


def test_lines_are_reported_and_sorted():
    warnings = scan("ok\n{{ a.__class__ }}\n\n{{ b.mro }}\n{{ c.__class__ }}")
    assert warnings == [
        "line 2: reads '__class__', a Python internal (a known sandbox escape route)",
        "line 4: reads 'mro', a Python internal (a known sandbox escape route)",
    ]


def test_unparseable_template_falls_back_to_text_search():
    warnings = scan("{% unknowntag %}\n{{ x.__globals__ }}")
    assert warnings and "'__globals__'" in warnings[0] and "does not parse" in warnings[0]
    assert warnings[0].startswith("line 2:")
    assert scan("{% unknowntag %} harmless") == []


def test_long_templates_say_they_were_scanned_in_part():
    from tmplkit.sandbox.static_scan import _MAX_SCAN_CHARS

    for head in ("{{ x }}", "{% unknowntag %}"):  # parsed, and the text-search fallback
        warnings = scan(head + " " * _MAX_SCAN_CHARS)
        assert warnings and "only the first" in warnings[-1]


def test_deep_nesting_does_not_crash():
    deep = "{{ " + "(" * 5000 + "x.__class__" + ")" * 5000 + " }}"
    assert any("'__class__'" in w for w in scan(deep))
    nested_ifs = "{% if a %}" * 3000 + "{{ y.__dict__ }}" + "{% endif %}" * 3000
    assert any("'__dict__'" in w for w in scan(nested_ifs))


def test_warnings_are_capped():
    text = "".join(f"{{{{ x.__a{i}__ }}}}" for i in range(100))
    warnings = scan(text)
    assert len(warnings) == MAX_WARNINGS + 1
    assert warnings[-1] == f"... and {100 - MAX_WARNINGS} more scan warnings"


@pytest.mark.corpus
def test_corpus_is_clean():
    paths = kept_paths()
    assert len(paths) == 43
    flagged = {p.name: scan(p.read_text(encoding="utf-8")) for p in paths}
    assert {k: v for k, v in flagged.items() if v} == {}
