"""Configuration: `[tool.tmplkit]` in pyproject.toml or a tmplkit.toml; flags override it; unknown
keys and bad values are one-line errors naming the file and the key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.cli.config import Config, find_config, load_config
from tmplkit.errors import InputError
from tmplkit.sources import corpus

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
FAILING = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder, the current folder, with two templates: one passing with a warning
    (llama3), one failing (nodelims)."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "llama3.jinja").write_text((FIXTURES / "llama3.jinja").read_text())
    (tmp_path / "templates" / "nodelims.jinja").write_text(FAILING)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- reading ------------------------------------------------------------------------------------

def test_every_key_of_a_tmplkit_toml(project):
    write(project / "expected.json", json.dumps({"nodelims": "no delimiters at all"}))
    path = write(project / "tmplkit.toml", """
sources = ["templates", "corpus:llama.cpp", "hf:org/name"]
fail-on = "warning"
tokenizer = "auto"
expected-failures = "expected.json"
[limits]
timeout = 5
memory = 512
jobs = 2
[tokenizers]
"llama3" = "vocab:llama-bpe"
"other" = "tok/tokenizer.json"
""")
    cfg = load_config(path)
    assert cfg.sources == ("templates", "corpus:llama.cpp", "hf:org/name")
    assert (cfg.fail_on, cfg.tokenizer, cfg.timeout, cfg.memory, cfg.jobs) == ("warning", "auto", 5.0, 512, 2)
    assert cfg.tokenizers == {"llama3": "vocab:llama-bpe", "other": str(Path("tok") / "tokenizer.json")}
    assert cfg.expected_failures == {"nodelims": "no delimiters at all"}
    assert cfg.to_dict()["path"] == str(path)


def test_expected_failures_as_a_table_and_paths_relative_to_the_file(project, monkeypatch):
    write(project / "pyproject.toml", """
[project]
name = "x"
[tool.tmplkit]
sources = ["templates/nodelims.jinja"]
[tool.tmplkit.expected-failures]
nodelims = "no delimiters at all"
""")
    sub = project / "deep" / "er"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert find_config() == project / "pyproject.toml"
    cfg = load_config()
    assert cfg.expected_failures == {"nodelims": "no delimiters at all"}
    # the source is the file next to pyproject.toml, wherever the command runs
    assert Path(cfg.sources[0]).resolve() == (project / "templates" / "nodelims.jinja").resolve()


def test_tmplkit_toml_first_and_a_pyproject_without_the_table_is_no_config(project):
    write(project / "pyproject.toml", "[project]\nname = 'x'\n")
    assert find_config(project) is None or find_config(project).parent != project
    write(project / "tmplkit.toml", "fail-on = 'warning'\n")
    write(project / "pyproject.toml", "[tool.tmplkit]\nfail-on = 'fail'\n")
    assert find_config(project) == project / "tmplkit.toml"
    assert load_config().fail_on == "warning"


@pytest.mark.parametrize(("text", "message"), [
    ("colour = 'red'\n", "unknown key 'colour' in the file; known keys: sources, fail-on, tokenizer"),
    ("[limits]\ntimeout = 1\nthreads = 2\n", "unknown key 'limits.threads' in [limits]"),
    ("fail-on = 'sometimes'\n", "'fail-on' must be one of fail, unchecked, warning, got 'sometimes'"),
    ("sources = 'templates'\n", "'sources' must be a list of strings, got 'templates'"),
    ("sources = 5\n", "'sources' must be a list of strings, got 5"),  # (it raised a TypeError)
    ("sources = true\n", "'sources' must be a list of strings, got True"),
    ("[limits]\ntimeout = -1\n", "'limits.timeout' must be a positive number, got -1"),
    ("[limits]\ntimeout = nan\n", "'limits.timeout' must be a positive number, got nan"),
    ("[limits]\njobs = 1.5\n", "'limits.jobs' must be a positive whole number, got 1.5"),
    ("[limits]\nmemory = true\n", "'limits.memory' must be a positive whole number, got True"),
    ("limits = 3\n", "'limits' must be a table of timeout, memory and jobs, got 3"),
    ("tokenizer = 3\n", "'tokenizer' must be a tokenizer"),
    ("[tokenizers]\nllama3 = 1\n", "'tokenizers' must be a table of template name = tokenizer"),
    ("[tokenizers]\nllama3 = 'auto'\n", "'tokenizers.llama3' must name a tokenizer"),
    ("expected-failures = 1\n", "'expected-failures' must be a JSON file name or a table"),
    ("expected-failures = 'missing.json'\n", "missing.json: cannot read"),
    ("fail-on = \n", "not valid TOML"),
])
def test_bad_configuration_is_one_line_naming_the_file_and_key(project, text, message):
    path = write(project / "tmplkit.toml", text)
    with pytest.raises(InputError) as e:
        load_config(path)
    text = str(e.value)
    assert "\n" not in text and message in text
    if "missing.json" not in message:
        assert text.startswith(f"{path}: ")


def test_unknown_key_in_pyproject_names_the_table(project):
    path = write(project / "pyproject.toml", "[tool.tmplkit]\nsource = ['x']\n")
    with pytest.raises(InputError, match=r"pyproject.toml: unknown key 'source' in \[tool.tmplkit\]"):
        load_config(path)


# ---- the command line: configuration, overridden by flags --------------------------------------

def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_audit_reads_sources_and_fail_on_from_the_configuration(project, capsys):
    write(project / "tmplkit.toml", """
