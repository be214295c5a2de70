"""llama-server's delimiter lists and its split (tmplkit.server_rules._delimiters), without a server."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tmplkit.errors import InputError
from tmplkit.server_rules import HANDLER_DELIMITERS, delimiters_of_row, load_server_delimiters, server_split

RESULTS = Path(__file__).resolve().parent.parent / "scripts" / "results"


def _reference(tokens, delimiters):
    """common_chat_msg_delimiters::split (common/chat.cpp:153-185), loop for loop."""
    out = []
    for i in range(len(tokens)):
        for role, seq in delimiters:
            if seq and tokens[i:i + len(seq)] == list(seq):
                out.append((role, i))
                break
    return out


def test_the_first_delimiter_in_list_order_wins_not_the_longest():
    delims = [("user", [7, 1]), ("tool", [7, 1, 9])]
    assert [(s.role, s.pos) for s in server_split([7, 1, 9, 4], delims)] == [("user", 0)]
    assert [(s.role, s.pos) for s in server_split([7, 1, 9, 4], delims[::-1])] == [("tool", 0)]


def test_matching_goes_on_at_the_next_token_not_after_the_match():
    delims = [("assistant", [3, 3]), ("user", [3])]
    spans = server_split([3, 3, 3, 0], delims)
    assert [(s.role, s.pos) for s in spans] == [("assistant", 0), ("assistant", 1), ("user", 2)]
    assert spans.last_user_start() == 2


def test_the_split_is_the_servers_loop_on_random_tokens():
    rng = random.Random(0)
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        delims = [(rng.choice(["user", "tool", "assistant"]), [rng.randrange(4) for _ in range(rng.randrange(1, 4))])
                  for _ in range(rng.randrange(0, 4))]
        assert [(s.role, s.pos) for s in server_split(tokens, delims)] == _reference(tokens, delims)


def test_no_delimiters_no_spans():
    spans = server_split([1, 2, 3], [])
    assert len(spans) == 0 and spans.last_user_start() is None


def test_rows_of_the_saved_comparison_give_the_servers_lists():
    auto = {"template": "t", "server": {"status": "ok", "route": "autoparser", "handler": None,
                                        "delimiters": [{"role": "assistant", "delimiter": "<a>"}, {"role": "user", "delimiter": "<u>"}]}}
    assert delimiters_of_row(auto) == (("assistant", "<a>"), ("user", "<u>"))
    handler = {"server": {"status": "ok", "route": "specialized", "handler": "Qwen3-Coder", "delimiters": None}}
    assert ("tool", "<|im_start|>user\n<tool_response>") in delimiters_of_row(handler)
    assert delimiters_of_row({"server": {"status": "ok", "route": "specialized", "handler": "LFM2"}}) == ()
    assert delimiters_of_row({"server": {"status": "refused", "route": None}}) is None


@pytest.mark.parametrize("results", ["server-delimiters.json", "server-delimiters-family-vocab.json"])
def test_every_handler_the_server_took_has_its_list(results):
    rows = json.loads((RESULTS / results).read_text())["results"]
    handlers = {r["server"]["handler"] for r in rows if r["server"]["route"] == "specialized"}
    assert handlers <= set(HANDLER_DELIMITERS)
    known = load_server_delimiters(RESULTS / results)
    assert len(known) == sum(r["server"]["status"] == "ok" for r in rows)


def test_a_file_that_is_not_a_saved_comparison_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a saved `tmplkit server delimiters") as exc:
        load_server_delimiters(bad)
    assert "\n" not in str(exc.value)
    with pytest.raises(InputError):
        load_server_delimiters(tmp_path / "missing.json")


def test_the_turns_study_takes_the_servers_lists(tmp_path):
    """A template the server serves without delimiters gets no user-start checkpoint in the
    llama-server setting; one missing from the saved result has no llama-server setting, and says so."""
    pytest.importorskip("tokenizers")
    from tmplkit.session import generate_session
    from tmplkit.sources import load_one
    from tmplkit.tokens.tokenizers import load_tokenizer
    from tmplkit.turns import study_turns

    template = load_one(str(Path(__file__).resolve().parent.parent / "fixtures" / "turns" / "stable.jinja"))
    try:
        tok = load_tokenizer("vocab:qwen35")
    except Exception as exc:  # the corpus vocabularies are fetched at set-up
        pytest.skip(f"no qwen35 vocabulary: {exc}")
    session = generate_session(3000, seed=0, style="agent")
    chatml = study_turns(template, session, tokenizer=tok, switches=False)
    none = study_turns(template, session, tokenizer=tok, switches=False, server={template.name: ()})
    assert chatml.cost.requests["llama-server"] != none.cost.requests["llama-server"]
    users = [len(r.checkpoints) for r in chatml.cost.requests["llama-server"]]
    assert sum(len(r.checkpoints) for r in none.cost.requests["llama-server"]) < sum(users)
    missing = study_turns(template, session, tokenizer=tok, switches=False, server={})
    assert "llama-server" not in missing.cost.requests
    assert any("not in the saved result" in n for n in missing.notes)


def test_the_servers_own_renders_feed_its_setting_alone():
    """Where llama.cpp's engine renders a request otherwise, the llama-server setting is simulated on
    that render; the other settings keep transformers'."""
    pytest.importorskip("tokenizers")
    from tmplkit.session import for_server, generate_session
    from tmplkit.sources import load_one
    from tmplkit.tokens.tokenizers import load_tokenizer
    from tmplkit.turns import iter_requests, study_turns

    template = load_one(str(Path(__file__).resolve().parent.parent / "fixtures" / "turns" / "stable.jinja"))
    try:
        tok = load_tokenizer("vocab:qwen35")
    except Exception as exc:
        pytest.skip(f"no qwen35 vocabulary: {exc}")
    session = generate_session(3000, seed=0, style="agent")
    texts = [r.text for r in iter_requests(for_server(template, session), template)]
    same = study_turns(template, session, tokenizer=tok, switches=False, server_texts=texts)
    plain = study_turns(template, session, tokenizer=tok, switches=False)
    assert same.cost.to_dict() == plain.cost.to_dict() and not any("otherwise" in n for n in same.notes)
    # a server that writes one more token at the start of every request: every request shifts by it
    shifted = study_turns(template, session, tokenizer=tok, switches=False, server_texts=["\n" + t for t in texts])
    assert [r.n_prompt for r in shifted.cost.requests["llama-server"]] == \
        [r.n_prompt + 1 for r in plain.cost.requests["llama-server"]]
    assert shifted.cost.requests["tmplkit"] == plain.cost.requests["tmplkit"]
    assert any("otherwise than transformers" in n for n in shifted.notes)
    with pytest.raises(InputError, match="server renders for"):
        study_turns(template, session, tokenizer=tok, switches=False, server_texts=texts[:1])
