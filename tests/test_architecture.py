"""The house's shape, checked on the source: no import cycle between modules or between
subpackages (every import counts: at the top, inside functions, under TYPE_CHECKING), no function
over 80 lines, and the layer packages re-export what their private modules list."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tmplkit"
MAX_FUNCTION_LINES = 80
# Packages made of private modules (`_name.py`), each with an `__all__` the package re-exports.
LAYER_PACKAGES = ("tmplkit.sandbox", "tmplkit.session", "tmplkit.server_rules", "tmplkit.auditing", "tmplkit.masks",
                  "tmplkit.behaviour")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The tmplkit modules `name` imports anywhere in its source (a package's submodule when the
    import names one, else the package)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "tmplkit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "tmplkit":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    out.discard(name)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _folder(module: str) -> str | None:
    """The subpackage or top-level module a module belongs to (None: the package root, which
    re-exports everything and which nothing imports)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_walk_finds_the_imports():
    assert "tmplkit.server_rules" in GRAPH["tmplkit.prefill.runner"]
    assert "tmplkit.session" in GRAPH["tmplkit.turns.requests"]
    assert GRAPH["tmplkit.errors"] == set()
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules():
    assert _cycles(GRAPH) == []


def test_no_import_cycle_between_subpackages():
    folders: dict[str, set[str]] = {}
    for module, imported in GRAPH.items():
        here = _folder(module)
        if here is None:
            continue
        folders.setdefault(here, set())
        for other in imported:
            there = _folder(other)
            assert there is not None, f"{module} imports the package root; import the module that holds the name"
            if there != here:
                folders[here].add(there)
    assert _cycles(folders) == []


def test_no_function_over_80_lines():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert long == []


@pytest.mark.parametrize("package", LAYER_PACKAGES)
def test_layer_packages_reexport_their_private_modules(package):
    pkg = importlib.import_module(package)
    private = [m for m in MODULES if m.startswith(package + ".") and m.rsplit(".", 1)[1].startswith("_")]
    assert private, package
    for name in private:
        module = importlib.import_module(name)
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for attr in module.__all__:
            assert getattr(module, attr) is getattr(pkg, attr, None), f"{package} does not re-export {name}.{attr}"
            assert attr in pkg.__all__, f"{attr} missing from {package}.__all__"


@pytest.mark.parametrize("package", ["tmplkit", *sorted(m for m, p in MODULES.items() if p.name == "__init__.py")])
def test_every_listed_name_exists(package):
    pkg = importlib.import_module(package)
    assert all(hasattr(pkg, name) for name in getattr(pkg, "__all__", ())), package
