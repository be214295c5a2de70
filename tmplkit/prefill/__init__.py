"""Checkpointing prefill: span-aware batches on a real model through llama-cpp-python.

    >>> from tmplkit.prefill import PrefillRunner, compare_policies, generate_session   # doctest: +SKIP

- `PrefillRunner(model, **settings).run(tokens, spans, policy)` -> `PrefillReport`;
  `.resume(tokens, spans)` reuses the memory or a checkpoint of the previous prompt.
- Policies: `none`, `every-user-start` (llama.cpp 73618f2), `gated` (llama.cpp PR 25420).
- `generate_session()` / `load_session()`: coding-agent sessions as OpenAI-style messages JSON.
- `build_prompt(session, template, tokenizer)`: tokens and tmplkit's spans for the runner.
- `tiny_model_path()`: a tiny random-weight gemma3 GGUF around a corpus vocabulary.
- `compare_policies(...)`: the `tmplkit prefill` command's library twin.
"""

from .checkpoints import Checkpoint, CheckpointStore
from .compare import compare_policies, prepare
from .policies import POLICIES, BatchPolicy, BreakContext, EveryUserStart, Gated, NoBreaks, ServerGated, get_policy
from .prompt import Prompt, build_prompt, server_delimiters, server_spans
from .report import CheckpointRecord, Comparison, DecodeCall, PolicyResult, PrefillReport
from .runner import ModelInfo, PrefillRunner, PrefillSettings
from .session import Session, generate_session, load_session, next_user_turn, save_session, session_from_json
from .tinymodel import TinyConfig, tiny_model_path

__all__ = [
    "POLICIES", "BatchPolicy", "BreakContext", "Checkpoint", "CheckpointRecord", "CheckpointStore", "Comparison",
    "DecodeCall", "EveryUserStart", "Gated", "ModelInfo", "NoBreaks", "PolicyResult", "PrefillReport",
    "PrefillRunner", "PrefillSettings", "Prompt", "ServerGated", "Session", "TinyConfig", "build_prompt", "compare_policies",
    "generate_session", "get_policy", "load_session", "next_user_turn", "prepare", "save_session",
    "server_delimiters", "server_spans", "session_from_json", "tiny_model_path",
]
