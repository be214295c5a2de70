"""tmplkit: chat-template boundary analysis.

Load a chat template, derive every role's start delimiter, prove it by a round trip, detect
message spans over token ids, and drive a checkpointing prefill runner.

The house, bottom up (nothing imports a stage above its own; tests/test_architecture.py checks):
sources (`sources`, `gguf_meta`, `corpus`, `jsonio`), render (`sandbox/`, `compile_cache`,
`static_scan`), analysis (`probes`, `analysis/`), tokens (`tokenizers`, `spans`, `token_delims`,
`token_audit`), session (`session/`: one conversation type, its generator, one render for a
server), server rules (`server_rules/`: what llama-server does, model-free), prefill (`prefill/`:
the runner on a real model), turns (`turns/`: a session request by request), training masks (`masks/`), replay (`replay`),
llama.cpp (`llama_server`, `engine_parity`), audit (`workers`, `isolate`, `auditing/`), surface
(`config`, `cli/`). This module re-exports the public names; nothing inside imports it.

    >>> import tmplkit
    >>> a = tmplkit.analyze(tmplkit.load_one("fixtures/templates/chatml-tools-in-user.jinja"))
    >>> a.status, a.tool_response_start
    ('pass', '<|im_start|>user\\n<tool_response>\\n')
"""

from . import _interrupt  # noqa: F401  (first: a Ctrl-C while the command starts is one line and exit 130)
from ._version import __version__ as __version__
from .analysis import Analysis, RoundTrip, analyze
from .auditing import AuditReport, audit
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
from .isolate import analyze_isolated
from .masks import AssistantMask, MaskError, TextMask, assistant_mask, assistant_masks, text_mask
from .prefill import PrefillReport, PrefillRunner, PrefillSettings, compare_policies, tiny_model_path
from .prefill.models import resolve_model
from .replay import SessionReplay, replay_session
from .sandbox import Limits, render
from .server_delimiters import DelimiterComparison, ServerDelimiters, compare_delimiters, server_delimiters
from .server_log import ServerLog, TaskPrefill, locate_breaks, read_server_log
from .server_resume import ResumeCheck, check_resume
from .server_session import ServedRequest, drive_session
from .session import Conversation, generate_session, load_conversation, load_session
from .sources import ChatTemplate, load, load_gguf, load_many, load_one
from .spans import SpanDetector, Spans, TextSpan, TokenSpan, split_text
from .static_scan import scan
from .token_audit import TokenRoundTrip, conversation_spans, token_round_trip, vocab_for_template
from .token_delims import TokenDelimiter, TokenDelimiters, token_delimiters
from .tokenizers import HFTokenizer, LlamaCppTokenizer, Tokenizer, load_tokenizer
from .turns import Divergence, MemoryModel, Request, SessionCost, TurnsReport, session_cost, session_requests, study_turns

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
