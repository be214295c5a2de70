"""tmplkit: chat-template boundary analysis.

Load a chat template, derive every role's start delimiter, prove it by a round trip, detect
message spans over token ids, and drive a checkpointing prefill runner.
"""

from .analyze import Analysis, RoundTrip, analyze
from .delimiters import ROLES, Delimiter, sort_delimiters
from .errors import (
    AnalysisError,
    GGUFError,
    InputError,
    ModelError,
    RenderError,
    RenderLimitError,
    SourceError,
    TmplkitError,
    TokenizerError,
)
from .sources import ChatTemplate, load, load_gguf, load_many, load_one
from .audit import AuditReport, audit
from .spans import TextSpan, split_text

__version__ = "0.1.0"

__all__ = [
    "ROLES", "Analysis", "AuditReport", "audit", "load", "load_gguf", "load_many", "load_one", "AnalysisError", "ChatTemplate", "Delimiter", "GGUFError", "InputError",
    "ModelError", "RenderError", "RenderLimitError", "RoundTrip", "SourceError", "TextSpan",
    "TmplkitError", "TokenizerError", "analyze", "sort_delimiters", "split_text",
]
