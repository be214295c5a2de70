"""Reasoning findings: the thinking switches that change a render, and the renders they give."""

from __future__ import annotations

from dataclasses import replace

from ..errors import RenderError
from ..probes import THINKING_FLAGS, Probe
from ._chat import ChatFindings
from ._probing import Prober

__all__ = ["switched_renders", "thinking_flags"]


def thinking_flags(prober: Prober, chat: ChatFindings) -> list[str]:
    """The thinking switches (enable_thinking, thinking, ...) that change the generation prompt."""
    flags: list[str] = []
    if chat.generation_render is None:
        return flags
    probe = chat.builder.build("U1", add_generation_prompt=True)
    for name, values in THINKING_FLAGS:
        if name not in prober.template.text:
            continue
        for value in values:
            try:
                if prober.render(replace(probe, kwargs={**probe.kwargs, name: value})) != chat.generation_render:
                    flags.append(name)
                    break
            except RenderError:
                continue
    return flags


def switched_renders(prober: Prober, probe: Probe, text: str, flags) -> list[tuple[str, str]]:
    """`probe` rendered with each value of each thinking switch in `flags`, where that changes the
    render: (the switch as `name=value`, the render). A switch is set per request, so delimiters
    must hold either way (DeepSeek V4 opens answers with `</think>`, or with `<think>` when thinking)."""
    out, seen = [], {text}
    for name, values in THINKING_FLAGS:
        if name not in flags:
            continue
        for value in values:
            try:
                other = prober.render(replace(probe, kwargs={**probe.kwargs, name: value}))
            except RenderError:
                continue
            if other not in seen:
                seen.add(other)
                out.append((f"{name}={value!r}", other))
    return out
