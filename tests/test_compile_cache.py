"""Compiled templates kept between runs: used when valid, ignored when not, never an error, same sandbox.

Every test points TMPLKIT_CACHE at a temporary folder. Whether the cache was used is seen from the
compiler being called (in process) or from the cache file being left as it was (a hit never
rewrites it), never from timing.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import tmplkit._version
from tmplkit.errors import RenderLimitError
from tmplkit.sandbox import compile_cache, render
from tmplkit.sandbox._jinja import _compile, _environment
from tmplkit.sandbox.compile_cache import cache_dir, cached_by_text, compile_template_cached
from tmplkit.sources import ChatTemplate

ROOT = Path(__file__).resolve().parent.parent
TEXT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private, empty cache folder, and a count of real compiles."""
    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TMPLKIT_NO_CACHE", raising=False)
    env = _environment()
    calls = []
    real = type(env).compile

    def counting(self, *args, **kwargs):
        calls.append(args[0] if args else kwargs.get("source"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(env), "compile", counting)
    _compile.cache_clear()  # the in-process cache would hide the folder
    yield calls
    _compile.cache_clear()


def _files() -> list[Path]:
    folder = cache_dir()
    return sorted(folder.iterdir()) if folder.is_dir() else []


def _render(text=TEXT):
    return compile_template_cached(_environment(), text).render(messages=HI)


def test_second_compile_loads_the_stored_code(cache):
    assert _render() == "<user>hi"
    assert len(cache) == 1
    (entry,) = _files()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache_dir().stat().st_mode) == 0o700
    before = entry.stat()
    assert _render() == "<user>hi"
    assert len(cache) == 1  # loaded, not compiled
    assert entry.stat().st_mtime_ns == before.st_mtime_ns and entry.stat().st_ino == before.st_ino


def test_the_key_is_the_text_and_the_version(cache, monkeypatch):
    _render()
    _render(TEXT + " ")
    assert len(_files()) == 2 and len(cache) == 2
    monkeypatch.setattr(tmplkit._version, "__version__", "0.0.0-other")
    monkeypatch.setattr(compile_cache, "_FINGERPRINTS", {})
    _render()
    assert len(_files()) == 3 and len(cache) == 3  # another tmplkit version does not reuse the code


def test_the_sandbox_is_the_same_with_cached_code(cache):
    escape = ChatTemplate("{{ ''.__class__.__mro__ }}", "escape", "-")
    mutate = ChatTemplate("{% set x = [] %}{{ x.append(1) }}", "mutate", "-")
    loop = ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loop", "-")
    for attempt in ("cold", "warm"):
        _compile.cache_clear()
        with pytest.raises(RenderLimitError) as info:
            render(escape, HI)
        assert info.value.kind == "unsafe", attempt
        with pytest.raises(Exception, match="unsafe|append"):
            render(mutate, HI)
        from tmplkit.sandbox import Limits

        with pytest.raises(RenderLimitError) as info:
            render(loop, HI, limits=Limits(seconds=0.2))
        assert info.value.kind == "timeout", attempt
    assert len(cache) == 3  # the warm renders ran the cached code


def _valid_entry(code) -> bytes:
    payload = marshal.dumps(code)
    return compile_cache._FORMAT + hashlib.sha256(payload).digest() + payload


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "flipped byte", "not code", "other code",
                                    "raising code"])
def test_a_damaged_file_is_ignored_and_rewritten(cache, damage):
    _render()
    (entry,) = _files()
    data = entry.read_bytes()
    damaged = {
        "garbage": b"\x00\xff" * 100,
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "flipped byte": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
        "not code": _valid_entry(42),
        "other code": _valid_entry(compile("x = 1", "<template>", "exec")),  # passes every check, is not a template
        "raising code": _valid_entry(compile("1/0", "<template>", "exec")),
    }[damage]
    entry.write_bytes(damaged)
    os.chmod(entry, 0o600)
    _compile.cache_clear()
    assert _render() == "<user>hi"
    assert len(cache) == 2  # compiled again
    assert entry.read_bytes() == data  # and written again
    _render()
    assert len(cache) == 2


def test_files_others_may_write_are_not_trusted(cache, tmp_path):
    _render()
    (entry,) = _files()
    os.chmod(entry, 0o666)
    _render()
    assert len(cache) == 2
    # A link in place of the file is not followed, even to a valid entry.
    good = tmp_path / "elsewhere.bin"
    good.write_bytes(entry.read_bytes())
    os.chmod(good, 0o600)
    entry.unlink()
    entry.symlink_to(good)
    _render()
    assert len(cache) == 3
    # A folder others may write is not used at all.
    for p in _files():
        p.unlink()
    os.chmod(cache_dir(), 0o777)
    _render()
    _render()
    assert len(cache) == 5 and _files() == []


