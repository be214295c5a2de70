"""One exception hierarchy. Every message says what was wrong and what to do.

Each exception declares the data it carries as attributes set in `__init__`, and inherits a builtin
where one fits (a malformed input is a `ValueError`), so callers that know only the builtin still
catch it.
"""

from __future__ import annotations

import re

# Control characters a terminal acts on (ESC starts a sequence that can recolour, move or retitle),
# but for the tab and the line breaks each caller handles: a template's own words are untrusted.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    r"""`text` with each control character a terminal would act on written as its escape.

    >>> escape_controls("red \x1b[31m!")
    'red \\x1b[31m!'
    """
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


def one_line(text: str) -> str:
    r"""`text` on one line of a terminal: its line breaks written as `\n` and `\r`, its other
    control characters as their escapes (`escape_controls`).

    >>> one_line("a\nb\x1b[2J")
    'a\\nb\\x1b[2J'
    """
    return escape_controls(text.replace("\r", "\\r").replace("\n", "\\n"))


class TmplkitError(Exception):
    """Base of every error tmplkit raises on bad input. The CLI prints it on one line."""

    exit_code = 2


class SourceError(TmplkitError):
    """A template source could not be loaded (missing file, bad GGUF, unknown repo...)."""


class GGUFError(SourceError, ValueError):
    """A GGUF file is truncated, corrupted, or not a GGUF file at all."""


class RenderError(TmplkitError):
    """The template itself raised, or produced something unusable.

    `template_message` is the template's own words (its `raise_exception` text, or the Jinja error),
    without tmplkit's framing; `template_raised` is True when the template refused the input on
    purpose (`raise_exception`), False when it broke; `engine_refusal` is True where transformers'
    sandbox refused what llama-server's engine renders (a list changed in place, a filter's
    sequence to `tojson`).
    """

    def __init__(self, message: str, *, template_message: str | None = None, template_raised: bool = False):
        super().__init__(message)
        self.template_message = template_message
        self.template_raised = template_raised
        self.engine_refusal = False


class RenderLimitError(RenderError):
    """A render went past a limit. `kind` is 'timeout', 'memory', 'size' or 'unsafe'."""

    KINDS = ("timeout", "memory", "size", "unsafe")

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class AnalysisError(TmplkitError, ValueError):
    """Delimiters could not be derived from a template."""


class TokenizerError(TmplkitError):
    """A tokenizer could not be loaded or used."""


class InputError(TmplkitError, ValueError):
    """A conversation, session or option given by the user is invalid."""


class ModelError(TmplkitError):
    """A model could not be loaded or a decode failed."""
