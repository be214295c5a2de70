"""What llama-server does, as rules without a model: below prefill (which follows them on a real
model) and turns (which simulates them over a session's requests).

- `_checkpoints`: when a checkpoint is taken (`checkpoint_due`, `near_end`, `near_end_breaks`) and
  the `CheckpointStore` with llama-server's eviction and restore rules;
- `_policies`, `_divergence_aware`: the batch policies; `_registry`: `POLICIES`, the one explicit
  registry of named ones, and `get_policy`;
- `_schedule`: `BatchSchedule`, where each batch of a prompt ends and which starts with a checkpoint;
- `_resume`: `plan_resume`, how much of what a slot holds a new prompt reuses (the prompt cache);
- `_settings`: `PrefillSettings`, named for llama-server's flags;
- `_delimiters`: llama-server's own delimiter lists (hard-coded, logged or saved) and its split.
"""

from ._checkpoints import Checkpoint, CheckpointStore, checkpoint_due, near_end, near_end_breaks
from ._delimiters import (
    HANDLER_DELIMITERS,
    SAVED_SCHEMA_VERSION,
    SERVER_DELIMITERS,
    delimiters_of_row,
    load_server_delimiters,
    server_delimiter_list,
    server_spans,
    server_split,
)
from ._divergence_aware import DivergenceAware
from ._policies import (
    BatchPolicy,
    BreakContext,
    EveryUserStart,
    FixedBreaks,
    Gated,
    NoBreaks,
    ServerGated,
    last_user_start,
    user_starts,
)
from ._registry import POLICIES, PolicyRegistry, get_policy
from ._resume import ResumePlan, plan_resume
from ._schedule import BatchSchedule, PlannedBatch
from ._settings import CACHE_TYPES, FLASH_ATTN, PrefillSettings, check_field_types

__all__ = [
    "CACHE_TYPES", "FLASH_ATTN", "HANDLER_DELIMITERS", "POLICIES", "SAVED_SCHEMA_VERSION", "SERVER_DELIMITERS", "BatchPolicy",
    "BatchSchedule", "BreakContext",
    "Checkpoint", "CheckpointStore", "DivergenceAware", "EveryUserStart", "FixedBreaks", "Gated", "NoBreaks",
    "PlannedBatch", "PolicyRegistry", "PrefillSettings", "ResumePlan", "ServerGated", "check_field_types", "checkpoint_due",
    "delimiters_of_row", "get_policy",
    "last_user_start", "load_server_delimiters", "near_end", "near_end_breaks", "plan_resume", "server_delimiter_list",
    "server_spans", "server_split", "user_starts",
]
