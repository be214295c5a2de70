"""One vocabulary of options across commands (tmplkit/cli/_common.py's VOCABULARY, listed in
docs/cli.md): every command's --help uses it, the old spellings still work for a release with one
line on stderr, and the global options are taken after every subcommand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tmplkit.cli import build_parser, main
from tmplkit.cli._common import VOCABULARY, session_of, template_and_session

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
CHATML = str(FIXTURES / "chatml.jinja")
LOGS = ROOT / "fixtures" / "server-logs"
FORMATS = {"text", "summary", "markdown", "json", "csv", "junit", "github"}
# Spellings the vocabulary replaced: none may show in any --help.
OLD = ("--json FILE", "--add-generation-prompt", "CONVERSATION", "SESSION.json", "{auto,text,json}", "table,json", "swa:N|recurrent (default")


def commands():
    """(name, parser) of every command, the nested ones (`server log`) included."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, p in sub.choices.items():
        nested = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            yield from ((f"{name} {n}", q) for n, q in nested[0].choices.items())
        else:
            yield name, p


def shown(p):
    """The actions --help shows."""
    return [a for a in p._actions if a.help != argparse.SUPPRESS]


@pytest.mark.parametrize("name, p", list(commands()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_help_uses_the_vocabulary(name, p):
    text = p.format_help()
    assert not [o for o in OLD if o in text], name
    for a in shown(p):
        flags = set(a.option_strings)
        if a.dest in ("source", "sources") or "--template" in flags:
            assert a.metavar == "SOURCE", name
        if "--session" in flags:
            assert a.metavar == "FILE", name
        if "--tokenizer" in flags:
            assert a.metavar == "PATH|auto", name
        if "--format" in flags:
            assert a.metavar == "FORMAT", name
            old = p.get_default("_format_aliases") or {}
            assert {c for c in a.choices if c not in old} <= FORMATS, (name, a.choices)
        if "--timeout" in flags:
            assert a.metavar == "SECONDS" and a.type is float, name
        if "--memory" in flags:  # (turns: a memory model given the old way too, until 0.4)
            assert a.metavar == "MB" and (a.type is int or a.type.__name__ == "mb_or_old_model"), name
            # (one limit, one meaning: every worker's allowance is counted from its start-up footprint)
            assert "beyond its start-up footprint" in " ".join(a.help.split()), name
        if "--report" in flags:
            assert a.metavar == "FORMAT:FILE" and isinstance(a, argparse._AppendAction), name
        if "--settings" in flags:
            assert a.metavar == "LIST", name
        if any("generation-prompt" in f for f in flags):
            assert flags == {"--generation-prompt", "--no-generation-prompt"}, name
        assert "--json" not in flags, name
    # the global options, after the (sub)command too
    for flag in ("-q", "-v", "--color", "--config", "--no-config"):
        assert any(flag in a.option_strings for a in p._actions), (name, flag)


def test_each_thing_has_one_spelling_across_commands():
    """The template positional or --template SOURCE; the conversation always --session FILE."""
    for name, p in commands():
        positional = [a.metavar for a in shown(p) if not a.option_strings]
        assert not {"CONVERSATION", "SESSION.json", "SESSION"} & set(positional), name
    takes = {name for name, p in commands() if any("--tokenizer" in a.option_strings for a in p._actions)}
    assert takes >= {"audit", "spans", "mask", "request", "turns", "server log"}
    timed = {name for name, p in commands() if any("--timeout" in a.option_strings for a in p._actions)}
    assert timed >= {"audit", "table", "show", "turns", "annotate", "mask", "spans", "request", "server log"}
    limited = {name for name, p in commands() if any("--memory" in a.option_strings and a.metavar == "MB" for a in p._actions)}
    assert limited >= {"audit", "show", "annotate", "mask", "spans", "request", "server log", "turns"}


def test_docs_cli_lists_the_vocabulary_once():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for what, (spelling, _) in VOCABULARY.items():
        row = f"| {what} | `{spelling.replace('|', chr(92) + '|')}` |"  # a pipe in a cell is escaped
        assert text.count(row) == 1, row


# ---- old spellings: still accepted for a release, with one line on stderr ----------------------------------

@pytest.mark.parametrize("argv, dest, value, new", [
    (["prefill", "gemma", "--session", "s.json", "--json", "x.json"], "report", ["json:x.json"], "--report json:FILE"),
    (["replay", "gemma", "--session", "s.json", "--json", "x.json"], "report", ["json:x.json"], "--report json:FILE"),
    (["spans", CHATML, "--session", "c.json", "--tokenizer", "t", "--add-generation-prompt"], "add_generation_prompt",
     True, "--generation-prompt"),
    (["turns", CHATML, "--memory", "recurrent"], "memory", "recurrent", "--memory-model"),
    (["prefill", "gemma", "--session", "s.json", "--policy", "gated"], "settings", "gated", "--settings LIST"),
])
def test_an_old_option_still_works_with_a_note(argv, dest, value, new, capsys):
    args = build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert getattr(args, dest) == value
    assert err.count("\n") == 1 and err.startswith("tmplkit: note: ") and "deprecated" in err and new in err


def test_an_old_format_name_still_works_with_a_note(capsys):
    from tmplkit.cli._common import format_of

    args = build_parser().parse_args(["server", "delimiters", CHATML, "--format", "table"])
    assert format_of(args) == "markdown"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--format table is deprecated" in err and "--format markdown" in err


@pytest.mark.parametrize("command", ["spans", "mask", "request"])
def test_the_old_template_option_and_positional_conversation_still_work(command, capsys):
    old = build_parser().parse_args([command, "chat.json", "--template", CHATML, "--tokenizer", "t"])
    assert template_and_session(old, command) == (CHATML, "chat.json")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"use tmplkit {command} SOURCE --session CONVERSATION" in err
    new = build_parser().parse_args([command, CHATML, "--session", "chat.json", "--tokenizer", "t"])
    assert template_and_session(new, command) == (CHATML, "chat.json") and capsys.readouterr().err == ""


def test_an_old_spelling_with_an_error_is_the_error_alone_and_its_note_comes_once_the_work_is_done(capsys):
    # (the note, then the error: two lines for bad input; a note is said after the work, once)
    code = main(["--no-config", "spans", "chat.json", "--template", CHATML, "--session", "chat.json", "--tokenizer", "t"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("tmplkit: error: give the template once"), err
    chat = str(Path(CHATML).parent.parent / "masks" / "chat.json")
    code = main(["--no-config", "spans", chat, "--template", CHATML, "--tokenizer", "vocab:qwen35", "-o", "/dev/null"])
    err = capsys.readouterr().err
    assert code == 0 and err.count("\n") == 1 and err.startswith("tmplkit: note: tmplkit spans --template SOURCE"), err


def test_a_note_is_said_where_the_work_was_done_and_found_a_template_that_refuses(capsys):
    # (`turns` exits 2 where a template refuses the session, after its report: the note was lost)
    gemma = str(Path(CHATML).parent / "gemma.jinja")
    code = main(["--no-config", "turns", CHATML, gemma, "--memory", "swa:512", "--tokenizer", "vocab:qwen35", "-j", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and "chatml: " in out, err
    assert "tmplkit: error: gemma: cannot render the session" in err and err.count("\n") == 2
    assert "tmplkit: note: " in err and "--memory-model" in err


@pytest.mark.parametrize("command", ["prefill", "replay"])
def test_the_old_positional_session_still_works(command, capsys):
    args = build_parser().parse_args([command, "gemma", "s.json"])
    assert session_of(args, command) == "s.json"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--session s.json" in err


def test_a_missing_session_is_one_line(capsys):
    assert main(["--no-config", "spans", CHATML, "--tokenizer", "vocab:qwen35"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs --session FILE" in err


# ---- global options after nested subcommands, and --tokenizer auto --------------------------------------

def test_quiet_verbose_and_color_after_nested_subcommands(capsys, tmp_path):
    out = tmp_path / "s.json"
    assert main(["--no-config", "session", "generate", "--tokens", "300", "-o", str(out), "-q", "--color", "never"]) == 0
    assert json.loads(out.read_text())["messages"]
    assert main(["--no-config", "server", "log", str(LOGS / "0.3.36-cold-lv3.log"), "-v", "--color", "always"]) == 0
    assert "1 task;" in capsys.readouterr().out


def test_tokenizer_auto_without_a_known_vocabulary_is_one_line(capsys, tmp_path):
    conv = tmp_path / "c.json"
    conv.write_text('[{"role": "user", "content": "hi"}]')
    for command in ("spans", "request", "mask"):
        assert main(["--no-config", command, CHATML, "--session", str(conv), "--tokenizer", "auto"]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--tokenizer auto: no tokenizer known for template 'chatml'" in err


@pytest.mark.corpus
def test_tokenizer_auto_finds_the_corpus_vocabulary(capsys, tmp_path):
    from tmplkit.sources import corpus

    if not corpus.is_fetched():
        pytest.skip("the llama.cpp corpus is not fetched (tmplkit corpus fetch)")
    pytest.importorskip("tokenizers")
    conv = tmp_path / "c.json"
    conv.write_text('[{"role": "user", "content": "hi"}]')
    src = str(corpus.templates_dir() / "Qwen3.5-4B.jinja")
    assert main(["--no-config", "spans", src, "--session", str(conv), "--tokenizer", "auto"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert main(["--no-config", "spans", src, "--session", str(conv), "--tokenizer", "vocab:qwen35"]) == 0
    assert json.loads(capsys.readouterr().out) == auto


# ---- table: a gate as audit is (issue item 9) -----------------------------------------------------------------

def test_table_fails_on_templates_that_did_not_pass_and_says_why(capsys, tmp_path):
    bad = str(FIXTURES / "same-text.jinja")
    assert main(["--no-config", "table", "--jobs", "1", CHATML, bad]) == 1
    out, err = capsys.readouterr()
    rows = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert rows[0].endswith("| why not |")
    (row,) = [r for r in rows if r.startswith("| same-text |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] != "pass" and cells[2:8] == ["-"] * 6 and cells[-1]  # no unproven delimiter, a reason
    assert "FAILED" in err
    listed = tmp_path / "expected.json"
    listed.write_text(json.dumps({"same-text": "renders the same text whatever the messages"}))
    assert main(["--no-config", "table", "--jobs", "1", CHATML, bad, "--expected-failures", str(listed)]) == 0
    assert r"| chatml | pass | `<\|im_start\|>user\n` |" in capsys.readouterr().out  # a template that passed keeps them


def test_an_option_is_given_whole_never_a_prefix_of_another(capsys):
    # (`turns T --template '{...}'` was read as --template-kwargs: prefill's --template is the template)
    with pytest.raises(SystemExit) as exit_:
        main(["--no-config", "turns", str(CHATML), "--template", '{"enable_thinking": false}'])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "unrecognized arguments: --template" in err, err


def test_a_misspelt_option_is_named_before_the_required_one_it_misspells(capsys):
    # (before: "missing: --tokenizer" for `--tokenizr`, the typo never named)
    for argv, says in ((["spans", CHATML, "--tokenizr", "vocab:qwen35", "--session", "s.json"], "unrecognized arguments: --tokenizr;"),
                       (["annotate", CHATML, "--outptu=x.json"], "unrecognized arguments: --outptu=x.json;"),
                       (["--no-config", "-q", "spans", CHATML, "--session", "-"], "missing: --tokenizer;"),
                       (["server", "log", "--format", "json"], "missing: LOG;"),
                       # options argparse takes, beside the missing one: that one is named
                       (["spans", CHATML, "-ofoo.json"], "missing: --tokenizer;"),
                       (["spans", CHATML, "-qv"], "missing: --tokenizer;"),
                       (["spans", CHATML, "--timeout", "-.5"], "missing: --tokenizer;"),
                       (["spans", CHATML, "--name", "-x y"], "missing: --tokenizer;"),
                       (["diff", CHATML, "-j2"], "missing: B;"),
                       (["diff", "--", "--a.jinja"], "missing: B;"),
                       (["server", "--tokenizr"], "missing: ")):
        with pytest.raises(SystemExit) as exc:  # (argparse's exit, as every usage error)
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and says in err and err.count("\n") == 1, err
    # (what the command line said is not read by a later parse in the same process)
    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["spans", CHATML])
    assert "missing: --tokenizer" in capsys.readouterr().err


# ---- one word for each format, option and usage across commands ------------------------------------------

def test_text_is_the_format_for_a_person_in_every_command():
    """`--format text` was refused by the five commands whose report for a person is a markdown table."""
    from tmplkit.cli._common import reports_of

    takes_format = [(name, p) for name, p in commands() if any("--format" in a.option_strings for a in p._actions)]
    assert len(takes_format) >= 11
    for name, p in takes_format:
        (fmt,) = [a for a in p._actions if "--format" in a.option_strings]
        if "markdown" in fmt.choices and "text" not in fmt.choices:
            assert fmt.type("text") == "markdown" and "markdown (or text)" in fmt.help, name
    for argv in (["prefill", "gemma", "--session", "s.json"], ["replay", "gemma", "--session", "s.json"],
                 ["engine-parity", CHATML], ["server", "delimiters", CHATML], ["table", CHATML]):
        args = build_parser().parse_args([*argv, "--format", "text"])
        assert args.format == "markdown", argv
    args = build_parser().parse_args(["replay", "gemma", "--session", "s.json", "--report", "text:r.md"])
    assert reports_of(args) == [("markdown", "r.md")]
    args._report_formats, args.report = ("text", "markdown", "json"), ["text:r.txt"]  # (a command with both: each its own)
    assert reports_of(args) == [("text", "r.txt")]


def test_table_text_is_its_markdown_table(capsys):
    assert main(["table", CHATML, "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert main(["table", CHATML]) == 0
    assert capsys.readouterr().out == text and text.startswith("| template |")


@pytest.mark.parametrize("command", ["spans", "mask", "request"])
def test_a_needed_source_is_shown_needed_in_the_usage(command):
    """SOURCE is optional to argparse only for the old `--template SOURCE CONVERSATION` spelling."""
    p = dict(commands())[command]
    usage, text = p.format_usage(), p.format_help()
    assert "[SOURCE]" not in usage and " SOURCE" in usage and "[SOURCE]" not in text


def test_replay_takes_prefills_llama_settings_but_checkpoints():
    """replay took six of them: no -ngl (no GPU offload), -fa, cache types, --swa-full or -nr."""
    from tmplkit.cli._common import prefill_settings

    args = build_parser().parse_args(["replay", "gemma", "--session", "s.json", "-ngl", "-1", "-fa", "on", "-ctk", "q8_0",
                                      "-ctv", "q8_0", "--swa-full", "-nr"])
    s = prefill_settings(args)
    assert (s.n_gpu_layers, s.flash_attn, s.cache_type_k, s.cache_type_v, s.swa_full, s.repack) == (-1, "on", "q8_0",
                                                                                                      "q8_0", True, False)
    replay = {f for a in dict(commands())["replay"]._actions for f in a.option_strings}
    prefill = {f for a in dict(commands())["prefill"]._actions for f in a.option_strings}
    assert prefill - replay == {"--checkpoints", "--policy", "--repeat"}  # (--policy: the old spelling, hidden)


def test_prefill_names_its_policies_with_settings_as_turns_and_replay_do(capsys):
    """prefill took --policy NAME|all, turns and replay --settings LIST: two spellings of one thing."""
    from tmplkit.cli._common import settings_of
    from tmplkit.server_rules import POLICIES

    p = dict(commands())["prefill"]
    assert "--settings LIST" in p.format_help() and "--policy" not in p.format_help()
    args = build_parser().parse_args(["prefill", "gemma", "--session", "s.json", "--settings", "gated,none,gated"])
    assert settings_of(args, tuple(POLICIES)) == ("gated", "none")
    assert capsys.readouterr().err == ""
    old = build_parser().parse_args(["prefill", "gemma", "--session", "s.json", "--policy", "all"])
    assert settings_of(old, tuple(POLICIES)) == tuple(POLICIES)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--policy is deprecated" in err and "--settings LIST" in err
