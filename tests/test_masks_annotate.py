"""`annotate_template` and the `mask` / `annotate` commands: the annotated copy renders
byte-identically and transformers' own mask on it equals tmplkit's; refusals are one line with
exit code 2; the mask command prints JSON (to_dict) or the highlighted render."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tmplkit.cli import main
from tmplkit.masks import AnnotationError, annotate_template, check_conversations, text_mask, transformers_mask
from tmplkit.session import for_server, load_conversation
from tmplkit.sources import ChatTemplate, load_one

pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "masks"
# (calls-before-text, analysis-dropped, header-closes-reasoning: turns that reason before their
# calls, a history rewritten once an answer follows, a reasoning block the user's turn closes, a
# system prompt only in the last user message)
NAMES = ["reasoning-kept", "reasoning-dropped", "header-ends-user", "think-open", "calls-before-text", "analysis-dropped",
         "header-closes-reasoning", "system-in-last-user", "think-block-last", "reasoning-steps"]


def template(name: str) -> ChatTemplate:
    return load_one(str(FIXTURES / f"{name}.jinja"))


@pytest.mark.parametrize("name", NAMES)
def test_annotated_copy_renders_the_same_and_transformers_masks_what_tmplkit_masks(name):
    t = template(name)
    annotated = annotate_template(t)
    assert re.search(r"\{%[-+]? generation [-+]?%\}", annotated.text) and annotated.text != t.text
    copy = ChatTemplate(annotated.text, t.name, t.source)
    checked = 0
    for c in check_conversations():
        server = for_server(t, c)
        try:
            ours = text_mask(t, server)
        except Exception:
            continue
        theirs, ranges = transformers_mask(annotated.text, server)
        assert theirs == ours.text == for_server(copy, c, inputs="transformers").render(add_generation_prompt=False)
        assert [r for r in ranges if r[1] > r[0]] == list(ours.ranges)
        checked += 1
    assert checked >= 2


# Our templates that each take one way of placing the tags (the annotated copy's telltale), and the
# masked text transformers must give on it: fixtures/masks/expected.json, written by hand.
PATHS = [("one-line-roles", "{% if m.role == 'assistant' %}{% generation"),  # a line every role's turn shares
         ("conditional-expression", "_tk_body"),  # the message loop's body captured
         ("end-in-next-message", "_tk_out"),  # start and end marks in different blocks
         ("string-built", "_tk_out"),  # marks inside the string the template builds
         ("tools-always", "{% generation")]  # proved on conversations shaped as the analysis found
EXPECTED = {k: v for k, v in json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8")).items()
            if not k.startswith("_")}


@pytest.mark.parametrize(("name", "telltale"), PATHS)
def test_each_way_of_placing_the_tags_gives_transformers_the_expected_mask(name, telltale):
    t = template(name)
    annotated = annotate_template(t)
    assert telltale in annotated.text and annotated.checked == len(check_conversations())
    for conv, expected in EXPECTED[name].items():
        server = for_server(t, load_conversation(FIXTURES / conv), inputs="transformers")  # (as a trainer renders)
        theirs, ranges = transformers_mask(annotated.text, server)
        assert theirs == server.render(add_generation_prompt=False)
        assert [theirs[a:b] for a, b in ranges if b > a] == [text for text, _ in expected]


def test_a_template_whose_own_tags_prove_is_kept_and_one_whose_tags_differ_is_retagged():
    own = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
           "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert annotate_template(ChatTemplate(own, "own", "-")).text == own
    wide = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<|im_start|>{{ m.role }}\n"
            "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
            "{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    retagged = annotate_template(ChatTemplate(wide, "wide", "-"))  # its own tags hold the header
    assert retagged.text != wide and "{% if true %}" in retagged.text


def run(capsys, *argv):
    code = main(["--no-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_annotate_command_writes_the_proved_copy(capsys, tmp_path):
    out = tmp_path / "annotated.jinja"
    code, _, err = run(capsys, "annotate", str(FIXTURES / "reasoning-kept.jinja"), "-o", str(out))
    assert code == 0 and "masks equal on" in err
    assert out.read_text(encoding="utf-8") == annotate_template(template("reasoning-kept")).text
    # -o - is standard output, as for every command (it was a traceback)
    code, stdout, err = run(capsys, "annotate", str(FIXTURES / "reasoning-kept.jinja"), "-o", "-")
    assert code == 0 and stdout == out.read_text(encoding="utf-8") and err.startswith("standard output: ")


def test_annotate_command_refuses_on_one_line_with_exit_2(capsys, tmp_path):
    tagged = tmp_path / "roleless.jinja"  # no role is written: no boundary is proven, no mask derived
    tagged.write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    out = tmp_path / "out.jinja"
    code, stdout, err = run(capsys, "annotate", str(tagged), "-o", str(out))
    assert code == 2 and stdout == "" and err.startswith("tmplkit: error: ") and err.count("\n") == 1
    assert not out.exists()
    code, _, err = run(capsys, "annotate", str(tmp_path / "missing.jinja"), "-o", str(out))
    assert code == 2 and err.count("\n") == 1


@pytest.fixture
def tokenizer_json(tmp_path) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()  # (as every byte-level tokenizer.json has: mask checks that it spells the delimiters)
    text = (FIXTURES / "reasoning-kept.jinja").read_text(encoding="utf-8") + (FIXTURES / "chat.json").read_text(encoding="utf-8")
    tok.train_from_iterator([text] * 5, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_mask_command_json_is_to_dict(capsys, tokenizer_json):
    code, out, _ = run(capsys, "mask", str(FIXTURES / "chat.json"), "--template", str(FIXTURES / "reasoning-kept.jinja"),
                       "--tokenizer", tokenizer_json)
    assert code == 0
    data = json.loads(out)
    assert data["schema_version"] == 1 and data["n_masked"] == sum(data["assistant_masks"]) > 0
    assert [t["rule"] for t in data["turns"]] == ["exact", "exact", "exact"]


def test_mask_command_text_highlights_only_with_colour(capsys, tokenizer_json, monkeypatch):
    args = ["mask", str(FIXTURES / "plain.json"), "--template", str(FIXTURES / "reasoning-kept.jinja"),
            "--tokenizer", tokenizer_json, "--format", "text"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and "\x1b[" not in out and "[[Hello.<|im_end|>]]" in out
    code, out, _ = run(capsys, *args, "--color", "always")
    assert "\x1b[1;32mHello.<|im_end|>\x1b[0m" in out
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in run(capsys, *args)[1]


def test_mask_command_bad_input_is_one_line(capsys, tmp_path, tokenizer_json):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "narrator", "content": "x"}]')
    code, out, err = run(capsys, "mask", str(FIXTURES / "reasoning-kept.jinja"), "--session", str(bad), "--tokenizer", tokenizer_json)
    assert code == 2 and out == "" and err.count("\n") == 1 and "narrator" in err
    code, _, err = run(capsys, "mask", str(tmp_path / "nope.jinja"), "--session", str(FIXTURES / "plain.json"),
                       "--tokenizer", tokenizer_json)
    assert code == 2 and err.count("\n") == 1


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["meta-llama-Llama-3.2-3B-Instruct", "Qwen3-Coder", "unsloth-gemma-3-270m-it"])
def test_corpus_templates_mask_each_turn_after_its_header(name, corpus_template):
    t = corpus_template(name)
    m = text_mask(t, FIXTURES / "plain.json" if "gemma" not in name else [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}])
    assert m.masked_text()[0].startswith("Hello.") and all(t.rule == "exact" for t in m.turns)
    assert "Hi" not in "".join(m.masked_text())


# Corpus templates whose turns reason before their calls, written in the ways the turns study reads
# from after the generation prompt: Gemma 4's calls before the text (interleaved), gpt-oss-20b's
# analysis before the answer, Qwen3.5-0.8B's text after reasoning that opens with the same sentence
# (the last two from the Hub corpus's development half).
@pytest.mark.corpus
@pytest.mark.parametrize("name", ["google-gemma-4-31B-it-interleaved", "unsloth-gpt-oss-20b", "Qwen-Qwen3.5-0.8B"])
def test_corpus_templates_that_reason_before_their_calls_annotate(name, corpus_template):
    t = corpus_template(name)
    annotated = annotate_template(t)
    server = for_server(t, check_conversations()[2])
    ours = text_mask(t, server)
    theirs, ranges = transformers_mask(annotated.text, server)
    assert theirs == ours.text and [r for r in ranges if r[1] > r[0]] == list(ours.ranges)
    # the tool-calling turn's mask holds its call
    assert any(("ls" in x and ("call" in x or "functions" in x or "tool" in x)) for x in ours.masked_text())


@pytest.mark.corpus
def test_the_mask_command_says_which_turns_learn_nothing():
    # Gemma 4 (thinking off) drops a turn's reasoning once a later user message comes and prints its
    # text after the tool results: no single stretch of the render is what the model generated, and
    # the summary says so rather than leaving those turns silently unlearned.
    from tmplkit.cli._mask import format_mask
    from tmplkit.masks import assistant_mask
    from tmplkit.sources.corpus import templates_dir

    class Chars:
        name = "chars"

        def tokenize_with_offsets(self, text):
            return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]

        def tokenize(self, text, *, add_bos=None):
            return [ord(c) for c in text]

        def detokenize(self, ids):
            return "".join(map(chr, ids))

    t = load_one(str(templates_dir() / "google-gemma-4-31B-it.jinja"))
    m = assistant_mask(t, Chars(), check_conversations()[4])
    dropped = [x.messages for x in m.turns if x.rule == "dropped"]
    assert dropped
    summary = format_mask(m, color=False).splitlines()[-1]
    assert f"nothing learned in {len(dropped)} turn(s)" in summary and f"{dropped[0][0]}..{dropped[0][1] - 1}" in summary


@pytest.mark.corpus
def test_the_summary_names_the_turns_learned_only_in_part():
    # Gemma 4, a turn with text and a tool call: the history moves the text after the tool
    # response, so the turn learns its call only (rule "history"); the summary was silent about it
    from tmplkit.cli._mask import format_mask
    from tmplkit.masks import text_mask
    from tmplkit.sources.corpus import templates_dir

    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}
    conv = [{"role": "user", "content": "List the files."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}, {"role": "assistant", "content": "One file."}]
    t = load_one(str(templates_dir() / "google-gemma-4-31B-it.jinja"))
    masked = text_mask(t, conv)
    partial = [x.messages for x in masked.turns if x.rule == "history"]
    assert partial == [(1, 2)] and "Let me look." not in "".join(masked.masked_text())

    class Result:  # (format_mask reads the text mask, its turns and the token mask)
        text, text_mask, turns, mask = masked.text, masked, masked.turns, [1]

    summary = format_mask(Result, color=False).splitlines()[-1]
    assert "1 turn(s) learned as the history writes them, which leaves out part of what the model generated there " \
           "(messages 1..1)" in summary


def test_a_template_without_proven_boundaries_is_refused():
    t = ChatTemplate("{% for m in messages %}{{ m.content }}\n{% endfor %}", "roleless", "-")
    with pytest.raises(AnnotationError, match="roleless"):
        annotate_template(t)


def test_mask_cli_notes_the_messages_the_render_leaves_out(capsys, tmp_path, tokenizer_json):
    # (the library's side: tests/test_masks.py)
    from test_masks import _LEFT_OUT

    session = tmp_path / "developer.json"
    session.write_text(json.dumps(_LEFT_OUT), encoding="utf-8")
    code, out, err = run(capsys, "mask", str(FIXTURES / "named-roles.jinja"), "--session", str(session),
                         "--tokenizer", tokenizer_json, "--format", "json")
    assert code == 0 and json.loads(out)["left_out"] == [0]
    assert "leaves out message 0 (developer)" in err and "as system" in err and err.count("\n") == 1
