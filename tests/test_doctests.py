"""The examples in the package's docstrings run as tests (doctest), from the repository root so
that they can name the fixtures."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import tmplkit

ROOT = Path(__file__).resolve().parent.parent
# `python -m` entry points run the command line when imported.
MODULES = sorted(m.name for m in pkgutil.walk_packages(tmplkit.__path__, "tmplkit.") if not m.name.endswith("__main__"))
OPTIONAL = {"llama_cpp", "matplotlib", "tokenizers", "transformers"}


def test_modules_with_examples_are_found():
    assert {"tmplkit", "tmplkit.cli.config", "tmplkit.auditing", "tmplkit.sources"} <= {"tmplkit", *MODULES}


@pytest.mark.parametrize("name", ["tmplkit", *MODULES])
def test_docstring_examples(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        if exc.name in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name} (an optional extra)")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    if not tests:
        pytest.skip("no examples")
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name} (output above)"
