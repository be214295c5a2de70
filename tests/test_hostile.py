"""The hostile-template suite: every template in fixtures/hostile ends as a reported verdict within
its limits, none executes anything outside the sandbox, and the auditing process stays small.

"Outside the sandbox" is checked by side effects: escape attempts try to create a marker file, to
read a secret file, and to read a secret environment variable; the marker must never appear and
the secrets must never show up anywhere in what an analysis returns.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import secrets
import time
from pathlib import Path

import psutil
import pytest

from tmplkit.analysis import Analysis, analyze
from tmplkit.auditing.isolate import analyze_isolated
from tmplkit.sandbox import Limits, render
from tmplkit.sandbox.static_scan import scan
from tmplkit.sources import ChatTemplate

HOSTILE_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "hostile"
SECRET_ENV = "TMPLKIT_HOSTILE_SECRET"
# Set at import (collection) time, before any worker process or forkserver starts, so that
# workers inherit it: an escape that reached os.environ would find it.
ENV_SECRET = os.environ.setdefault(SECRET_ENV, "env-secret-" + secrets.token_hex(8))

TIMEOUT = 3.0       # per template, in the workers
MEMORY_MB = 512     # per worker, beyond its start-up footprint
IN_PROCESS = Limits(seconds=0.5)
SLACK = 5.0         # a verdict later than its limit plus this is a hang


def load_manifest() -> dict:
    return json.loads((HOSTILE_DIR / "manifest.json").read_text(encoding="utf-8"))


def load_hostile(marker: Path, secret_file: Path) -> list[ChatTemplate]:
    """The hostile templates, with the marker and secret-file placeholders filled in."""
    out = []
    for name in sorted(load_manifest()):
        text = (HOSTILE_DIR / f"{name}.jinja").read_text(encoding="utf-8")
        text = text.replace("@MARKER@", str(marker)).replace("@SECRET_FILE@", str(secret_file))
        out.append(ChatTemplate(text=text, name=name, source=f"hostile:{name}"))
    return out


def verdict(a: Analysis) -> str:
    """How an analysis ended: its status, or 'size' where the output-size limit stopped it.

    analyze() and the workers report a render stopped by the size limit as status 'memory' (a
    resource exhaustion) with the limit's message; this tells the two apart.
    """
    if a.status in ("error", "memory") and any("over the limit of" in e or "; refusing" in e for e in a.errors):
        return "size"
    return a.status


def leaked(a: Analysis, needles) -> list[str]:
    blob = json.dumps(a.to_dict()) + repr(a)
    if a.round_trip is not None:
        blob += a.round_trip.rendered
    return [n for n in needles if n in blob]


def _read_secrets(template) -> Analysis:
    """A worker target that reads what an escape would: proves the secrets are there to leak."""
    secret_file = Path(template.text)
    return Analysis(name=template.name, source=template.source, status="pass",
                    warnings=(os.environ.get(SECRET_ENV, ""), secret_file.read_text()))


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "ESCAPED-MARKER"
    secret_file = root / "secret.txt"
    file_secret = "file-secret-" + secrets.token_hex(8)
    secret_file.write_text(file_secret)
    return {"marker": marker, "secret_file": secret_file, "needles": [ENV_SECRET, file_secret],
            "templates": load_hostile(marker, secret_file)}


@pytest.fixture(scope="module")
def isolated(arena):
    """One isolated run over the whole suite (jobs=2), with the host's memory measured around it."""
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    t0 = time.monotonic()
    results = analyze_isolated(arena["templates"], jobs=2, timeout=TIMEOUT, memory_mb=MEMORY_MB)
    return {"results": {a.name: a for a in results}, "order": [a.name for a in results],
            "seconds": time.monotonic() - t0, "rss_growth": proc.memory_info().rss - rss_before}


MANIFEST = load_manifest()


def test_manifest_matches_the_fixture_files():
    files = {p.stem for p in HOSTILE_DIR.glob("*.jinja")}
    assert files == set(MANIFEST)
    assert len(files) >= 50
    for name, entry in MANIFEST.items():
        assert entry["what"] and entry["expect"], name


def test_workers_can_see_the_secrets(arena):
    """The leak checks below mean something: a worker that looks does find both secrets."""
    t = ChatTemplate(text=str(arena["secret_file"]), name="probe", source="-")
    (a,) = analyze_isolated([t], target=_read_secrets)
    assert list(a.warnings[:2]) == arena["needles"]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_isolated_verdict(isolated, arena, name):
    a = isolated["results"][name]
    assert verdict(a) in MANIFEST[name]["expect"], (a.status, a.errors)
    assert a.seconds <= TIMEOUT + SLACK
    assert not leaked(a, arena["needles"])
    assert all("\n" not in e and len(e) < 2200 for e in a.errors)
    assert not arena["marker"].exists()


def test_isolated_run_as_a_whole(isolated, arena):
    assert isolated["order"] == [t.name for t in arena["templates"]]
    assert isolated["rss_growth"] < 100 * 2 ** 20
    assert not arena["marker"].exists()


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_scan_flags_exactly_the_escape_routes(arena, name):
    t = next(t for t in arena["templates"] if t.name == name)
    warnings = scan(t.text)
    assert bool(warnings) == MANIFEST[name]["scan"], warnings


def test_scan_warnings_reach_the_analysis(isolated):
    for name, entry in MANIFEST.items():
        if entry["scan"]:
            assert isolated["results"][name].warnings, name


def test_in_process_verdicts(arena):
    """The library API (no workers): render limits stop everything marked safe in process."""
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    # The suite's own heap out of the collector's way: a full collection over it, triggered by the
    # recursion bomb's frames, took 0.1-0.6 s late in a whole run (0.015 s alone) and turned the
    # recursion's error into a timeout of the 0.5 s limit.
    gc.collect()
    gc.freeze()
    try:
        _in_process_verdicts(arena)
    finally:
        gc.unfreeze()
    assert proc.memory_info().rss - rss_before < 300 * 2 ** 20
    assert not arena["marker"].exists()


def _in_process_verdicts(arena):
    for t in arena["templates"]:
        entry = MANIFEST[t.name]
        if not entry["inprocess"]:
            continue
        t0 = time.monotonic()
        a = analyze(t, limits=IN_PROCESS)
        elapsed = time.monotonic() - t0
        assert verdict(a) in entry["expect"], (t.name, a.status, a.errors)
        assert elapsed <= IN_PROCESS.seconds + SLACK, (t.name, elapsed)
        assert not leaked(a, arena["needles"]), t.name


CLEAN = ChatTemplate(
    text="{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{{ tools|tojson if tools }}"
         "{{ raise_exception is defined }}{{ namespace(a=1).a }}",
    name="clean", source="-")


def test_mutation_never_reaches_the_caller_or_the_next_render(arena):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    before_messages, before_tools = copy.deepcopy(messages), copy.deepcopy(tools)
    clean_before = render(CLEAN, messages, tools=tools)
    from tmplkit.sandbox import _jinja as render_mod

    env = render_mod._environment()
    globals_before = dict(env.globals)
    for t in arena["templates"]:
        if t.name.startswith("mutate_"):
            try:
                render(t, messages, tools=tools, limits=IN_PROCESS)
            except Exception:
                pass
    assert messages == before_messages and tools == before_tools
    assert render(CLEAN, messages, tools=tools) == clean_before
    assert dict(env.globals) == globals_before
