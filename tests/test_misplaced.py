"""`misplaced_messages`: a message judged where its own words lie, never where they only coincide
with markup or with words before them (those false flags made `spans` exit 1 and `request` refuse
a conversation every delimiter read right)."""

from __future__ import annotations

from pathlib import Path

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


def test_a_tool_result_the_assistant_echoes_later_is_still_found_misplaced():
    # (the first place on the message's own side was taken however far ahead: the assistant's echo
    # in its own turn excused the tool result written as a user turn)
    turns = (("user", "Weather in Paris?"), ("assistant", "calling it"), ("user", "sunny, 22 degrees"),
             ("assistant", "sunny, 22 degrees"))
    messages = msgs(("user", "Weather in Paris?"), ("assistant", "calling it"), ("tool", "sunny, 22 degrees"),
                    ("assistant", "sunny, 22 degrees"))
    text = chatml(*turns)
    assert misplaced_messages(text, messages, CHATML) == (
        f"message 2 (tool) lies in a user span (character {text.index('<|im_start|>user', 1)})",)


def test_a_user_message_said_again_later_is_each_judged_where_it_lies():
    turns = (("user", "Weather in Paris?"), ("assistant", "calling it"), ("tool", "sunny\nGo on please"),
             ("assistant", "It is sunny."), ("user", "Go on please"))
    messages = msgs(("user", "Weather in Paris?"), ("assistant", "calling it"), ("tool", "sunny"),
                    ("user", "Go on please"), ("assistant", "It is sunny."), ("user", "Go on please"))
    text = chatml(*turns)
    assert misplaced_messages(text, messages, CHATML) == (
        f"message 3 (user) lies in a tool span (character {text.index('<|im_start|>tool')})",)


def test_a_system_prompt_written_into_the_last_user_turn_is_out_of_order_not_a_move():
    # (Mistral's: found there, it moved the search past every message before it, unjudged)
    turns = (("user", "First question here"), ("assistant", "calling it"), ("user", "a result"),
             ("assistant", "fine then"), ("user", "Be brief.\n\nSecond question"))
    messages = msgs(("system", "Be brief."), ("user", "First question here"), ("assistant", "calling it"),
                    ("tool", "a result"), ("assistant", "fine then"), ("user", "Second question"))
    text = chatml(*turns)
    assert misplaced_messages(text, messages, CHATML) == (
        f"message 3 (tool) lies in a user span (character {text.index('<|im_start|>user', 1)})",)


def test_a_template_that_drops_tool_results_has_none_to_misplace(tmp_path, capsys):
    # (the user quoting a tool's output was taken for the tool result, in a user span: `spans`
    # exit 1 on a template the analysis says drops tool results, and the user's words are theirs)
    import json

    from tmplkit.cli import main

    text = chatml(("user", "Weather in Paris?"), ("assistant", "It is sunny."), ("user", "you said sunny, 22 degrees?"))
    messages = msgs(("user", "Weather in Paris?"), ("assistant", ""), ("tool", "sunny, 22 degrees"),
                    ("assistant", "It is sunny."), ("user", "you said sunny, 22 degrees?"))
    assert misplaced_messages(text, messages, CHATML, drops_tools=True) == ()
    session = tmp_path / "s.json"
    session.write_text(json.dumps({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 22 degrees"},
        {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "you said sunny, 22 degrees?"}]}))
    template = str(Path(__file__).parent.parent / "fixtures" / "templates" / "no-tool-support.jinja")
    code = main(["--no-config", "spans", template, "--session", str(session), "--tokenizer", "vocab:qwen35", "-o",
                 str(tmp_path / "o.json")])
    assert code == 0 and json.loads((tmp_path / "o.json").read_text())["misplaced"] == [], capsys.readouterr().err


class _Chars:
    """A tokenizer of one token per character (its code point), BOS 1 first: offsets anyone can read."""

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        return [1] + [ord(c) for c in text]

    def tokenize_with_offsets(self, text: str):
        return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]


def test_split_disagreements_name_each_start_the_ids_read_otherwise_than_the_text():
    from tmplkit.session.token_spans import split_disagreements
    from tmplkit.tokens.spans import SpanDetector

    tok, delims = _Chars(), [Delimiter("user", "<u>"), Delimiter("assistant", "<a>")]

    def said(text, pairs):
        return split_disagreements(text, delims, tok, SpanDetector([(r, [ord(c) for c in q]) for r, q in pairs]))

    text = "<u>hello<a>fine<u>ok"
    assert said(text, [("user", "<u>"), ("assistant", "<a>")]) == ()
    # ids cut back into the delimiter (`u>`) still start its message; the same ids in content do not
    assert said(text, [("user", "u>"), ("assistant", "a>")]) == ()
    assert said("<u>see u> here<a>yo", [("user", "u>"), ("assistant", "<a>")]) == (
        "the token split starts a user message at character 7 ('u> here<a>yo'), where the text starts none",)
    # a delimiter the ids miss, and a start given to another role
    assert said(text, [("user", "<u>")]) == ("the token split misses the assistant start at character 8",)
    assert said(text, [("user", "<u>"), ("user", "<a>")]) == (
        "the token split starts a user message at character 8, where the text starts an assistant one",)
    # the generation prompt at the render's end without its trailing whitespace: no disagreement
    prompt = [Delimiter("user", "<u>"), Delimiter("assistant", "<a> ")]
    detector = SpanDetector([("user", [ord(c) for c in "<u>"]), ("assistant", [ord(c) for c in "<a>"])])
    assert split_disagreements("<u>hi<a> yo<u>ok<a>", prompt, tok, detector) == ()
    # past three, how many more
    many = "".join(f"<u>m{i}" for i in range(6))
    assert said(many, [("assistant", "<u>")])[-1] == "3 more"
