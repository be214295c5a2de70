#!/usr/bin/env python
"""Whether llama.cpp loads a model and decodes with its layers offloaded on this machine, and if
not, under which setting it does: each variant in a process of its own (a crash ends only that
one), llama.cpp's log kept, the verdicts as JSON. `scripts/gpu_check.sh run` calls it before the
tests and runs them under the first variant that offloads and decodes.

    python scripts/gpu_load_check.py --out load-check.json            # the tiny model (tiny:qwen35)
    python scripts/gpu_load_check.py --model FILE.gguf --out load-check.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> (model params set on llama.cpp's defaults, environment added)
VARIANTS: dict[str, tuple[dict, dict]] = {
    "cpu": ({"n_gpu_layers": 0}, {}),
    "offload": ({"n_gpu_layers": 99}, {}),
    "offload-tmplkit-loader": ({"n_gpu_layers": 99, "tmplkit": True}, {}),  # LlamaModel, its log callback
    "offload-no-extra-bufts": ({"n_gpu_layers": 99, "use_extra_bufts": False}, {}),  # as LlamaModel sets it
    # The runner's own path (PrefillRunner), and a plain load after tmplkit's import: on an H200
    # (CUDA 13.0) every plain load above decoded while the tests' runner crashed loading the same model.
    "offload-tmplkit-imported-first": ({"n_gpu_layers": 99, "import_first": "tmplkit"}, {}),
    "runner": ({"n_gpu_layers": 99, "runner": True, "import_first": "tmplkit"}, {}),
    "runner-llama-imported-first": ({"n_gpu_layers": 99, "runner": True}, {}),
    "offload-no-pinned": ({"n_gpu_layers": 99}, {"GGML_CUDA_NO_PINNED": "1"}),
    "offload-no-mmap": ({"n_gpu_layers": 99, "load_mode": 0}, {}),
    "offload-no-host": ({"n_gpu_layers": 99, "no_host": True}, {}),
}


def child(variant: str, model: str) -> int:
    """Load `model` under `variant`, decode 64 tokens, print one JSON line per step reached."""
    params = dict(VARIANTS[variant][0])
    if params.pop("import_first", None) == "tmplkit":
        sys.path.insert(0, str(ROOT))
        import tmplkit.prefill  # noqa: F401  (numpy and the library before llama_cpp, as in the tests)
    import llama_cpp

    if params.pop("runner", False):
        return _runner(llama_cpp, variant, model, params["n_gpu_layers"])
    step = {"variant": variant, "offload_supported": bool(llama_cpp.llama_supports_gpu_offload())}
    print(json.dumps({**step, "step": "loading"}), flush=True)
    if params.pop("tmplkit", False):
        sys.path.insert(0, str(ROOT))
        from tmplkit.tokens.llama_model import LlamaModel

        owner = LlamaModel(llama_cpp, Path(model), n_gpu_layers=params["n_gpu_layers"])  # (kept: it owns the model)
        m = owner.model
    else:
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        for key, value in params.items():
            setattr(mparams, key, value)
        m = llama_cpp.llama_model_load_from_file(model.encode(), mparams)
    if not m:
        print(json.dumps({**step, "step": "load failed"}), flush=True)
        return 1
    print(json.dumps({**step, "step": "loaded"}), flush=True)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 512, 512, 512
    ctx = llama_cpp.llama_init_from_model(m, cparams)
    if not ctx:
        print(json.dumps({**step, "step": "context failed"}), flush=True)
        return 1
    ids = (llama_cpp.llama_token * 64)(*range(100, 164))
    rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(ids, 64))
    logits = llama_cpp.llama_get_logits_ith(ctx, -1)
    finite = rc == 0 and bool(logits) and all(abs(logits[i]) < 1e30 for i in range(16))
    print(json.dumps({**step, "step": "decoded" if finite else f"decode returned {rc}"}), flush=True)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(m)
    return 0 if finite else 1


def _runner(llama_cpp, variant: str, model: str, n_gpu_layers: int) -> int:
    sys.path.insert(0, str(ROOT))
    from tmplkit.prefill import PrefillRunner

    step = {"variant": variant, "offload_supported": bool(llama_cpp.llama_supports_gpu_offload())}
    print(json.dumps({**step, "step": "loading"}), flush=True)
    with PrefillRunner(model, n_ctx=512, n_batch=512, n_ubatch=128, n_threads=2, flash_attn="off",
                       n_gpu_layers=n_gpu_layers) as runner:
        print(json.dumps({**step, "step": "loaded"}), flush=True)
        report = runner.run(list(range(100, 164)), None, "none")
        print(json.dumps({**step, "step": "decoded" if report.n_processed == 64 else "decode short"}), flush=True)
    return 0


def check(model: str, timeout: float) -> dict:
    out: dict = {"model": model, "variants": {}}
    for name, (_, env) in VARIANTS.items():
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--child", name, model],
                                  env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = "timeout", _text(exc.stdout), _text(exc.stderr)
        steps = [json.loads(line)["step"] for line in stdout.splitlines() if line.startswith("{")]
        out["variants"][name] = {"exit_code": rc, "reached": steps[-1] if steps else "nothing", "env": env,
                                 "seconds": round(time.time() - t0, 1), "log_tail": stderr.strip().splitlines()[-25:]}
        print(f"{name}: exit {rc}, reached {out['variants'][name]['reached']}", file=sys.stderr)
    works = [n for n, v in out["variants"].items() if n.startswith("offload") and v["reached"] == "decoded"]
    out["first_offload_that_works"] = works[0] if works else None
    return out


def _text(raw) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF model (default: the tiny model around the qwen35 vocabulary)")
    ap.add_argument("--out", help="the JSON written (required)")
    ap.add_argument("--timeout", type=float, default=90, help="seconds for each variant")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(*args.child)
    if not args.out:
        ap.error("--out FILE is required")
    sys.path.insert(0, str(ROOT))
    model = args.model
    if model is None:
        from tmplkit.prefill import tiny_model_path

        model = str(tiny_model_path("qwen35"))
    elif not Path(model).is_file():
        ap.error(f"no model file at {model}; give a GGUF model")
    result = check(model, args.timeout)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"first_offload_that_works": result["first_offload_that_works"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