def test_turned_off_or_unusable_is_not_an_error(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("TMPLKIT_NO_CACHE", "1")
    assert not compile_cache.enabled()
    _render()
    _render()
    assert len(cache) == 2 and not cache_dir().exists()
    monkeypatch.setenv("TMPLKIT_NO_CACHE", "0")
    assert compile_cache.enabled()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TMPLKIT_CACHE", str(blocker / "cache"))  # cannot be created
    assert _render() == "<user>hi"


def test_compile_errors_are_not_cached(cache):
    from tmplkit.errors import RenderError

    bad = ChatTemplate("{% for %}", "bad", "-")
    for _ in range(2):
        _compile.cache_clear()
        with pytest.raises(RenderError, match="does not compile"):
            render(bad, HI)
    assert _files() == []


def test_a_second_audit_in_new_processes_loads_the_compiled_templates(tmp_path):
    """Through the command line and its worker processes: the second audit rewrites no cache file."""
    env = {**os.environ, "TMPLKIT_CACHE": str(tmp_path / "cache")}
    env.pop("TMPLKIT_NO_CACHE", None)
    fixtures = [str(p) for p in sorted((ROOT / "fixtures" / "templates").glob("*.jinja"))[:4]]

    def audit() -> str:
        proc = subprocess.run([sys.executable, "-m", "tmplkit", "audit", "--format", "json", *fixtures],
                              env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.stdout

    first = audit()
    folder = tmp_path / "cache" / "compiled"
    entries = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}
    # Per template: its compiled code and its static scan's warnings; for those the analysis asks
    # it of (two of these four), what it reads of the clock.
    suffixes = sorted(Path(n).suffix for n in entries)
    assert suffixes.count(".bin") == len(fixtures) and len(fixtures) < suffixes.count(".json") <= 2 * len(fixtures)
    second = audit()
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()} == entries

    def without_seconds(text):
        import json

        data = json.loads(text)
        rows = data["results"] if isinstance(data, dict) else data
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert without_seconds(first) == without_seconds(second)


_COMPUTED: list[str] = []


def _words(text: str) -> list[str]:
    _COMPUTED.append(text)
    return text.split()


def _word_set(text: str):
    _COMPUTED.append(text)
    return set(text.split())  # not JSON data


def test_results_of_the_text_are_kept_as_json(cache):
    _COMPUTED.clear()
    assert cached_by_text(_words, "a b") == ["a", "b"]
    assert cached_by_text(_words, "a b") == ["a", "b"]
    assert _COMPUTED == ["a b"]
    (entry,) = _files()
    assert entry.suffix == ".json" and stat.S_IMODE(entry.stat().st_mode) == 0o600
    # Another function of the same text is another entry; a result that is not JSON is not kept.
    assert cached_by_text(_word_set, "a b") == {"a", "b"}
    assert cached_by_text(_word_set, "a b") == {"a", "b"}
    assert _COMPUTED == ["a b", "a b", "a b"] and len(_files()) == 1
    # A payload with a valid checksum that is not JSON is computed again, and replaced.
    entry.write_bytes(compile_cache._FORMAT + hashlib.sha256(b"{").digest() + b"{")
    os.chmod(entry, 0o600)
    assert cached_by_text(_words, "a b") == ["a", "b"]
    assert len(_COMPUTED) == 4
    assert cached_by_text(_words, "a b") == ["a", "b"] and len(_COMPUTED) == 4


def test_the_scan_warnings_come_from_the_cache(cache, monkeypatch):
    from tmplkit.analysis import Analysis
    from tmplkit.auditing import isolate

    hostile = "{{ x.__class__ }}"
    plain = Analysis(name="t", source="-", status="pass")
    first = isolate.add_scan_warnings(plain, hostile)
    assert any("__class__" in w for w in first.warnings)

    def no_scan(text):
        raise AssertionError("the scan ran again")

    no_scan.__qualname__, no_scan.__module__ = "scan", "tmplkit.sandbox.static_scan"  # the same key as the real scan
    monkeypatch.setattr(isolate, "scan", no_scan)
    assert isolate.add_scan_warnings(plain, hostile) == first


def test_what_a_template_reads_of_the_clock_comes_from_the_cache(cache, monkeypatch):
    """Whether a template reads the clock or draws at random is kept with its code: a warm audit
    parsed every template again for it (half its time, scripts/bench_audit.py)."""
    from tmplkit.sandbox import _jinja, draws_at_random, reads_clock, reads_date

    dated = "{{ strftime_now('%Y') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    drawn = "{{ ['a', 'b'] | random }}"
    plain = TEXT
    first = [(reads_clock(t), reads_date(t), draws_at_random(t)) for t in (dated, drawn, plain)]
    assert first == [(True, True, False), (True, False, True), (False, False, False)]
    assert len(_files()) == 3 and all(p.suffix == ".json" for p in _files())

    def no_parse(self, *args, **kwargs):
        raise AssertionError("the template was parsed again")

    _jinja._time_reads.cache_clear()  # (as a new process starts)
    with monkeypatch.context() as m:
        m.setattr(type(_environment()), "parse", no_parse)
        assert [(reads_clock(t), reads_date(t), draws_at_random(t)) for t in (dated, drawn, plain)] == first
    # A template that does not parse is kept as such: nothing is proved, it may read the clock.
    broken = "{% for %}"
    assert reads_clock(broken) and reads_date(broken) and not draws_at_random(broken)
    _jinja._time_reads.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(type(_environment()), "parse", no_parse)
        assert reads_clock(broken) and reads_date(broken) and not draws_at_random(broken)
    _jinja._time_reads.cache_clear()
