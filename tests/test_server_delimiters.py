"""How `tmplkit server delimiters` reads the server and words the comparison, without a server:
the log lines that name the route and the autoparser's starts, the two end-of-prompt batch ends,
and the verdicts on a probe whose user starts are given. The runs on llama-server itself are in
test_server_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmplkit import analyze, load_one
from tmplkit.errors import InputError
from tmplkit.server.delimiter_comparison import (
    VERDICTS,
    ComparisonReport,
    compare_delimiters,
    comparison_failures,
    format_comparison_table,
    verdict_counts,
)
from tmplkit.server.delimiters import (
    ServerDelimiters,
    ServerStart,
    _route,
    _user_starts,
    message_opener,
)
from tmplkit.server.log import TaskPrefill
from tmplkit.server.process import MessageDelimiter, server_log_error
from tmplkit.tokens.gguf_vocab import bytes_to_unicode

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "templates"


def test_the_route_and_the_autoparsers_starts_come_from_the_log():
    # as llama-server prints them at -lv 5 (common/chat-diff-analyzer.cpp:271-272), a start that
    # holds a newline running onto the next line
    auto = ("0.00.913.255 D common_chat_templates_apply_jinja: using differential autoparser\n"
            "0.00.915.808 D user_msg_start: <|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
            "0.00.915.808 D assistant_msg_start: <|im_start|>assistant\n"
            "0.00.915.809 D reasoning_mode: NONE\n")
    assert _route(auto) == ("autoparser", None, (
        MessageDelimiter("assistant", "<|im_start|>assistant"),
        MessageDelimiter("user", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user")))
    no_user = auto.replace("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user", "")
    assert _route(no_user)[2] == (MessageDelimiter("assistant", "<|im_start|>assistant"),)
    assert _route("0.00.898.729 D Using specialized template: Qwen3-Coder\n") == ("specialized", "Qwen3-Coder", None)
    assert _route("slot launch_slot_: id  0 | task 0 | processing task\n") == ("specialized", None, None)  # Gemma 4's


def _task(n: int, starts, ubatch: int = 512) -> TaskPrefill:
    return TaskPrefill(task=0, slot=0, level="trace", n_prompt=n, n_reused=0, n_processed=n, n_generated=1, n_common=0,
                       batch_starts=tuple(starts), batches_complete=True, n_batch=16384, n_ubatch=ubatch,
                       checkpoints_created=(), checkpoints_restored=(), full_reprocess=False)


def test_the_end_of_prompt_breaks_are_told_apart_by_a_shorter_prompt():
    text = "".join(f"<u>Kq{c}1Zx" for c in "ABCD") + "<a>" * 300  # each character one token (the byte model)
    opener = message_opener(text, [{"role": "user", "content": f"Kq{c}1Zx"} for c in "ABCD"])
    n = len(text)
    # a user start that happens to lie at n - 4 - 512, and the two end-of-prompt breaks
    a = _task(n, [0, 11, 22, n - 516, n - 4])
    assert a.near_end == (n - 516, n - 4)
    # without its last 20 tokens, the same text there: n - 516 is no user start of the shorter prompt
    shorter = _task(n - 20, [0, 11, 22, n - 536, n - 24])
    starts, undecided = _user_starts(a, text, [(shorter, text[:-20])], lambda p: p, opener)
    assert starts == {11, 22} and undecided == []
    # ... or it is one (it starts a batch there too)
    shorter = _task(n - 20, [0, 11, 22, n - 536, n - 516, n - 24])
    assert _user_starts(a, text, [(shorter, text[:-20])], lambda p: p, opener)[0] == {11, 22, n - 516}
    # with no shorter prompt it cannot be told; n - 4 opens no message (after the last content): left out
    starts, undecided = _user_starts(a, text, [], lambda p: p, opener)
    assert starts == {11, 22} and undecided == []  # n - 516 lies after the last content too
    b = _task(40, [0, 11, 22, 36])
    assert _user_starts(b, text, [], lambda p: p, opener) == ({11, 22}, [])
    # an end-of-prompt break before a message's content, and no shorter prompt to ask: undecided
    text = "<u>KqA1Zx" + "x" * 600 + "<u>KqB1Zx" + "y" * 10
    n = len(text)
    c = _task(n, [0, n - 516, n - 4])
    assert _user_starts(c, text, [], lambda p: p, message_opener(text, [{"role": "user", "content": "KqA1Zx"},
                                                                {"role": "user", "content": "KqB1Zx"}])) == (set(), [n - 516])


@pytest.fixture(scope="module")
def qwen_like():
    template = load_one(str(FIXTURES / "chatml-tools-in-user.jinja"))
    analysis = analyze(template)
    from tmplkit.sandbox import render

    rt = analysis.round_trip
    kwargs = dict(rt.render_kwargs)
    prompt = render(template, list(rt.messages), **kwargs)
    return analysis, prompt, tuple(rt.messages)


def _server(analysis, prompt, messages, roles_opened, **kw) -> ServerDelimiters:
    """The server's user starts at the messages `roles_opened` selects (by role)."""
    opened = [i for i, m in enumerate(messages) if m["role"] in roles_opened]
    starts = tuple(ServerStart(100 + i, i, messages[i]["role"]) for i in opened)
    base = dict(template="chatml-tools-in-user", status="ok", vocab="bytes", route="autoparser",
                delimiters=(MessageDelimiter("assistant", "<|im_start|>assistant"), MessageDelimiter("user", "<|im_start|>user")),
                user_starts=starts, n_tokens=len(prompt), prompt=prompt, messages=messages)
    return ServerDelimiters(**{**base, **kw})


