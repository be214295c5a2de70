"""The llama.cpp corpus templates the tests use: every one but those whose names the Hub corpus holds
outside its development half (scripts/_held_out.py, which lists them by hash), so that the tests,
like the figures, use the development half's names only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("_held_out", Path(__file__).resolve().parent.parent / "scripts" / "_held_out.py")
_HELD = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_HELD)
held_out = _HELD.held_out
kept_paths = _HELD.kept_paths
