"""The prompt a server is given, a role rendered as another role, templates that need a system message."""

from __future__ import annotations

from pathlib import Path

from tmplkit.analysis import analyze
from tmplkit.analysis._probing import Prober
from tmplkit.analysis._verdict import GENERATION_PROMPT_MATCH, extend_back, replaced, round_trip_verdict
from tmplkit.analysis.probes import SYSTEM_PREAMBLE, ProbeBuilder
from tmplkit.delimiters import Delimiter, sort_delimiters, split_text
from tmplkit.sandbox import render
from tmplkit.sources import ChatTemplate

FIXTURES = Path(__file__).parent.parent / "fixtures" / "templates"


def fixture(name: str, bos=None, eos=None) -> ChatTemplate:
    return ChatTemplate(text=(FIXTURES / f"{name}.jinja").read_text(encoding="utf-8"), name=name, source="fixture",
                        bos_token=bos, eos_token=eos)


# --- the generation prompt ----------------------------------------------------------------------


def test_round_trip_includes_the_conversation_cut_where_a_server_is_given_it():
    a = analyze(fixture("source-destination"))
    assert a.status == "pass", a.round_trip.problems
    assert a.user_start == "Source: user\n\n " and a.generation_prompt == "Source: assistant\nDestination: user\n\n "
    # The round-trip render itself ends with the generation prompt.
    assert a.round_trip.rendered.endswith(a.generation_prompt)


def test_a_user_start_that_matches_inside_the_generation_prompt_fails_the_round_trip():
    a = analyze(fixture("source-destination"))
    rt = a.round_trip
    cut = sort_delimiters([Delimiter(d.role, "user\n\n ") if d.role == "user" else d for d in a.delimiters])
    # `user\n\n ` still splits every user turn; only the generation prompt tells it is one start too many.
    spans = split_text(rt.rendered, cut)
    assert spans[-1].role == "user" and rt.rendered[spans[-1].start - len("Destination: "):].startswith("Destination: ")
    probe = ProbeBuilder(Prober(fixture("source-destination"), None).needles).build("S1 U1 A1 U2", add_generation_prompt=True)
    text = render(fixture("source-destination"), probe.messages, **probe.kwargs)
    bad = round_trip_verdict(text, probe, cut, ["own"] * 4)
    assert not bad.passed
    assert any("a user delimiter matches in the generation prompt" in p for p in bad.problems)
    assert round_trip_verdict(text, probe, a.delimiters, ["own"] * 4).passed


def test_a_template_that_refuses_a_cut_is_not_failed_for_it():
    # Mistral Nemo's shape: the system prompt goes into the last user message only; a conversation
    # cut after tool results renders without it, and that is no failure.
    nemo = ("{%- set sys = messages[0].content if messages[0].role == 'system' else '' %}"
            "{%- set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
            "{%- for m in messages %}{% if m.role == 'user' %}[INST]{% if loop.index0 == ns.last and sys %}{{ sys }}\n\n{% endif %}{{ m.content }}[/INST]"
            "{% elif m.role == 'assistant' %}{{ m.content or '' }}{% for c in m.tool_calls | default([]) %}[TOOL_CALLS]{{ c.function.arguments | tojson }}{% endfor %}</s>"
            "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% endif %}{% endfor %}")
    a = analyze(ChatTemplate(text=nemo, name="nemo", source="-"))
    assert a.status == "pass", a.round_trip.problems


# --- a role rendered as another -----------------------------------------------------------------


def test_system_rendered_as_a_user_turn_of_its_own_is_reported():
    # Rendered exactly as a user message: refused as impossible, with the render that proves it.
    a = analyze(fixture("system-as-user", eos="<|im_end|>"))
    assert a.status == "impossible", a.round_trip.problems
    assert a.errors[0].startswith("system messages render exactly like user messages")
    assert a.capabilities["system"] == "as_user" and a.system_start is None
    rt = a.round_trip
    system = next(m["content"] for m in rt.messages if m["role"] == "system")
    spans = split_text(rt.rendered, a.delimiters)
    at = rt.rendered.index(system)
    first = next(s for s in spans if s.start <= at < s.end)
    user = next(m["content"] for m in rt.messages if m["role"] == "user")
    # Its own user span, not the next user message's: a prefill engine counts one user start more.
    assert first.role == "user" and not first.start <= rt.rendered.index(user) < first.end
    assert rt.expected_roles[:2] == ("user", "user")


