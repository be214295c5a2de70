"""Input a user did not mean, each refused in one line with exit code 2 by every command that
reads it: a number of more digits than Python converts (in a conversation, a tool call's
arguments, a lock, a configuration, a server log, an option), an option given two values, a
lock record damaged inside its objects, a configuration file named to a command that uses few
of its settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tmplkit.cli import build_parser, main
from tmplkit.cli._common import format_of

ROOT = Path(__file__).resolve().parent.parent
CHATML = str(ROOT / "fixtures" / "templates" / "chatml.jinja")
CHAT = str(ROOT / "fixtures" / "masks" / "chat.json")
LOG = ROOT / "fixtures" / "server-logs" / "0.3.36-session-lv4.log"
HUGE = "1" + "0" * 5000  # past Python's 4,300-digit limit on int()


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (no configuration found from here)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # (argparse's own refusals)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, *words: str) -> bool:
    return err.startswith("tmplkit: error: ") and err.count("\n") == 1 and all(w in err for w in words)


def _huge_inputs(tmp: Path) -> dict:
    def write(name: str, text: str) -> str:
        (tmp / name).write_text(text, encoding="utf-8")
        return str(tmp / name)

    call = {"type": "function", "function": {"name": "ls", "arguments": '{"n": ' + HUGE + "}"}}
    return {
        "conversation": write("c.json", f'[{{"role": "user", "content": "hi", "n": {HUGE}}}]'),
        "arguments": write("a.json", json.dumps([{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "", "tool_calls": [call]},
                                                 {"role": "tool", "content": "a.txt"}, {"role": "user", "content": "ok"}])),
        "lock": write("l.json", f'{{"schema_version": {HUGE}, "templates": {{}}}}'),
        "config": write("t.toml", f"x = {HUGE}\n"),
        "log": write("s.log", LOG.read_text(encoding="utf-8").replace("cached n_tokens = 118", f"cached n_tokens = {HUGE}")),
    }


@pytest.mark.parametrize("case", ["mask", "turns", "arguments", "lock", "config", "log", "kwargs", "memory-model"])
def test_a_number_past_pythons_digit_limit_is_one_line_naming_the_file(case, tmp_path, capsys):
    files = _huge_inputs(tmp_path)
    argv = {
        "mask": ["--no-config", "mask", CHATML, "--session", files["conversation"], "--tokenizer", "vocab:qwen35"],
        "turns": ["--no-config", "turns", CHATML, "--session", files["conversation"]],
        "arguments": ["--no-config", "turns", CHATML, "--session", files["arguments"]],
        "lock": ["--no-config", "audit", CHATML, "--lock", files["lock"]],
        "config": ["--config", files["config"], "audit", CHATML],
        "log": ["--no-config", "server", "log", files["log"]],
        "kwargs": ["--no-config", "turns", CHATML, "--session", CHAT, "--template-kwargs", f'{{"x": {HUGE}}}'],
        "memory-model": ["--no-config", "turns", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35",
                         "--memory-model", f"swa:{HUGE}"],
    }[case]
    code, _, err = run(capsys, *argv)
    assert code == 2 and one_line(err), err[-300:]
    assert "Traceback" not in err and "set_int_max_str_digits" not in err
    if case == "memory-model":
        assert "more than llama.cpp holds" in err and len(err) < 400  # (the value shown cut short)
    elif case == "log":
        assert "5001 digits" in err and "edited or damaged" in err
    else:
        assert "more than 4300 digits" in err
    if case == "arguments":
        assert "message [1]: the tool call's arguments" in err


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("command", ["turns", "request", "kwargs"])
def test_nan_or_infinity_which_json_has_not_is_refused_in_a_conversation(command, constant, tmp_path, capsys):
    # (Python's json reads them: the render held NaN where llama-server refuses the request)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "maximum": 0}}}]
    text = json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": tools}).replace('"maximum": 0',
                                                                                              f'"maximum": {constant}')
    (tmp_path / "c.json").write_text(text, encoding="utf-8")
    argv = {"turns": ["turns", CHATML, "--session", "c.json"],
            "request": ["request", CHATML, "--session", "c.json", "--tokenizer", "vocab:qwen35"],
            "kwargs": ["turns", CHATML, "--session", CHAT, "--template-kwargs", f'{{"x": {constant}}}']}[command]
    code, out, err = run(capsys, "--no-config", *argv)
    assert code == 2 and out == "" and one_line(err, f"{constant} is no JSON number", "not valid JSON"), err


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_or_infinity_in_a_tool_calls_arguments_is_refused(constant, tmp_path, capsys):
    # (the arguments string is parsed on its own: Python's json took NaN there too)
    call = {"type": "function", "function": {"name": "f", "arguments": f'{{"n": {constant}}}'}}
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "ok"}, {"role": "user", "content": "thanks"}]
    (tmp_path / "c.json").write_text(json.dumps({"messages": msgs}), encoding="utf-8")
    code, out, err = run(capsys, "--no-config", "turns", CHATML, "--session", str(tmp_path / "c.json"))
    assert code == 2 and out == "" and one_line(err, "message [1]: the tool call's arguments",
                                                   f"{constant}, which is no JSON number"), err


@pytest.mark.parametrize("number", ["1e999", "-1e400", "9" * 400])
@pytest.mark.parametrize("where", ["tools", "arguments", "kwargs"])
def test_a_number_no_double_holds_is_refused_as_llama_server_refuses_it(number, where, tmp_path, capsys):
    # (Python read 1e999 as infinity: the prompt held `inf`, `Infinity`, where llama-server answers
    # "number overflow" and renders nothing)
    call = {"type": "function", "function": {"name": "f", "arguments": '{"n": 0}'}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "maximum": 0}}}]
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "ok"}, {"role": "user", "content": "thanks"}]
    text = json.dumps({"messages": msgs, "tools": tools})
    text = text.replace('"maximum": 0', f'"maximum": {number}') if where == "tools" else text.replace(
        '{\\"n\\": 0}', f'{{\\"n\\": {number}}}')
    (tmp_path / "c.json").write_text(text, encoding="utf-8")
    kwargs = ["--template-kwargs", f'{{"x": {number}}}'] if where == "kwargs" else []
    session = str(tmp_path / "c.json") if where != "kwargs" else CHAT
    code, out, err = run(capsys, "--no-config", "turns", CHATML, "--session", session, *kwargs)
    assert code == 2 and out == "" and one_line(err, "more than a double holds"), err
    if where == "arguments":
        assert "message [1]: the tool call's arguments" in err


def test_a_server_log_with_a_batch_size_no_server_runs_with_is_refused(tmp_path, capsys):
    text = LOG.read_text(encoding="utf-8")
    damaged = re.sub(r"(llama_context: n_batch +=) 2048", r"\1 99999999999", text)
    assert damaged != text  # (the line the damage is put in)
    (tmp_path / "b.log").write_text(damaged, encoding="utf-8")
    code, _, err = run(capsys, "--no-config", "server", "log", str(tmp_path / "b.log"))
    assert code == 2 and one_line(err, "n_batch = 99999999999", "edited or damaged")


@pytest.mark.parametrize("argv, words", [
    (["turns", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35", "--memory", "swa:512", "--memory-model", "recurrent"],
     ["--memory swa:512 and --memory-model recurrent"]),
    (["diff", CHATML, CHATML, "-o", "a.txt", "-o", "b.txt"], ["-o a.txt and -o b.txt"]),
    (["audit", CHATML, "-j", "1", "--jobs", "2"], ["-j 1 and --jobs 2"]),
])
def test_an_option_given_two_values_is_refused_not_the_last_taken(argv, words, capsys):
    code, _, err = run(capsys, "--no-config", *argv)
    errors = [line for line in err.splitlines() if ": error: " in line]  # (besides a deprecation note)
    assert code == 2 and len(errors) == 1 and all(w in errors[0] for w in ["given twice", "give it once", *words]), err


def test_a_global_option_given_before_and_after_the_command_with_two_values_is_refused(capsys):
    code, _, err = run(capsys, "--no-config", "--color", "always", "audit", CHATML, "--color", "never")
    assert code == 2 and one_line(err, "--color given twice", "--color always and --color never")
    code, _, err = run(capsys, "--no-config", "--color", "never", "audit", CHATML, "--color", "never")
    assert code == 0, err


def test_an_option_given_twice_alike_is_taken(tmp_path, capsys):
    code, out, err = run(capsys, "--no-config", "audit", CHATML, "--format", "json", "--format", "json")
    assert code == 0 and json.loads(out), err


@pytest.mark.parametrize("command", [["server", "delimiters", CHATML], ["engine-parity", CHATML]])
@pytest.mark.parametrize("first, second", [("table", "markdown"), ("markdown", "table"), ("table", "table")])
def test_an_old_name_of_a_format_given_with_its_new_one_is_one_value(command, first, second):
    # (`table` is an old name of `markdown`: the two mean one format, compared as the option reads them)
    args = build_parser(lazy=True).parse_args([*command, "--format", first, "--format", second])
    assert format_of(args) == "markdown"


@pytest.mark.parametrize("argv, words", [
    (["server", "delimiters", CHATML, "--format", "table", "--format", "json"], ["--format table and --format json"]),
    (["mask", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35", "--format", "auto", "--format", "text"],
     ["--format auto and --format text"]),  # (auto is no --format: text or json by where it goes, not text)
    (["audit", CHATML, "-j", "1", "--jobs", "2.0"], ["invalid int value"]),
])
def test_two_values_that_mean_two_things_are_still_refused(argv, words, capsys):
    code, _, err = run(capsys, "--no-config", *argv)
    assert code == 2 and err.count("\n") == 1 and all(w in err for w in words), err


@pytest.mark.parametrize("command", [["spans", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35"],
                                     ["request", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35"]])
@pytest.mark.parametrize("flags", [["--generation-prompt", "--no-generation-prompt"],
                                   ["--no-generation-prompt", "--generation-prompt"]])
def test_a_flag_given_with_its_no_flag_is_refused_not_the_last_taken(command, flags, capsys):
    code, out, err = run(capsys, "--no-config", *command, *flags)
    assert code == 2 and out == "" and err.count("\n") == 1, err  # (argparse's line: tmplkit spans: error: ...)
    assert f"{flags[0]} and {flags[1]} contradict each other; give one" in err


def test_the_old_spelling_of_a_flag_with_the_no_flag_is_refused(capsys):
    code, _, err = run(capsys, "--no-config", "spans", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35",
                       "--add-generation-prompt", "--no-generation-prompt")
    assert code == 2 and "--add-generation-prompt and --no-generation-prompt contradict each other" in err
    code, _, err = run(capsys, "--no-config", "spans", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35",
                       "--add-generation-prompt", "--generation-prompt", "--no-generation-prompt")
    assert code == 2 and "contradict each other" in err
    code, _, err = run(capsys, "--no-config", "spans", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35",
                       "--no-generation-prompt", "--no-generation-prompt")
    assert code == 0, err


@pytest.mark.parametrize("argv, flags", [
    (["audit", CHATML, "--in-process", "--timeout", "1"], "--timeout with --in-process"),
    (["audit", CHATML, "--in-process", "-j", "2"], "--jobs with --in-process"),
    (["lock", CHATML, "--in-process", "--memory", "100", "-o", "l.json"], "--memory with --in-process"),
    (["diff", CHATML, CHATML, "--in-process", "--timeout", "3", "-j", "1"], "--jobs, --timeout with --in-process"),
])
def test_a_worker_limit_given_with_in_process_is_refused_not_ignored(argv, flags, tmp_path, capsys):
    # (--in-process runs no worker: a 1 microsecond --timeout passed, and a lock was written under it)
    code, out, err = run(capsys, "--no-config", *argv)
    assert code == 2 and out == "" and one_line(err, flags, "would be ignored", "drop --in-process"), err
    assert not (tmp_path / "l.json").exists()


def test_in_process_without_worker_limits_runs(capsys):
    code, _, err = run(capsys, "--no-config", "audit", CHATML, "--in-process")
    assert code == 0, err


def test_a_number_given_twice_in_two_spellings_is_one_value(capsys):
    code, _, err = run(capsys, "--no-config", "audit", CHATML, "-j", "1", "--jobs", "01", "--timeout", "5", "--timeout", "5.0")
    assert code == 0, err


@pytest.mark.parametrize("damage, words", [
    (lambda r: r["generation"]["default"].__setitem__("prompt", 5), "'generation' of 'default'"),
    (lambda r: r["generation"]["default"].__setitem__("reasoning", {"a": 1}), "'generation' of 'default'"),
    (lambda r: r.__setitem__("generation", {}), "'generation' is empty"),
    (lambda r: r["rendered"].__setitem__("assistant", "no"), "'rendered'"),
    (lambda r: r["starts"].__setitem__("bogus", "x"), "'bogus'"),
    (lambda r: r["prefix_stability"].__setitem__("request", "x"), "'prefix_stability'"),
    # (a delimiter edited into numbers was read as a changed behaviour, exit 1; an empty record was "KeyError: 'name'")
    (lambda r: r.__setitem__("delimiters", [{"role": 5, "text": None}]), "a delimiter in 'delimiters' is not an object"),
    (lambda r: r.clear(), "'name' is missing"),
    # (the lock's schema refuses keys no record has; the reader took them, and the next lock dropped them unsaid)
    (lambda r: r.__setitem__("verdcit", "pass"), "'verdcit' is no field of a record"),
    (lambda r: r["delimiters"][0].__setitem__("note", "x"), "a delimiter in 'delimiters' is not an object"),
    (lambda r: r["delimiters"][0].__setitem__("role", "narrator"), "a delimiter in 'delimiters' is not an object"),
])
def test_a_lock_record_damaged_inside_is_refused_by_audit_and_lock_and_left_as_it_was(damage, words, tmp_path, capsys):
    good = tmp_path / "good.json"
    assert run(capsys, "--no-config", "lock", CHATML, "-o", str(good))[0] == 0
    data = json.loads(good.read_text(encoding="utf-8"))
    damage(data["templates"]["chatml"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    before = bad.read_bytes()
    code, out, err = run(capsys, "--no-config", "audit", CHATML, "--lock", str(bad))
    assert code == 2 and one_line(err, "not a behaviour record", words, "--fresh"), err
    code, _, err = run(capsys, "--no-config", "lock", CHATML, "-o", str(bad))
    assert code == 2 and one_line(err, "not a behaviour record", "--fresh") and bad.read_bytes() == before


def test_a_lock_with_a_key_no_lock_has_is_refused_and_left_as_it_was(tmp_path, capsys):
    lock = tmp_path / "lock.json"
    assert run(capsys, "--no-config", "lock", CHATML, "-o", str(lock))[0] == 0
    data = json.loads(lock.read_text(encoding="utf-8"))
    lock.write_text(json.dumps({**data, "templtes": {}}), encoding="utf-8")
    before = lock.read_bytes()
    for command in ("audit", "lock"):
        code, _, err = run(capsys, "--no-config", command, CHATML, "--lock", str(lock))
        assert code == 2 and one_line(err, "'templtes' is no key of a behaviour lock", "--fresh"), err
    assert lock.read_bytes() == before


def test_a_lock_whose_prefix_check_a_limit_stopped_is_read_back(tmp_path, capsys):
    # (a pass whose agent-session check a limit stopped is locked as "not checked")
    path = tmp_path / "lock.json"
    assert run(capsys, "--no-config", "lock", CHATML, "-o", str(path))[0] == 0
    data = json.loads(path.read_text(encoding="utf-8"))
    data["templates"]["chatml"]["prefix_stability"] = {"verdict": "not checked", "cause": "the time limit", "request": None}
    path.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = run(capsys, "--no-config", "lock", CHATML, "-o", str(path))
    assert code == 0 and "not a behaviour record" not in err, err


@pytest.mark.parametrize("command", [
    ["mask", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35"],
    ["server", "log", str(LOG)],
    ["schema"],
    ["session", "generate", "--tokens", "500"],
])
@pytest.mark.parametrize("config", ["missing", "broken"])
def test_every_command_refuses_a_configuration_file_it_is_named_that_cannot_be_read(command, config, tmp_path, capsys):
    path = tmp_path / "tmplkit.toml"
    if config == "broken":
        path.write_text("sources = [\n", encoding="utf-8")
    code, out, err = run(capsys, "--config", str(path), *command)
    assert code == 2 and out == "" and one_line(err, str(path)), err


def test_tokenizer_auto_takes_the_configurations_pairing_in_mask_as_in_audit(tmp_path, capsys):
    (tmp_path / "tmplkit.toml").write_text('[tokenizers]\nchatml = "vocab:qwen35"\n', encoding="utf-8")
    code, out, err = run(capsys, "--config", str(tmp_path / "tmplkit.toml"), "mask", CHATML, "--session", CHAT,
                         "--tokenizer", "auto", "--format", "json")
    assert code == 0, err
    with_auto = json.loads(out)
    code, out, _ = run(capsys, "--no-config", "mask", CHATML, "--session", CHAT, "--tokenizer", "vocab:qwen35", "--format", "json")
    assert code == 0 and json.loads(out) == with_auto
    code, _, err = run(capsys, "--no-config", "mask", CHATML, "--session", CHAT, "--tokenizer", "auto")
    assert code == 2 and one_line(err, "no tokenizer known for template 'chatml'", "[tokenizers]")


def test_annotate_with_an_empty_output_says_the_spelling_of_standard_output_it_takes(capsys):
    code, _, err = run(capsys, "--no-config", "annotate", CHATML, "-o", "")
    assert code == 2 and one_line(err, "-o -") and "leave -o out" not in err
