"""The paths a command is given, checked before it works: an output that is one of its inputs, an
output given twice, standard input given twice, `-o -`; and the shape of a usage error (one line,
like every other error), a configuration that is not UTF-8, template variables a render sets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
CHATML = ROOT / "fixtures" / "templates" / "chatml.jinja"
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture()
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(CHATML, tmp_path / "in.jinja")
    (tmp_path / "conv.json").write_text(json.dumps(CHAT), encoding="utf-8")
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["--no-config", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *words) -> bool:
    return code == 2 and err.startswith("tmplkit") and err.count("\n") == 1 and all(w in err for w in words)


@pytest.mark.parametrize("argv", [
    ("audit", "in.jinja", "-o", "in.jinja"),
    ("table", "in.jinja", "-o", "./in.jinja"),  # another spelling of the same file
    ("show", "in.jinja", "-o", "in.jinja"),
    ("audit", "in.jinja", "--report", "json:in.jinja"),
    ("lock", "in.jinja", "--lock", "in.jinja", "--fresh"),
    ("annotate", "in.jinja", "-o", "in.jinja"),
    ("audit", ".", "-o", "in.jinja"),  # a template the folder source reads
    ("audit", "in.jinja", "-o", "in.jinja/"),  # a path spelled as a folder: it replaced in.jinja
    ("lock", "in.jinja", "-o", "./in.jinja/."),
    ("audit", "model", "-o", "model/additional_chat_templates/tool_use.jinja"),  # found only by loading
    ("mask", "in.jinja", "--session", "conv.json", "--tokenizer", "vocab:qwen35", "-o", "conv.json"),
    # the file a tokenizer folder loads (the mask replaced tok/tokenizer.json)
    ("mask", "in.jinja", "--session", "conv.json", "--tokenizer", "tok", "-o", "tok/tokenizer.json"),
    ("spans", "in.jinja", "--session", "conv.json", "--tokenizer", "gguf/", "-o", "./gguf/vocab.gguf"),
])
def test_an_output_that_is_an_input_is_refused_and_left_as_it_was(here, capsys, argv):
    (here / "tok").mkdir()
    (here / "tok" / "tokenizer.json").write_text("{}", encoding="utf-8")
    (here / "gguf").mkdir()
    (here / "gguf" / "vocab.gguf").write_bytes(b"GGUF")
    (here / "model" / "additional_chat_templates").mkdir(parents=True)
    shutil.copy(CHATML, here / "model" / "chat_template.jinja")
    shutil.copy(CHATML, here / "model" / "additional_chat_templates" / "tool_use.jinja")
    before = {p: p.read_bytes() for p in here.rglob("*") if p.is_file()}
    code, out, err = run(capsys, *argv)
    if argv[-1].endswith(("/", ".")):
        assert one_line_error(code, err, "the path names a folder")
    else:
        assert one_line_error(code, err, "also what the command reads", "give another path")
    assert {p: p.read_bytes() for p in here.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("argv", [("server", "log", "-", "-o", "in.log"), ("audit", "-", "-o", "in.log")])
def test_an_output_that_standard_input_is_redirected_from_is_refused(here, argv):
    # (`tmplkit server log - -o a.log < a.log` replaced the log with its report: `-` was never
    # compared with the outputs)
    log = (ROOT / "fixtures" / "server-logs" / "0.3.36-cold-lv3.log").read_bytes()
    (here / "in.log").write_bytes(log if argv[0] == "server" else CHATML.read_bytes())
    before = (here / "in.log").read_bytes()
    with open(here / "in.log", "rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", *argv], stdin=stdin,
                              capture_output=True, text=True, timeout=120)
    assert one_line_error(done.returncode, done.stderr, "in.log: it is also what the command reads", "standard input")
    assert (here / "in.log").read_bytes() == before
    # redirected from the same file, another output is written
    with open(here / "in.log", "rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", *argv[:-1], "out.txt"], stdin=stdin,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (here / "out.txt").read_text(encoding="utf-8").strip()


@pytest.mark.parametrize("setting,argv", [
    ('sources = ["in.jinja"]', ("audit", "-o", "in.jinja")),
    ('lock = "my.lock.json"', ("audit", "in.jinja", "-o", "my.lock.json")),
    ('expected-failures = "ef.json"', ("table", "in.jinja", "-o", "ef.json")),
    ('sources = ["in.jinja"]', ("audit", "-o", "tmplkit.toml")),  # the configuration itself
    ('tokenizer = "tok"', ("audit", "in.jinja", "-o", "tok/tokenizer.json")),  # the file a tokenizer folder loads
    ('[tokenizers]\nin = "tok"', ("table", "in.jinja", "-o", "tok/tokenizer.json")),
])
def test_an_output_that_the_configuration_names_is_refused_and_left_as_it_was(here, capsys, setting, argv):
    (here / "tok").mkdir()
    (here / "tok" / "tokenizer.json").write_text("{}", encoding="utf-8")
    (here / "my.lock.json").write_text("{}", encoding="utf-8")
    (here / "ef.json").write_text("{}", encoding="utf-8")
    (here / "tmplkit.toml").write_text(setting + "\n", encoding="utf-8")
    before = {p: p.read_bytes() for p in here.rglob("*") if p.is_file()}
    code = main(["--config", "tmplkit.toml", *argv])
    err = capsys.readouterr().err
    assert one_line_error(code, err, "also what the command reads", "give another path"), err
    assert {p: p.read_bytes() for p in here.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("argv", [
    ("schema", "audit", "-o", "tmplkit.toml"), ("session", "generate", "-o", "./tmplkit.toml"),
    ("turns", str(CHATML), "-o", "tmplkit.toml"), ("annotate", str(CHATML), "-o", "tmplkit.toml"),
    ("spans", str(CHATML), "--session", "c.json", "--tokenizer", "vocab:qwen35", "-o", "sub/../tmplkit.toml"),
])
def test_the_configuration_found_is_no_output_of_a_command_that_does_not_read_it(here, capsys, argv):
    # (these commands wrote over it: they read no setting, yet it is the project's)
    (here / "sub").mkdir()
    (here / "tmplkit.toml").write_text('fail-on = "warning"\n', encoding="utf-8")
    (here / "c.json").write_text('[{"role": "user", "content": "hi"}]', encoding="utf-8")
    code = main(list(argv))
    assert one_line_error(code, capsys.readouterr().err, "tmplkit.toml: it is also what the command reads")
    assert (here / "tmplkit.toml").read_text(encoding="utf-8") == 'fail-on = "warning"\n'
    # a file of that name where no configuration is found, or with --no-config, is any output
    assert main(["schema", "audit", "-o", "sub/tmplkit.toml"]) == 0
    assert main(["--no-config", "schema", "audit", "-o", "tmplkit.toml"]) == 0


def test_standard_input_in_the_configuration_is_refused_not_waited_on(here, capsys):
    # (every command read it at once: `show` waited on standard input for expected failures)
    (here / "tmplkit.toml").write_text('expected-failures = "-"\n', encoding="utf-8")
    code = main(["--config", "tmplkit.toml", "show", "in.jinja"])
    assert one_line_error(code, capsys.readouterr().err, "'expected-failures' names standard input (-)", "give a file")


def test_a_symlink_to_an_input_is_that_input(here, capsys):
    (here / "link.md").symlink_to(here / "in.jinja")
    code, _, err = run(capsys, "audit", "in.jinja", "-o", "link.md")
    assert one_line_error(code, err, "also what the command reads")
    assert (here / "in.jinja").read_bytes() == CHATML.read_bytes()


def test_an_output_beside_the_templates_of_a_folder_is_written(here, capsys):
    code, _, _ = run(capsys, "audit", ".", "-o", "report.md")
    assert code == 0 and (here / "report.md").is_file()


@pytest.fixture()
def folders(here):
    """`d`, a folder of templates, and `model`, a model folder with an `additional_chat_templates/`."""
    (here / "d").mkdir()
    shutil.copy(CHATML, here / "d" / "chatml.jinja")
    (here / "model" / "additional_chat_templates").mkdir(parents=True)
    shutil.copy(CHATML, here / "model" / "chat_template.jinja")
    return here


@pytest.mark.parametrize("argv", [
    ("lock", "d", "-o", "d/new.jinja"),  # the lock, a JSON file, read as a template the next run
    ("lock", "d", "--lock", "d/new.j2"),
    ("table", "d", "-o", "d/table.jinja2"),
    ("audit", "d", "--report", "json:d/report.JINJA"),
    ("audit", "in.jinja", "d", "-o", "d/report.jinja"),  # (the folder is one source of two)
    ("show", "d", "-o", "d/shown.jinja"),
    ("diff", "in.jinja", "d", "-o", "d/diff.jinja"),  # (diff's B)
    ("table", "d", "-o", "d/tokenizer_config.json"),  # it would make d a model folder
    ("audit", "model", "-o", "model/chat_template.json"),
    ("audit", "model", "-o", "model/additional_chat_templates/report.jinja"),
    ("annotate", "d", "-o", "d/tokenizer_config.json"),  # a template, read as the model folder's configuration
    ("annotate", "d", "-o", "d/chat_template.jinja"),  # it would make d a model folder of this template alone
])
def test_an_output_a_folder_source_would_read_as_a_template_is_refused_before_any_work(folders, capsys, argv):
    before = {p: p.read_bytes() for p in folders.rglob("*") if p.is_file()}
    code, out, err = run(capsys, *argv)
    assert one_line_error(code, err, "is a folder the command reads templates from", "the next run"), err
    assert out == "" and "annotated" not in err
    assert {p: p.read_bytes() for p in folders.rglob("*") if p.is_file()} == before


def test_an_output_a_configured_folder_source_would_read_is_refused(folders, capsys):
    (folders / "tmplkit.toml").write_text('sources = ["d"]\n', encoding="utf-8")
    code = main(["--config", "tmplkit.toml", "lock", "-o", "d/new.jinja"])
    assert one_line_error(code, capsys.readouterr().err, "the template source d", "the next run")
    assert sorted(p.name for p in (folders / "d").iterdir()) == ["chatml.jinja"]


@pytest.mark.parametrize("lock, argv, words", [
    ("d/new.jinja", ("lock", "d"), ("the next run", "(from 'lock' in")),  # the lock read as a template of the folder
    ("in.jinja", ("lock", "in.jinja", "--fresh"), ("also what the command reads", "(from 'lock' in")),
    ("d/new.jinja", ("lock",), ("the template source d", "the next run")),  # (the configured source d too)
])
def test_a_lock_only_the_configuration_names_is_checked_as_lock_o_is(folders, capsys, lock, argv, words):
    (folders / "tmplkit.toml").write_text(f'sources = ["d"]\nlock = "{lock}"\n', encoding="utf-8")
    before = {p: p.read_bytes() for p in folders.rglob("*") if p.is_file()}
    code = main(["--config", "tmplkit.toml", *argv, "--in-process"])
    err = capsys.readouterr().err
    assert one_line_error(code, err, *words), err
    assert {p: p.read_bytes() for p in folders.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("argv, written", [
    (("table", "d", "-o", "d/table.md"), "d/table.md"),
    (("audit", "model", "-o", "model/notes.jinja"), "model/notes.jinja"),  # a model folder reads chat_template.jinja only
    (("lock", "d", "-o", "elsewhere.jinja"), "elsewhere.jinja"),  # (a name alone is no harm outside the folder)
])
def test_an_output_a_folder_source_does_not_read_is_written(folders, capsys, argv, written):
    code, _, err = run(capsys, *argv)
    assert code == 0 and (folders / written).is_file(), err


def test_annotate_may_add_a_template_to_the_folder_it_reads_but_not_replace_one(folders, capsys):
    pytest.importorskip("transformers")
    # (a model folder's chat_template.jinja is where transformers reads the annotated copy from)
    (folders / "hf").mkdir()
    (folders / "hf" / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML.read_text()}),
                                                          encoding="utf-8")
    code, _, err = run(capsys, "annotate", "hf", "-o", "hf/chat_template.jinja")
    assert code == 0 and "{% generation %}" in (folders / "hf" / "chat_template.jinja").read_text(), err
    code, _, err = run(capsys, "annotate", "hf", "-o", "hf/chat_template.jinja")
    assert one_line_error(code, err, "also what the command reads")


@pytest.mark.parametrize("argv", [
    ("annotate", "d/chatml.jinja", "-o", "d/chat_template.jinja"),  # (one file of the folder given, not the folder)
    ("audit", "in.jinja", "--format", "json", "-o", "d/tokenizer_config.json"),
    ("session", "generate", "--tokens", "300", "-o", "d/chat_template.json"),
])
def test_no_command_makes_a_folder_of_templates_one_models_folder(folders, capsys, argv):
    # (annotate wrote d/chat_template.jinja: the next `tmplkit audit d` read that one file, and passed)
    shutil.copy(CHATML, folders / "d" / "other.jinja")
    code, _, err = run(capsys, *argv)
    assert one_line_error(code, err, "would make it one model's folder", "2 templates (chatml.jinja, other.jinja)"), err
    assert sorted(p.name for p in (folders / "d").iterdir()) == ["chatml.jinja", "other.jinja"]
    code, out, err = run(capsys, "audit", "d")
    assert code == 0 and "2 templates" in out + err


@pytest.mark.parametrize("source", ["hf", "hf/tokenizer_config.json"])
@pytest.mark.parametrize("name", [None, "hf:tool_use"])
def test_annotate_does_not_put_a_chat_template_jinja_in_place_of_a_model_folders_named_templates(folders, capsys, name,
                                                                                                 source):
    pytest.importorskip("transformers")
    # (transformers and the folder loader read chat_template.jinja before the JSON's list: the
    # folder's default would become this copy and the list's other templates would be read no more)
    (folders / "hf").mkdir()
    listed = [{"name": "default", "template": CHATML.read_text()}, {"name": "tool_use", "template": CHATML.read_text() + " "}]
    (folders / "hf" / "tokenizer_config.json").write_text(json.dumps({"chat_template": listed}), encoding="utf-8")
    code, _, err = run(capsys, "annotate", source, *(["--name", name] if name else []), "-o", "hf/chat_template.jinja")
    assert one_line_error(code, err, "takes the place of the templates its JSON files hold (hf, hf:tool_use)",
                          "additional_chat_templates/NAME.jinja")
    assert not (folders / "hf" / "chat_template.jinja").exists()


def test_every_argument_that_names_a_template_source_is_one_the_output_check_knows():
    import argparse

    from tmplkit.cli import build_parser
    from tmplkit.cli._outputs import _TEMPLATE_SOURCES

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for nested in action.choices.values():
                    yield from parsers(nested)

    named = {a.dest for p in parsers(build_parser()) for a in p._actions if a.metavar in ("SOURCE", "A", "B")}
    assert named and named <= set(_TEMPLATE_SOURCES)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_report_that_cannot_be_written_leaves_every_other_output_as_it_was(here, capsys):
    (here / "b.md").write_text("old", encoding="utf-8")
    code, out, err = run(capsys, "audit", "in.jinja", "-o", "b.md", "--report", "json:a.json", "--report", "junit:/dev/full")
    assert one_line_error(code, err, "/dev/full", "cannot write")
    assert (here / "b.md").read_text(encoding="utf-8") == "old" and not (here / "a.json").exists()
    code, out, err = run(capsys, "audit", "in.jinja", "--report", "json:/dev/full")
    assert one_line_error(code, err, "/dev/full") and out == ""  # (standard output after the files, not before)


def test_a_model_runs_outputs_are_written_all_or_none(here, capsys):
    from types import SimpleNamespace

    from tmplkit.cli._common import emit_model_run

    result = SimpleNamespace(to_markdown=lambda: "| run |\n", to_dict=lambda: {"run": 1})
    args = SimpleNamespace(plot=None, format="markdown", output="out.md")
    with pytest.raises(InputError, match="missing/r.json"):
        emit_model_run(result, args, [("json", "r.json"), ("json", "missing/r.json")], None)
    assert not (here / "out.md").exists() and not (here / "r.json").exists()
    emit_model_run(result, args, [("json", "r.json")], None)
    assert (here / "out.md").read_text() == "| run |\n" and json.loads((here / "r.json").read_text()) == {"run": 1}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_model_runs_plot_is_written_with_its_other_outputs_all_or_none(here):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from tmplkit.cli._common import emit_model_run
    from tmplkit.replay import ReplayedRequest, SessionReplay, replay_png

    reqs = {"tmplkit": tuple(ReplayedRequest(k, 100 * (k + 1), 100 * k, 100, None, 100, 0.01, 0.0, 5) for k in range(2))}
    rep = SessionReplay("m.gguf", "t", {"kind": "swa"}, reqs, (100, 90))
    (here / "p.png").write_bytes(b"old plot")
    args = SimpleNamespace(plot="p.png", format="markdown", output="out.md")
    with pytest.raises(InputError, match="/dev/full"):  # (the plot is no longer written first)
        emit_model_run(rep, args, [("json", "/dev/full")], replay_png)
    assert (here / "p.png").read_bytes() == b"old plot" and not (here / "out.md").exists()
    emit_model_run(rep, args, [("json", "r.json")], replay_png)
    assert (here / "p.png").read_bytes()[:4] == b"\x89PNG" and (here / "out.md").exists()


def test_two_outputs_to_one_file_are_refused_but_dev_null_twice_is_fine(here, capsys):
    code, _, err = run(capsys, "audit", "in.jinja", "-o", "same.txt", "--report", "json:same.txt")
    assert one_line_error(code, err, "given as two outputs")
    assert not (here / "same.txt").exists()
    code, _, _ = run(capsys, "audit", "in.jinja", "-o", "/dev/null", "--report", "json:/dev/null")
    assert code == 0


def test_an_output_named_twice_in_two_spellings_is_one_file(here, capsys):
    # (`-o a.txt -o ./a.txt` was refused as given twice, where `--lock x.json -o ./x.json` was one)
    (here / "link.txt").symlink_to(here / "a.txt")
    for twice in (("-o", "a.txt", "-o", "./a.txt"), ("-o", "a.txt", "--output", "link.txt")):
        code, _, err = run(capsys, "audit", "in.jinja", "--in-process", *twice)
        assert code == 0 and "1 template: 1 pass" in (here / "a.txt").read_text(encoding="utf-8"), err
    code, _, err = run(capsys, "audit", "in.jinja", "-o", "a.txt", "-o", "b.txt")
    assert one_line_error(code, err, "given twice", "a.txt", "b.txt")


@pytest.mark.corpus
def test_a_cached_tokenizer_named_or_chosen_by_auto_is_not_replaced_by_the_output(here, capsys, monkeypatch):
    # (`--tokenizer vocab:qwen35 -o <its cached GGUF>` wrote the JSON over the corpus's vocabulary,
    # as did `--tokenizer auto` where it chose that file): a private copy of the corpus, so that a
    # failure here spoils no other test's cache
    from tmplkit.sources import corpus

    cache = here / "cache"
    own = cache / corpus.corpus_dir().name
    (own / "vocab").mkdir(parents=True)
    (own / "templates").mkdir()
    shutil.copy(corpus.vocab_path("qwen35"), own / "vocab")
    shutil.copy(corpus.templates_dir() / "Qwen3.5-4B.jinja", own / "templates")
    monkeypatch.setenv("TMPLKIT_CACHE", str(cache))
    gguf = own / "vocab" / "ggml-vocab-qwen35.gguf"
    before = gguf.read_bytes()
    for argv in (("spans", "in.jinja", "--tokenizer", "vocab:qwen35"),
                 ("spans", "corpus:llama.cpp", "--name", "Qwen3.5-4B", "--tokenizer", "auto"),
                 ("audit", "corpus:llama.cpp", "--tokenizer", "auto")):
        code, _, err = run(capsys, *argv, *(("--session", "conv.json") if argv[0] == "spans" else ()), "-o", str(gguf))
        # (refused as the tokenizer read, or before that as a file no report replaces: a GGUF model)
        assert (one_line_error(code, err, "it is also what the command reads", "vocab:qwen35")
                or one_line_error(code, err, "ggml-vocab-qwen35.gguf: a GGUF model, not an output")), err
        assert gguf.read_bytes() == before


def test_a_hub_tokenizer_named_without_hf_is_not_replaced_by_the_output(here, capsys, monkeypatch):
    # (a bare ORG/NAME reads the Hub cache as hf:ORG/NAME does; only the hf: spelling was protected,
    # and `spans --tokenizer org/name -o <its cached tokenizer.json>` wrote over it, exit 0)
    pytest.importorskip("huggingface_hub")
    cache = here / "hub"
    snapshot = cache / "models--org--name" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (cache / "models--org--name" / "refs").mkdir()
    (cache / "models--org--name" / "refs" / "main").write_text("abc123")
    cached = snapshot / "tokenizer.json"
    cached.write_text('{"model": {}}')
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    for spec in ("org/name", "hf:org/name"):
        code, _, err = run(capsys, "spans", "in.jinja", "--session", "conv.json", "--tokenizer", spec, "-o", str(cached))
        assert one_line_error(code, err, "it is also what the command reads"), err
        assert cached.read_text() == '{"model": {}}'


def corpus_vocab_path():
    from tmplkit.sources import corpus

    return corpus.vocab_path("qwen35")


@pytest.mark.corpus
def test_an_input_file_named_twice_in_two_spellings_is_one_file(here, capsys):
    # (`--session conv.json --session ./conv.json` was refused as given twice, as were --lock and
    # --config so, where -o took them as one; --memory-model swa:512 and swa:0512 are one model too)
    (here / "link.json").symlink_to(here / "conv.json")
    for twice in (("--session", "conv.json", "--session", "./conv.json"), ("--session", "conv.json", "--session", "link.json")):
        code, out, err = run(capsys, "spans", "in.jinja", *twice, "--tokenizer", "vocab:qwen35")
        assert code == 0 and json.loads(out)["n_tokens"] > 0, err
    (here / "tmplkit.toml").write_text('sources = ["in.jinja"]\n', encoding="utf-8")
    code = main(["--config", "tmplkit.toml", "show", "in.jinja", "--config", "./tmplkit.toml"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("# in:"), err
    code, _, err = run(capsys, "turns", "in.jinja", "--session", "conv.json", "--memory-model", "swa:512",
                       "--memory-model", "swa:0512", "--tokenizer", "vocab:qwen35", "--no-switches")
    assert code == 0, err
    # a tokenizer file in two spellings too; a spec that names no file there is compared as given
    shutil.copy(corpus_vocab_path(), here / "q.gguf")
    code, out, err = run(capsys, "spans", "in.jinja", "--session", "conv.json", "--tokenizer", "q.gguf", "--tokenizer", "./q.gguf")
    assert code == 0, err
    code, _, err = run(capsys, "spans", "in.jinja", "--session", "conv.json", "--tokenizer", "vocab:qwen35", "--tokenizer",
                       "./vocab:qwen35")
    assert one_line_error(code, err, "given twice")
    # two files, or two models, are still two values
    (here / "other.json").write_text(json.dumps(CHAT), encoding="utf-8")
    code, _, err = run(capsys, "spans", "in.jinja", "--session", "conv.json", "--session", "other.json", "--tokenizer", "vocab:qwen35")
    assert one_line_error(code, err, "given twice", "conv.json", "other.json")
    code, _, err = run(capsys, "turns", "in.jinja", "--memory-model", "swa:512", "--memory-model", "swa:256")
    assert one_line_error(code, err, "given twice", "swa:512", "swa:256")


def test_the_lock_named_twice_is_refused(here, capsys):
    code, _, err = run(capsys, "lock", "in.jinja", "--lock", "a.json", "-o", "b.json")
    assert one_line_error(code, err, "given twice", "a.json", "b.json")
    assert not (here / "a.json").exists() and not (here / "b.json").exists()


@pytest.mark.parametrize("twice", [("-o", "x.json", "--lock", "./x.json"), ("--lock", "x.json", "-o", "sub/../x.json"),
                                   ("-o", "x.json", "--output", "link.json")])
def test_the_lock_named_twice_in_two_spellings_is_one_file(here, capsys, twice):
    (here / "sub").mkdir()
    (here / "x.json").write_text('{"schema_version": 1, "templates": {}}', encoding="utf-8")
    (here / "link.json").symlink_to(here / "x.json")
    code, _, err = run(capsys, "lock", "in.jinja", *twice, "--in-process", "--fresh")
    assert code == 0 and "in.jinja" in (here / "x.json").read_text(encoding="utf-8"), err
    code, _, err = run(capsys, "lock", "in.jinja", "--lock", "x.json", "-o", "sub/x.json")
    assert one_line_error(code, err, "given twice", "x.json", "sub/x.json")


def test_standard_input_twice_is_refused(here, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", open(here / "conv.json"))
    code, _, err = run(capsys, "spans", "-", "--session", "-", "--tokenizer", "vocab:qwen35")
    assert one_line_error(code, err, "standard input (-) is given twice")


def test_dash_is_standard_output_and_an_empty_path_is_refused(here, capsys):
    code, out, _ = run(capsys, "audit", "in.jinja", "-o", "-")
    assert code == 0 and "1 pass" in out and not (here / "-").exists()
    code, _, err = run(capsys, "audit", "in.jinja", "-o", "")
    assert one_line_error(code, err, "the path is empty")


@pytest.mark.parametrize("argv, words", [
    (("audit", "in.jinja", "--format", "bogus"), ("--format", "invalid choice", "see tmplkit audit --help")),
    (("server",), ("the subcommand, one of delimiters, log",)),
    (("corpus",), ("ACTION, one of fetch, path",)),
    ((), ("the subcommand, one of audit",)),
    (("spans", "in.jinja"), ("missing: --tokenizer",)),
])
def test_a_usage_error_is_one_line_naming_what_is_missing(here, capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert one_line_error(code, err, *words) and "usage:" not in err and out == ""


def test_a_configuration_that_is_not_utf8_is_one_line(here, capsys):
    (here / "tmplkit.toml").write_bytes(b'sources = ["\xff"]\n')
    code = main(["audit", "in.jinja"])
    err = capsys.readouterr().err
    assert one_line_error(code, err, "tmplkit.toml", "not UTF-8")


def test_a_configuration_saved_with_a_byte_order_mark_says_so(here, capsys):
    # (it was "not valid TOML (Invalid statement (at line 1, column 1))", where nothing is to see)
    (here / "tmplkit.toml").write_bytes(b'\xef\xbb\xbfsources = ["in.jinja"]\n')
    code = main(["audit", "in.jinja"])
    err = capsys.readouterr().err
    assert one_line_error(code, err, "tmplkit.toml: starts with a byte order mark (BOM)", "save it as UTF-8 without one")


def test_a_lock_named_onto_a_file_that_is_no_json_says_to_give_it_its_own_path(here, capsys):
    # (`lock in.jinja -o in.jinja`-like slips onto another template said "fix the JSON")
    shutil.copy(CHATML, here / "other.jinja")
    before = (here / "other.jinja").read_bytes()
    code, _, err = run(capsys, "lock", "in.jinja", "-o", "other.jinja")
    assert one_line_error(code, err, "other.jinja: not a behaviour lock (not JSON)", "a path of its own")
    assert "fix the JSON" not in err and (here / "other.jinja").read_bytes() == before
    (here / "data.bin").write_bytes(b"\xff\xfe\x00binary")  # (it said "save the file as UTF-8")
    code, _, err = run(capsys, "lock", "in.jinja", "-o", "data.bin")
    assert one_line_error(code, err, "data.bin: not a behaviour lock (not JSON)", "a path of its own"), err
    # --fresh replaces a lock of any layout, not such a file (it wrote over them)
    for name in ("other.jinja", "data.bin"):
        before = (here / name).read_bytes()
        code, _, err = run(capsys, "lock", "--in-process", "in.jinja", "-o", name, "--fresh")
        assert one_line_error(code, err, f"{name}: not a behaviour lock", "a path of its own"), err
        assert (here / name).read_bytes() == before
    (here / "broken.json").write_text("{", encoding="utf-8")  # (a lock's own JSON broken: fix it)
    code, _, err = run(capsys, "lock", "in.jinja", "-o", "broken.json")
    assert one_line_error(code, err, "broken.json: not valid JSON", "fix the JSON")


def test_template_variables_a_render_sets_are_refused(here, capsys):
    code, _, err = run(capsys, "turns", "in.jinja", "--template-kwargs", '{"messages": 1}')
    assert one_line_error(code, err, "template variables messages", "leave them out")


@pytest.mark.parametrize("content, words", [
    ('"str"', "no list of results"),
    ("{", "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "nested"),
    ('{"results": [{"template": "a", "server": {"status": "ok", "route": "autoparser", "delimiters": [1]}}]}',
     "template 'a' is not as the command writes it"),
    # (a delimiter edited into a number ended `turns` in "failed in its worker: AttributeError", blaming the template)
    ('{"results": [{"template": "a", "server": {"status": "ok", "route": "autoparser", "delimiters": '
     '[{"role": "user", "delimiter": 5}]}}]}', "template 'a' is not as the command writes it (each delimiter a role and a string)"),
    ('{"results": [{"template": "a", "server": {"status": "ok", "route": "autoparser", "delimiters": '
     '[{"role": null, "delimiter": "<u>"}]}}]}', "template 'a' is not as the command writes it"),
    # (each was taken, the template then left out as if the server had refused it, or kept with
    # delimiters the command never writes)
    ('{"schema_version": 2, "results": []}', "a saved result of layout 2, not this tmplkit's (1)"),
    ('{"schema_version": true, "results": []}', "a saved result of layout True, not this tmplkit's (1)"),
    ('{"results": [{"template": "a", "server": {"status": "ok", "route": "bogus"}}]}',
     "template 'a': the route 'bogus' is not known here"),
    ('{"results": [{"template": "a", "server": {"status": "ok", "route": "specialized", "handler": "Nope"}}]}',
     "template 'a': llama-server's handler 'Nope' is not known here"),
    ('{"results": [{"template": "a", "server": {"status": "ok", "route": "specialized", "handler": "LFM2", '
     '"delimiters": [{"role": 5, "delimiter": null}]}}]}', "template 'a' is not as the command writes it"),
])
def test_a_saved_server_delimiters_file_of_another_shape_is_one_line(tmp_path, content, words):
    from tmplkit.server_rules import load_server_delimiters

    path = tmp_path / "d.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="write one with") as e:
        load_server_delimiters(path)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_lock_written_to_a_device_keeps_nothing_and_a_non_lock_says_fresh(here, capsys):
    # (`lock -o /dev/null` read the device as an old lock and was refused; a JSON file that is no
    # lock was told to be written with the very command that had just failed)
    code, _, err = run(capsys, "lock", "--in-process", "in.jinja", "-o", "/dev/null")
    assert code == 0 and "wrote /dev/null" in err
    (here / "l.json").write_text('{"schema_version": 0, "templates": []}', encoding="utf-8")  # (a lock, damaged)
    code, _, err = run(capsys, "lock", "--in-process", "in.jinja", "-o", "l.json")
    assert one_line_error(code, err, "not a behaviour lock", "--lock l.json --fresh`")
    assert run(capsys, "lock", "--in-process", "in.jinja", "-o", "l.json", "--fresh")[0] == 0


def test_a_lock_is_never_written_over_json_of_another_kind(here, capsys):
    # (`lock -o s.json` said to write it with `--lock s.json --fresh`, which then replaced the session;
    # so for a list of expected failures)
    for name, content in (("s.json", '[{"role": "user", "content": "hi"}]'), ("x.json", '{"chat": "a known failure"}')):
        (here / name).write_text(content, encoding="utf-8")
        for fresh in ((), ("--fresh",)):
            code, _, err = run(capsys, "lock", "--in-process", "in.jinja", "-o", name, *fresh)
            assert one_line_error(code, err, f"{name}: not a behaviour lock (it holds other JSON)", "a path of its own"), err
            assert "--fresh`" not in err and (here / name).read_text(encoding="utf-8") == content


@pytest.mark.parametrize("argv", [("audit", "in.jinja"), ("table", "in.jinja"), ("schema", "audit"),
                                  ("session", "generate"), ("diff", "in.jinja", "in.jinja")])
def test_an_output_is_never_written_over_a_model_or_another_binary_file(here, capsys, argv):
    # (`-o model.gguf` replaced a 25 MB model with a page of text, exit 0)
    model = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 8
    (here / "model.gguf").write_bytes(model)
    (here / "blob.bin").write_bytes(b"text first\x00then binary")
    for name in ("model.gguf", "blob.bin"):
        code, _, err = run(capsys, *argv, "-o", name)
        assert one_line_error(code, err, f"{name}: a", "not an output of this command", "a path of its own"), err
    assert (here / "model.gguf").read_bytes() == model
    (here / "old.txt").write_text("an older report\n", encoding="utf-8")  # (a text file is an output's, replaced)
    code, _, err = run(capsys, *argv, "-o", "old.txt")
    assert code in (0, 1) and (here / "old.txt").read_text(encoding="utf-8") != "an older report\n", err
