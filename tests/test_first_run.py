"""A first run people can read: the mask JSON as rows, not a value a line; annotate without
transformers' PyTorch warning (tmplkit runs no model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit.cli._common import json_compact

ROOT = Path(__file__).resolve().parent.parent


def test_json_compact_keeps_the_value_and_puts_arrays_on_one_line():
    value = {"ids": [1, 2, 3], "flags": [True, False], "offsets": [[0, 2], [2, 5]], "turns": [{"a": [0, 5], "r": "x"}],
             "empty": {}, "none": None, "text": "é\n"}
    text = json_compact(value)
    assert json.loads(text) == value
    lines = text.splitlines()
    assert ' "ids": [1, 2, 3],' in lines and ' "offsets": [[0, 2], [2, 5]],' in lines and '"text": "é\\n"' in text


def test_the_mask_json_is_rows_not_a_value_a_line(tmp_path):
    pytest.importorskip("tokenizers")
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    run = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", "mask",
                          str(ROOT / "fixtures" / "templates" / "chatml-tools-in-user.jinja"),
                          "--session", str(ROOT / "fixtures" / "masks" / "chat.json"), "--tokenizer", "vocab:qwen35",
                          "--format", "json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["n_tokens"] > 50 and len(run.stdout.splitlines()) < 60  # was one line per token, id, flag and offset


def test_annotate_says_nothing_of_pytorch(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "annotated.jinja"
    run = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", "annotate",
                          str(ROOT / "fixtures" / "templates" / "chatml.jinja"), "-o", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "PyTorch" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert "{% generation %}" in out.read_text(encoding="utf-8")
