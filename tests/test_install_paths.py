"""What each install path gives, as the README's install table says: every command it lists runs
on that install, and what the install lacks is refused in one line. Each install is a fresh
process in which the packages it does not have cannot be imported (as after that `pip install`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit.sources import corpus

ROOT = Path(__file__).resolve().parent.parent
CHATML = str(ROOT / "fixtures" / "templates" / "chatml.jinja")
CHAT = str(ROOT / "fixtures" / "masks" / "chat.json")

# The packages each install path lacks (the extras' top-level modules).
MISSING = {
    "pip install .": ("llama_cpp", "tokenizers", "transformers", "matplotlib"),
    "pip install '.[vocab]'": ("llama_cpp", "transformers", "matplotlib"),
    "pip install '.[hf]'": ("llama_cpp", "matplotlib"),
}

# command (as the README's table names it) -> argv that exercises it ({tmp}: a scratch folder)
COMMANDS = {
    "audit": ["audit", "--in-process", CHATML],
    "table": ["table", "--format", "csv", CHATML],
    "show": ["show", CHATML],
    "session": ["session", "generate", "--tokens", "2000", "-o", "{tmp}/s.json"],
    "turns": ["turns", CHATML, "--session", CHAT],
    "corpus": ["corpus", "path"],
    "schema": ["schema", "audit"],
    "lock": ["lock", "--in-process", CHATML, "--lock", "{tmp}/tmplkit.lock.json"],
    "diff": ["diff", "--in-process", CHATML, CHATML],
    "spans": ["spans", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35"],
    "mask": ["mask", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35", "--format", "json"],
    "request": ["request", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35", "-o", "{tmp}/body.json"],
    "annotate": ["annotate", CHATML, "-o", "{tmp}/annotated.jinja"],
    "prefill": ["prefill", "{tmp}/model.gguf", "--session", CHAT],
}


def _run(argv: list[str], missing: tuple[str, ...], tmp: Path) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            f"for m in {missing!r}: sys.modules[m] = None\n"
            "from tmplkit.cli import main\n"
            f"sys.exit(main(['--no-config', *{[a.replace('{tmp}', str(tmp)) for a in argv]!r}]))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp)


def _table() -> dict[str, set[str]]:
    """The README's install table: install -> the commands it adds (a row says "also ..." of the rows above)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(pip install [^`]+)` \| (.*?) \| (.*?) \|$", text, re.M)
    out, so_far = {}, set()
    for install, gives, _ in rows:
        named = set(re.findall(r"\*\*(\w[\w-]*)\*\*", gives))
        so_far = so_far | named if gives.startswith("also") else named
        out[install] = set(so_far)
    return out


def test_the_readme_table_names_every_install_the_test_checks():
    table = _table()
    assert set(MISSING) <= set(table), table.keys()
    assert {"audit", "table", "show", "turns"} <= table["pip install ."]
    assert "spans" not in table["pip install ."] and "request" not in table["pip install ."]
    for commands in table.values():
        assert commands <= set(COMMANDS) | {"replay", "server", "engine-parity"}, commands


@pytest.mark.corpus
@pytest.mark.parametrize("install", list(MISSING))
def test_each_install_runs_what_the_readme_says(install, tmp_path):
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    given = _table()[install]
    for name, argv in COMMANDS.items():
        proc = _run(argv, MISSING[install], tmp_path)
        if name in given:
            assert proc.returncode == 0, f"{install}: {name}: {proc.stderr}"
        else:  # refused before any work, on one line, naming what to install
            assert proc.returncode == 2, f"{install}: {name} ran ({proc.returncode}), the README says it needs more"
            assert proc.stderr.count("\n") == 1 and "pip install" in proc.stderr, f"{install}: {name}: {proc.stderr}"
