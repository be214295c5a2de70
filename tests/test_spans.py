"""Span splitting: text spans, token spans, and the fast detector against the reference loop."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tmplkit.delimiters import Delimiter, split_text, text_matches
from tmplkit.errors import InputError
from tmplkit.server_rules import server_split
from tmplkit.tokens.spans import SpanDetector, Spans, TokenSpan, split_reference, split_resumed

# ---- text ------------------------------------------------------------------------------------


def test_split_text_longest_wins_and_prefix_is_unowned():
    ds = [Delimiter("user", "<u>"), Delimiter("tool", "<u><t>"), Delimiter("assistant", "<a>")]
    spans = split_text("pre<u>hi<a>ok<u><t>res", ds)
    assert [(s.role, s.start, s.end) for s in spans] == [("user", 3, 8), ("assistant", 8, 13), ("tool", 13, 22)]


def test_text_matches_name_the_delimiter_that_matched():
    ds = [Delimiter("user", "<u>"), Delimiter("tool", "<u><t>")]
    assert text_matches("<u><t>x<u>y", ds) == [(0, Delimiter("tool", "<u><t>")), (7, Delimiter("user", "<u>"))]


# ---- token spans: semantics ------------------------------------------------------------------

USER, ASSIST, TOOL = [1, 2], [1, 3], [1, 2, 4]


def test_split_basic_semantics():
    det = SpanDetector([("user", USER), ("assistant", ASSIST), ("tool", TOOL)])
    toks = [9, 9, 1, 2, 5, 5, 1, 3, 6, 1, 2, 4, 7, 1, 2, 8]
    spans = det.split(toks)
    assert [(s.role, s.pos, s.len) for s in spans] == [
        ("user", 2, 4), ("assistant", 6, 3), ("tool", 9, 4), ("user", 13, 3)]
    assert spans.roles == ("user", "assistant", "tool", "user")
    assert len(spans) == 4 and spans[-1] == TokenSpan("user", 13, 3)
    assert sum(s.len for s in spans) == len(toks) - 2  # the 2 tokens before the first belong to none
    assert spans.starts("user") == [2, 13] and spans.starts() == [2, 6, 9, 13] and spans.starts("system") == []
    assert spans.is_user_start(2) and spans.is_user_start(13)
    assert not spans.is_user_start(9) and not spans.is_user_start(3)
    assert spans.last_user_start() == 13
    assert spans.last_user_start(before=13) == 2
    assert spans.last_user_start(before=2) is None
    assert json.loads(json.dumps(spans.to_dict())) == {
        "n_tokens": 16,
        "spans": [{"role": "user", "pos": 2, "len": 4}, {"role": "assistant", "pos": 6, "len": 3},
                  {"role": "tool", "pos": 9, "len": 4}, {"role": "user", "pos": 13, "len": 3}]}
    assert list(spans) == split_reference(toks, det.delimiters)
    with pytest.raises(IndexError):
        spans[4]


def test_longest_wins_whatever_the_order_given():
    a = SpanDetector([("user", USER), ("tool", TOOL)]).split([1, 2, 4, 0])
    b = SpanDetector([("tool", TOOL), ("user", USER)]).split([1, 2, 4, 0])
    assert a == b and a.roles == ("tool",)


def test_no_match_empty_input_and_numpy_input():
    det = SpanDetector([("user", USER)])
    assert len(det.split([])) == 0 and det.split([]).last_user_start() is None
    assert len(det.split([5, 6, 1])) == 0
    arr = np.array([1, 2, 1, 2], dtype=np.int32)
    assert det.split(arr) == det.split(arr.tolist())
    assert det.split(arr).starts("user") == [0, 2]


def test_match_resumes_after_the_delimiter():
    # [1, 1, 1] with delimiter [1, 1]: matches at 0, then 2 is too short to match.
    assert SpanDetector([("user", [1, 1])]).split([1, 1, 1]).starts() == [0]
    assert SpanDetector([("user", [1, 1])]).split([1, 1, 1, 1]).starts() == [0, 2]


def test_skips_jump_regions_and_count_inside_the_span():
    det = SpanDetector([("user", USER), ("assistant", ASSIST)])
    toks = [1, 2, 0, 1, 3, 1, 2, 0, 0, 1, 3]
    # a media chunk at 3..6 hides an assistant and a user delimiter; the user span absorbs it
    spans = det.split(toks, skips={3: 4})
    assert [(s.role, s.pos, s.len) for s in spans] == [("user", 0, 9), ("assistant", 9, 2)]
    # a skip that starts inside a delimiter prevents that match
    assert det.split(toks, skips={4: 1}).starts() == [0, 5, 9]
    assert det.split(toks, skips={6: 2}).starts() == [0, 3, 9]
    # zero-length, negative and out-of-range skips are ignored; one past the end is clipped
    assert det.split(toks, skips={0: 0, -3: 2, 99: 1}) == det.split(toks)
    assert det.split(toks, skips={8: 100}).starts() == [0, 3, 5]


def test_text_delimiters_need_a_tokenizer():
    with pytest.raises(InputError):
        SpanDetector([("user", "<u>")])

    class Chars:
        name = "chars"

        def tokenize(self, text, add_bos=False):
            return [ord(c) for c in text]

    det = SpanDetector([Delimiter("user", "U:"), ("assistant", "A:")], tokenizer=Chars())
    assert det.split([ord(c) for c in "xU:hiA:yo"]).roles == ("user", "assistant")


def test_accepts_token_delimiters_objects():
    class TD:
        def __init__(self, role, ids):
            self.role, self.ids = role, ids

    class Set:
        delimiters = (TD("tool", (1, 2, 4)), TD("user", (1, 2)))

    assert SpanDetector(Set()).split([1, 2, 4, 1, 2]).roles == ("tool", "user")


def test_duplicate_id_sequences_keep_one_role():
    det = SpanDetector([("assistant", [5]), ("user", [5])])
    assert det.split([5]).roles == ("user",)  # role order breaks the tie, as in sort_delimiters


# ---- fast vs reference, on random streams with planted delimiters ------------------------------

ROLES = ("system", "user", "assistant", "tool")


@st.composite
def streams(draw):
    alphabet = draw(st.integers(2, 6))  # tiny alphabet: accidental, overlapping and nested matches
    n_delims = draw(st.integers(1, 6))
    delims = []
    for _ in range(n_delims):
        seq = draw(st.lists(st.integers(0, alphabet), min_size=1, max_size=5))
        delims.append((draw(st.sampled_from(ROLES)), seq))
    # nested: a delimiter extended by a suffix, under another role
    if draw(st.booleans()):
        role, seq = delims[0]
        delims.append((draw(st.sampled_from(ROLES)), seq + draw(st.lists(st.integers(0, alphabet), min_size=1, max_size=3))))
    parts: list[int] = []
    for _ in range(draw(st.integers(0, 25))):
        if draw(st.booleans()):
            parts.extend(draw(st.sampled_from(delims))[1])
        else:
            parts.extend(draw(st.lists(st.integers(0, alphabet), max_size=6)))
    n = len(parts)
    skips = {}
    if n and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 4))):
            skips[draw(st.integers(-2, n + 2))] = draw(st.integers(0, 6))
    return delims, parts, skips


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_fast_split_equals_reference(case):
    delims, tokens, skips = case
    det = SpanDetector(delims)
    fast = det.split(tokens, skips=skips or None)
    ref = split_reference(tokens, delims, skips=skips or None)
    assert list(fast) == ref
    assert fast.n_tokens == len(tokens)
    # spans tile the tokens from the first start to the end
    if ref:
        assert sum(s.len for s in fast) == len(tokens) - ref[0].pos
    users = [s.pos for s in ref if s.role == "user"]
    assert fast.last_user_start() == (users[-1] if users else None)
    for s in ref:
        assert fast.is_user_start(s.pos) == (s.role == "user")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.lists(st.tuples(st.floats(0, 1), st.lists(st.integers(0, 6), max_size=30)), min_size=1, max_size=6))
# (a match before the shared ids' end that runs past it: the restart cannot be at a start there)
@example(([("user", [1]), ("tool", [2, 3, 4])], [0, 0, 0, 2, 1], {}), [(0.85, [3, 4])])
def test_a_split_resumed_after_the_shared_ids_equals_the_whole_split(case, steps):
    """A session's requests, each the one before cut somewhere and continued: each split resumed
    from the spans of the one before equals its whole split, the greedy detector's and the
    server's (which matches at every position)."""
    delims, tokens, _ = case
    det = SpanDetector(delims)
    server_delims = [(role, seq) for role, seq in delims]
    longest = max(len(seq) for _, seq in delims)
    mine, theirs, before = det.split(tokens), server_split(tokens, server_delims), tuple(tokens)
    for cut, more in steps:
        ids = before[:int(cut * len(before))] + tuple(more)
        same = len(os.path.commonprefix([before, ids]))
        mine = split_resumed(det.split, ids, mine, same, det.longest)
        theirs = split_resumed(lambda arr: server_split(arr, server_delims), ids, theirs, same, longest, greedy=False)
        assert list(mine) == list(det.split(ids)) and mine.n_tokens == len(ids)
        assert list(theirs) == list(server_split(ids, server_delims)) and theirs.n_tokens == len(ids)
        before = ids


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=200), st.integers(0, 201))
def test_last_user_start_before(tokens, before):
    spans = SpanDetector([("user", [1]), ("assistant", [2, 3])]).split(tokens)
    users = [s.pos for s in spans if s.role == "user" and s.pos < before]
    assert spans.last_user_start(before=before) == (users[-1] if users else None)


