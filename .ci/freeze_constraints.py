"""Print pip constraints pinning what this environment has installed for tmplkit[all]: the
project's dependencies, every extra's, and theirs, at the installed versions.

    .venv/bin/python .ci/freeze_constraints.py > constraints.txt     (make constraints)
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


EXTRAS = {"hf", "vocab", "llama", "plot", "test", "lint", "docs"}


def closure(root: str = "tmplkit") -> dict[str, str]:
    """{normalized name: version} of every distribution tmplkit[all] pulls in, tmplkit excluded."""
    seen: dict[str, str] = {}
    todo: list[tuple[str, set[str]]] = [(root, EXTRAS)]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a dependency for another platform or Python version
        key = _norm(dist.metadata["Name"])
        if key in seen:
            continue
        seen[key] = dist.version
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((req.name, set(req.extras)))
    seen.pop(_norm(root), None)
    return seen


def main() -> int:
    pins = closure()
    print("# The versions the test suite is known to pass with (tmplkit[all] and everything it pulls in).")
    print("# Regenerate after a passing `make test-latest`: make constraints")
    for name in sorted(pins):
        print(f"{name}=={pins[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