def test_the_verdicts(qwen_like, matches_schema):
    analysis, prompt, messages = qwen_like
    users = tuple(i for i, m in enumerate(messages) if m["role"] == "user")
    same = compare_delimiters(_server(analysis, prompt, messages, {"user"}), analysis)
    assert same.verdicts == ("agree",) and same.server == same.tmplkit == users and same.tmplkit_passed
    # the autoparser's <|im_start|>user on a template that writes tool results in user turns
    tools = compare_delimiters(_server(analysis, prompt, messages, {"user", "tool"}), analysis)
    assert tools.verdicts == ("tool results taken for user messages",)
    assert {r for _, r in tools.extra} == {"tool"} and "25213" in tools.advice()
    # a handler that matches nothing: missed; one that has no list: no delimiters at all
    missed = compare_delimiters(_server(analysis, prompt, messages, set(), route="specialized", handler="Kimi K3",
                                        delimiters=None), analysis)
    assert missed.verdicts == ("real user messages missed",) and [i for i, _ in missed.missed] == list(users)
    assert "a resume goes back further" in missed.advice()
    none = compare_delimiters(_server(analysis, prompt, messages, set(), route="specialized", handler="LFM2",
                                      delimiters=None), analysis)
    assert none.verdicts == ("no delimiters at all",)
    refused = compare_delimiters(ServerDelimiters("x", "refused", "bytes", error="chat template parsing error"), analysis)
    assert refused.verdicts == ("refused by llama-server",) and "parsing error" in refused.advice()
    rows = [same, tools, missed, none, refused]
    assert list(verdict_counts(rows)) == list(VERDICTS) and sum(verdict_counts(rows).values()) == 5
    table = format_comparison_table(rows)
    assert "LFM2 handler: none" in table and "Kimi K3 handler: hard-coded, not logged" in table
    assert table.rstrip().endswith("refused by llama-server: 1")
    d = tools.to_dict()
    assert d["verdicts"] == ["tool results taken for user messages"] and d["server"]["route"] == "autoparser"
    assert d["extra"][0]["role"] == "tool" and "prompt" not in d["server"]
    assert matches_schema("server-delimiters", ComparisonReport(tuple(rows), "0.3.36").to_dict())
    # the gate (--fail-on): what differs, then also what was not compared
    assert comparison_failures(rows, "differs") == (tools, missed, none)
    assert comparison_failures(rows, "unchecked") == (tools, missed, none, refused)
    assert comparison_failures([same], "unchecked") == ()
    with pytest.raises(InputError, match="fail_on must be one of differs, unchecked"):
        comparison_failures(rows, "fail")


def test_the_servers_reason_for_refusing_a_template(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("0.00.024.018 D args_field: 'arguments'\n"
                   "\x1b[0m0.00.024.274 E srv          init: init: chat template parsing error: Unable to generate "
                   "parser for this template. Automatic parser generation failed: \n------------\n"
                   "While executing CallExpression at line 1\nError: Jinja Exception: Conversation roles must alternate\n"
                   "0.00.024.618 E srv  llama_server: exiting due to model loading error\n")
    assert server_log_error(log) == ("chat template parsing error: Unable to generate parser for this template. "
                                     "Automatic parser generation failed: Error: Jinja Exception: Conversation roles "
                                     "must alternate")
    assert server_log_error(tmp_path / "none.log") is None
    # the bare line it prints first quotes the template, not the reason: the logged line wins
    log.write_text("error: the supplied chat template is not supported: {{ x | wordcount }}\n\n"
                   "0.00.006.791 E common_chat_verify_template: failed to apply template: Unable to generate parser "
                   "for this template. Automatic parser generation failed: \n------------\n"
                   "Error: Unknown (built-in) filter 'wordcount' for type String\n")
    assert server_log_error(log).endswith("Error: Unknown (built-in) filter 'wordcount' for type String")
    # a model it cannot load: the first error line says why, the later ones follow from it
    log.write_text("0.00.014.520 E llama_model_load: error loading model: tensor 'blk.1.attn_k.weight' data is not "
                   "within the file bounds, model is corrupted or incomplete\n"
                   "0.00.014.529 E llama_model_load_from_file_impl: failed to load model\n"
                   "0.00.017.289 E srv  llama_server: exiting due to model loading error\n")
    assert server_log_error(log).startswith("error loading model: tensor 'blk.1.attn_k.weight' data is not within")


def test_the_byte_vocabulary_maps_every_byte_to_its_own_character():
    chars = bytes_to_unicode()
    assert sorted(chars) == list(range(256)) and len(set(chars.values())) == 256
    assert chars[ord("a")] == "a" and chars[ord(" ")] == "\u0120"  # GPT-2's map
