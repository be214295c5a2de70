"""Rendering chat templates: a sandboxed Jinja environment that renders exactly as transformers does.

`render()` gives the same text as transformers' `tokenizer.apply_chat_template(..., tokenize=False)`:
the same environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, a
`{% generation %}` tag), the same `tojson` filter and `raise_exception`/`strftime_now`/`dict`/
`namespace` globals, and the same preparation of the inputs (None-valued message keys dropped,
everything reduced to plain JSON data, bos/eos passed as variables; a session's reasoning is
aliased under transformers' names by `tmplkit.session.given_messages`).

Two things differ on purpose:

- `strftime_now` reads a pinned clock (`PINNED_NOW`) unless `clock=` is given, so renders are
  deterministic; pass `clock=system_clock` for the real time.
- Templates are untrusted code, so every render runs under `Limits`: a wall-clock budget and a cap
  on the characters produced. They are checked cooperatively inside the sandbox (on every loop
  iteration, every call, the intercepted `*`/`**`/`%`/`+`/`~` operators, every filter result, every
  namespace store, and on the output stream), and a render that goes past one raises
  `RenderLimitError` with kind 'timeout' or 'size'.

`engine="llama-server"` (the server setting's renders) renders too what transformers' sandbox
refuses and llama-server's own engine renders: a template's list or dict changed in place (Kimi
K2's queue of call ids) and a filter's sequence given to `tojson` (llama.cpp's DeepSeek R1), on
the render's own copy of the inputs, under the same limits and refusals (`ENGINES`).

    >>> from tmplkit.sources import ChatTemplate
    >>> t = ChatTemplate(text="{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", name="t", source="-")
    >>> render(t, [{"role": "user", "content": "hi"}])
    '<user>hi'

The package is split by concern: `_limits` (the limits, the clock, the state a render checks, the
hints), `_jinja` (the sandboxed environment and its hooks, compiling), `_inputs` (input
preparation) and `_rendering` (`render`, `compile_template`, render errors).
"""

from ._inputs import REASONING_KEYS, Prepared, prepare_message, prepare_tools
from ._jinja import draws_at_random, reads_clock, reads_date
from ._limits import DEFAULT_LIMITS, PINNED_NOW, Limits, hint, hint_place, hints_for, system_clock
from ._rendering import ENGINES, compile_template, render, render_with_prompt

__all__ = ["ENGINES", "Limits", "DEFAULT_LIMITS", "PINNED_NOW", "REASONING_KEYS", "Prepared", "prepare_tools", "system_clock",
           "render", "render_with_prompt", "reads_clock", "reads_date", "draws_at_random", "compile_template",
           "hint", "hint_place", "hints_for", "prepare_message"]
