"""The house's shape, checked on the source: every module imports only its own layer and the layers
below it (DESIGN.md's list, `LAYERS`), no import cycle between modules or between subpackages
(every import counts: at the top, inside functions, under TYPE_CHECKING), no function over 80
lines, and the layer packages re-export what their private modules list."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tmplkit"
MAX_FUNCTION_LINES = 80
# The layers, bottom up, as DESIGN.md and docs/development.md draw them: each a folder of tmplkit/
# (the ground floor: modules at the top). A module may import its own layer and those below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("_version", "_interrupt", "errors", "atomic", "jsonio", "markup", "delimiters", "environment", "schemas")),
    ("sources", ("sources",)),
    ("render", ("sandbox",)),
    ("analysis", ("analysis",)),
    ("tokens", ("tokens",)),
    ("session", ("session",)),
    ("server rules", ("server_rules",)),
    ("prefill", ("prefill",)),
    ("turns", ("turns",)),
    ("masks", ("masks",)),
    ("replay", ("replay",)),
    ("server", ("server",)),
    ("audit", ("auditing", "behaviour")),
    ("surface", ("cli", "__main__")),
)
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


def _layer_of(module: str) -> int | None:
    """The index in LAYERS of a tmplkit module (None: the package root, which re-exports all)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    for i, (_, places) in enumerate(LAYERS):
        if parts[1] in places:
            return i
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS (and to DESIGN.md)")


def _climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a layer above the importer's own, as 'importer (layer) -> imported (layer)'."""
    out = []
    for module, imported in sorted(graph.items()):
        here = _layer_of(module)
        if here is None:
            continue
        for other in sorted(imported):
            there = _layer_of(other)
            if there is None or there > here:
                name = "the package root" if there is None else LAYERS[there][0]
                out.append(f"{module} ({LAYERS[here][0]}) -> {other} ({name})")
    return out


def test_every_module_is_in_a_layer_and_the_top_holds_only_the_ground_floor():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert top == sorted(n for n in LAYERS[0][1] if (PACKAGE / f"{n}.py").exists())
    for module in MODULES:
        _layer_of(module)


def test_no_module_imports_a_layer_above_its_own():
    assert _climbs(GRAPH) == []


def test_a_planted_climb_is_caught():
    """An import from a higher layer fails the check (the analysis reaching up into tokens, as it once did)."""
    planted = {**GRAPH, "tmplkit.analysis._verdict": GRAPH["tmplkit.analysis._verdict"] | {"tmplkit.tokens.spans"}}
    assert _climbs(planted) == ["tmplkit.analysis._verdict (analysis) -> tmplkit.tokens.spans (tokens)"]
    planted = {**GRAPH, "tmplkit.errors": {"tmplkit.sandbox"}}
    assert _climbs(planted) == ["tmplkit.errors (ground) -> tmplkit.sandbox (render)"]


def test_the_layer_list_is_the_one_in_the_docs():
    """docs/development.md lists the same layers, in the same order, with the same folders."""
    text = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    documented = [(name.strip(), tuple(re.findall(r"`tmplkit/([\w_]+)", places))) for name, places in rows]
    documented = [(name, places) for name, places in documented if places]
    assert [name for name, _ in documented] == [name for name, _ in LAYERS]
    for (name, places), (_, listed) in zip(documented, LAYERS):
        assert set(places) <= set(listed), name


def test_the_layer_list_is_design_md_s():
    """DESIGN.md (the team's design notes, beside the checkout where it is laid) draws the same
    layers in the same order: each line of its house starts with a layer's name."""
    design = PACKAGE.parent.parent / "shared" / "DESIGN.md"
    if not design.is_file():
        pytest.skip("DESIGN.md is not beside this checkout")
    text = design.read_text(encoding="utf-8")
    house = text.split("## The house", 1)[1].split("```")[1]
    names = [name for name, _ in LAYERS]
    starts = [next((n for n in names if line.startswith(n + " ")), None) for line in house.splitlines() if line[:1].strip()]
    assert [n for n in starts if n] == names


def test_the_walk_finds_the_imports():
    assert "tmplkit.server_rules" in GRAPH["tmplkit.prefill.runner"]
    assert "tmplkit.session._render" in GRAPH["tmplkit.session.requests"]
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


def test_the_package_root_loads_no_layer_until_a_name_is_used():
    """`import tmplkit` is lazy (the root's `__getattr__`): no layer, no numpy, no Jinja; a public
    name loads its layer on first use, and every name of `__all__` resolves."""
    import subprocess
    import sys

    code = ("import sys, tmplkit\n"
            "before = sorted(m for m in sys.modules if m.startswith('tmplkit'))\n"
            "heavy = [m for m in ('numpy', 'jinja2') if m in sys.modules]\n"
            "tmplkit.analyze\n"
            "print(before, heavy, 'tmplkit.analysis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=PACKAGE.parent, check=True).stdout.strip()
    assert out == "['tmplkit', 'tmplkit._interrupt', 'tmplkit._version'] [] True"
    import tmplkit

    assert all(getattr(tmplkit, name) is not None for name in tmplkit.__all__)
    with pytest.raises(AttributeError):
        tmplkit.no_such_name  # noqa: B018
