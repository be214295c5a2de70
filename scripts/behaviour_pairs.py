"""Real template pairs through `tmplkit diff`: the Hub corpus's development half held at two revisions
(`NAME@rev` -> `NAME`), and finetunes against their base family's template (a Qwen3.5/3.6, Qwen3,
Qwen2.5, Llama 3, Mistral or Gemma finetune against the base as the llama.cpp corpus or the dev half
holds it). For each pair: the behaviour changes in words, whether the texts differ, and the command.

    python scripts/behaviour_pairs.py -o scripts/results/behaviour-pairs.json

Each row is the same as `tmplkit diff BASE.jinja FINETUNE.jinja` on the two corpus files (H: the Hub
corpus's templates folder, `tmplkit corpus path hub`; L: the llama.cpp corpus's, `tmplkit corpus path`).
Only development-half Hub names are read, and no llama.cpp template whose name is in the held-out half.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _held_out import held_out  # noqa: E402
from _machine import cpu_model  # noqa: E402

from tmplkit.atomic import write_text_atomic  # noqa: E402
from tmplkit.behaviour import compare, derive_records  # noqa: E402
from tmplkit.sources import corpus, load_one  # noqa: E402

# (kind, old: "H:name" | "L:name", new) -- old is the revision or base, new the current or finetune.
PAIRS = (
    ("revision", "H:Qwen-Qwen3-0.6B@a55ee1", "H:Qwen-Qwen3-0.6B"),
    ("revision", "H:deepseek-ai-DeepSeek-R1-Distill-Qwen-32B@56a144", "H:deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"),
    ("finetune", "L:Qwen3.5-4B", "H:Indexnusrefather-Qwen-3.5-2b-roleplay-tuned-v2-ERP-tolerant"),
    ("finetune", "L:Qwen3.5-4B", "H:YoozLabs-Yooz-Quality-v3-Qwen3.5-4B"),
    ("finetune", "L:Qwen3.5-4B", "H:OBLITERATUS-Qwen3.6-27B-OBLITERATED"),
    ("finetune", "L:Qwen3.5-4B", "H:XMB480-Qwen3.6-fixed-tool-calling"),
    ("finetune", "L:Qwen3.5-4B", "H:lordx64-Qwen3.6-35B-A3B-Claude-4.7-Opus-Reasoning-Distilled"),
    ("finetune", "H:Qwen-Qwen3-0.6B", "H:OpenPipe-Qwen3-14B-Instruct"),
    ("finetune", "H:Qwen-Qwen3-0.6B", "H:TeichAI-Qwen3-14B-Claude-4.5-Opus-High-Reasoning-Distill"),
    ("finetune", "H:Qwen-Qwen3-0.6B", "H:amazon-GDN-primed-HQwen3-8B-Instruct"),
    ("finetune", "H:C10X-Qwen2.5-0.5B-Instruct", "H:Adamaja111-legal-qwen2.5-1.5b-ft"),
    ("finetune", "H:C10X-Qwen2.5-0.5B-Instruct", "H:Lautloserspieler-Nova-Qwen2.5-14B-Secure-Coder"),
    ("finetune", "L:meta-llama-Llama-3.3-70B-Instruct", "H:KISTI-KONI-KONI-Llama3.1-8B-Instruct-20241024"),
    ("finetune", "L:meta-llama-Llama-3.3-70B-Instruct", "H:tokyotech-llm-Llama-3.1-Swallow-8B-Instruct-v0.5"),
    ("finetune", "L:meta-llama-Llama-3.3-70B-Instruct", "H:typhoon-ai-llama3.1-typhoon2-8b-instruct"),
    ("finetune", "L:meta-llama-Llama-3.3-70B-Instruct", "H:Skywork-Skywork-Reward-Llama-3.1-8B"),
    ("finetune", "H:NousResearch-Meta-Llama-3-8B-Instruct", "H:shenzhi-wang-Llama3-8B-Chinese-Chat"),
    ("finetune", "H:NousResearch-Meta-Llama-3-8B-Instruct", "H:rombodawg-rombos_Replete-Coder-Llama3-8B"),
    ("finetune", "H:NousResearch-Meta-Llama-3-8B-Instruct", "H:turboderp-Cat-Llama-3-70B-instruct"),
    ("finetune", "L:meta-llama-Llama-3.2-3B-Instruct", "H:baseten-Llama-3.2-3B-Instruct-pythonic"),
    ("finetune", "L:meta-llama-Llama-3.3-70B-Instruct", "H:nvidia-Llama-3_3-Nemotron-Super-49B-v1"),
    ("finetune", "H:mistralai-Mistral-Small-24B-Instruct-2501", "H:dphn-Dolphin-Mistral-24B-Venice-Edition"),
    ("finetune", "H:mistralai-Ministral-3-14B-Instruct-2512", "H:mistralai-Ministral-3-3B-Reasoning-2512"),
    ("finetune", "L:google-gemma-4-31B-it", "H:OBLITERATUS-gemma-4-E4B-it-OBLITERATED"),
    ("finetune", "L:google-gemma-4-31B-it", "H:Ayodele01-gemma-4-E4B-Gemini-3.1-Pro-Reasoning-Distill"),
    ("finetune", "H:unsloth-gemma-3-270m-it", "H:planeB-user_gemma_3_1b_it"),
)


def path_of(spec: str) -> Path:
    """The corpus file of 'H:name' (a development-half Hub name only) or 'L:name' (not held out)."""
    where, _, name = spec.partition(":")
    if where == "H":
        if name not in set(corpus.hub_dev_names()):
            raise SystemExit(f"{name}: not in the Hub corpus's development half; leave it out")
        return corpus.hub_templates_dir() / f"{name}.jinja"
    if held_out(name):
        raise SystemExit(f"{name}: its name is in the held-out half; leave it out")
    return corpus.templates_dir() / f"{name}.jinja"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="scripts/results/behaviour-pairs.json")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    specs = list(dict.fromkeys(s for _, old, new in PAIRS for s in (old, new)))
    templates = [load_one(str(path_of(s))) for s in specs]
    start = time.perf_counter()
    records = dict(zip(specs, derive_records(templates, jobs=args.jobs, timeout=args.timeout)))
    took = time.perf_counter() - start
    rows = []
    for kind, old, new in PAIRS:
        d = compare(records[old], records[new])
        rows.append({"kind": kind, "old": old, "new": new, "same_behaviour": d.same, "text_changed": bool(d.text_change),
                     "headline": d.headline, "changes": [c.to_dict() for c in d.changes],
                     "first_render": d.first_render,
                     "verdicts": [records[old].verdict, records[new].verdict],
                     "command": f"tmplkit diff {old.replace(':', '/')}.jinja {new.replace(':', '/')}.jinja"})
    summary = {"pairs": len(rows), "same_behaviour": sum(r["same_behaviour"] for r in rows),
               "text_only": sum(r["same_behaviour"] and r["text_changed"] for r in rows),
               "identical_text": sum(not r["text_changed"] for r in rows),
               "changed_behaviour": sum(not r["same_behaviour"] for r in rows)}
    out = {"command": "python scripts/behaviour_pairs.py", "machine": cpu_model(), "seconds": round(took, 1),
           "summary": summary, "rows": rows}
    write_text_atomic(args.output, json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    for r in rows:
        said = "; ".join(c["message"] for c in r["changes"]) or r["headline"]
        print(f"| {r['kind']} | `{r['old']}` -> `{r['new']}` | {said.replace('|', '&#124;')} |")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
