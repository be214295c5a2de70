"""Hardening figures: how hostile templates and corrupted GGUF files end, and what isolation costs.

Measured in one run:

1. every template of fixtures/hostile, analyzed in worker processes with the production limits
   (10 s, 1024 MiB) and, where safe, in process: how each ended, escapes (marker file created or
   a secret leaked), hangs past the limit, tracebacks;
2. fuzzed GGUF inputs (hand-built corruptions, random structured files, every-byte flips of a
   small file, truncations and length-field corruptions of a real vocab GGUF): how many loaded,
   how many ended in a clean one-line TmplkitError, anything else, and the largest allocation
   relative to the file size (tracemalloc);
3. the 70-template corpus through analyze_isolated with --jobs 1 and --jobs 2: same results, the
   median wall time of each, and the speed-up;
4. the peak memory (max RSS) of this auditing process.

    python scripts/bench_hostile.py [--out scripts/results/hostile] [--repeat 3] [--fuzz 2000]

Writes <out>.json and <out>.md (the markdown table for docs/hardening.md) atomically, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import secrets
import shutil
import statistics
import struct
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_gguf_fuzz import CASES, GOOD_KVS, HUGE, gguf_bytes  # noqa: E402
from test_hostile import SECRET_ENV, leaked, load_hostile, load_manifest, verdict  # noqa: E402
from test_isolate import _by_name  # noqa: E402  (a target that sleeps for "nap-" templates)

from tmplkit.analysis import analyze  # noqa: E402
from tmplkit.atomic import write_text_atomic  # noqa: E402
from tmplkit.auditing.isolate import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, analyze_isolated  # noqa: E402
from tmplkit.errors import TmplkitError  # noqa: E402
from tmplkit.sandbox import Limits  # noqa: E402
from tmplkit.sandbox.static_scan import scan  # noqa: E402
from tmplkit.sources import (  # noqa: E402
    corpus,  # noqa: E402
    load,
    load_gguf,
)

HANG_SLACK = 2.0
GGUF_HANG_S = 5.0  # a load that takes this long on a file of at most a few MB counts as a hang


def _problems(a, needles, marker: Path, limit: float) -> dict:
    return {
        "escaped": bool(leaked(a, needles)) or marker.exists(),
        "hang": a.seconds > limit + HANG_SLACK,
        "traceback": any("Traceback" in e or "\n" in e for e in a.errors),
    }


def bench_hostile(workdir: Path) -> dict:
    marker = workdir / "ESCAPED-MARKER"
    secret_file = workdir / "secret.txt"
    file_secret = "file-secret-" + secrets.token_hex(8)
    secret_file.write_text(file_secret)
    needles = [os.environ[SECRET_ENV], file_secret]
    manifest = load_manifest()
    templates = load_hostile(marker, secret_file)

    t0 = time.monotonic()
    isolated = analyze_isolated(templates, jobs=2, timeout=DEFAULT_TIMEOUT, memory_mb=DEFAULT_MEMORY_MB)
    isolated_wall = time.monotonic() - t0
    peak_after_isolated = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rows, endings, unexpected = [], Counter(), []
    totals = Counter()
    for a in isolated:
        v = verdict(a)
        endings[v] += 1
        p = _problems(a, needles, marker, DEFAULT_TIMEOUT)
        totals.update(k for k, bad in p.items() if bad)
        if v not in manifest[a.name]["expect"]:
            unexpected.append(a.name)
        rows.append({"name": a.name, "verdict": v, "seconds": round(a.seconds, 3), "scan_warnings": len(a.warnings), **p})

    limits = Limits()
    in_endings, in_totals, in_count = Counter(), Counter(), 0
    for t in templates:
        if not manifest[t.name]["inprocess"]:
            continue
        in_count += 1
        a = analyze(t, limits=limits)
        in_endings[verdict(a)] += 1
        in_totals.update(k for k, bad in _problems(a, needles, marker, limits.seconds).items() if bad)
    return {
        "templates": len(templates),
        "limits": {"timeout_s": DEFAULT_TIMEOUT, "memory_mb": DEFAULT_MEMORY_MB, "jobs": 2},
        "isolated": {"endings": dict(sorted(endings.items())), "escapes": totals["escaped"], "hangs": totals["hang"],
                     "tracebacks": totals["traceback"], "unexpected": unexpected, "wall_s": round(isolated_wall, 2),
                     "slowest_s": max(r["seconds"] for r in rows),
                     "peak_rss_mb": round(peak_after_isolated, 1)},
        "in_process": {"templates": in_count, "endings": dict(sorted(in_endings.items())), "escapes": in_totals["escaped"],
                       "hangs": in_totals["hang"], "tracebacks": in_totals["traceback"],
                       "limits": {"seconds": limits.seconds, "max_output_chars": limits.max_output_chars}},
        "scan_flagged": sum(1 for r in rows if r["scan_warnings"]),
        "scan_expected": sum(1 for e in manifest.values() if e["scan"]),
        "rows": rows,
    }


# --- GGUF fuzzing ---------------------------------------------------------------------------------


def _fuzz_inputs(rng: random.Random, n_random: int, workdir: Path):
    """(label, bytes or a callable that prepares the file) for every fuzzed input."""
    for name, data in CASES.items():
        yield f"case:{name}", data
    good = gguf_bytes(GOOD_KVS + [("tokenizer.chat_template.tool_use", 8, "{{ tools }}")])
    for i in range(len(good)):
        for new in {0x00, 0xFF, (good[i] + 1) & 0xFF} - {good[i]}:
            yield f"flip:{i}", good[:i] + bytes([new]) + good[i + 1:]
    for n in range(len(good)):
        yield f"cut:{n}", good[:n]
    for k in range(n_random):
        data = bytearray(good if rng.random() < 0.7 else gguf_bytes(GOOD_KVS, version=rng.choice([1, 2, 3])))
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            if not data:
                break
            if kind < 0.4:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif kind < 0.8 and len(data) > 16:
                at = rng.randrange(8, len(data) - 8)
                data[at:at + 8] = struct.pack("<Q", rng.choice([0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63, HUGE, len(data)]))
            else:
                data = data[:rng.randrange(len(data) + 1)]
        yield f"random:{k}", bytes(data)


def _load_checked(path: Path, measure: bool) -> tuple[str, int]:
    if measure:
        tracemalloc.start()
    try:
        load_gguf(path)
        outcome = "loaded"
    except TmplkitError as exc:
        msg = str(exc)
        outcome = "clean_error" if ("\n" not in msg and str(path) in msg) else "unclear_error"
    except BaseException:  # noqa: BLE001 - counted, not raised
        outcome = "escaped_exception"
    peak = 0
    if measure:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, peak


def bench_gguf(workdir: Path, n_random: int, seed: int = 25213) -> dict:
    rng = random.Random(seed)
    warm = workdir / "warm.gguf"
    warm.write_bytes(gguf_bytes(GOOD_KVS))
    load_gguf(warm)  # import the reader before tracemalloc measures anything
    outcomes: Counter = Counter()
    worst_ratio, worst_over = 0.0, 0
    slowest = 0.0
    slow = 0
    p = workdir / "fuzz.gguf"
    tried = 0
    for i, (_, data) in enumerate(_fuzz_inputs(rng, n_random, workdir)):
        p.write_bytes(data)
        t0 = time.perf_counter()
        outcome, peak = _load_checked(p, measure=(i % 5 == 0))
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, elapsed)
        slow += elapsed > GGUF_HANG_S
        outcomes[outcome] += 1
        if peak:
            worst_over = max(worst_over, peak - len(data))
            worst_ratio = max(worst_ratio, peak / max(len(data), 1))
        tried += 1
    # A real vocab GGUF: truncations at field boundaries and random offsets, then length fields.
    real = corpus.vocab_path("phi-3")
    size = real.stat().st_size
    cut = workdir / "phi3.gguf"
    shutil.copyfile(real, cut)
    offsets = sorted({rng.randrange(size) for _ in range(300)} | set(range(64)), reverse=True)
    real_outcomes: Counter = Counter()
    for n in offsets:
        os.truncate(cut, n)
        t0 = time.perf_counter()
        outcome, _ = _load_checked(cut, measure=False)
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, elapsed)
        slow += elapsed > GGUF_HANG_S
        real_outcomes[outcome] += 1
    data = bytearray(real.read_bytes())
    for _ in range(300):
        at = rng.randrange(24, size - 8)
        mutated = bytearray(data)
        mutated[at:at + 8] = struct.pack("<Q", rng.choice([HUGE, 2 ** 63, 2 ** 32, size]))
        cut.write_bytes(mutated)
        outcome, _ = _load_checked(cut, measure=False)
        real_outcomes[outcome] += 1
    total = tried + sum(real_outcomes.values())
    all_outcomes = outcomes + real_outcomes
    return {
        "inputs": total,
        "synthetic": tried,
        "real_gguf": {"file": real.name, "size": size, "inputs": sum(real_outcomes.values())},
        "outcomes": dict(sorted(all_outcomes.items())),
        "clean_errors": all_outcomes["clean_error"],
        "loaded": all_outcomes["loaded"],
        "not_clean": all_outcomes["unclear_error"] + all_outcomes["escaped_exception"],
        "max_peak_over_file_bytes": worst_over,
        "slowest_load_s": round(slowest, 3),
        "hangs": slow,
    }


# --- corpus: jobs 1 vs 2 --------------------------------------------------------------------------


def _comparable(results):
    return [{k: v for k, v in a.to_dict().items() if k != "seconds"} for a in results]


def bench_jobs(repeat: int) -> dict:
    templates = load("corpus:llama.cpp")
    load_before = os.getloadavg()[0]
    analyze_isolated(templates[:2], jobs=2)  # start the forkserver outside the timings
    times = {1: [], 2: []}
    reference = None
    same = True
    for _ in range(repeat):
        for jobs in (1, 2):
            t0 = time.perf_counter()
            results = analyze_isolated(templates, jobs=jobs)
            times[jobs].append(time.perf_counter() - t0)
            if reference is None:
                reference = _comparable(results)
            same = same and _comparable(results) == reference
    t0 = time.perf_counter()
    in_process = [analyze(t) for t in templates]
    in_process_s = time.perf_counter() - t0
    flagged = [t.name for t in templates if scan(t.text)]
    med1, med2 = statistics.median(times[1]), statistics.median(times[2])
    return {
        "templates": len(templates),
        "repeat": repeat,
        "median_s": {"jobs_1": round(med1, 3), "jobs_2": round(med2, 3), "in_process": round(in_process_s, 3)},
        "speedup_jobs_2": round(med1 / med2, 2),
        "same_results": same,
        "same_as_in_process": _comparable(in_process) == reference,
        "statuses": dict(Counter(r["status"] for r in reference)),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(max(load_before, os.getloadavg()[0]), 2),
        "scan_flagged": flagged,
    }


def bench_pool(n: int = 24, nap: float = 0.1) -> dict:
    """How many workers really run at once: templates that only sleep, so other load on the
    machine does not matter. Ideal: n * nap / jobs."""
    from tmplkit.sources import ChatTemplate

    templates = [ChatTemplate(text=str(nap), name=f"nap-{i}", source="-") for i in range(n)]
    analyze_isolated(templates[:2], jobs=2, target=_by_name)
    out = {}
    for jobs in (1, 2, 4):
        t0 = time.perf_counter()
        analyze_isolated(templates, jobs=jobs, target=_by_name)
        out[f"jobs_{jobs}"] = round(time.perf_counter() - t0, 3)
    return {"templates": n, "nap_s": nap, "wall_s": out,
            "speedup": {k: round(out["jobs_1"] / v, 2) for k, v in out.items()}}


# --- report ---------------------------------------------------------------------------------------


def markdown(r: dict) -> str:
    h, g, j = r["hostile"], r["gguf"], r["jobs"]
    iso, inp = h["isolated"], h["in_process"]
    endings = ", ".join(f"{k} {v}" for k, v in iso["endings"].items())
    in_endings = ", ".join(f"{k} {v}" for k, v in inp["endings"].items())
    lines = [
        "| What | Tried | How it ended | Escapes | Hangs past the limit | Tracebacks |",
        "|---|---:|---|---:|---:|---:|",
        f"| Hostile templates, worker processes ({iso_limits(h)}) | {h['templates']} | {endings} | "
        f"{iso['escapes']} | {iso['hangs']} | {iso['tracebacks']} |",
        f"| Hostile templates, in process (render limits {inp['limits']['seconds']:g} s, "
        f"{inp['limits']['max_output_chars']:,} chars) | {inp['templates']} | {in_endings} | {inp['escapes']} | "
        f"{inp['hangs']} | {inp['tracebacks']} |",
        f"| Fuzzed GGUF inputs | {g['inputs']} | {g['clean_errors']} one-line errors, {g['loaded']} loaded, "
        f"{g['not_clean']} other | n/a | {g['hangs']} (slowest load {g['slowest_load_s']} s) | {g['not_clean']} |",
        "",
        f"Scan: {h['scan_flagged']} of {h['templates']} hostile templates flagged "
        f"({h['scan_expected']} reach for an escape route); {len(j['scan_flagged'])} of the {j['templates']} corpus templates. "
        f"Largest GGUF-load allocation beyond the file size: {g['max_peak_over_file_bytes'] / 1024:.0f} KiB. "
        f"Peak RSS of the auditing process: {iso['peak_rss_mb']:.0f} MiB after the isolated hostile run, "
        f"{r['peak_rss_mb']:.0f} MiB for the whole benchmark (in-process analyses included).",
        "",
        "| Corpus (70 templates), analyze_isolated | Median wall time | Speed-up |",
        "|---|---:|---:|",
        f"| --jobs 1 | {j['median_s']['jobs_1']:.2f} s | 1.00 |",
        f"| --jobs 2 | {j['median_s']['jobs_2']:.2f} s | {j['speedup_jobs_2']:.2f} |",
        f"| in process (no isolation) | {j['median_s']['in_process']:.2f} s | |",
        "",
        f"Pool concurrency ({j['pool']['templates']} templates that each sleep {j['pool']['nap_s']:g} s, so load from "
        f"other processes does not count): --jobs 1 {j['pool']['wall_s']['jobs_1']:.2f} s, --jobs 2 "
        f"{j['pool']['wall_s']['jobs_2']:.2f} s ({j['pool']['speedup']['jobs_2']:.2f}x), --jobs 4 "
        f"{j['pool']['wall_s']['jobs_4']:.2f} s ({j['pool']['speedup']['jobs_4']:.2f}x).",
        "",
        f"Same results with --jobs 1 and --jobs 2: {'yes' if j['same_results'] else 'NO'}; "
        f"same as in process: {'yes' if j['same_as_in_process'] else 'NO'} "
        f"(median of {j['repeat']} runs, {j['cpu_count']} cores, load average {j['load_average_1m']} "
        f"while measuring, Python {r['python']}).",
    ]
    return "\n".join(lines) + "\n"


def iso_limits(h: dict) -> str:
    lim = h["limits"]
    return f"{lim['timeout_s']:g} s, {lim['memory_mb']} MiB, jobs {lim['jobs']}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results" / "hostile"),
                        help="output path without suffix (.json and .md are written)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the corpus per --jobs value (median)")
    parser.add_argument("--fuzz", type=int, default=2000, help="random structured GGUF inputs")
    args = parser.parse_args(argv)
    os.environ.setdefault(SECRET_ENV, "env-secret-" + secrets.token_hex(8))
    with tempfile.TemporaryDirectory(prefix="tmplkit-bench-") as tmp:
        work = Path(tmp)
        hostile = bench_hostile(work)
        gguf = bench_gguf(work, args.fuzz)
    jobs = bench_jobs(args.repeat)
    jobs["pool"] = bench_pool()
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result = {"hostile": hostile, "gguf": gguf, "jobs": jobs, "peak_rss_mb": round(peak_rss_mb, 1),
              "python": platform.python_version(), "platform": platform.platform()}
    table = markdown(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    write_text_atomic(out.with_suffix(".md"), table)
    print(table)
    return 0 if (hostile["isolated"]["escapes"] == hostile["isolated"]["hangs"] == hostile["isolated"]["tracebacks"] == 0
                 and gguf["not_clean"] == gguf["hangs"] == 0 and jobs["same_results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
