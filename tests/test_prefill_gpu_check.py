"""scripts/gpu_check.sh, dry-run on the CPU: the steps a GPU machine runs, with the installed llama_cpp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.model, pytest.mark.corpus, pytest.mark.slow]
pytest.importorskip("llama_cpp")

ROOT = Path(__file__).resolve().parent.parent


def test_dry_run_tests_and_benchmarks_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work"), "BUNDLE": str(tmp_path / "no-bundle")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "run", "--dry-run", "--quick", str(out)],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["dry_run"] and summary["n_gpu_layers"] == 0
    assert summary["tests_exit_code"] == 0 and summary["bench_exit_code"] == 0
    assert summary["bench_hybrid_exit_code"] == 0
    hybrid = json.loads((out / "prefill-hybrid-gpu.json").read_text())["given"]
    assert "qwen35-hybrid" in hybrid["model"] and hybrid["runs"]["every-user-start@server-spans"]
    assert 'failures="0"' in (out / "tests.xml").read_text()
    # the load check: every variant, the runner's own path too, loads and decodes on the CPU
    load = json.loads((out / "load-check.json").read_text())
    assert {"offload", "runner", "offload-tmplkit-imported-first"} <= set(load["variants"])
    assert all(v["reached"] == "decoded" and v["exit_code"] == 0 for v in load["variants"].values()), load
    assert load["first_offload_that_works"] == "offload" and summary["last_step"] == "done"
    assert len(list(out.iterdir())) <= 8  # what a GPU machine sends back
    bench = json.loads((out / "prefill-gpu.json").read_text())
    assert "--n-gpu-layers 0" in bench["command"] and bench["qwen"]["runs"]["gated"]
    assert bench["qwen"]["runs"]["gated"][0]["calls"]  # per decode call seconds


def test_refuses_a_machine_without_cuda_unless_dry_run(tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin", "WORK": str(tmp_path / "work")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "run", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=60)
    if Path("/usr/bin/nvidia-smi").exists():
        pytest.skip("this machine has nvidia-smi")
    assert proc.returncode == 2 and "no nvidia-smi" in proc.stderr and "--dry-run" in proc.stderr


def test_llama_first_runs_a_script_or_module_with_llama_cpp_imported_first(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint('llama_cpp' in sys.modules, 'numpy' in sys.modules, sys.argv[1:])\n")
    first = ROOT / "scripts" / "llama_first.py"
    proc = subprocess.run([sys.executable, str(first), str(script), "a", "--b"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split("\n")[0] == "True True ['a', '--b']", proc.stderr[-500:]
    # the libraries load before numpy's: llama_cpp.llama_cpp is imported before numpy is
    timed = subprocess.run([sys.executable, "-X", "importtime", str(first), str(script)], capture_output=True, text=True, timeout=60)
    names = [line.rsplit("|", 1)[-1].strip() for line in timed.stderr.splitlines() if "|" in line]
    assert names.index("llama_cpp.llama_cpp") < names.index("numpy")
    module = subprocess.run([sys.executable, str(first), "-m", "json.tool", "--help"], capture_output=True, text=True, timeout=60)
    assert module.returncode == 0 and "json.tool" in module.stdout + module.stderr
    bare = subprocess.run([sys.executable, str(first)], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 1 and bare.stderr.strip().startswith("usage:")
