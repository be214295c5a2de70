"""`misplaced_messages`: a message judged where its own words lie, never where they only coincide
with markup or with words before them (those false flags made `spans` exit 1 and `request` refuse
a conversation every delimiter read right)."""

from __future__ import annotations

from tmplkit.delimiters import Delimiter
from tmplkit.session.token_spans import misplaced_messages

CHATML = [Delimiter("user", "<|im_start|>user\n"), Delimiter("assistant", "<|im_start|>assistant\n"),
          Delimiter("tool", "<|im_start|>tool\n")]
THINK = [*CHATML, Delimiter("reasoning", "<think>"), Delimiter("reasoning_end", "</think>")]


def chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)


def msgs(*turns: tuple[str, str]) -> list[dict]:
    return [{"role": role, "content": text} for role, text in turns]


def test_a_message_whose_words_are_a_role_header_is_not_in_that_header():
    # ("ok" is too short to be judged, so "assistant" was looked for from "Hello there" on and
    # found in the assistant's header: "message 2 (user) lies in an assistant span")
    turns = (("user", "Hello there"), ("assistant", "ok"), ("user", "assistant"))
    assert misplaced_messages(chatml(*turns), msgs(*turns), CHATML) == ()


def test_words_said_before_in_a_call_or_in_reasoning_are_not_the_message():
    text = chatml(("user", "Hello there"), ("assistant", '<think>they may say: search again</think>ok\n'
                                                         '<call>find {"q": "search again"}</call>'),
                  ("tool", "no"), ("user", "search again"))
    messages = msgs(("user", "Hello there"), ("assistant", "ok"), ("tool", "no"), ("user", "search again"))
    assert misplaced_messages(text, messages, THINK) == ()


def test_a_user_message_inside_another_roles_turn_is_still_found():
    turns = (("user", "Hello there"), ("assistant", "calling it"), ("tool", "result one\nnext question"))
    messages = msgs(("user", "Hello there"), ("assistant", "calling it"), ("tool", "result one"),
                    ("user", "next question"))
    text = chatml(*turns)
    assert misplaced_messages(text, messages, CHATML) == (
        f"message 3 (user) lies in a tool span (character {text.index('<|im_start|>tool')})",)


def test_a_tool_result_in_a_user_turn_is_still_found():
    turns = (("user", "Hello there"), ("assistant", "calling it"), ("user", "result one"))
    messages = msgs(("user", "Hello there"), ("assistant", "calling it"), ("tool", "result one"))
    text = chatml(*turns)
    assert misplaced_messages(text, messages, CHATML) == (
        f"message 2 (tool) lies in a user span (character {text.rindex('<|im_start|>user')})",)
