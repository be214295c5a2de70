"""Bad template sources other than GGUF: malformed JSON configs, odd folders, Hub repos that are
not there while offline. Each ends in a one-line SourceError naming the source, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmplkit.errors import SourceError, TmplkitError
from tmplkit.sources import templates as sources


def _check(exc: BaseException, where) -> str:
    message = str(exc)
    assert isinstance(exc, SourceError), repr(exc)
    assert "\n" not in message and str(where) in message, message
    return message


BAD_CONFIGS = [
    ("not json", "{'chat_template': 'x'}", "not valid JSON (line 1, column 2"),
    ("truncated", '{"chat_template": "{{ x }', "not valid JSON"),
    ("bom", "\ufeff" + '{"chat_template": "x"}', "not valid JSON"),
    ("empty", "", "empty"),
    ("null", "null", "expected a JSON object"),
    ("list", '[{"chat_template": "x"}]', "expected a JSON object"),
    ("string", '"{{ messages }}"', "expected a JSON object"),
    ("no template", '{"bos_token": "<s>"}', "no 'chat_template' key"),
    ("template null", '{"chat_template": null}', "must be a string or a list"),
    ("template number", '{"chat_template": 1e999}', "must be a string or a list"),
    ("template object", '{"chat_template": {"default": "x"}}', "must be a string or a list"),
    ("template empty", '{"chat_template": "   "}', "is empty"),
    ("named list empty", '{"chat_template": []}', "empty list"),
    ("named list without names", '{"chat_template": [{"template": "x"}]}', "item 0 must be"),
    ("named list name not string", '{"chat_template": [{"name": 1, "template": "x"}]}', "item 0 must be"),
    ("named list template not string", '{"chat_template": [{"name": "default", "template": 2}]}', "item 0 must be"),
    ("named list of strings", '{"chat_template": ["x", "y"]}', "item 0 must be"),
    ("a name with a newline", '{"chat_template": [{"name": "good\\n::error::x", "template": "x"}]}',
     "a name with a control character"),
    ("a name twice", '{"chat_template": [{"name": "a", "template": "x"}, {"name": "a", "template": "y"}]}',
     "names two templates 'a'"),
    ("second item bad", '{"chat_template": [{"name": "default", "template": "x"}, {"name": "rag"}]}', "item 1 must be"),
    ("bos token number", '{"chat_template": "x", "bos_token": 1}', "'bos_token' should be a string"),
    ("eos token list", '{"chat_template": "x", "eos_token": ["</s>"]}', "'eos_token' should be a string"),
    ("eos added token without content", '{"chat_template": "x", "eos_token": {"id": 2}}', "'eos_token' should be a string"),
    ("deep nesting", "[" * 100_000 + "]" * 100_000, "JSON"),
]


@pytest.mark.parametrize("filename", ["tokenizer_config.json", "chat_template.json"])
@pytest.mark.parametrize("content,expected", [(c, e) for _, c, e in BAD_CONFIGS], ids=[n for n, _, _ in BAD_CONFIGS])
def test_malformed_config_file(tmp_path, filename, content, expected):
    path = tmp_path / filename
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TmplkitError) as info:
        sources.load(path)
    assert expected in _check(info.value, path)


@pytest.mark.parametrize("content,expected", [(c, e) for _, c, e in BAD_CONFIGS if e != "no 'chat_template' key"],
                         ids=[n for n, _, e in BAD_CONFIGS if e != "no 'chat_template' key"])
def test_malformed_config_in_a_model_folder(tmp_path, content, expected):
    (tmp_path / "tokenizer_config.json").write_text(content, encoding="utf-8")
    with pytest.raises(TmplkitError) as info:
        sources.load(tmp_path)
    _check(info.value, tmp_path)


def test_odd_files_and_folders(tmp_path):
    latin1 = tmp_path / "t.jinja"
    latin1.write_bytes(b"{{ 'caf\xe9' }}")
    with pytest.raises(SourceError) as info:
        sources.load(latin1)
    assert "not valid UTF-8 at byte 7" in _check(info.value, latin1)

    fifo = tmp_path / "pipe.jinja"
    os.mkfifo(fifo)
    with pytest.raises(SourceError) as info:
        sources.load(fifo)  # must not block waiting for a writer
    assert "not a regular file" in _check(info.value, fifo)
    json_fifo = tmp_path / "fifo-model" / "tokenizer_config.json"
    json_fifo.parent.mkdir()
    os.mkfifo(json_fifo)
    with pytest.raises(SourceError) as info:
        sources.load(json_fifo)
    assert "not a regular file" in _check(info.value, json_fifo)

    too_long = tmp_path / ("x" * 5000)
    with pytest.raises(SourceError, match="cannot use this path"):
        sources.load(too_long)

    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(SourceError) as info:
        sources.load(empty_dir)
    _check(info.value, empty_dir)

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    with pytest.raises(SourceError) as info:
        sources.load(model)
    assert "no chat template" in _check(info.value, model)

    (model / "chat_template.json").write_text('{"template": "x"}')
    with pytest.raises(SourceError) as info:
        sources.load(model)
    assert "expected an object with 'chat_template'" in _check(info.value, model)

    unknown = tmp_path / "weights.bin"
    unknown.write_bytes(b"\0" * 10)
    with pytest.raises(SourceError) as info:
        sources.load(unknown)
    assert "unknown kind of template source" in _check(info.value, unknown)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
_config = st.fixed_dictionaries({}, optional={
    "chat_template": _json | st.lists(st.fixed_dictionaries({}, optional={"name": _json, "template": _json}), max_size=3),
    "bos_token": _json, "eos_token": _json,
})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=st.one_of(_config, _json))
def test_fuzzed_configs_load_or_fail_cleanly(tmp_path, config):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    try:
        templates = sources.load(path)
    except TmplkitError as exc:
        _check(exc, path)
    else:
        assert templates and all(isinstance(t.text, str) and t.text.strip() for t in templates)


# --- the Hub, offline, with an empty or partial cache ---------------------------------------------


_LOADER = (
    "import sys\n"
    "from tmplkit import sources, TmplkitError\n"
    "try:\n"
    "    print(len(sources.load(sys.argv[1])))\n"
    "except TmplkitError as e:\n"
    "    print('ERROR', e); sys.exit(2)\n"
)


def _offline(hf_home: Path, spec: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-c", _LOADER, spec], env=env, capture_output=True, text=True, timeout=120)


def _cached_repo(root: Path, repo: str, files: dict[str, str], commit: str = "b" * 40) -> None:
    base = root / "hub" / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    for name, text in files.items():
        p = base / "snapshots" / commit / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_an_empty_source_is_refused_not_the_current_folder(tmp_path, monkeypatch):
    # (Path("") is "."; the library loaded every template of the current folder: an unset variable
    # as a source audited whatever lay there; a Path given is taken as it reads)
    (tmp_path / "a.jinja").write_text("{{ messages[0].content }}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match=r'is empty; give .*a folder \("\." for the current one\)'):
        sources.load("")
    assert [t.name for t in sources.load(".")] == ["a"]


def test_hub_offline_with_an_empty_cache(tmp_path):
    """Several specs in one interpreter each: a missing repo, a missing revision, a bad spec."""
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    code = (
        "import sys\n"
        "from tmplkit import sources, TmplkitError\n"
        "for spec in sys.argv[1:]:\n"
        "    try:\n"
        "        sources.load(spec); print('LOADED', spec)\n"
        "    except TmplkitError as e:\n"
        "        print('ERROR', e)\n"
    )
    specs = ["hf:acme/nothing", "hf:acme/nothing@v1.0", "hf:acme/nothing@" + "c" * 40, "hf:", "hf:acme",
             "hf:/x", "hf:a/b/c", "hf:acme/x@"]
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", code, *specs], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(specs), proc.stdout
    for spec, line in zip(specs, lines):
        assert line.startswith("ERROR "), line
        assert spec.rstrip("@") in line or spec in line, line
    assert "HF_HUB_OFFLINE" in lines[0] and "HF_HUB_OFFLINE" in lines[1]
    assert "hf:org/name" in lines[3] and "hf:org/name" in lines[4]


def test_hub_cached_repo_with_broken_files(tmp_path):
    _cached_repo(tmp_path, "acme/broken", {"tokenizer_config.json": "{not json"})
    _cached_repo(tmp_path, "acme/notemplate", {"tokenizer_config.json": '{"eos_token": "</s>"}'})
    for spec, expected in (("hf:acme/broken", "not valid JSON"), ("hf:acme/notemplate", "no chat template")):
        proc = _offline(tmp_path, spec)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout.startswith("ERROR") and expected in proc.stdout, proc.stdout
        assert "Traceback" not in proc.stderr


def test_cli_offline_missing_repo_is_one_line(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run([sys.executable, "-m", "tmplkit.cli", "show", "hf:acme/nothing"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tmplkit: error: hf:acme/nothing"), proc.stderr
