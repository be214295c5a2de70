"""One exception hierarchy. Every message says what was wrong and what to do."""

from __future__ import annotations


class TmplkitError(Exception):
    """Base of every error tmplkit raises on bad input. The CLI prints it on one line."""

    exit_code = 2


class SourceError(TmplkitError):
    """A template source could not be loaded (missing file, bad GGUF, unknown repo...)."""


class GGUFError(SourceError):
    """A GGUF file is truncated, corrupted, or not a GGUF file at all."""


class RenderError(TmplkitError):
    """The template itself raised, or produced something unusable."""


class RenderLimitError(RenderError):
    """A render went past a limit. `kind` is 'timeout', 'memory', 'size' or 'unsafe'."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class AnalysisError(TmplkitError):
    """Delimiters could not be derived from a template."""


class TokenizerError(TmplkitError):
    """A tokenizer could not be loaded or used."""


class InputError(TmplkitError):
    """A conversation, session or option given by the user is invalid."""


class ModelError(TmplkitError):
    """A model could not be loaded or a decode failed."""
