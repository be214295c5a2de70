"""A template that draws at random (the `random` filter, `lipsum`): its draws are seeded by the
render's time, so every analysis, lock and audit of it agrees with the last, and a session's
requests, each at its own time, draw anew and are named as such."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path

from tmplkit import analyze, load_one
from tmplkit.cli import main
from tmplkit.sandbox import PINNED_NOW, draws_at_random, reads_clock, reads_date, render
from tmplkit.session import generate_session
from tmplkit.sources import ChatTemplate
from tmplkit.turns import study_turns

GREETING = Path(__file__).parent.parent / "fixtures" / "turns" / "random-greeting.jinja"
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def _at(when: datetime):
    return lambda: when


def test_a_render_draws_the_same_at_the_same_time_and_anew_at_another():
    t = load_one(str(GREETING))
    first = render(t, MSGS, clock=_at(PINNED_NOW))
    assert all(render(t, MSGS, clock=_at(PINNED_NOW)) == first for _ in range(5))
    # (before, the process's own draws: two renders at one time differed, 4 times in 5)
    greetings = {render(t, MSGS, clock=_at(PINNED_NOW + timedelta(minutes=k))).split("\n")[1].split(".")[0] for k in range(12)}
    assert len(greetings) > 1 and greetings <= {"Hi", "Hello", "Hey", "Howdy", "Hullo"}


def test_lipsum_draws_by_the_time_and_the_process_draws_are_left_alone():
    t = ChatTemplate("{{ lipsum(2, html=False, min=5, max=9) }}|{{ lipsum(1) }}", "lorem", "test")
    random.seed(7)
    expected = random.random()
    random.seed(7)
    text = render(t, MSGS, clock=_at(PINNED_NOW))
    assert random.random() == expected  # (a render draws from its own generator)
    assert text == render(t, MSGS, clock=_at(PINNED_NOW)) != render(t, MSGS, clock=_at(PINNED_NOW + timedelta(days=1)))
    plain, html = text.split("|")
    assert len(plain.split("\n\n")) == 2 and all(5 <= len(p.split()) < 9 and p.endswith(".") for p in plain.split("\n\n"))
    assert html.startswith("<p>") and html.endswith("</p>")


def test_draws_at_random_is_told_from_reading_the_date():
    assert draws_at_random("{{ messages|random }}") and draws_at_random("{{ lipsum(1) }}")
    assert draws_at_random("{% filter random %}ab{% endfilter %}")
    assert draws_at_random("{{ [['a', 'b']] | map('random') | first }}")  # (a filter given by name)
    assert not draws_at_random("{{ messages | map(attribute='role') | join }}")
    assert not draws_at_random("{{ messages | map('upper') | join }}")
    assert not draws_at_random("{{ strftime_now('%d') }}") and reads_clock("{{ strftime_now('%d') }}")
    assert reads_date("{{ strftime_now('%d') }}") and not reads_date("{# strftime_now #}{{ [1, 2] | random }}")
    assert not draws_at_random("{% if %}")  # (does not parse: no draw named, though nothing is proved)


def test_the_analysis_agrees_with_itself_and_keeps_the_draw_out_of_the_system_start():
    t = load_one(str(GREETING))
    a, b = analyze(t), analyze(t)
    # (with the process's draws, the system start could hold one run's greeting, or the first letter
    # the run's draws share, and change from one run to the next)
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0} and a.status == "pass"
    assert a.system_start == "<|im_start|>system\n"


def test_the_lock_of_a_template_that_draws_holds_on_the_next_audit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["lock", str(GREETING), "--lock", "l.json"]) == 0
    for _ in range(2):  # (before: a changed behaviour on most audits, "date or time" the named cause)
        assert main(["audit", str(GREETING), "--lock", "l.json"]) == 0
        assert "0 changed behaviour -> ok" in capsys.readouterr().out


def test_the_turns_study_names_the_random_draw(tmp_path):
    session = generate_session(3000, seed=0, style="agent", requests=4)
    r = study_turns(load_one(str(GREETING)), session)
    assert not r.stable and set(r.causes()) == {"random draw"}
    assert "draws at random" in r.first.detail and "greeting" not in r.first.detail
    # the same draw by `map('random')`, and a mention of strftime_now in a comment, still named so
    other = tmp_path / "mapped.jinja"
    other.write_text("{# no strftime_now here #}" + GREETING.read_text().replace(
        "{{ ['Hi', 'Hello', 'Hey', 'Howdy', 'Hullo'] | random }}", "{{ [['Hi', 'Hello', 'Hey', 'Howdy', 'Hullo']] | map('random') | first }}"))
    assert "map('random')" in other.read_text()
    assert set(study_turns(load_one(str(other)), session).causes()) == {"random draw"}
