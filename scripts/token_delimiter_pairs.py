#!/usr/bin/env python
"""Token delimiters of every template that passes the analysis, on ten of the corpus's vocabularies:
per pair, whether they split the probe render as the text does, and their ids as text.

    python scripts/token_delimiter_pairs.py --corpus hub --json scripts/results/token-delimiters-hub.json
    python scripts/token_delimiter_pairs.py --corpus llama.cpp --compare OLD.json

`--corpus hub` is the Hub corpus's development half only; `--corpus llama.cpp` leaves out the
templates whose names the Hub's held-out half has (`_held_out.py`). `--compare OLD.json` (this script's JSON
from another revision): the pairs that pass in one and not the other, and those whose ids changed.
A vocabulary need not be the template's own: the check is of how delimiters are read off tokens,
and every tokenizer splits a delimiter's edges its own way. `opening_wrong`: the passing pairs whose
token split of a conversation that opens with a user message (the probe opens with a system message;
tokenized with the vocabulary's BOS) differs from its text split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _held_out import held_out  # scripts/, beside this file
from _machine import cpu_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VOCABS = ("llama-bpe", "qwen2", "gpt-2", "llama-spm", "qwen35", "phi-3", "command-r", "gemma-4", "deepseek-llm", "falcon")


def templates(which: str) -> list:
    from tmplkit.sources import corpus
    from tmplkit.sources.templates import load

    if which == "hub":
        return [t for n in corpus.hub_dev_names() for t in load(str(corpus.hub_templates_dir() / f"{n}.jinja"))]
    return [t for t in load("corpus:llama.cpp") if not held_out(t.name)]  # (names the Hub's held-out half has: left out)


def pairs(which: str) -> dict:
    from tmplkit.analysis import analyze
    from tmplkit.errors import TmplkitError
    from tmplkit.tokens.delimiter_ids import token_delimiters
    from tmplkit.tokens.tokenizers import load_tokenizer

    toks = {v: load_tokenizer(f"vocab:{v}") for v in VOCABS}
    out: dict = {}
    for t in templates(which):
        try:
            analysis = analyze(t)
        except TmplkitError:
            continue
        if analysis.status != "pass":
            continue
        for v, tok in toks.items():
            try:
                td = token_delimiters(analysis, tok)
            except TmplkitError as exc:
                out[f"{t.name}|{v}"] = {"error": str(exc)[:200]}
                continue
            row = out[f"{t.name}|{v}"] = {"passed": td.passed, "ids": {d.role: d.token_text for d in td.delimiters},
                                          "problem": td.problems[0] if td.problems else None}
            if td.passed:
                row["opens"] = _opens(t, analysis, td, tok)
    return out


# A conversation as most open: a user message first (the probe opens with a system message).
OPENING = ({"role": "user", "content": "Hello there, can you help me?"},
           {"role": "assistant", "content": "Of course. What do you need?"},
           {"role": "user", "content": "Tell me a joke."})


def _opens(template, analysis, td, tok) -> bool | None:
    """Whether the token split of a conversation that opens with a user message, rendered as the
    probe is (no BOS/EOS strings: a vocabulary not the template's own would spell a family's as text)
    and tokenized with the vocabulary's BOS, finds the roles the text split does (None: the template
    does not render it)."""
    from tmplkit.delimiters import ROLES, split_text
    from tmplkit.errors import TmplkitError
    from tmplkit.sandbox import render
    from tmplkit.tokens.spans import SpanDetector

    try:
        text = render(template, list(OPENING))
    except TmplkitError:
        return None
    expected = [s.role for s in split_text(text, analysis.delimiters) if s.role in ROLES]
    return [s.role for s in SpanDetector(td).split(tok.tokenize(text)) if s.role in ROLES] == expected


def compare(old: dict, new: dict) -> dict:
    def passed(row) -> bool:
        return bool(row.get("passed"))

    both = [k for k in new if k in old]
    return {"pairs": len(both),
            "now_pass": sorted(k for k in both if passed(new[k]) and not passed(old[k])),
            "now_fail": sorted(k for k in both if passed(old[k]) and not passed(new[k])),
            "passing_ids_changed": sum(1 for k in both if passed(old[k]) and passed(new[k]) and old[k]["ids"] != new[k]["ids"])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", choices=("llama.cpp", "hub"), default="llama.cpp")
    p.add_argument("--json", metavar="FILE", help="write the pairs (and a comparison, with --compare) to FILE")
    p.add_argument("--compare", metavar="OLD", help="this script's JSON from another revision")
    args = p.parse_args()
    rows = pairs(args.corpus)
    res: dict = {"corpus": args.corpus, "vocabularies": list(VOCABS), "cpu": cpu_model(),
                 "passed": sum(1 for r in rows.values() if r.get("passed")), "n_pairs": len(rows),
                 # of the passing pairs, those whose split of a conversation opening with a user message is wrong
                 "opening_wrong": sorted(k for k, r in rows.items() if r.get("opens") is False)}
    if args.compare:
        res["compared"] = compare(json.loads(Path(args.compare).read_text())["pairs"], rows)
    print(json.dumps({k: v for k, v in res.items() if k != "pairs"}, indent=2))
    res["pairs"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
