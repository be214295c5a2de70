#!/usr/bin/env bash
# Build llama-server (CPU, no web UI) from the same pinned llama-cpp-python sdist tmplkit runs on,
# so the prefill benchmark can measure tmplkit's runner and llama-server side by side.
#
#   scripts/build_llama_server.sh            # prints the path of the llama-server binary
#   JOBS=2 CMAKE_ARGS="-DGGML_CUDA=on" scripts/build_llama_server.sh   # a CUDA build
#   scripts/build_llama_server.sh 0.3.33     # another pinned release (tmplkit/server/pins.py)
#
# Downloads the sdist with pip (no other network access), checks its sha256 against the pin in
# tmplkit/sources/corpus.py (another release: tmplkit/server/pins.py), and builds in
# ~/.cache/tmplkit/llama-server-<version>/ (or $TMPLKIT_CACHE), never inside the repository.
# Idempotent: an existing binary is reused.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$here/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

# One pinned release: the argument (default: the one tmplkit runs on), with its sha256.
pin="$("$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1])
from tmplkit.errors import TmplkitError
from tmplkit.server.pins import server_pin
try:
    print(*server_pin(sys.argv[2] or None))
except TmplkitError as exc:
    sys.exit(f"build_llama_server: {exc}")' "$here" "${1:-}")"
version="${pin% *}"
sha="${pin#* }"
cache="${TMPLKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tmplkit}"
root="$cache/llama-server-$version${BUILD_SUFFIX:-}"
bin="$root/build/bin/llama-server"
jobs="${JOBS:-2}"

if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi

mkdir -p "$root"
sdist="$root/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
    tmp="$(mktemp -d "$root/.download-XXXXXX")"
    # only this sdist: its build dependencies as wheels (no-binary :all: builds them from source)
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$tmp" >&2
    mv "$tmp/llama_cpp_python-$version.tar.gz" "$sdist"
    rmdir "$tmp"
fi
got="$(sha256sum "$sdist" | cut -d' ' -f1)"
if [ "$got" != "$sha" ]; then
    echo "build_llama_server: sha256 mismatch for $sdist: got $got, expected $sha" >&2
    rm -f "$sdist"
    exit 1
fi

src="$root/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
    tmp="$(mktemp -d "$root/.extract-XXXXXX")"
    tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$version/vendor/llama.cpp"
    rm -rf "$src"
    mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp" "$src"
    rm -rf "$tmp"
fi

# Release, shared ggml (as the Python wheel), CPU only unless CMAKE_ARGS says otherwise.
# LLAMA_BUILD_UI is off by default in this llama.cpp; LLAMA_OPENSSL off: loopback HTTP only.
# shellcheck disable=SC2086
cmake -S "$src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF ${CMAKE_ARGS:-} >&2
cmake --build "$root/build" --target llama-server -j "$jobs" >&2
[ -x "$bin" ] || { echo "build_llama_server: build finished but $bin is missing" >&2; exit 1; }
echo "$bin"
