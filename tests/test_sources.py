"""Loading templates from every kind of source, and the errors for bad sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit import GGUFError, SourceError, sources
from tmplkit.sources.gguf_meta import GGUF_MAGIC, GGUFValueType, Keys

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_value_type_codes_match_gguf_package():
    import gguf

    assert GGUF_MAGIC == gguf.GGUF_MAGIC
    assert {t.name: t.value for t in GGUFValueType} == {t.name: t.value for t in gguf.GGUFValueType}


def test_metadata_keys_match_gguf_package():
    import gguf

    names = [n for n in vars(Keys.Tokenizer) if n.isupper() and n != "PREFIX"]
    assert names
    assert {n: getattr(Keys.Tokenizer, n) for n in names} == {n: getattr(gguf.Keys.Tokenizer, n) for n in names}
    assert Keys.Tokenizer.LIST.startswith(Keys.Tokenizer.PREFIX)


def test_gguf_chat_templates_list_is_not_a_template(write_gguf, tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "listed.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_chat_template([{"name": "default", "template": CHATML}, {"name": "rag", "template": "RAG"}])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from tmplkit.sources.gguf_meta import read_metadata

    assert Keys.Tokenizer.CHAT_TEMPLATES in read_metadata(path, lambda k: True)  # the list of names is there
    assert [t.name for t in sources.load(path)] == ["listed", "listed:rag"]


def test_gguf_default_and_named_templates_with_bos_eos(write_gguf):
    path = write_gguf(template=CHATML, named={"tool_use": "TOOLS {{ messages }}", "rag": "RAG"})
    got = sources.load(path)
    assert [t.name for t in got] == ["model", "model:rag", "model:tool_use"]
    assert got[0].text == CHATML
    assert (got[0].bos_token, got[0].eos_token) == ("<s>", "</s>")
    assert all(t.source == str(path) for t in got)


def test_a_gguf_without_a_template_still_gives_its_special_tokens(write_gguf):
    # a server's model may carry no template (engine-parity takes the template from elsewhere)
    from tmplkit.sources.templates import gguf_special_tokens

    path = write_gguf(template=None)
    assert gguf_special_tokens(path) == ("<s>", "</s>")
    with pytest.raises(SourceError, match="no chat template"):
        sources.load(path)

def test_gguf_large_sparse_file_reads_only_metadata(write_gguf):
    # A 20 GB model: the tensor region is a sparse hole that must never be read.
    path = write_gguf(template=CHATML)
    with open(path, "r+b") as f:
        f.truncate(20 * 1024**3)
    assert sources.load(path)[0].text == CHATML


def test_gguf_without_template(write_gguf):
    path = write_gguf(template=None)
    with pytest.raises(SourceError, match="has no chat template") as exc:
        sources.load(path)
    assert str(path) in str(exc.value)


def test_gguf_truncated_and_not_gguf(write_gguf, tmp_path):
    path = write_gguf(template=CHATML)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFError, match="truncated|corrupted"):
        sources.load(cut)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        sources.load(fake)


@pytest.mark.corpus
def test_real_vocab_gguf_templates():
    from tmplkit.sources import corpus

    qwen = sources.load(corpus.vocab_path("qwen35"))
    assert qwen[0].bos_token == "<|endoftext|>" and "<|im_start|>" in qwen[0].text
    names = [t.name for t in sources.load(corpus.vocab_path("command-r"))]
    assert names == ["ggml-vocab-command-r", "ggml-vocab-command-r:rag", "ggml-vocab-command-r:tool_use"]


def test_missing_and_unknown_sources(tmp_path):
    with pytest.raises(SourceError, match="no such file or folder"):
        sources.load(tmp_path / "nope.gguf")
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"x")
    with pytest.raises(SourceError, match="unknown kind of template source"):
        sources.load(odd)
    with pytest.raises(SourceError, match="unknown corpus"):
        sources.load("corpus:nothing")
    with pytest.raises(SourceError, match="corpus:: no corpus named; give corpus:llama.cpp"):  # (it loaded llama.cpp's)
        sources.load("corpus:")
    # one template of a corpus, written as hf:org/name is: what to give instead (before: "unknown corpus")
    with pytest.raises(SourceError, match=r"names no template; give corpus:llama.cpp --name Qwen3.5-4B$"):
        sources.load("corpus:llama.cpp/Qwen3.5-4B")
    with pytest.raises(SourceError, match="unknown corpus"):
        sources.load("corpus:nothing/Qwen3.5-4B")


def test_jinja_file_and_folder_of_templates(tmp_path):
    (tmp_path / "b.jinja").write_text(CHATML)
    (tmp_path / "a.jinja").write_text("{{ messages[0].content }}")
    (tmp_path / "notes.md").write_text("not a template")
    got = sources.load(tmp_path)
    assert [t.name for t in got] == ["a", "b"]
    assert sources.load(tmp_path / "b.jinja")[0].text == CHATML
    bad = tmp_path / "bad.jinja"
    bad.write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(SourceError, match="not valid UTF-8"):
        sources.load(bad)


def test_tokenizer_config_string_and_named_list(tmp_path):
    model = tmp_path / "org-model"
    model.mkdir()
    cfg = model / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": CHATML, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    (t,) = sources.load(cfg)
    assert (t.name, t.text, t.bos_token, t.eos_token) == ("org-model", CHATML, "<s>", "</s>")
    cfg.write_text(json.dumps({"chat_template": [{"name": "default", "template": CHATML},
                                                 {"name": "tool_use", "template": "T"}]}))
    assert [t.name for t in sources.load(model)] == ["org-model", "org-model:tool_use"]


def test_one_template_of_a_source_is_its_default_and_a_folder_of_several_needs_a_name(tmp_path):
    # (the first was taken: a list with "default" second read its "tool_use", and `diff old/ new/`
    # compared the first file of each folder and said "no change in behaviour")
    cfg = tmp_path / "m" / "tokenizer_config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": CHATML}]}))
    assert sources.load_one(cfg.parent).text == CHATML
    assert sources.load_one(cfg.parent, "tool_use").text == "T"
    cfg.write_text(json.dumps({"chat_template": [{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]}))
    with pytest.raises(SourceError, match=r"holds 2 templates and none is the default \(m:a, m:b\); give --name"):
        sources.load_one(cfg)
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a.jinja").write_text("A")
    assert sources.load_one(folder).text == "A"  # (one template is the default)
    (folder / "b.jinja").write_text(CHATML)
    with pytest.raises(SourceError, match=r"holds 2 templates and none is the default \(a, b\); give --name"):
        sources.load_one(folder)
    assert sources.load_one(folder, "b").text == CHATML


def test_model_folder_precedence_and_additional_templates(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "OLD", "eos_token": "<e>"}))
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    extra = tmp_path / "additional_chat_templates"
    extra.mkdir()
    (extra / "rag.jinja").write_text("RAG")
    got = sources.load(tmp_path)
    assert [(t.name.split(":")[-1], t.text, t.eos_token) for t in got] == [
        (tmp_path.name, CHATML, "<e>"), ("rag", "RAG", "<e>")]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"chat_template": 5}', "must be a string or a list"),
    ('{"chat_template": [{"template": "x"}]}', "item 0 must be"),
    ('{"other": 1}', "no 'chat_template' key"),
])
def test_malformed_json_sources(tmp_path, content, message):
    path = tmp_path / "chat_template.json"
    path.write_text(content)
    with pytest.raises(SourceError, match=message):
        sources.load(path)


def _hf_cache(root: Path, repo: str, files: dict[str, str], commit: str = "a" * 40) -> None:
    # The layout huggingface_hub's cache uses: refs/<branch> -> commit, snapshots/<commit>/files.
    base = root / "hub" / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    for name, text in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_text(text)


def _load_offline(hf_home: Path, spec: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    code = ("import sys, json; from tmplkit import sources, TmplkitError\n"
            "try:\n    print(json.dumps([[t.name, t.text, t.eos_token] for t in sources.load(sys.argv[1])]))\n"
            "except TmplkitError as e:\n    print('ERROR', e); sys.exit(2)")
    return subprocess.run([sys.executable, "-c", code, spec], env=env, capture_output=True, text=True, timeout=60)


def test_hf_repo_from_local_cache_offline(tmp_path):
    _hf_cache(tmp_path, "acme/chat-7b", {
        "tokenizer_config.json": json.dumps({"eos_token": "<|end|>"}),
        "chat_template.jinja": CHATML,
        "additional_chat_templates/tool_use.jinja": "TOOLS",
    })
    proc = _load_offline(tmp_path, "hf:acme/chat-7b")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [["chat-7b", CHATML, "<|end|>"], ["chat-7b:tool_use", "TOOLS", "<|end|>"]]


def test_hf_unknown_repo_or_revision_offline(tmp_path):
    _hf_cache(tmp_path, "acme/chat-7b", {"chat_template.jinja": CHATML})
    for spec in ("hf:acme/missing", "hf:acme/chat-7b@v9"):
        proc = _load_offline(tmp_path, spec)
        assert proc.returncode == 2
        assert proc.stdout.startswith("ERROR") and "HF_HUB_OFFLINE" in proc.stdout and "Traceback" not in proc.stderr
    with pytest.raises(SourceError, match="hf:org/name"):
        sources.load("hf:not-a-repo")


def test_a_corpus_folder_left_empty_is_not_a_fetched_corpus(tmp_path, monkeypatch):
    # (`corpus fetch` said done on empty folders; every later command then failed obscurely)
    from tmplkit.sources import corpus

    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path))
    for sub in ("templates", "vocab"):
        (corpus.corpus_dir() / sub).mkdir(parents=True)
    (corpus.hub_dir() / "templates").mkdir(parents=True)
    assert not corpus.is_fetched() and not corpus.is_hub_fetched()
    (corpus.corpus_dir() / "templates" / "x.jinja").write_text("{{ 1 }}")
    (corpus.corpus_dir() / "vocab" / "ggml-vocab-x.gguf").write_bytes(b"GGUF")
    (corpus.hub_dir() / "templates" / "y.jinja").write_text("{{ 1 }}")
    assert corpus.is_fetched() and corpus.is_hub_fetched()


def test_corpus_fetch_checks_the_cache_against_its_manifest_and_fetches_a_damaged_one_again(tmp_path, monkeypatch):
    # (`corpus fetch`, "download and verify", said done on a cache whose template was garbage and
    # whose vocabulary was junk: it looked only for a file of each kind)
    from tmplkit.sources import corpus

    monkeypatch.setenv("TMPLKIT_CACHE", str(tmp_path))
    folder = corpus.corpus_dir()
    for sub in ("templates", "vocab"):
        (folder / sub).mkdir(parents=True)
    (folder / "templates" / "x.jinja").write_text("{{ 1 }}")
    (folder / "vocab" / "ggml-vocab-x.gguf").write_bytes(b"GGUF")
    assert corpus.cache_problem(folder) == "it has no readable manifest of its files"
    corpus._write_manifest(folder)
    assert corpus.cache_problem(folder) is None
    fetched = []
    monkeypatch.setattr(corpus, "_fetch_package", lambda target, *a: fetched.append(target) or target)
    assert corpus.fetch() == folder and fetched == []  # (whole: nothing downloaded)
    (folder / "templates" / "x.jinja").write_text("garbage {{")
    assert corpus.cache_problem(folder) == "templates/x.jinja was changed"
    (folder / "templates" / "y.jinja").write_text("{{ 2 }}")
    assert corpus.cache_problem(folder) == "templates/x.jinja was changed"
    (folder / "templates" / "x.jinja").write_text("{{ 1 }}")
    assert corpus.cache_problem(folder) == "templates/y.jinja was added"
    (folder / "templates" / "y.jinja").unlink()
    (folder / "vocab" / "ggml-vocab-x.gguf").unlink()
    (folder / "vocab" / "ggml-vocab-z.gguf").write_bytes(b"GGUF")
    assert corpus.cache_problem(folder) == "vocab/ggml-vocab-x.gguf is missing"
    assert corpus.fetch() == folder and fetched == [folder]  # (damaged: fetched again)


def test_a_name_no_template_has_lists_twenty_of_a_large_source(tmp_path):
    # (a folder of hundreds of templates listed every name on the one line)
    for i in range(25):
        (tmp_path / f"t{i:02d}.jinja").write_text("{{ messages[0].content }}")
    with pytest.raises(SourceError) as info:
        sources.load_one(str(tmp_path), "nope")
    message = str(info.value)
    assert message.endswith("no template named 'nope'; it has: " + ", ".join(f"t{i:02d}" for i in range(20)) + ", ...")


@pytest.mark.parametrize("call", ["render", "render_with_prompt", "analyze", "analyze_isolated", "audit", "text_mask", "assistant_mask",
                                  "session_requests", "study_turns"])
def test_a_template_given_as_text_is_named_where_the_library_takes_a_chattemplate(call, qwen35):
    """A template's text (or a path as a string) where a ChatTemplate goes: each public entry says
    what it got and how to make one (an AttributeError deep inside before, or the text read as a
    session)."""
    import tmplkit

    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    calls = {
        "render": lambda t: tmplkit.render(t, chat),
        "render_with_prompt": lambda t: tmplkit.sandbox.render_with_prompt(t, chat),
        "analyze": lambda t: tmplkit.analyze(t),
        "analyze_isolated": lambda t: tmplkit.analyze_isolated([t], jobs=1),
        "audit": lambda t: tmplkit.audit([t]),
        "text_mask": lambda t: tmplkit.text_mask(t, chat),
        "assistant_mask": lambda t: tmplkit.assistant_mask(t, qwen35, chat),
        "session_requests": lambda t: tmplkit.session_requests(chat, t),
        "study_turns": lambda t: tmplkit.study_turns(t, chat),
    }
    with pytest.raises(TypeError, match=r"^expected a ChatTemplate, got str: give tmplkit.load_one\(PATH\)"):
        calls[call](CHATML)
    calls[call](sources.ChatTemplate(CHATML, "chatml", "-"))  # (the same call with one: no TypeError)
