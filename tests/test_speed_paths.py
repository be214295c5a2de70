"""Fast paths held to their plain references: the one-scan delimiter split (`text_matches`) against
the loop of `str.find`s, on random delimiter sets and texts that overlap and nest, and on the
renders of corpus templates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tmplkit.delimiters import ROLES, Delimiter, _text_matches_plain, split_text, text_matches

# A small alphabet so that delimiters overlap, nest and share prefixes (`<u>`, `<u><t>`, `u>`).
_PIECES = st.sampled_from(["<", ">", "u", "t", "|", "\n", "a", "<u>", "<|"])
_DELIMS = st.lists(st.builds(Delimiter, st.sampled_from(ROLES + ("reasoning",)), st.lists(_PIECES, min_size=1, max_size=4).map("".join)),
                   max_size=6)


@settings(max_examples=400, deadline=None)
@given(delims=_DELIMS, text=st.lists(_PIECES, max_size=40).map("".join))
def test_one_scan_split_equals_the_plain_loop(delims, text):
    assert text_matches(text, delims) == _text_matches_plain(text, delims)


@pytest.mark.corpus
def test_one_scan_split_equals_the_plain_loop_on_corpus_renders():
    from tmplkit.analysis import analyze
    from tmplkit.session import for_server, generate_session
    from tmplkit.sources import corpus, load_one

    session = generate_session(3000, seed=1, style="agent")
    compared = 0
    for path in sorted(corpus.templates_dir().glob("*.jinja")):
        t = load_one(str(path))
        try:
            delims = analyze(t).delimiters
            text = for_server(t, session).render(add_generation_prompt=False)
        except Exception:  # a template that refuses the session is no case here
            continue
        assert text_matches(text, delims) == _text_matches_plain(text, delims), t.name
        assert [s.start for s in split_text(text, delims)] == [at for at, _ in _text_matches_plain(text, delims)]
        compared += bool(delims)
    assert compared >= 40


def _lcp_plain(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@settings(max_examples=300, deadline=None)
@given(common=st.integers(0, 9000), tail_a=st.lists(st.integers(0, 3), max_size=5), tail_b=st.lists(st.integers(0, 3), max_size=5),
       kind=st.sampled_from([list, tuple]))
def test_lcp_of_token_lists_equals_the_plain_walk(common, tail_a, tail_b, kind):
    from tmplkit.markup import lcp

    shared = [i % 7 for i in range(common)]  # long lists: past the blocks the walk compares whole
    a, b = kind(shared + tail_a), kind(shared + tail_b)
    assert lcp(a, b) == _lcp_plain(a, b)
    assert lcp(a, b[:common // 2]) == _lcp_plain(a, b[:common // 2])


@settings(max_examples=200, deadline=None)
@given(common=st.integers(0, 200_000), tail_a=st.text(max_size=5), tail_b=st.text(max_size=5), as_bytes=st.booleans())
def test_lcp_of_texts_equals_the_plain_walk(common, tail_a, tail_b, as_bytes):
    """Texts are compared in place, block by block past 65,536 characters: the prefix is the one a
    character-by-character walk finds, wherever the first difference lies."""
    from tmplkit.markup import lcp

    shared = ("ab\u00e9\U0001f642" * (common // 4 + 1))[:common]
    a, b = shared + tail_a, shared + tail_b
    if as_bytes:
        a, b = a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    assert lcp(a, b) == _lcp_plain(a, b) == lcp(b, a)
    assert lcp(a, b[:len(b) // 2]) == _lcp_plain(a, b[:len(b) // 2])
    assert lcp(a, a) == len(a) and lcp(a, a[:0]) == 0
