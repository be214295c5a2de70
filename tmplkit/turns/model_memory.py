"""A model's memory kind, read from its GGUF metadata: what a resume can reuse on it.

- full attention: the KV cache rolls back to any position, so a resume recomputes from the first
  token that differs and needs no checkpoint;
- a sliding window of N: the cache keeps only the last positions (N + n_ubatch, padded), so a
  resume behind them goes back to a context checkpoint or to zero;
- recurrent, and hybrid (recurrent layers beside full-attention ones): a recurrent state holds
  only the newest position and cannot roll back; in a hybrid the attention layers could, but the
  memory's oldest position is the larger of the two (llama-memory-hybrid.cpp `seq_pos_min`), so a
  resume anywhere before the end goes back to a checkpoint (a copy of the state) or to zero, as a
  recurrent model does. The simulation treats both as `MemoryModel("recurrent")`.

Which architectures are recurrent or hybrid is llama.cpp's own list (llama.cpp as vendored in
llama-cpp-python 0.3.36, src/llama-arch.cpp `llm_arch_is_recurrent` line 1071 and
`llm_arch_is_hybrid` line 1085); a window is the `{arch}.attention.sliding_window` key.

    >>> describe_memory(model_memory("tiny-qwen35-hybrid.gguf"))            # doctest: +SKIP
    'hybrid (recurrent + full attention, qwen35)'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import GGUFError, InputError
from ..prefill.models import resolve_model
from ..sources.gguf_meta import read_metadata
from .simulation import MemoryModel

__all__ = ["HYBRID_ARCHS", "RECURRENT_ARCHS", "ModelMemory", "describe_memory", "model_memory", "memory_of_model"]

# src/llama-arch.cpp llm_arch_is_recurrent (line 1071), by the names of LLM_ARCH_NAMES (lines 38-156)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# src/llama-arch.cpp llm_arch_is_hybrid (line 1085)
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen3next",
    "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
})


@dataclass(frozen=True)
class ModelMemory:
    """A model's memory: `kind` is "full", "swa", "recurrent" or "hybrid"; `n_swa` the window."""

    arch: str
    kind: str
    n_swa: int = 0

    def memory(self, n_ubatch: int = 512) -> MemoryModel:
        """The simulation's model of it (a hybrid resumes as a recurrent model does)."""
        if self.kind == "swa":
            return MemoryModel.swa(self.n_swa, n_ubatch)
        return MemoryModel("recurrent" if self.kind in ("recurrent", "hybrid") else "full")

    def to_dict(self) -> dict:
        return {"arch": self.arch, "kind": self.kind, "n_swa": self.n_swa}


def describe_memory(m: ModelMemory) -> str:
    """One line for a person: what the memory is."""
    if m.kind == "swa":
        return f"sliding window of {m.n_swa} ({m.arch})"
    if m.kind == "hybrid":
        return f"hybrid (recurrent + full attention, {m.arch})"
    return f"{'recurrent' if m.kind == 'recurrent' else 'full attention'} ({m.arch})"


def model_memory(path: str | os.PathLike) -> ModelMemory:
    """The memory of the model in GGUF file `path`; InputError when it names no architecture."""
    try:
        meta = read_metadata(Path(path), lambda k: k == "general.architecture" or k.endswith(".attention.sliding_window"))
    except GGUFError as exc:
        raise InputError(str(exc)) from None
    raw = meta.get("general.architecture")
    arch = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None
    if not arch:
        raise InputError(f"{path}: no general.architecture in its metadata; give a model GGUF")
    if arch in HYBRID_ARCHS:
        return ModelMemory(arch, "hybrid")
    if arch in RECURRENT_ARCHS:
        return ModelMemory(arch, "recurrent")
    window = meta.get(f"{arch}.attention.sliding_window")
    if isinstance(window, int) and window > 0:
        return ModelMemory(arch, "swa", window)
    return ModelMemory(arch, "full")


def memory_of_model(spec: str | os.PathLike, n_ubatch: int = 512) -> tuple[MemoryModel, ModelMemory]:
    """The simulation's memory for a model given as a GGUF path or a shortcut (`tiny:qwen35`,
    `tiny:qwen35-hybrid`, `gemma`; built or assembled on first use), and what the model says."""
    m = model_memory(Path(resolve_model(spec)))
    return m.memory(n_ubatch), m
