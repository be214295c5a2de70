"""The one-pass render of a request with and without its generation prompt (`render_with_prompt`),
and the study's shortcuts that rest on it and on `reads_clock`, held to the plain renders they replace."""

from __future__ import annotations

from pathlib import Path

import pytest
from _kept import kept_paths

from tmplkit.sandbox import _jinja, reads_clock, render, render_with_prompt
from tmplkit.session import for_server, generate_session
from tmplkit.session.requests import request_points
from tmplkit.sources import ChatTemplate, corpus, load_one
from tmplkit.turns import study_turns

FIX = Path(__file__).parent.parent / "fixtures" / "turns"
MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]


def _both(template: ChatTemplate, messages) -> tuple[str, str]:
    return (render(template, messages, add_generation_prompt=True), render(template, messages, add_generation_prompt=False))


@pytest.mark.parametrize(("text", "split"), [
    ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}", True),
    # constant text after the block is in both renders
    ("{% for m in messages %}{{ m.content }}|{% endfor %}{% if add_generation_prompt %}<a>{% endif %}[end]", True),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt and messages %}<a>{% endif %}", True),
    # read twice, read before the end, an else branch, text that is not constant after it: two renders
    ("{% if add_generation_prompt %}!{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
     "{% if add_generation_prompt %}<a>{% endif %}", False),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% else %}<end>{% endif %}", False),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}{{ messages|length }}", False),
    ("{% set ns = namespace(g=add_generation_prompt) %}{{ messages[0].content }}{% if ns.g %}<a>{% endif %}", False),
    # a template that names the variant's own mark is not given the variant
    ("{{ tmplkit_prompt_mark }}{{ messages[0].content }}{% if add_generation_prompt %}<a>{% endif %}", False),
])
def test_one_pass_equals_the_two_renders(text, split):
    t = ChatTemplate(text, "t", "-")
    assert (_jinja._compile_split(text) is not None) == split
    assert render_with_prompt(t, MSGS) == _both(t, MSGS)


def test_a_template_that_raises_raises_the_same_in_one_pass():
    t = ChatTemplate("{{ raise_exception('no') }}{% if add_generation_prompt %}<a>{% endif %}", "t", "-")
    with pytest.raises(Exception) as plain:
        render(t, MSGS, add_generation_prompt=True)
    with pytest.raises(type(plain.value)) as fast:
        render_with_prompt(t, MSGS)
    assert str(fast.value) == str(plain.value)


def test_reads_clock():
    assert reads_clock("{{ strftime_now('%d') }}")
    assert reads_clock("{% set f = strftime_now %}{{ f('%d') }}")
    assert reads_clock("{{ messages|random }}") and reads_clock("{{ lipsum(1) }}")
    assert not reads_clock("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert reads_clock("{% if %}")  # does not parse: nothing proved


@pytest.mark.corpus
def test_one_pass_equals_the_two_renders_on_the_corpus():
    """Every corpus template over every request of a generated agent session; the fast path is
    taken where the proof holds (most of them, Qwen3.5's among them)."""
    session = generate_session(6000, seed=3, style="agent", requests=3)
    split = 0
    for path in kept_paths():
        t = load_one(path)
        conv = for_server(t, session)
        msgs = list(conv.messages)
        split += _jinja._compile_split(t.text) is not None
        for n, _ in request_points(msgs):
            try:
                plain = (conv.render(msgs[:n], add_generation_prompt=True), conv.render(msgs[:n], add_generation_prompt=False))
            except Exception:
                continue  # a template that refuses the shape
            assert conv.render_with_prompt(msgs[:n]) == plain, (path.stem, n)
    assert split >= 25  # (27 of the 43)
    assert _jinja._compile_split(load_one(corpus.templates_dir() / "Qwen3.5-4B.jinja").text) is not None


@pytest.mark.parametrize("name", sorted(p.stem for p in FIX.glob("*.jinja")))
def test_study_is_the_same_without_the_shortcuts(name, monkeypatch):
    """The study with one-pass requests and the date check left out where the clock is not read,
    against the study with two renders per request and every redraw."""
    template = load_one(str(FIX / f"{name}.jinja"))
    session = generate_session(6000, seed=2, style="agent", requests=3)
    fast = study_turns(template, session)
    monkeypatch.setattr("tmplkit.sandbox._rendering._compile_split", lambda text: None)
    monkeypatch.setattr("tmplkit.session._render.reads_clock", lambda text: True)  # (ServerConversation.reads_clock)
    assert study_turns(template, session).to_dict() == fast.to_dict()


@pytest.mark.corpus
def test_study_is_the_same_without_the_shortcuts_on_qwen35(monkeypatch, corpus_template, qwen35):
    template = corpus_template("Qwen3.5-4B")
    session = generate_session(8000, seed=1, style="agent", requests=4)
    fast = study_turns(template, session, tokenizer=qwen35)
    monkeypatch.setattr("tmplkit.sandbox._rendering._compile_split", lambda text: None)
    monkeypatch.setattr("tmplkit.session._render.reads_clock", lambda text: True)  # (ServerConversation.reads_clock)
    assert study_turns(template, session, tokenizer=qwen35).to_dict() == fast.to_dict()
