"""Shared test helpers. Tests never touch the network; real data comes from the pinned corpus."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tmplkit.sources import corpus

# Child processes (the workers' forkserver, which Python 3.11 starts without the parent's
# sys.path, and the CLI run as a subprocess) import this checkout's package, from whatever
# folder a test changed to, not another copy installed in the environment.
_ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

# The commands the tests start get Ctrl-C at its default, as a terminal starts them: a suite run in
# the background of a script (SIGINT ignored) would hand them the ignore, which tmplkit rightly keeps,
# and its Ctrl-C tests would fail or pass without interrupting anything.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    # Tests that need the pinned corpus skip with a clear reason when it is not fetched.
    if corpus.is_fetched():
        return
    skip = pytest.mark.skip(reason="llama.cpp corpus not in the cache; run `tmplkit corpus fetch`")
    for item in items:
        if "corpus" in item.keywords:
            item.add_marker(skip)


def _corpus_vocab(name: str):
    """The corpus's vocab-only GGUF `name` as a tokenizer; skips when llama_cpp or the corpus is missing."""
    from tmplkit.tokens.tokenizers import load_tokenizer

    pytest.importorskip("llama_cpp")
    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    return load_tokenizer(f"vocab:{name}")


@pytest.fixture(scope="session")
def qwen35():
    """The qwen35 vocabulary (Qwen3.5 / Qwen3-Coder templates put tool responses inside user turns)."""
    return _corpus_vocab("qwen35")


@pytest.fixture(scope="session")
def phi3():
    """The phi-3 vocabulary (a BOS-adding SentencePiece vocab)."""
    return _corpus_vocab("phi-3")


@pytest.fixture(scope="session")
def corpus_template():
    """Load a template by name from the llama.cpp corpus, or else from the Hub corpus's development
    half (skips when that is not fetched): tests name only templates of the development half where
    the llama.cpp corpus shares a name with the held-out half."""
    from tmplkit.sources import load_one

    def load(name: str):
        path = corpus.templates_dir() / f"{name}.jinja"
        if not path.is_file():
            if not corpus.is_hub_fetched():
                pytest.skip("the Hub corpus is not in the cache; run `tmplkit corpus fetch hub`")
            path = corpus.hub_templates_dir() / f"{name}.jinja"
        return load_one(str(path))

    return load


@pytest.fixture
def write_gguf(tmp_path):
    """Write a small GGUF with a vocabulary and the given chat templates; returns its path."""
    import gguf

    def make(name="model.gguf", template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
             named=None, tokens=("<unk>", "<s>", "</s>", "hello"), bos=1, eos=2):
        path = tmp_path / name
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_tokenizer_model("llama")
        w.add_token_list(list(tokens))
        if bos is not None:
            w.add_bos_token_id(bos)
        if eos is not None:
            w.add_eos_token_id(eos)
        if template is not None:
            w.add_string("tokenizer.chat_template", template)
        for key, text in (named or {}).items():
            w.add_string(f"tokenizer.chat_template.{key}", text)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    return make


@pytest.fixture(scope="session")
def matches_schema():
    """`check(name, data)`: validate `data` against the shipped JSON Schema `name` (tmplkit/schemas)."""
    import jsonschema

    from tmplkit.schemas import load_schema

    def check(name: str, data) -> bool:
        jsonschema.Draft202012Validator(load_schema(name)).validate(data)
        return True

    return check


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    """A folder with a small byte-level BPE tokenizer.json trained here, with ChatML's two special
    tokens (for the tests of the Hugging Face tokenizer path and of the outputs it feeds)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = ["hello world user assistant <tool_response>\nresult\n", "ünïcødé text 😀",
             "system user assistant tool hello world result Be brief.\n"]
    tok.train_from_iterator(texts * 20, trainer)
    folder = tmp_path_factory.mktemp("tiny")
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="session")
def llama_server_path():
    """The pinned llama-server binary, or a skip that says how to build it (with the corpus the
    server tests render from)."""
    pytest.importorskip("llama_cpp")
    from tmplkit.server.process import llama_server_binary

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    path = llama_server_binary()
    if path is None:
        pytest.skip("llama-server is not built: run `bash scripts/build_llama_server.sh` "
                    "(one CMake target from the pinned sdist) or set TMPLKIT_LLAMA_SERVER")
    return path
