"""The server setting's `enable_thinking`: what llama-server passes, decided as its handlers and
its differential autoparser decide (tmplkit.session._thinking); tests/test_engine_parity.py holds
two templates of ours against the pinned server itself, scripts/server_caps.py the corpora."""

from __future__ import annotations

import pytest

from tmplkit.session import render_variables, server_thinking
from tmplkit.session._thinking import diff_split, segments
from tmplkit.sources import ChatTemplate

_CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _t(text: str) -> ChatTemplate:
    return ChatTemplate(text, "t", "-")


def test_segments_split_text_and_markers_as_the_autoparser_does():
    assert [(s.value, s.marker) for s in segments("a<b>c[d]")] == [("a", False), ("<b>", True), ("c", False), ("[d]", True)]
    assert [(s.value, s.marker) for s in segments("x<open")] == [("x", False), ("<open", False)]


def test_the_diff_of_a_render_and_its_extension_is_the_extension():
    d = diff_split("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n")
    assert (d.prefix, d.left, d.right, d.suffix) == ("<|im_start|>assistant\n", "", "<think>\n", "")
    d = diff_split("<a>one<b>", "<a>two<b>")
    assert (d.prefix, d.left, d.right, d.suffix) == ("<a>", "one", "two", "<b>")


@pytest.mark.parametrize("text, thinks", [
    # the reasoning of a reply between tags (the presence probe)
    ("{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
     "{{ m.content }}{% endfor %}", True),
    # reasoning printed with no marker around it: not found
    ("{% for m in messages %}{{ m.reasoning_content | default('') }} {{ m.content }}{% endfor %}", False),
    # the switch opens a reasoning block that closes the prompt (the switch probe)
    (_CHATML + "{% if add_generation_prompt and enable_thinking %}<think>{% endif %}", True),
    # the switch writes text that does not close the prompt: no reasoning found
    ("{% for m in messages %}{{ m.content }}{% if enable_thinking is defined and not enable_thinking %} /no_think"
     "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}", False),
    # reasoning only on a tool-call turn (the scope probe)
    ("{% for m in messages %}{% if m.tool_calls %}{{ m.reasoning_content }}<call>{% endif %}{{ m.content }}{% endfor %}", True),
    # handlers taken by a marker: GigaChat V3 never reasons; Qwen3-Coder's does where it names <think>
    ("<|role_sep|><|message_sep|>{{ messages[0].content }}", False),
    ("<tool_call><function=<parameter={{ messages[0].content }}", False),
    ("<tool_call><function=<parameter=<think>{{ messages[0].content }}", True),
    # the autoparser's patch for old Qwen / DeepSeek reasoning templates
    ("{% for m in messages %}{{ m.content.split('</think>')[-1] }}{% endfor %}", True),
    (_CHATML, False),
])
def test_the_server_thinks_where_its_handlers_and_probes_find_reasoning(text, thinks):
    assert server_thinking(_t(text)) is thinks


def test_the_server_setting_passes_enable_thinking_only_to_a_template_that_names_it():
    named = _t(_CHATML + "{% if enable_thinking %}<think>{% endif %}")
    assert render_variables(named)["enable_thinking"] is True
    assert render_variables(named, {"enable_thinking": False})["enable_thinking"] is False  # the request's own wins
    assert "enable_thinking" not in render_variables(named, inputs="transformers")  # transformers passes none
    assert "enable_thinking" not in render_variables(_t(_CHATML))


def test_one_handler_takes_a_template_as_on_the_server():
    # The server tries its handlers in order and the first whose markers the source holds takes the
    # template: one with Ministral 3's markers and Gemma 4's call marker gets Ministral's treatment
    # only (no Gemma 4 turn opened after a closed one), where each family's check on its own gave both.
    from tmplkit.session import as_server_finishes, server_handler

    both = _t("[SYSTEM_PROMPT][TOOL_CALLS][ARGS]{{ \"'<|tool_call>call:'\" }}")
    gemma = _t("{{ \"'<|tool_call>call:'\" }}")
    assert server_handler(both) == "Ministral/Magistral Large 3" and server_handler(gemma) == "Gemma 4"
    assert as_server_finishes(both, "x<turn|>\n", True) == "x<turn|>\n"
    assert as_server_finishes(gemma, "x<turn|>\n", True) == "x<turn|>\n<|turn>model\n"
