"""The one owner of a llama.cpp model: llama-cpp-python imported once with one install message,
llama.cpp's backend initialised once with its log captured (so a failure is told in llama.cpp's own
words), and `LlamaModel`, the wrapper of a `llama_model` handle that the tokenizer (vocabulary
only) and the prefill runner (weights) both load through.

Process-wide by nature: llama.cpp has one backend and one log callback.
"""

from __future__ import annotations

import ctypes
import os
from collections import deque
from pathlib import Path

from ..environment import llama_log_echo
from ..errors import ModelError, TmplkitError
from ..sources.gguf_meta import GGUFError, holds_no_weights
from .vocab_check import damaged_vocabulary

__all__ = ["LlamaModel", "clear_log", "ensure_backend", "import_llama_cpp", "log_cause"]


def import_llama_cpp(error: type[TmplkitError] = ModelError, what: str = "running a model"):
    """The llama_cpp module, or `error` saying that `what` needs it and how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise error(f"{what} needs llama-cpp-python, which is not installed; run `pip install 'tmplkit[llama]'`") from exc
    return llama_cpp


_LOG_LINES: deque[tuple[int, str]] = deque(maxlen=40)


_LOG_CB = None  # kept referenced: llama.cpp calls it for the life of the process


_BACKEND_READY = False


def ensure_backend(llama_cpp) -> None:
    """Initialise llama.cpp's backend once and capture its warnings and errors (echoed to stderr
    as well when TMPLKIT_LLAMA_LOG=1), so a failure can be explained in llama.cpp's own words."""
    global _LOG_CB, _BACKEND_READY
    if _BACKEND_READY:
        return
    echo = llama_log_echo()

    @llama_cpp.llama_log_callback
    def _cb(level, text, user_data):  # pragma: no cover - called from C
        try:
            s = text.decode("utf-8", "replace") if text else ""
        except Exception:
            return
        if echo:
            os.write(2, s.encode())
        if level in (3, 4) and s.strip():  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
            _LOG_LINES.append((int(level), s.strip()))

    _LOG_CB = _cb
    llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _BACKEND_READY = True


def clear_log() -> None:
    _LOG_LINES.clear()


def log_cause(default: str) -> str:
    """The first error llama.cpp logged since the last clear (its own words, one line)."""
    errors = [text for level, text in _LOG_LINES if level == 4] or [text for _, text in _LOG_LINES]
    cause = errors[0] if errors else default
    head, sep, rest = cause.partition(": ")
    if sep and " " not in head:  # drop the C function name prefix
        cause = rest
    return " ".join(cause.split())[:300]


def _require_sound_vocabulary(path: Path) -> None:
    """ModelError for a model whose vocabulary llama.cpp would abort the process on
    (`vocab_check.damaged_vocabulary`, the tokenizer's own check)."""
    problem = damaged_vocabulary(Path(path))
    if problem is not None:
        raise ModelError(problem)


def _holds_no_weights(path) -> bool:
    """`holds_no_weights`, False where the file is no sound GGUF (llama.cpp's own words say why)."""
    try:
        return holds_no_weights(path)
    except (GGUFError, OSError):
        return False


class LlamaModel:
    """A `llama_model` loaded from a GGUF file (its weights on the CPU unless `n_gpu_layers`;
    `repack`: llama.cpp may repack them into CPU-specific buffers; `vocab_only`: the vocabulary
    alone, no weights, for a tokenizer), and what the runner and the tokenizer read of it. The one
    owner of a model: whoever made it frees it (`free`), after every context on it."""

    def __init__(self, llama_cpp, path: Path, *, n_gpu_layers: int = 0, repack: bool = False, vocab_only: bool = False):
        self._lc = llama_cpp
        if not vocab_only:  # (a tokenizer checks its file itself, before it comes here)
            _require_sound_vocabulary(path)
        ensure_backend(llama_cpp)
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.use_extra_bufts = repack
        mparams.vocab_only = vocab_only
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            if not vocab_only and _holds_no_weights(path):
                raise ModelError(f"{path}: a vocabulary-only GGUF (no weights), which serves as a --tokenizer but runs "
                                 "nothing; give the model's full GGUF")
            raise ModelError(f"llama.cpp cannot load {path}: {log_cause('not a valid GGUF model')}; give a GGUF model "
                             "file that llama.cpp reads (a download cut short, or a newer format than this llama.cpp's)")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    @property
    def n_vocab(self) -> int:
        return int(self._lc.llama_vocab_n_tokens(self.vocab))

    @property
    def n_swa(self) -> int:
        return int(self._lc.llama_model_n_swa(self.model))

    @property
    def is_recurrent(self) -> bool:
        return bool(self._lc.llama_model_is_recurrent(self.model))

    @property
    def is_hybrid(self) -> bool:
        return bool(self._lc.llama_model_is_hybrid(self.model))

    @property
    def add_bos(self) -> bool:
        return bool(self._lc.llama_vocab_get_add_bos(self.vocab))

    def chat_template(self) -> str | None:
        tmpl = self._lc.llama_model_chat_template(self.model, None)
        return tmpl.decode("utf-8", "replace") if tmpl else None

    def free(self) -> None:
        """Free the model (after every context on it)."""
        if self.model:
            self._lc.llama_model_free(self.model)
            self.model = None