sources = ["templates/llama3.jinja"]
fail-on = "warning"
""")
    code, out, _ = run(capsys, "audit", "--in-process")
    assert code == 1 and "llama3" in out and out.rstrip().endswith("-> FAILED")  # a warning fails
    assert run(capsys, "audit", "--in-process", "--fail-on", "fail")[0] == 0  # the flag overrides
    assert run(capsys, "audit", "--in-process", "--no-config", "templates/llama3.jinja")[0] == 0
    # sources on the command line replace the configuration's
    code, out, _ = run(capsys, "audit", "--in-process", "templates/nodelims.jinja")
    assert code == 1 and "nodelims" in out and "llama3" not in out


def test_expected_failures_with_reasons_from_the_configuration(project, capsys):
    write(project / "pyproject.toml", """
[tool.tmplkit]
sources = ["templates"]
[tool.tmplkit.expected-failures]
nodelims = "renders messages back to back, no delimiters"
""")
    code, out, _ = run(capsys, "audit", "--in-process")
    assert code == 0 and "IMPOSSIBLE (expected)" in out
    # --expected-failures FILE replaces the configuration's list
    write(project / "other.json", "{}")
    assert run(capsys, "audit", "--in-process", "--expected-failures", "other.json")[0] == 1


def test_config_flag_and_limits(project, capsys, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "ci.toml"
    write(elsewhere, "[limits]\njobs = 0\n")
    code, _, err = run(capsys, "audit", "--config", str(elsewhere), "templates")
    assert code == 2 and err == f"tmplkit: error: {elsewhere}: 'limits.jobs' must be a positive whole number, got 0\n"
    write(elsewhere, "[limits]\njobs = 1\ntimeout = 30\nmemory = 256\n")
    code, out, _ = run(capsys, "--config", str(elsewhere), "audit", "templates/llama3.jinja", "--format", "json")
    assert code == 0 and json.loads(out)["summary"]["templates"] == 1


def test_no_sources_anywhere_is_a_one_line_error(project, capsys):
    code, _, err = run(capsys, "audit")
    assert code == 2 and err.startswith("tmplkit: error: no template sources given") and err.count("\n") == 1


@pytest.mark.parametrize(("command", "text", "key", "needle"), [
    ("audit templates", "tokenizer = 'tk/missing.json'\n", "tokenizer", "tokenizer file not found"),
    ("audit templates", "[tokenizers]\nllama3 = 'tk/missing.gguf'\n", "tokenizers.llama3", "tokenizer file not found"),
    ("audit templates", "expected-failures = 'missing.json'\n", "expected-failures", "cannot read"),
    ("audit templates", "lock = 'missing.lock.json'\n", "lock", "no such lock"),
    ("audit", "sources = ['templates', 'missing.jinja']\n", "sources", "no such file"),
    ("table", "sources = ['missing.jinja']\n", "sources", "no such file"),
    ("lock", "sources = ['missing.jinja']\n", "sources", "no such file"),
])
def test_a_configured_value_that_names_nothing_names_the_configuration(project, capsys, monkeypatch, command, text,
                                                                       key, needle):
    # The user typed none of these: the one line says where the value came from, before any work.
    import tmplkit.auditing as audit_mod

    monkeypatch.setattr(audit_mod, "audit", lambda *a, **k: pytest.fail("analysed before the value was checked"))
    write(project / "tmplkit.toml", text)
    code, _, err = run(capsys, *command.split())
    assert code == 2 and err.count("\n") == 1 and needle in err, err
    assert err.rstrip().endswith(f"(from '{key}' in {project / 'tmplkit.toml'})"), err


def test_a_value_typed_is_not_blamed_on_the_configuration(project, capsys):
    write(project / "tmplkit.toml", "fail-on = 'fail'\n")
    code, _, err = run(capsys, "audit", "templates", "--tokenizer", "tk/missing.json")
    assert code == 2 and "tokenizer file not found" in err and "tmplkit.toml" not in err, err


def test_tokenizer_pairing_is_used_before_any_analysis(project, capsys, monkeypatch):
    # Without llama-cpp-python, a paired vocab: tokenizer only llama.cpp reads (SentencePiece) is
    # refused at once: the pairing was read.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    write(project / "tmplkit.toml", "[tokenizers]\nllama3 = 'vocab:phi-3'\n")
    code, _, err = run(capsys, "audit", "--in-process", "templates/llama3.jinja")
    assert code == 2 and "needs llama-cpp-python" in err


@pytest.mark.corpus
def test_tokenizer_pairing_runs_the_token_round_trip_of_paired_templates(project, capsys):
    pytest.importorskip("llama_cpp", reason="the corpus vocabs open through llama-cpp-python (the 'llama' extra)")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    (project / "templates" / "nodelims.jinja").unlink()
    write(project / "templates" / "chatml.jinja", (FIXTURES / "chatml.jinja").read_text())
    write(project / "tmplkit.toml", "[tokenizers]\nchatml = 'vocab:qwen35'\n")
    code, out, _ = run(capsys, "audit", "--in-process", "--format", "json", "templates")
    rows = {r["name"]: r for r in json.loads(out)["results"]}
    assert code == 0
    assert rows["chatml"]["token_round_trip"]["tokenizer"] == "vocab:qwen35"
    assert rows["chatml"]["token_round_trip"]["passed"] is True
    assert rows["llama3"]["token_round_trip"] is None  # not paired, and no default tokenizer


def test_empty_config_without_a_file():
    assert Config().to_dict()["path"] is None and Config().sources == ()


def test_a_configuration_past_a_mebibyte_is_refused_before_it_is_read(project, capsys):
    # (a 15 MB list of sources, under the 16 MiB cap then, took 46 s to check: a command that did not
    # even use them looked hung)
    from tmplkit.cli import main

    (project / "tmplkit.toml").write_text("sources = [" + '"chat.jinja",' * 100_000 + "]\n")
    assert main(["audit", "templates/llama3.jinja"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too big for a configuration (at most 1048576)" in err, err


def test_a_large_pyproject_of_another_project_is_not_read_as_a_configuration(project, capsys):
    """A pyproject.toml past the configuration's limit that has no tmplkit table is another project's
    file: found on the way up from the current folder, it stopped every command ("too big for a
    configuration"); one that does mention tmplkit is still refused."""
    from tmplkit.cli import main

    big = "[project]\nname = 'other'\n[tool.other]\nwords = [" + '"padding",' * 120_000 + "]\n"
    (project / "pyproject.toml").write_text(big)
    assert main(["audit", "-q", "templates/llama3.jinja"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    (project / "pyproject.toml").write_text(big + "[tool.tmplkit]\nsources = []\n")
    assert main(["audit", "templates/llama3.jinja"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "too big for a configuration" in err, err