def test_spans_of_other_roles_or_lengths_are_refused_where_joined():
    det = SpanDetector([("user", [1]), ("assistant", [2])])
    whole = det.split([1, 5, 2, 5])
    assert [(s.role, s.pos) for s in whole.joined(2, det.split([2, 5]), 4)] == [("user", 0), ("assistant", 2)]
    with pytest.raises(ValueError, match="other roles"):
        whole.joined(2, SpanDetector([("user", [1]), ("system", [3])]).split([3, 5]), 4)
    with pytest.raises(ValueError, match="do not make 5 tokens"):
        whole.joined(2, det.split([2, 5]), 5)


def test_spans_is_the_public_result_type():
    assert isinstance(SpanDetector([("user", [1])]).split([1]), Spans)


def test_the_librarys_own_delimiter_dicts_are_read_and_other_shapes_refused():
    # (a `message_delimiters()` or `id_lists()` dict was unpacked as a pair: role 'role', text
    # 'delimiter', a silently wrong split)
    want = [("user", 2, 4), ("assistant", 6, 3), ("tool", 9, 4), ("user", 13, 3)]
    toks = [9, 9, 1, 2, 5, 5, 1, 3, 6, 1, 2, 4, 7, 1, 2, 8]
    as_ids = [{"role": "user", "ids": USER}, {"role": "assistant", "ids": ASSIST}, {"role": "tool", "ids": TOOL}]
    assert [(s.role, s.pos, s.len) for s in SpanDetector(as_ids).split(toks)] == want
    texts = {"<u>": USER, "<a>": ASSIST, "<t>": TOOL}

    class Tok:
        def tokenize(self, text):
            return texts[text]

    as_text = [{"role": "user", "delimiter": "<u>"}, {"role": "assistant", "delimiter": "<a>"},
               {"role": "tool", "delimiter": "<t>"}]
    assert [(s.role, s.pos, s.len) for s in SpanDetector(as_text, Tok()).split(toks)] == want
    for bad in ([{"name": "user"}], ["user"], [("user",)]):
        with pytest.raises(InputError, match="a delimiter given as"):
            SpanDetector(bad)


@pytest.mark.parametrize("ids", [[10**12], [float("nan")], [1.5], ["1"], [[1, 2]]])
def test_token_ids_that_are_no_32_bit_integers_are_one_line(ids):
    # (an OverflowError or a ValueError from numpy; 1.5 and "1" were read as 1)
    with pytest.raises(InputError, match="token ids must be"):
        SpanDetector([("user", USER)]).split(ids)
