"""A system message rendered as a user turn: the prompt's spans count it as a user start, and the
Prompt says which user starts are really another role's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit.delimiters import Delimiter
from tmplkit.prefill.prompt import build_prompt, user_starts_of_other_roles
from tmplkit.session import Session
from tmplkit.sources import ChatTemplate
from tmplkit.tokens.spans import SpanDetector

FIXTURES = Path(__file__).parent.parent / "fixtures" / "templates"
MESSAGES = ({"role": "system", "content": "Be brief and exact."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"})
CHATML = [Delimiter("user", "<|im_start|>user\n"), Delimiter("assistant", "<|im_start|>assistant\n")]


def _char_spans(text, delimiters):
    """Token spans over one token per character, so positions are character offsets."""
    return SpanDetector([(d.role, [ord(c) for c in d.text]) for d in delimiters]).split([ord(c) for c in text])


def test_a_user_span_holding_only_a_system_message_is_told_apart():
    text = ("<|im_start|>user\nBe brief and exact.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")
    spans = _char_spans(text, CHATML)
    assert spans.roles.count("user") == 3
    assert user_starts_of_other_roles(text, CHATML, MESSAGES, spans) == ((0, "system"),)


def test_a_system_prompt_folded_into_a_user_turn_is_no_extra_start():
    text = ("<|im_start|>user\nBe brief and exact.\n\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")
    assert user_starts_of_other_roles(text, CHATML, MESSAGES, _char_spans(text, CHATML)) == ()


def test_build_prompt_marks_the_system_turn_among_the_user_starts():
    pytest.importorskip("llama_cpp")
    from tmplkit.sources import corpus
    from tmplkit.tokens.tokenizers import load_tokenizer

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    t = ChatTemplate(text=(FIXTURES / "system-as-user.jinja").read_text(encoding="utf-8"), name="system-as-user",
                     source="fixture", eos_token="<|im_end|>")
    tok = load_tokenizer("vocab:qwen2")
    try:
        p = build_prompt(Session(MESSAGES), t, tok)
    finally:
        tok.close()
    users = p.spans.starts("user")
    # The engine sees three user starts for two user messages: the first is the system message.
    assert p.role_counts()["user"] == 3 and len(users) == 3
    assert p.as_user == ((users[0], "system"),)
    assert p.user_message_starts() == users[1:]
    assert p.to_dict()["user_starts_of_other_roles"] == {"system": 1}
