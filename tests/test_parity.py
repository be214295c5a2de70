"""tmplkit renders every template of the llama.cpp corpus byte for byte as transformers does.

transformers' own renderer (`render_jinja_template`, after `apply_chat_template`'s message
normalization) is the reference; no tokenizer or network is needed. Where transformers raises,
tmplkit must raise too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _kept import kept_paths

from tmplkit.errors import InputError, RenderError
from tmplkit.sandbox import PINNED_NOW, render
from tmplkit.sources import ChatTemplate, corpus

ctu = pytest.importorskip("transformers.utils.chat_template_utils", reason="transformers is not installed")

pytestmark = pytest.mark.corpus

TOKENS = json.loads((Path(__file__).parent.parent / "fixtures/templates/corpus_tokens.json").read_text(encoding="utf-8"))

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name."}},
                       "required": ["city"]},
    },
}]


FLAT_TOOLS = [t["function"] for t in TOOLS]
# Variables some templates read besides the standard ones (Firefunction: `functions`, `datetime`).
EXTRA_VARIABLES = {"functions": json.dumps(FLAT_TOOLS), "datetime": "2025-01-01"}


def _call(i: int, city: str, string_args: bool = False) -> dict:
    args = {"city": city}
    return {"id": f"call{i:05d}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(args) if string_args else args}}


CHAT = [
    {"role": "user", "content": "Hello there."},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "Tell me a joke about <tags> & \"quotes\", café."},
]
SYSTEM = [{"role": "system", "content": "You are terse."}, *CHAT]


def _tools_conversation(string_args: bool) -> list[dict]:
    return [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"role": "assistant", "content": None, "reasoning_content": "Two lookups.",
         "tool_calls": [_call(1, "Paris", string_args), _call(2, "Oslo", string_args)]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18 C, sunny"},
        {"role": "tool", "tool_call_id": "call00002", "name": "get_weather", "content": "{\"temp\": 4}"},
        {"role": "assistant", "content": "Paris is sunny; Oslo is cold."},
        {"role": "user", "content": "Thanks!"},
    ]


CASES = {
    "chat": (CHAT, {}),
    "chat+generation_prompt": (CHAT, {"add_generation_prompt": True}),
    "system+generation_prompt": (SYSTEM, {"add_generation_prompt": True}),
    "system+thinking_off": (SYSTEM, {"add_generation_prompt": True, "enable_thinking": False}),
    "tools": (_tools_conversation(False), {"tools": TOOLS}),
    "tools+string_arguments+generation_prompt": (_tools_conversation(True), {"tools": TOOLS, "add_generation_prompt": True}),
    "tool_messages_without_tools_list": (_tools_conversation(False), {}),
    "system+tools+generation_prompt": (SYSTEM, {"tools": TOOLS, "add_generation_prompt": True}),
    "flat_tools": (_tools_conversation(False), {"tools": FLAT_TOOLS}),
    "extra_variables": (SYSTEM, {"add_generation_prompt": True, **EXTRA_VARIABLES}),
    "tools+extra_variables": (_tools_conversation(True), {"tools": TOOLS, **EXTRA_VARIABLES}),
}


@pytest.fixture(scope="module", autouse=True)
def pinned_transformers_clock():
    """transformers' strftime_now reads datetime.now(); pin it to tmplkit's default clock."""

    class Pinned(ctu.datetime):
        @classmethod
        def now(cls, tz=None):
            return PINNED_NOW

    saved = ctu.datetime
    ctu.datetime = Pinned
    yield
    ctu.datetime = saved


def _templates() -> list[ChatTemplate]:
    if not corpus.is_fetched():
        return []
    out = []
    for path in kept_paths():
        tokens = TOKENS.get(path.stem, {})
        out.append(ChatTemplate(text=path.read_text(encoding="utf-8"), name=path.stem, source=str(path),
                                bos_token=tokens.get("bos_token"), eos_token=tokens.get("eos_token")))
    return out


def _transformers_render(template: ChatTemplate, messages, tools=None, add_generation_prompt=False, **kwargs) -> str:
    """What tokenizer.apply_chat_template(messages, tokenize=False, ...) renders, special tokens given."""
    conversation = ctu._normalize_chat_messages(messages)
    special = {k: v for k, v in (("bos_token", template.bos_token), ("eos_token", template.eos_token)) if v is not None}
    rendered, _ = ctu.render_jinja_template(
        conversations=[conversation], tools=tools, chat_template=template.text,
        add_generation_prompt=add_generation_prompt, **{**special, **kwargs},
    )
    return rendered[0]


TEMPLATES = _templates()


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_byte_identical_to_transformers(template):
    mismatches = []
    rendered_any = False
    for case, (messages, kwargs) in CASES.items():
        try:
            expected = _transformers_render(template, messages, **kwargs)
        except Exception:  # the template refused or broke under transformers: tmplkit must too
            with pytest.raises((RenderError, InputError)):
                render(template, messages, **kwargs)
            continue
        rendered_any = True
        actual = render(template, messages, **kwargs)
        if actual != expected:
            at = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), min(len(actual), len(expected)))
            mismatches.append(f"{case}: first difference at {at}: {actual[at:at + 40]!r} vs {expected[at:at + 40]!r}")
    assert not mismatches, "\n".join(mismatches)
    assert rendered_any, "transformers rendered none of the conversations"


def test_the_whole_corpus_is_covered():
    assert len(TEMPLATES) == 43  # (the templates the tests use: `_kept`)
