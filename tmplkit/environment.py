"""The environment variables tmplkit reads, each read here and nowhere else.

| variable | what it does |
|---|---|
| `TMPLKIT_CACHE` | the cache folder (else `$XDG_CACHE_HOME/tmplkit`, else `~/.cache/tmplkit`) |
| `TMPLKIT_NO_CACHE` | set (to anything but `""` or `0`): compiled templates are not kept between runs |
| `TMPLKIT_LLAMA_SERVER` | the llama-server binary to use for the default pinned release |
| `TMPLKIT_LLAMA_LOG` | `1`: llama.cpp's own log is echoed on stderr as well as kept for errors |
| `NO_COLOR` | set and non-empty: no colour on a terminal (https://no-color.org) |
| `TERM` | `dumb`: no colour, and progress is written a line a step rather than redrawn |
| `TRANSFORMERS_VERBOSITY` | set to `error` only while tmplkit imports transformers (`quiet_transformers`), unless given |

Each is read when asked for (not at import time), so a test or a caller may set it first.

    >>> import os
    >>> before = os.environ.get("TMPLKIT_CACHE"); os.environ["TMPLKIT_CACHE"] = "/tmp/tk-cache"
    >>> str(cache_root())
    '/tmp/tk-cache'
    >>> _ = os.environ.pop("TMPLKIT_CACHE") if before is None else os.environ.update(TMPLKIT_CACHE=before)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cache_root", "compile_cache_enabled", "llama_log_echo", "llama_server_override", "no_color",
           "quiet_transformers", "terminal_is_dumb"]


def cache_root() -> Path:
    """The cache folder: $TMPLKIT_CACHE, else $XDG_CACHE_HOME/tmplkit, else ~/.cache/tmplkit."""
    env = os.environ.get("TMPLKIT_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tmplkit"


def compile_cache_enabled() -> bool:
    """False when TMPLKIT_NO_CACHE is set (to anything but '' or '0')."""
    return os.environ.get("TMPLKIT_NO_CACHE", "") in ("", "0")


def llama_server_override() -> Path | None:
    """$TMPLKIT_LLAMA_SERVER as a path, or None."""
    env = os.environ.get("TMPLKIT_LLAMA_SERVER")
    return Path(env) if env else None


def llama_log_echo() -> bool:
    """Whether llama.cpp's log is echoed on stderr (TMPLKIT_LLAMA_LOG=1)."""
    return os.environ.get("TMPLKIT_LLAMA_LOG") == "1"


def terminal_is_dumb() -> bool:
    """TERM=dumb: a terminal that cannot move the cursor or show colour."""
    return os.environ.get("TERM") == "dumb"


def no_color() -> bool:
    """NO_COLOR set to a non-empty value."""
    return bool(os.environ.get("NO_COLOR"))


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Import transformers inside this block with its log at errors only: its import warns that
    PyTorch is missing, which tmplkit never needs (it renders chat templates, it runs no model).
    A TRANSFORMERS_VERBOSITY the user set is kept; ours is removed again after the block."""
    if "TRANSFORMERS_VERBOSITY" in os.environ:
        yield
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    try:
        yield
    finally:
        os.environ.pop("TRANSFORMERS_VERBOSITY", None)
