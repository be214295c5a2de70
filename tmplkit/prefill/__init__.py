"""Checkpointing prefill: span-aware batches on a real model through llama-cpp-python.

    >>> from tmplkit.prefill import PrefillRunner, compare_policies, generate_session   # doctest: +SKIP

- `PrefillRunner(model, **settings).run(tokens, spans, policy)` -> `PrefillReport`;
  `.resume(tokens, spans)` reuses the memory or a checkpoint of the previous prompt;
  `.decode_generated(tokens)` -> `GenerationReport` decodes the model's reply one token per call,
  as llama-server generates (teacher-forced, no checkpoints).
- The runner follows llama-server's rules, which live below it in `tmplkit.server_rules` (and are
  importable from here too): the policies `none`, `every-user-start` (llama.cpp 73618f2), `gated`
  (llama.cpp PR 25420) and `divergence-aware` in the registry `POLICIES`; `BatchSchedule` (where
  batches end, which start with a checkpoint; the rule is `checkpoint_due`); the resume plan;
  `PrefillSettings`.
- Sessions (`generate_session()` / `load_session()`) are `tmplkit.session`'s.
- `build_prompt(session, template, tokenizer)`: tokens and tmplkit's spans for the runner.
- `tiny_model_path()`: a tiny random-weight gemma3 GGUF around a corpus vocabulary;
  `tiny_hybrid_path()`: a tiny random-weight qwen35 hybrid (recurrent + full attention) around one.
- `compare_policies(...)`: the `tmplkit prefill` command's library twin.
"""

from ..server_rules import (
    POLICIES,
    BatchPolicy,
    BatchSchedule,
    BreakContext,
    Checkpoint,
    CheckpointStore,
    EveryUserStart,
    FixedBreaks,
    Gated,
    NoBreaks,
    PlannedBatch,
    PrefillSettings,
    ServerGated,
    checkpoint_due,
    get_policy,
    server_delimiter_list,
    server_spans,
)
from ..session import Session, generate_session, load_session, next_user_turn, save_session, session_from_json
from .compare import compare_policies, prepare
from .prompt import Prompt, build_prompt
from .report import CheckpointRecord, Comparison, DecodeCall, GenerationReport, PolicyResult, PrefillReport
from .runner import ModelInfo, PrefillRunner
from .tinyhybrid import HybridConfig, tiny_hybrid_path
from .tinymodel import TinyConfig, tiny_model_path

__all__ = [
    "POLICIES", "BatchPolicy", "BatchSchedule", "BreakContext", "Checkpoint", "CheckpointRecord", "CheckpointStore",
    "Comparison", "DecodeCall", "EveryUserStart", "FixedBreaks", "Gated", "GenerationReport", "HybridConfig", "ModelInfo",
    "NoBreaks",
    "PlannedBatch", "PolicyResult", "PrefillReport", "PrefillRunner", "PrefillSettings", "Prompt", "ServerGated",
    "Session", "TinyConfig", "build_prompt", "checkpoint_due", "compare_policies",
    "generate_session", "get_policy", "load_session", "next_user_turn", "prepare", "save_session",
    "server_delimiter_list", "server_spans", "session_from_json", "tiny_hybrid_path", "tiny_model_path",
]
