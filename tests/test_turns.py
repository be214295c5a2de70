"""A session turn by turn: requests, divergences and their causes, on templates written for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tmplkit import load_one
from tmplkit.errors import InputError, RenderLimitError
from tmplkit.session import Session, for_server, generate_session, load_session
from tmplkit.turns import CAUSES, common_prefix, request_points, session_requests, study_turns
from tmplkit.turns.formats import format_turns

FIX = Path(__file__).parent.parent / "fixtures" / "turns"


@pytest.fixture(scope="module")
def session():
    return generate_session(3000, seed=0, style="agent", requests=2)


def tmpl(name: str):
    return load_one(str(FIX / f"{name}.jinja"))


def test_request_points_follow_user_messages_and_tool_batches():
    msgs = [{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "tool"},
            {"role": "assistant"}, {"role": "assistant"}, {"role": "user"}]
    # the model speaks after the user message, after both tool results (not between them), and at the end
    assert request_points(msgs) == [(2, 3), (5, 7), (8, 8)]


def test_a_system_message_mid_way_is_a_request_point_and_a_greeting_is_not():
    # (an answer after a system message a client adds mid-way was no turn: its training mask was
    # silently empty; a greeting before the first user message stays no generated turn)
    roles = lambda *rs: [{"role": r} for r in rs]  # noqa: E731
    assert request_points(roles("user", "assistant", "user", "system", "assistant")) == [(1, 2), (4, 5)]
    assert request_points(roles("system", "assistant", "user", "assistant")) == [(3, 4)]
    assert request_points(roles("assistant", "user", "system", "assistant")) == [(3, 4)]
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Translate 'chat'."}, {"role": "system", "content": "One word."},
            {"role": "assistant", "content": "Chat."}]
    from tmplkit.masks import text_mask

    chatml = load_one(str(FIX.parent / "templates" / "chatml.jinja"))
    assert "".join(text_mask(chatml, conv).masked_text()).count("Chat.") == 1


def test_requests_hold_the_generated_turn_after_the_prompt(session):
    reqs = session_requests(session, tmpl("stable"))
    assert len(reqs) == len(request_points(session.messages))
    for r in reqs[:-1]:
        assert r.rule == "prefix" and r.generation_prompt == "<|im_start|>assistant\n"
        assert r.text.endswith(r.generation_prompt) and r.generated.endswith("<|im_end|>\n")
    # the reasoning of the turn is part of what the model generated
    first_turn = session.messages[reqs[0].turn[0]]
    assert first_turn["reasoning_content"] in reqs[0].generated


def test_stable_template_is_stable(session):
    r = study_turns(tmpl("stable"), session)
    assert r.stable and r.first is None and r.n_requests > 10
    assert all(d.position == d.n_held for d in r.divergences)


def test_a_session_of_one_request_is_not_applicable_not_stable():
    # (it said "stable over 1 request", where the audit says "not applicable": nothing is resumed)
    r = study_turns(tmpl("stable"), Session(({"role": "user", "content": "hi"},), ()))
    assert r.n_requests == 1 and r.stable is None and r.one_request and r.switches == ()
    assert format_turns([r], "text").startswith("stable: not applicable: the session has one request")


def test_date_stamping_template_diverges_on_the_date(session):
    r = study_turns(tmpl("date"), session)
    assert not r.stable
    assert r.first.request == 1 and r.first.cause == "date or time"
    assert set(r.causes()) == {"date or time"}
    assert "Now: " in r.first.held_text


def test_dropped_reasoning_is_found_and_the_switch_that_keeps_it(session):
    r = study_turns(tmpl("drops-reasoning"), session)
    assert not r.stable
    assert r.first.cause == "reasoning dropped"
    # it diverges when the second user message comes, not on tool results
    user_at = [i for i, m in enumerate(session.messages) if m["role"] == "user"][1]
    assert r.first.request == next(k for k, (n, _) in enumerate(request_points(session.messages)) if n == user_at + 1)
    assert r.stable_with == ("keep_reasoning=True",)


def test_llama_server_keeps_earlier_reasoning_by_default(session):
    # The pinned llama-server sets `preserve_reasoning` unless told otherwise, and with it
    # `preserve_thinking` (common/arg.cpp, caps_apply_preserve_reasoning): the server setting's
    # renders keep the reasoning, so the session is stable there, and turning it off breaks it;
    # transformers sets no switch, and the study names the one that keeps it.
    r = study_turns(tmpl("preserve-switch"), session)
    assert r.stable and r.switches == (("preserve_thinking=False", False),)
    for off in (study_turns(tmpl("preserve-switch"), session, kwargs={"preserve_reasoning": False}),
                study_turns(tmpl("preserve-switch"), session, inputs="transformers")):
        assert not off.stable and off.first.cause == "reasoning dropped" and off.stable_with == ("preserve_thinking=True",)
    held = for_server(tmpl("preserve-switch"), session).render()
    assert held.count("<think>") == sum(1 for m in session.messages if m.get("reasoning_content"))


def test_generation_prompt_that_differs_from_the_rendered_turn(session):
    reqs = session_requests(session, tmpl("gp-differs"))
    assert reqs[0].rule == "newest-turn"  # request 0 is no prefix of the render with the turn
    assert reqs[0].generation_prompt.endswith("<think>\n\n</think>\n\n")
    # the model continues after the generation prompt with what the template prints for the turn
    turn = session.messages[reqs[0].turn[0]]
    assert reqs[0].generated.startswith(turn["content"])
    r = study_turns(tmpl("gp-differs"), session)
    assert r.first.request == 1 and r.first.cause == "generation prompt"
    assert r.first.position == len(reqs[0].text) - len("<think>\n\n</think>\n\n")


MASKS = Path(__file__).parent.parent / "fixtures" / "masks"


def test_a_turn_that_reasons_then_calls_tools_is_generated_from_after_the_prompt():
    # The prompt closes an empty reasoning block; the history prints the turn's reasoning inside it,
    # then the calls, then the text: the model writes the calls and the text, not the text alone.
    # (llama-server passes this template enable_thinking true, its reasoning on tool-call turns
    # found; the request asks for none, as a client's `enable_thinking: false` does)
    t = load_one(str(MASKS / "calls-before-text.jinja"))
    reqs = session_requests(load_session(MASKS / "agent.json"), t, kwargs={"enable_thinking": False})
    assert reqs[0].rule == "newest-turn" and reqs[0].generation_prompt.endswith("<think>\n</think>\n")
    assert reqs[0].generated == ('<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>\n'
                                 "Let me list them.<|im_end|>\n")


def test_the_generation_prompt_starts_where_the_markup_unit_it_parts_inside_starts(corpus_template):
    # Phi-3.5 writes `<|assistant|>\n` with the prompt and `</s>` without it: the two renders share
    # their `<`, and the generation prompt read `|assistant|>\n`.
    t = corpus_template("microsoft-Phi-3.5-mini-instruct")
    reqs = session_requests(load_session(MASKS / "chat.json"), t)
    assert {r.generation_prompt for r in reqs} == {"<|assistant|>\n"}
    assert all(r.text.endswith("<|end|>\n<|assistant|>\n") for r in reqs)


def test_a_run_of_answers_asked_for_by_one_request_is_generated_whole():
    # The history writes a reasoning block in the newest answer only, so the request is no prefix
    # of the render with the turn: the turn, two answers in a row, starts at the first of them (the
    # needle in the last answer found the last alone, and the first was learned nowhere).
    t = load_one(str(MASKS / "think-block-last.jinja"))
    reqs = session_requests(load_session(MASKS / "answers-in-a-row.json"), t)
    assert reqs[0].rule == "newest-turn" and reqs[0].turn == (1, 3)
    # (the first answer written as its history writes it, after its header: no reasoning block)
    assert reqs[0].generated == ("Part one: the moon pulls the sea.<|im_end|>\n<|im_start|>assistant\n"
                                 "<think>\n\n</think>\n\nPart two: the sun pulls less.<|im_end|>\n")


def test_a_turn_whose_history_is_rewritten_starts_after_the_requests_history():
    # Once the answer exists the history drops the earlier turn's analysis; the answer's turn still
    # starts at the header after the tool result, and the model writes its analysis, a second
    # header and the answer.
    t = load_one(str(MASKS / "analysis-dropped.jinja"))
    last = session_requests(load_session(MASKS / "chat.json"), t)[-1]
    assert last.rule == "newest-turn" and last.text.endswith("<|start|>tool<|message|>a.txt<|end|><|start|>assistant")
    assert last.generated == ("<|channel|>analysis<|message|>One file.<|end|>"
                              "<|start|>assistant<|channel|>final<|message|>a.txt<|end|>")


def test_a_turn_after_a_reasoning_block_the_user_turn_closes_is_what_follows_the_block():
    # The user's turn ends with the header and an empty reasoning block (the generation prompt is
    # empty); the history fills the block: the model writes its calls after it, not nothing.
    t = load_one(str(MASKS / "header-closes-reasoning.jinja"))
    reqs = session_requests(load_session(MASKS / "chat.json"), t)
    assert reqs[1].generation_prompt == "" and reqs[1].text.endswith("<|assistant|><think></think>")
    assert reqs[1].generated == '<call>ls {"path": "."}</call><|end|>'


def test_a_turn_after_a_rewritten_last_user_message_starts_where_the_history_ends():
    # The system prompt is written into the last user message only: once the answer follows it is
    # gone, so no request is a prefix; with no generation prompt, the turn starts right after the
    # history's end as the render writes it ("[/INST]"), the space the model writes included.
    t = load_one(str(MASKS / "system-in-last-user.jinja"))
    reqs = session_requests(load_session(MASKS / "plain.json"), t)
    assert [r.rule for r in reqs] == ["newest-turn", "newest-turn"] and reqs[0].generation_prompt == ""
    assert [r.generated for r in reqs] == [" Hello.</s>", " Goodbye.</s>"]


def test_tool_list_that_moves(session):
    r = study_turns(tmpl("tools-last-user"), session)
    assert r.first.cause == "tool list"


def test_causes_are_from_the_renders_not_the_name(session, tmp_path):
    # the same template under another name gives the same verdict
    p = tmp_path / "qwen3-totally.jinja"
    p.write_text((FIX / "stable.jinja").read_text())
    assert study_turns(load_one(str(p)), session).stable


def test_common_prefix():
    assert common_prefix("abcdef", "abcxef") == 3
    assert common_prefix("abc", "abcdef") == 3
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix("", "x") == 0


def test_formats(session):
    reports = [study_turns(tmpl("stable"), session), study_turns(tmpl("date"), session)]
    text = format_turns(reports, "text")
    assert "stable: stable over" in text and "date: NOT stable" in text and "date or time" in text
    data = json.loads(format_turns(reports, "json"))["reports"]
    assert [d["stable"] for d in data] == [True, False]
    assert data[1]["first_divergence"]["cause"] in CAUSES
    md = format_turns(reports, "markdown").splitlines()
    assert md[0].startswith("| template | stable |") and len(md) == 4
    csv_lines = format_turns(reports, "csv").splitlines()
    assert csv_lines[0].startswith("template,stable,") and csv_lines[2].startswith("date,False,")


@pytest.mark.parametrize("messages, message", [
    ([{"role": "system", "content": "s"}], "no request in the session"),
    ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], "messages[1].role"),
])
def test_bad_sessions_are_one_line_errors(tmp_path, messages, message):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"messages": messages}))
    with pytest.raises(InputError) as e:
        session_requests(load_session(p), tmpl("stable"))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_session_without_a_generated_turn_has_one_request():
    s = Session(({"role": "user", "content": "hi"},))
    (r,) = session_requests(s, tmpl("stable"))
    assert r.generated == "" and r.rule == "" and r.held == r.text


def test_newest_tool_result_rendered_otherwise_once_answered(session):
    r = study_turns(tmpl("open-last-tool"), session)
    assert r.first.request == 2 and r.first.cause == "last tool result"  # request 1 ended with a tool result
    assert "<|im_end|>" in r.first.request_text and set(r.causes()) == {"last tool result"}


def test_a_bare_template_that_writes_eos_after_each_reply_renders_the_session(session):
    # Mistral's shape: `eos_token` after every answer; a bare .jinja gives none, so the requests are
    # rendered with the family's common pair, as the analysis renders (it used to fail: undefined).
    text = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
            "{% elif m.role == 'assistant' %}{{ m.content or '' }}{% for c in m.tool_calls | default([]) %}"
            "[TOOL_CALLS]{{ c.function.arguments | tojson }}{% endfor %}{{ eos_token }}"
            "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% endif %}{% endfor %}")
    from tmplkit.session import SERVER_VARIABLES, render_variables
    from tmplkit.sources import ChatTemplate

    t = ChatTemplate(text=text, name="bare-mistral", source="-")
    assert render_variables(t, inputs="transformers") == {"bos_token": "<s>", "eos_token": "</s>"}
    assert render_variables(t) == {"bos_token": "<s>", "eos_token": "</s>", **SERVER_VARIABLES}  # llama-server's own
    assert render_variables(t, {"preserve_reasoning": False})["truncate_history_thinking"] is True
    assert render_variables(t, {"eos_token": "<end>"})["eos_token"] == "<end>"  # the caller's win
    reqs = session_requests(session, t)
    assert len(reqs) == len(request_points(session.messages))
    assert reqs[0].text.startswith("<s>[INST]") and "</s>" in reqs[1].text
    assert not study_turns(t, session, switches=False).error


def test_a_whole_session_renders_for_prefill_with_the_same_variables(session):
    from tmplkit.session import render_conversation
    from tmplkit.sources import ChatTemplate

    text = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
            "{% elif m.role == 'assistant' %}{{ m.content or '' }}{{ eos_token }}"
            "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% endif %}{% endfor %}")
    t = ChatTemplate(text=text, name="bare-mistral", source="-")
    rendered = render_conversation(t, session)
    assert rendered.startswith("<s>[INST]") and "</s>" in rendered
    assert session_requests(session, t)[-1].text == render_conversation(t, Session(session.messages[:session_requests(session, t)[-1].n_messages], session.tools))


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen3.5-4B",
                                  "google-gemma-4-31B-it", "tencent-Hy-MT2-30B-A3B"])
def test_switches_left_out_without_the_walk_are_those_the_walk_leaves_out(name, monkeypatch, corpus_template):
    """A switch is skipped when the session's end renders alike with it; the switches found are
    those a walk over every request finds (DeepSeek's `thinking` changes only the generation
    prompt after a user message, which the last request, after tool results, does not show)."""
    from tmplkit.session import generate_session
    from tmplkit.turns import summary

    template = corpus_template(name)  # (Hy-MT2 from the Hub corpus's development half: its reasoning_effort switches)
    session = generate_session(8000, seed=1, style="agent", requests=4)
    quick = study_turns(template, session).switches
    monkeypatch.setattr(summary._SessionEnd, "same_with", lambda self, other: False)
    assert quick == study_turns(template, session).switches


def test_a_session_render_s_limits_are_set_by_a_block_and_its_message_says_how(tmp_path):
    # (the session functions rendered under SESSION_LIMITS alone, and a limit's message advised
    # `Limits(seconds=...)`, which none of them takes)
    from tmplkit.sandbox import hints_for
    from tmplkit.session import SESSION_LIMITS, active_session_limits, for_server, session_limits

    spin = tmp_path / "spin.jinja"
    spin.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if m.content == 'spin' %}"
                    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{% endif %}\n{% endfor %}")
    convo = Session(({"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "spin"}), ())
    hint = r"raise it around the call: `with tmplkit\.session\.session_limits\(seconds=\.\.\.\)`"
    with session_limits(seconds=0.3):
        # (the output limit stays the session's: a block that raises the time keeps 50M characters)
        assert active_session_limits().seconds == 0.3 and active_session_limits().max_output_chars == 50_000_000
        r = study_turns(load_one(str(spin)), convo)
        with pytest.raises(RenderLimitError, match=r"took longer than 0\.3 s.*" + hint):
            session_requests(convo, load_one(str(spin)))
        # (on the command line the way is from Python too: before, "a larger Limits(seconds=...)")
        with hints_for("cli"), pytest.raises(RenderLimitError, match=r"analyze it from Python inside `with tmplkit\.session"
                                                                     r"\.session_limits\(seconds=\.\.\.\)` \(one render's limit is not a "
                                                                     r"command-line option\)"):
            session_requests(convo, load_one(str(spin)))
    assert r.error.startswith("rendering template 'spin' took longer than 0.3 s") and "session_limits" in r.error
    assert active_session_limits() is SESSION_LIMITS
    # a template slow on every render meets the limit first in the probes of what it reads: the same words
    slow = tmp_path / "slow.jinja"
    slow.write_text("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
                    "{% for m in messages %}{{ m.content }}{% endfor %}")
    with session_limits(seconds=0.2), pytest.raises(RenderLimitError, match=hint):
        for_server(load_one(str(slow)), convo).render()
    with session_limits(max_output_chars=None):  # (None lifts a limit; the time stays)
        assert active_session_limits().max_output_chars is None and active_session_limits().seconds == 60
    with pytest.raises(InputError, match="session_limits\\(\\) changes nothing"):
        with session_limits():
            pass
    with pytest.raises(InputError, match="Limits.seconds must be positive"):
        with session_limits(seconds=-1):
            pass
