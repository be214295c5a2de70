"""The probe conversations a behaviour record renders, and their renders under each thinking switch.

The probes are ordinary conversations (a user question, a system prompt, a reply with reasoning,
a tool call and its result), each with content no template writes itself, so that whether a
message's content reaches the render is a substring test. They are rendered in the sandbox, with
the generation prompt where the model would speak next, plainly and with each value of each
thinking switch the analysis found (`enable_thinking=False`, ...).
"""

from __future__ import annotations

from ..analysis.probes import THINKING_FLAGS
from ..errors import RenderError, RenderLimitError, TmplkitError
from ..sandbox import render
from ..sources.templates import family_special_tokens

__all__ = ["PROBE_NAMES", "SETTINGS_DEFAULT", "probe_renders", "rendered_roles", "switch_settings"]

SYSTEM = "Answer in one short line, zq-system."
USER = "What is the capital of France, zq-user?"
ANSWER = "Paris, zq-answer."
REASONING = "The user asks for a capital, zq-reasoning."
FOLLOW_UP = "And of Spain, zq-follow?"
RESULT = '{"temperature_zq": 21}'
TOOL_ANSWER = "It is 21 degrees, zq-after-tool."
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# Mistral templates take tool-call ids of exactly 9 letters and digits.
CALL = {"id": "call0001a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
SETTINGS_DEFAULT = "default"


def _probes() -> dict[str, tuple[list[dict], bool, bool]]:
    """name -> (messages, with tools, add_generation_prompt)."""
    user = {"role": "user", "content": USER}
    system = {"role": "system", "content": SYSTEM}
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    result = {"role": "tool", "tool_call_id": CALL["id"], "name": "get_weather", "content": RESULT}
    reasoned = {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}
    return {
        "user": ([user], False, True),
        "user without generation prompt": ([user], False, False),
        "system": ([system, user], False, True),
        "conversation": ([system, user, {"role": "assistant", "content": ANSWER},
                          {"role": "user", "content": FOLLOW_UP}], False, True),
        "earlier reasoning": ([user, reasoned, {"role": "user", "content": FOLLOW_UP}], False, True),
        "last reasoning": ([user, reasoned], False, False),
        "tool call": ([system, user, call, result], True, True),
        "tool answer": ([system, user, call, result, {"role": "assistant", "content": TOOL_ANSWER},
                         {"role": "user", "content": FOLLOW_UP}], True, True),
    }


PROBE_NAMES = tuple(_probes())


def switch_settings(flags) -> list[tuple[str, dict]]:
    """('default', {}) and, for each thinking switch in `flags` (the analysis's thinking_flags),
    each of its values as ('name=value', {name: value}), named as Analysis.generation_reasoning is."""
    out: list[tuple[str, dict]] = [(SETTINGS_DEFAULT, {})]
    for name, values in THINKING_FLAGS:
        if name in flags:
            out += [(f"{name}={value!r}", {name: value}) for value in values]
    return out


def _one_line(text: object, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _render_or_error(template, messages, tools, gp: bool, kwargs: dict) -> str:
    """The render, or 'error: ...' / 'limit: ...' (a template that refuses a probe does so alike twice)."""
    try:
        return render(template, messages, tools=TOOLS if tools else None, add_generation_prompt=gp, **kwargs)
    except RenderLimitError as exc:
        return f"limit: {exc.kind}"
    except RenderError as exc:
        return f"error: {_one_line(exc.template_message or exc)}"
    except TmplkitError as exc:  # an input the template's variables refuse
        return f"error: {_one_line(exc)}"


def probe_renders(template, flags=()) -> dict[str, str]:
    """Every probe rendered with each switch setting: {'probe' or 'probe [setting]': text}.
    A setting's renders are kept only where one differs from the default's. A template that refuses
    a probe gives 'error: ...' (its own words), one past a limit 'limit: KIND'."""
    out: dict[str, str] = {}
    tokens = family_special_tokens(template)  # a bare .jinja that needs BOS/EOS gets its family's, as in the analysis
    for setting, kwargs in switch_settings(flags):
        texts = {name: _render_or_error(template, m, tools, gp, {**tokens, **kwargs}) for name, (m, tools, gp) in _probes().items()}
        if setting == SETTINGS_DEFAULT:
            out.update(texts)
        elif any(texts[n] != out[n] for n in texts):
            out.update({f"{n} [{setting}]": t for n, t in texts.items()})
    return out


def rendered_roles(renders: dict[str, str]) -> dict[str, bool | None]:
    """Whether each role's content reaches the render (None: the probe did not render)."""
    def seen(probe: str, needle: str) -> bool | None:
        text = renders.get(probe, "error: ")
        return None if text.startswith(("error: ", "limit: ")) else needle in text

    return {"system": seen("system", SYSTEM), "user": seen("user", USER),
            "assistant": seen("conversation", ANSWER), "tool": seen("tool call", RESULT)}
