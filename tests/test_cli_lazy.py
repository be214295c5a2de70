"""The command line loads only what it uses: `tmplkit --version` and `tmplkit --help` import no layer
of the library, a subcommand's module is imported when that subcommand is parsed, and the parser
built that way is the one `build_parser()` builds whole (tmplkit/cli/__init__.py's `_COMMANDS`)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit.cli import _COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # a child process imports this checkout
HEAVY = ("jinja2", "numpy", "transformers", "tmplkit.auditing", "tmplkit.sandbox", "tmplkit.analysis")
# `python -m tmplkit ARGS` in a fresh process, then the modules it imported (as JSON on stderr's last line).
_PROBE = ("import json, runpy, sys\n"
          "sys.argv = ['tmplkit', *sys.argv[1:]]\n"
          "try:\n"
          "    runpy.run_module('tmplkit', run_name='__main__', alter_sys=True)\n"
          "except SystemExit as exc:\n"
          "    code = exc.code\n"
          "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}), file=sys.stderr)\n")


def imported(*args: str) -> tuple[int, str, set[str]]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, cwd=ROOT, env=ENV)
    seen = json.loads(proc.stderr.splitlines()[-1])
    return seen["code"], proc.stdout, set(seen["modules"])


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_no_layer(args):
    code, out, modules = imported(*args)
    assert code == 0 and out.startswith(("tmplkit ", "usage: tmplkit"))
    assert not [m for m in HEAVY if m in modules]
    # (the parser's own helpers only: output checks, and the store action that refuses an option given twice)
    assert not [m for m in modules if m.startswith("tmplkit.cli._") and m not in ("tmplkit.cli._outputs", "tmplkit.cli._once")]


def test_a_subcommand_imports_its_own_module_only():
    code, out, modules = imported("schema", "--help")
    assert code == 0 and out.startswith("usage: tmplkit schema")
    assert "tmplkit.cli._schema" in modules
    assert not {"tmplkit.cli._audit", "tmplkit.cli._turns", "tmplkit.cli._prefill"} & modules
    assert not [m for m in HEAVY if m in modules]


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


@pytest.mark.parametrize("name", list(_COMMANDS))
def test_each_subcommand_built_on_its_own_is_the_one_built_with_all(name):
    whole = _commands(build_parser()).choices[name]
    lazy = build_parser(lazy=True)
    alone = _commands(lazy)._name_parser_map[name]
    assert alone is None  # not built until parsed
    alone = _commands(lazy).load(name)
    assert alone.format_help() == whole.format_help()
    assert [a.option_strings for a in alone._actions] == [a.option_strings for a in whole._actions]


def test_the_listing_is_the_same_built_lazily_or_whole():
    assert build_parser(lazy=True).format_help() == build_parser().format_help()
    assert list(_commands(build_parser()).choices) == list(_COMMANDS)


def test_audit_help_draws_its_choices_without_loading_the_audit():
    code, out, modules = imported("audit", "--help")
    assert code == 0 and "--fail-on {fail,unchecked,warning}" in out
    assert "tmplkit.auditing._choices" in modules
    assert not {"jinja2", "numpy", "tmplkit.analysis", "tmplkit.auditing._formats"} & modules


def test_the_format_names_are_the_formats():
    from tmplkit.auditing import AUDIT_FORMAT_NAMES, AUDIT_FORMATS

    assert tuple(AUDIT_FORMATS) == AUDIT_FORMAT_NAMES


def test_the_parsers_worker_limits_are_the_workers_own():
    """The limits the parsers show and use without a layer loaded are `auditing.contained`'s."""
    from tmplkit.auditing import contained
    from tmplkit.cli import _limits

    assert (_limits.DEFAULT_TIMEOUT, _limits.DEFAULT_MEMORY_MB) == (contained.DEFAULT_TIMEOUT, contained.DEFAULT_MEMORY_MB)
