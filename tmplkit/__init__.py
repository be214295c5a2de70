"""tmplkit: chat-template boundary analysis.

Load a chat template, derive every role's start delimiter, prove it by a round trip, detect
message spans over token ids, and drive a checkpointing prefill runner.

The house, bottom up, each layer a folder (nothing imports a layer above its own;
tests/test_architecture.py checks): the ground floor (`errors`, `atomic`, `jsonio`, `markup`,
`delimiters`, `environment`), `sources/`, `sandbox/` (render), `analysis/`, `tokens/`, `session/`,
`server_rules/`, `prefill/`, `turns/`, `masks/`, `replay/`, `server/` (the real llama-server),
`auditing/`, and the surface `cli/`. This module re-exports the public names; nothing inside
imports it.

The names load on first use (`__getattr__`, as huggingface_hub's root does): `import tmplkit`
imports no layer, so a command, or a caller that needs one function, pays only for what it uses.

    >>> import tmplkit
    >>> a = tmplkit.analyze(tmplkit.load_one("fixtures/templates/chatml-tools-in-user.jinja"))
    >>> a.status, a.tool_response_start
    ('pass', '<|im_start|>user\\n<tool_response>\\n')
"""

# First, before any other import: a Ctrl-C while the command starts is one line and exit 130.
from . import _interrupt  # noqa: F401, I001  (the order is the point)

import importlib
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

# Where each public name lives: module (relative to this package) -> names.
_LAZY: dict[str, tuple[str, ...]] = {
    ".analysis": ("Analysis", "RoundTrip", "analyze"),
    ".auditing": ("AuditReport", "audit"),
    ".auditing.isolate": ("analyze_isolated",),
    ".delimiters": ("ROLES", "Delimiter", "TextSpan", "sort_delimiters", "split_text"),
    ".errors": ("AnalysisError", "GGUFError", "InputError", "ModelError", "RenderError", "RenderLimitError", "SourceError",
                "TmplkitError", "TokenizerError"),
    ".masks": ("AssistantMask", "MaskError", "TextMask", "assistant_mask", "assistant_masks", "text_mask"),
    ".prefill": ("PrefillReport", "PrefillRunner", "PrefillSettings", "compare_policies", "tiny_model_path"),
    ".prefill.models": ("resolve_model",),
    ".replay.replaying": ("SessionReplay", "replay_session"),
    ".sandbox": ("Limits", "render"),
    ".sandbox.static_scan": ("scan",),
    ".server.chat_session": ("ServedRequest", "drive_session"),
    ".server.delimiter_comparison": ("DelimiterComparison", "compare_delimiters"),
    ".server.delimiters": ("ServerDelimiters", "server_delimiters"),
    ".server.log": ("ServerLog", "TaskPrefill", "read_server_log"),
    ".server.log_breaks": ("locate_breaks",),
    ".server.resume": ("ResumeCheck", "check_resume"),
    ".session": ("Conversation", "generate_session", "load_conversation", "load_session"),
    ".session.token_spans": ("conversation_spans",),
    ".sources.templates": ("ChatTemplate", "load", "load_gguf", "load_many", "load_one"),
    ".tokens.delimiter_ids": ("TokenDelimiter", "TokenDelimiters", "token_delimiters"),
    ".tokens.roundtrip": ("TokenRoundTrip", "token_round_trip", "vocab_for_template"),
    ".tokens.spans": ("SpanDetector", "Spans", "TokenSpan"),
    ".tokens.tokenizers": ("HFTokenizer", "LlamaCppTokenizer", "Tokenizer", "load_tokenizer"),
    ".turns": ("Divergence", "MemoryModel", "Request", "SessionCost", "TurnsReport", "session_cost", "session_requests", "study_turns"),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "ROLES", "Analysis", "AnalysisError", "AuditReport", "ChatTemplate", "Conversation", "Delimiter",
    "GGUFError", "HFTokenizer", "InputError", "Limits", "LlamaCppTokenizer", "ModelError", "PrefillReport",
    "PrefillRunner", "PrefillSettings", "RenderError",
    "RenderLimitError", "RoundTrip", "SourceError", "SpanDetector", "Spans", "TextSpan", "TmplkitError",
    "TokenDelimiter", "TokenDelimiters", "TokenRoundTrip", "TokenSpan", "Tokenizer", "TokenizerError",
    "analyze", "analyze_isolated", "audit", "compare_policies", "conversation_spans", "generate_session", "load",
    "load_conversation", "load_gguf", "load_session",
    "load_many", "load_one", "load_tokenizer", "render", "scan", "sort_delimiters", "split_text",
    "tiny_model_path", "token_delimiters", "token_round_trip", "vocab_for_template",
    "Divergence", "MemoryModel", "Request", "SessionCost", "SessionReplay", "TurnsReport", "replay_session",
    "resolve_model", "session_cost", "session_requests", "study_turns",
    "DelimiterComparison", "ServedRequest", "ServerDelimiters", "ServerLog", "TaskPrefill", "compare_delimiters",
    "drive_session", "locate_breaks", "read_server_log", "server_delimiters", "ResumeCheck", "check_resume",
    "AssistantMask", "MaskError", "TextMask", "assistant_mask", "assistant_masks", "text_mask",
]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tmplkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported eagerly
    from .analysis import Analysis, RoundTrip, analyze
    from .auditing import AuditReport, audit
    from .auditing.isolate import analyze_isolated
    from .delimiters import ROLES, Delimiter, TextSpan, sort_delimiters, split_text
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
    from .masks import AssistantMask, MaskError, TextMask, assistant_mask, assistant_masks, text_mask
    from .prefill import PrefillReport, PrefillRunner, PrefillSettings, compare_policies, tiny_model_path
    from .prefill.models import resolve_model
    from .replay.replaying import SessionReplay, replay_session
    from .sandbox import Limits, render
    from .sandbox.static_scan import scan
    from .server.chat_session import ServedRequest, drive_session
    from .server.delimiter_comparison import DelimiterComparison, compare_delimiters
    from .server.delimiters import ServerDelimiters, server_delimiters
    from .server.log import ServerLog, TaskPrefill, read_server_log
    from .server.log_breaks import locate_breaks
    from .server.resume import ResumeCheck, check_resume
    from .session import Conversation, generate_session, load_conversation, load_session
    from .session.token_spans import conversation_spans
    from .sources.templates import ChatTemplate, load, load_gguf, load_many, load_one
    from .tokens.delimiter_ids import TokenDelimiter, TokenDelimiters, token_delimiters
    from .tokens.roundtrip import TokenRoundTrip, token_round_trip, vocab_for_template
    from .tokens.spans import SpanDetector, Spans, TokenSpan
    from .tokens.tokenizers import HFTokenizer, LlamaCppTokenizer, Tokenizer, load_tokenizer
    from .turns import Divergence, MemoryModel, Request, SessionCost, TurnsReport, session_cost, session_requests, study_turns

