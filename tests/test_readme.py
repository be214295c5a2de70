"""The README, the documentation pages and the changelog as a reader gets them: no merge leftovers,
every local link points at a file that exists, and the site builds with MkDocs in strict mode (where
a broken link or anchor fails the build, which a test proves)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = ["README.md", "CHANGELOG.md", *(str(p.relative_to(ROOT)) for p in DOCS)]


def test_the_docs_pages_exist():
    names = {p.name for p in DOCS}
    assert {"index.md", "cli.md", "analysis.md", "ci.md", "llama-server.md", "sessions.md"} <= names


@pytest.mark.parametrize("name", PAGES)
def test_no_merge_conflict_markers(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert not re.search(r"^(<{7}|={7}|>{7})( |$)", text, re.M), f"{name} holds a merge conflict marker"


@pytest.mark.parametrize("name", ["README.md", *(str(p.relative_to(ROOT)) for p in DOCS)])
def test_local_links_point_at_files(name):
    page = ROOT / name
    text = page.read_text(encoding="utf-8")
    targets = {m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", text)}
    missing = [t for t in targets if t and not re.match(r"[a-z]+:", t) and not (page.parent / t).exists()]
    assert not missing, missing


def test_readme_links_every_docs_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in DOCS if f"(docs/{p.name})" not in text]
    assert not unlinked, unlinked


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the 'docs' extra)")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=120,
    )


def test_ci_builds_the_site_strict():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert "make docs" in ci and ci.index("make lint") < ci.index("make docs") < ci.index("make test")


def test_ci_runs_the_quick_start_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme[readme.index("## Quick start"):]
    block = quick[quick.index("```sh") + 5:quick.index("```", quick.index("```sh") + 5)]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make audit", "make test"]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert all(c in ci for c in commands) and ci[-1] == "make test"
    makefile = (ROOT / "Makefile").read_text()
    assert "\t$(BIN)/mkdocs build --strict -d site\n" in makefile


def test_site_builds_strict(tmp_path):
    run = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize(
    "link",
    ["[gone](no-such-page.md)", "[gone](cli.md#no-such-heading)", "[gone](#no-such-heading)"],
)
def test_a_broken_link_fails_the_strict_build(tmp_path, link):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "ci.md"
    page.write_text(page.read_text(encoding="utf-8") + f"\nSee {link}.\n", encoding="utf-8")
    run = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    target = link[link.index("(") + 1 : -1]
    assert run.returncode != 0, run.stdout + run.stderr
    assert "strict mode" in run.stdout + run.stderr
    assert f"contains a link '{target}'" in run.stderr, run.stderr


def test_the_changelog_names_the_package_version():
    # the newest released section is the version the package says it is (and its tag's name)
    from tmplkit import __version__

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, re.M)
    assert released and released[0] == __version__, (released[:1], __version__)
    assert f"`v{__version__}`" in text and f"v{__version__}" in (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
