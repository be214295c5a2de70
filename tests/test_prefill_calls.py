"""scripts/prefill_calls.py: the per-call cost model recovers known costs and reads the committed results."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _script():
    pytest.importorskip("numpy")  # the script's least squares (numpy comes with the llama extra)
    spec = importlib.util.spec_from_file_location("prefill_calls", ROOT / "scripts" / "prefill_calls.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _given(schedules: dict[str, list[tuple[int, int]]], slow: dict[tuple[int, int], float] | None = None) -> dict:
    """Runs whose seconds follow the model exactly (2 ms/token, 1 ms per token x 10k context, 0.1 s
    per ubatch), plus `slow` extra seconds on given calls."""
    slow = slow or {}
    runs = {}
    for name, calls in schedules.items():
        recs = [[s, n, "rule", None, 0.002 * n + 0.001 * n * (s + n / 2) / 1e4 + 0.1 * -(-n // 512) + slow.get((s, n), 0.0)]
                for s, n in calls]
        runs[name] = [{"seconds": sum(c[-1] for c in recs), "calls": recs} for _ in range(3)]
    return {"settings": {"n_ubatch": 512}, "runs": runs}


def test_the_model_is_recovered_and_a_slow_call_is_named():
    mod = _script()
    none = [(k * 2048, 2048) for k in range(7)] + [(14336, 1000)]
    gated = [(0, 700)] + [(700 + k * 2048, 2048) for k in range(6)] + [(12988, 1900), (14888, 300), (15188, 148)]
    exact = mod.explain(_given({"none": none, "gated": gated}))["model"]
    assert abs(exact["per_token_s"] - 0.002) < 1e-6 and abs(exact["per_ubatch_s"] - 0.1) < 1e-4
    res = mod.explain(_given({"none": none, "gated": gated}, slow={(14888, 300): 0.3}))
    worst = res["variants"]["gated"]["slowest_for_their_shape"][0]
    assert (worst["start"], worst["size"]) == (14888, 300) and worst["extra_s"] > 0.15
    assert res["variants"]["gated"]["measured_s"] > res["variants"]["gated"]["predicted_s"]


def test_reads_a_committed_benchmark_result(capsys):
    mod = _script()
    path = ROOT / "scripts" / "results" / "prefill-quiet-16k-seed15.json"
    assert mod.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| gated | 12 |" in out and "| none | 10 |" in out
    data = json.loads(path.read_text())
    assert mod.explain(data["given"])["variants"].keys() == {"none", "gated"}


def test_a_result_without_runs_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text('{"sections": {}}')
    assert _script().main([str(bad)]) == 2
    assert "no 'given' section" in capsys.readouterr().err
