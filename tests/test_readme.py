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


# A docs page opens with what a user does and sees: a command and its output, before its second
# section; then it explains, in paragraphs short enough to read (a list item is a paragraph of its
# own; code blocks and tables are not paragraphs).
MAX_PARAGRAPH_LINES = 12
COMMAND = re.compile(r"^(\$ )?(tmplkit |python scripts/|make )")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def _paragraphs(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each paragraph or list item outside code blocks and tables."""
    found: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 0
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```") or fenced or not stripped or stripped.startswith(("|", "#")):
            if current:
                found.append((start, current))
            current = []
            if stripped.startswith("```"):
                fenced = not fenced
            continue
        if LIST_ITEM.match(line) and current:
            found.append((start, current))
            current = []
        if not current:
            start = number
        current.append(line)
    if current:
        found.append((start, current))
    return found


def _command_block_before_second_section(text: str) -> bool:
    sections = 0
    block: list[str] | None = None
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if block is not None and any(COMMAND.match(b.strip()) for b in block):
                return True
            block = [] if block is None else None
        elif block is not None:
            block.append(line)
        elif line.startswith("## "):
            sections += 1
            if sections == 2:
                return False
    return False


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_docs_page_opens_with_a_command(page):
    text = page.read_text(encoding="utf-8")
    assert _command_block_before_second_section(text), (
        f"{page.name}: no fenced code block with a command (`$ tmplkit ...`, `python scripts/...`, "
        "`make ...`) before its second `##` heading"
    )


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_docs_page_paragraphs_are_short(page):
    long = [
        f"line {start}: {len(lines)} lines ({lines[0].strip()[:50]}...)"
        for start, lines in _paragraphs(page.read_text(encoding="utf-8"))
        if len(lines) > MAX_PARAGRAPH_LINES
    ]
    assert not long, f"{page.name}: paragraphs over {MAX_PARAGRAPH_LINES} lines: {long}"


def test_the_paragraph_check_counts_what_a_reader_sees():
    text = "\n".join(
        ["# T", "", "```console", "$ tmplkit audit x.jinja", *["out"] * 20, "```", "", "| a |", "|---|"]
        + ["| b |"] * 20
        + ["", *["word"] * 3, "- item", "  more", "- item"]
    )
    assert [len(lines) for _, lines in _paragraphs(text)] == [3, 2, 1]
    assert _command_block_before_second_section(text)
    assert not _command_block_before_second_section("# T\n\n## A\n\n## B\n\n```sh\ntmplkit x\n```\n")
    assert not _command_block_before_second_section("# T\n\n```python\nimport tmplkit\n```\n")
