"""The README and the changelog as a reader gets them: no merge leftovers, and every local link
points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_no_merge_conflict_markers(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert not re.search(r"^(<{7}|={7}|>{7})( |$)", text, re.M), f"{name} holds a merge conflict marker"


def test_local_links_point_at_files():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = {m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", text)}
    missing = [t for t in targets if t and not re.match(r"[a-z]+:", t) and not (ROOT / t).exists()]
    assert not missing, missing