def test_system_rendered_as_a_marked_user_turn_gets_a_start_of_its_own():
    # A user turn that says it holds the system prompt: that opening is the system start.
    marked = ("{%- for m in messages %}<|im_start|>{{ 'user' if m.role == 'system' else m.role }}\n"
              "{% if m.role == 'system' %}[SYSTEM] {% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    a = analyze(ChatTemplate(text=marked, name="marked", source="-"))
    assert a.status == "pass", a.round_trip.problems
    assert a.system_start == "<|im_start|>user\n[SYSTEM] " and a.capabilities["system"] == "own_turn"


def test_system_rendered_as_a_user_turn_that_differs_only_elsewhere_fails():
    # The system prompt's user turn differs from a user message's only after the content: no start
    # tells it apart, and the verdict says why instead of passing a user start too many.
    tail = ("{%- for m in messages %}<|im_start|>{{ 'user' if m.role == 'system' else m.role }}\n{{ m.content }}"
            "{% if m.role == 'system' %} (instructions){% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    a = analyze(ChatTemplate(text=tail, name="tail", source="-"))
    assert a.status == "fail" and a.capabilities["system"] == "as_user"
    assert any("rendered as a user turn of its own" in p for p in a.round_trip.problems)


def test_system_folded_into_the_first_user_turn_stays_inside_user():
    folded = ("{%- set sys = messages[0].content + '\n\n' if messages[0].role == 'system' else '' %}"
              "{%- for m in messages if m.role != 'system' %}<|im_start|>{{ m.role }}\n{% if loop.first %}{{ sys }}{% endif %}"
              "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    a = analyze(ChatTemplate(text=folded, name="folded", source="-"))
    assert a.status == "pass", a.round_trip.problems
    assert a.capabilities["system"] == "inside_user"


# --- a template that needs a system message -----------------------------------------------------


def test_a_template_that_needs_a_system_message_is_probed_with_one():
    t = fixture("needs-system", eos="</s>")
    a = analyze(t)
    assert a.status == "pass", (a.errors, a.round_trip.problems)
    assert a.capabilities["system_required"] is True
    assert (a.user_start, a.assistant_start, a.tool_response_start) == ("### User:\n", "### Assistant:\n", "### Tool result:\n")
    # The probes it was analyzed with render as they are kept.
    rt = a.round_trip
    assert render(t, list(rt.messages), **rt.render_kwargs) == rt.rendered


def test_templates_that_render_without_a_system_message_do_not_get_one():
    a = analyze(fixture("system-as-user", eos="<|im_end|>"))
    assert a.capabilities["system_required"] is False
    assert SYSTEM_PREAMBLE not in a.round_trip.rendered


# --- BOS inside a turn --------------------------------------------------------------------------


def test_bos_written_at_every_turn_is_part_of_the_user_start_with_the_real_token():
    a = analyze(fixture("llama2", bos="<s>", eos="</s>"))
    assert a.status == "pass", a.round_trip.problems
    assert a.user_start == "<s>[INST] " and a.assistant_start == "[/INST] "
    assert a.round_trip.rendered.count("<s>[INST] ") == a.round_trip.expected_roles.count("user")


def test_delimiters_derived_without_bos_eos_are_proved_with_the_common_ones():
    bare = fixture("llama2")
    a = analyze(bare)
    assert a.status == "pass", a.round_trip.problems
    assert a.user_start == "[INST] "
    from tmplkit.analysis._verdict import prompt_cuts, round_trip
    from tmplkit.sources import family_special_tokens as special_tokens

    assert special_tokens(bare) == {"bos_token": "<s>", "eos_token": "</s>"}
    prober = Prober(bare, None)
    text, probe, _, _ = prober.attempt(ProbeBuilder(prober.needles), "S1 U1 A1 U2 A2 U3", add_generation_prompt=True)
    cuts = prompt_cuts(prober, probe)
    # The conversation cut after a user message, rendered with the family's BOS/EOS.
    assert [label for label, _, _ in cuts] == ["cut after a user message, bos_token='<s>', eos_token='</s>'"]
    assert "</s><s>[INST] " in cuts[0][2]
    modes = ["in_user", "own", "own", "own", "own", "own"]
    assert round_trip(probe, text, None, [], a.delimiters, modes, cuts).passed
    # A delimiter that holds only while the EOS renders empty is caught by the render with real tokens:
    # a user start there fails (a server ends a batch where no user message starts) ...
    eos_bound = sort_delimiters(a.delimiters + (Delimiter("user", "</s>"),))
    assert round_trip_verdict(text, probe, eos_bound, modes).passed
    proved = round_trip(probe, text, None, [], eos_bound, modes, cuts)
    assert not proved.passed and any(p.startswith("cut after a user message, bos_token='<s>', eos_token='</s>': ") for p in proved.problems)
    # ... another role's start moves no message's content: the round trip passes and warns where it is.
    tool_bound = sort_delimiters(a.delimiters + (Delimiter("tool", "</s>"),))
    warned = round_trip(probe, text, None, [], tool_bound, modes, cuts)
    assert warned.passed and any(n.startswith("cut after a user message, bos_token='<s>', eos_token='</s>': a tool delimiter also "
                                              "matches at character") for n in warned.notes)


def test_a_source_with_real_tokens_is_not_proved_with_other_ones():
    from tmplkit.sources import family_special_tokens as special_tokens

    assert special_tokens(fixture("llama2", bos="<s>", eos="</s>")) == {}
    assert special_tokens(ChatTemplate(text="{{ bos_token }}<|start_header_id|>", name="l3", source="-")) == {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


# --- a start cut too short for the generation prompt --------------------------------------------


def test_a_user_start_that_matches_in_the_generation_prompt_is_extended_back_to_its_markup():
    t = fixture("header-ahead")
    a = analyze(t)
    assert a.status == "pass", a.round_trip.problems
    # Each turn ends with ` <step> Source: `, so the start cut after that closer is `user\n\n `,
    # which the generation prompt's `Destination: user\n\n ` also holds; `Source: ` is kept.
    assert a.user_start == "Source: user\n\n " and "user\n\n " in a.generation_prompt
    assert Delimiter("user", "Source: user\n\n ") in a.delimiters
    prober = Prober(t, None)
    text, probe, _, _ = prober.attempt(ProbeBuilder(prober.needles), "S1 U1 A1 U2", add_generation_prompt=True)
    short = replaced(a.delimiters, "user", "Source: user\n\n ", "user\n\n ")
    bad = round_trip_verdict(text, probe, short, ["own"] * 4)
    assert any(GENERATION_PROMPT_MATCH in p for p in bad.problems)
    assert round_trip_verdict(text, probe, a.delimiters, ["own"] * 4).passed


def test_the_other_starts_are_extended_back_over_the_same_header_markup():
    # header-ahead's turns end with ` <step> Source: ` whoever speaks next: the `Source: ` the user
    # start was extended back over opens every next header. The tool result's start was left
    # `tool\n\n ` (the round trip passes with it too), and an answer followed by results ended in
    # the next header, ` <step> Source:`.
    t = fixture("header-ahead")
    a = analyze(t)
    assert a.status == "pass" and a.round_trip.passed, a.round_trip.problems
    assert (a.tool_response_start, a.assistant_start, a.system_start) == (
        "Source: tool\n\n ", "Source: assistant\n\n ", "Source: system\n\n ")
    assert {d.role: d.text for d in a.delimiters} == {
        "user": "Source: user\n\n ", "assistant": "Source: assistant\n\n ", "system": "Source: system\n\n ",
        "tool": "Source: tool\n\n "}
    # Where the results' turn opens another header (` <step> Result: `), no tool context holds
    # `Source: ` before `Result: tool\n\n `: that start is left as it is.
    other = t.text.replace("{{- ' <step> Source: ' }}", "{{- ' <step> ' + ('Result: ' if loop.nextitem and "
                                                           "loop.nextitem.role == 'tool' else 'Source: ') }}")
    assert other != t.text
    b = analyze(ChatTemplate(text=other, name="header-ahead-result", source="-"))
    assert b.status == "pass" and b.tool_response_start == "Result: tool\n\n "
    assert b.user_start == "Source: user\n\n " and b.assistant_start == "Source: assistant\n\n "


def test_extend_back_takes_the_shortest_form_at_a_markup_boundary_that_passes():
    contexts = [" <step> [hdr] Source: user\n\n ", "\n[hdr] Source: user\n\n ", "[hdr] Source: user\n\n "]
    prompt = "[hdr] Source: assistant\nDestination: user\n\n "
    seen = []

    def passes(d):
        seen.append(d)
        return d not in prompt

    assert extend_back("user\n\n ", contexts, passes) == "Source: user\n\n "
    assert seen == ["Source: user\n\n "]  # `: user`, `e: user` start inside a word: never tried
    # Needing more than every context shows before the content: nothing is made up.
    assert extend_back("user\n\n ", contexts, lambda d: d.startswith("<step>")) is None
    # A delimiter the contexts do not end with is not extended.
    assert extend_back("tool\n\n ", contexts, lambda d: True) is None


def test_a_start_that_passes_is_not_extended():
    a = analyze(fixture("source-destination"))
    assert a.user_start == "Source: user\n\n " and a.assistant_start == "Source: assistant\n\n "


# --- tool results rendered as user turns ----------------------------------------------------------

_CHATML_TOOLS = ("{% for m in messages %}<|im_start|>{{ ROLE }}\n{{ m.content or '' }}"
                 "{% for c in m.tool_calls | default([]) %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tool_results_rendered_as_user_turns_are_reported_as_user():
    as_user = _CHATML_TOOLS.replace("ROLE", "'user' if m.role == 'tool' else m.role")
    a = analyze(ChatTemplate(text=as_user, name="tool-as-user", source="-"))
    assert a.capabilities["tool"] == "as_user"
    # Still no delimiter can tell them from user messages: refused as impossible, with the reason.
    assert a.status == "impossible" and any("render exactly like user messages" in e for e in a.errors)
    own = analyze(ChatTemplate(text=_CHATML_TOOLS.replace("ROLE", "m.role"), name="tool-own", source="-"))
    assert own.status == "pass" and "tool" not in own.capabilities


# --- turns that differ by context -----------------------------------------------------------------


def test_a_first_turn_after_the_tool_list_starts_at_its_own_opener_not_at_the_tool_list():
    a = analyze(fixture("first-turn-opener"))
    assert a.status == "pass", a.round_trip.problems
    users = [d.text for d in a.delimiters if d.role == "user"]
    assert users == ["Question:\n", "<|user|>\n"]
    # The tool list lies before the first user span: a checkpoint at that start holds it.
    spans = split_text(a.round_trip.rendered, a.delimiters)
    first_user = next(s for s in spans if s.role == "user")
    assert a.round_trip.rendered.rfind("</tools>", 0, first_user.start) >= 0
    assert "</tools>" not in a.round_trip.rendered[first_user.start:]


def test_context_candidates_are_the_lines_after_the_last_varying_text_shortest_first():
    from tmplkit.analysis._chat import context_candidates

    prober = Prober(fixture("first-turn-opener"), None)
    name = prober.needles.prefix + "tool"
    seg = '<tools>\n{"name": "' + name + '"}\n</tools>\nQuestion:\n'
    got = context_candidates(prober, seg, "system", None)
    assert got[:2] == ["Question:\n", "</tools>\nQuestion:\n"]
    assert got[-1] == '<tools>\n{"name": "'  # the start cut like every other, last
    # Without varying text there is nothing to skip: the plain start alone.
    assert context_candidates(prober, "<|user|>\n", "system", None) == ["<|user|>\n"]


# --- reasoning decided by context, and fused with the assistant's start ---------------------------

_KEEPS_WITH_TOOLS = (
    "{%- set keep = tools is not none and tools | length > 0 %}"
    "{%- set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{%- for m in messages %}<|{{ m.role }}|>\n"
    "{%- if m.role == 'assistant' and m.reasoning_content and (keep or loop.index0 > ns.last) %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{- m.content or '' }}{% for c in m.tool_calls | default([]) %}<call>{{ c.function.arguments | tojson }}</call>{% endfor %}\n"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_reasoning_kept_only_when_tools_are_given_is_said_in_a_warning():
    a = analyze(ChatTemplate(text=_KEEPS_WITH_TOOLS, name="keeps-with-tools", source="-"))
    assert a.status == "pass", a.round_trip.problems
    assert (a.reasoning_start, a.reasoning_end) == ("<think>", "</think>")
    assert a.earlier_reasoning == "kept"
    assert any("kept in an agent conversation with tools but dropped in a plain chat" in w for w in a.warnings)


def test_reasoning_kept_everywhere_gets_no_context_warning():
    always = _KEEPS_WITH_TOOLS.replace("(keep or loop.index0 > ns.last)", "true")
    a = analyze(ChatTemplate(text=always, name="keeps", source="-"))
    assert a.earlier_reasoning == "kept"
    assert not any("by context" in w or "plain chat" in w for w in a.warnings)


def test_an_answer_after_tool_results_that_opens_with_reasoning_markup_is_said_to_be_fused():
    # DeepSeek-V3.2's shape: after tool results the answer has no role marker, only `</think>`.
    fused = (
        "{%- set ns = namespace(tool=false) %}{% for m in messages %}"
        "{%- if m.role == 'user' %}<|U|>{{ m.content }}{% set ns.tool = false %}"
        "{%- elif m.role == 'assistant' %}{{ '\n\n' if ns.tool else '<|A|>' }}"
        "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% else %}</think>{% endif %}"
        "{{- m.content or '' }}{% for c in m.tool_calls | default([]) %}<call>{{ c.function.arguments | tojson }}</call>{% endfor %}<|end|>"
        "{%- set ns.tool = false %}"
        "{%- elif m.role == 'tool' %}<result>{{ m.content }}</result>{% set ns.tool = true %}"
        "{%- elif m.role == 'system' %}{{ m.content }}{% endif %}{% endfor %}"
        "{%- if add_generation_prompt %}{% if ns.tool %}\n\n<think></think>{% else %}<|A|><think></think>{% endif %}{% endif %}")
    a = analyze(ChatTemplate(text=fused, name="fused", source="-"))
    assert "</think>" in [d.text for d in a.delimiters if d.role == "assistant"], a.delimiters
    assert any("'</think>' is also the reasoning end" in w and "fused" in w for w in a.warnings), a.warnings


def test_tool_results_inside_the_assistant_turn_with_no_marker_never_pass():
    # The results are written into the assistant turn after the calls with nothing that marks them:
    # no delimiter can put them in a tool span, so the verdict must not pass them as assistant text.
    unmarked = ("{%- for m in messages %}{% if m.role == 'tool' %}{{ m.content }}\n"
                "{% else %}<|{{ m.role }}|>{{ m.content or '' }}{% for c in m.tool_calls | default([]) %}"
                "<call>{{ c.function | tojson }}</call>{% endfor %}\n{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    a = analyze(ChatTemplate(text=unmarked, name="unmarked", source="-"))
    assert a.status != "pass"
    assert a.tool_response_start is None or any("tool" in p for p in a.round_trip.problems)
