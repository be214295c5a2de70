"""The settings of a prefill, named for llama-server's flags: what llama.cpp is given (context,
batch and ubatch sizes, threads, flash attention, KV cache types, repacking, polling) and the
server's checkpoint rules (on or off, how many, the minimum step, the batch policy); value objects
and defaults apart from the runner that uses them, so the cost model reads them without it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import InputError
from ._registry import get_policy

__all__ = ["CACHE_TYPES", "FLASH_ATTN", "PrefillSettings", "check_field_types"]

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
# ggml_type ids of the KV cache types llama.cpp accepts (ggml.h).
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
INT32_MAX = 2**31 - 1  # llama.cpp's sizes are 32-bit fields, its positions int32
MAX_THREADS = 512  # GGML_MAX_N_THREADS (ggml.h): the most threads a ggml threadpool holds


# A field's annotation -> the types its value may have (a bool is no int here: `n_ctx=True` is a slip)
_FIELD_TYPES = {"int": (int,), "int | None": (int, type(None)), "bool": (bool,), "bool | None": (bool, type(None)),
                "str": (str,)}


def check_field_types(obj) -> None:
    """InputError (one line) where a field of the dataclass `obj` holds a value its annotation does not
    allow (an int, an optional int, a bool, an optional bool or a str): built by hand from the library,
    `PrefillSettings(n_ctx="4096")` raised a TypeError from a comparison, and `n_ctx=4096.0` passed on.
    A numpy scalar is taken as the Python value it holds (`np.int64(4096)`, `np.True_`)."""
    for f in fields(obj):
        allowed, value = _FIELD_TYPES.get(str(f.type)), getattr(obj, f.name)
        if allowed is None:
            continue
        if type(value).__module__ == "numpy" and callable(getattr(value, "item", None)):
            value = value.item()  # (numpy's scalars as Python's: a report writes the settings as JSON)
            object.__setattr__(obj, f.name, value)  # (frozen: set once, as it is built)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            want = {"int": "an integer", "bool": "true or false", "str": "a string"}[str(f.type).split(" ")[0]]
            none = " or None" if "None" in str(f.type) else ""
            raise InputError(f"{type(obj).__name__}.{f.name} must be {want}{none}, got {value!r}")


@dataclass(frozen=True)
class PrefillSettings:
    """Everything a PrefillRunner passes to llama.cpp, plus the checkpoint rules.

    `checkpoints`: None = on exactly when the model cannot roll its memory back (llama-server's
    rule); True/False force it. `swa_full`: allocate the full-size sliding-window cache, which
    can roll back and needs no checkpoints (llama-cpp-python's `Llama` default); False is
    llama-server's default. `repack`: let llama.cpp repack weights into CPU-specific buffers
    (llama-server's `--no-repack` turns it off); None = on, except on CPUs with AMX, where the
    AMX repacking of llama.cpp in llama-cpp-python 0.3.36 crashes in llama_decode (seen with
    Gemma 3 Q4_K_M, in llama-server too). `poll`: like llama-server, attach a persistent CPU
    threadpool whose idle threads busy-wait at this polling level (llama-server's `--poll`,
    default 50); None leaves ggml's per-graph default threadpool.

    Ranges are llama.cpp's: `n_ctx`, `n_batch`, `n_ubatch` 1 to 2**31 - 1 (a batch larger than the
    context, and a ubatch larger than the batch, are cut to it, as llama.cpp does: the runner
    reports the sizes it used); `n_threads` 1 to 512 (GGML_MAX_N_THREADS), None or 0 for every core
    (llama.cpp's `-t 0`); `n_gpu_layers` -1 for every layer (llama.h: negative means all).
    """

    n_ctx: int = 32768
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    swa_full: bool = False
    repack: bool | None = None
    poll: int | None = 50
    checkpoints: bool | None = None
    max_checkpoints: int = 32
    checkpoint_min_step: int = 8192
    policy: str = "gated"

    def __post_init__(self):
        check_field_types(self)
        for name in ("n_ctx", "n_batch", "n_ubatch", "max_checkpoints"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}")
        # llama.cpp's 32-bit fields (llama-server's int options too): a larger value would wrap
        for name in ("n_ctx", "n_batch", "n_ubatch", "max_checkpoints", "checkpoint_min_step"):
            if getattr(self, name) > INT32_MAX:
                raise InputError(f"{name} must be at most {INT32_MAX} (a 32-bit field of llama.cpp's), got {getattr(self, name)}")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_THREADS:
                raise InputError(f"{name} must be between 1 and {MAX_THREADS} (ggml's most), or 0 for every core, got {value}")
        if not -1 <= self.n_gpu_layers <= INT32_MAX:
            raise InputError(f"n_gpu_layers must be -1 (every layer) or between 0 and {INT32_MAX}, got {self.n_gpu_layers}")
        if self.poll is not None and not 0 <= self.poll <= 100:
            raise InputError(f"poll must be between 0 and 100, got {self.poll}")
        if self.checkpoint_min_step < 0:
            raise InputError(f"checkpoint_min_step must be >= 0, got {self.checkpoint_min_step}")
        if self.flash_attn not in FLASH_ATTN:
            raise InputError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}, got {self.flash_attn!r}")
        for name in ("cache_type_k", "cache_type_v"):
            if getattr(self, name) not in CACHE_TYPES:
                raise InputError(f"{name} must be one of {', '.join(CACHE_TYPES)}, got {getattr(self, name)!r}")
        get_policy(self.policy)

    def to_dict(self) -> dict:
        return asdict(self)
