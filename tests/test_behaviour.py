"""The behaviour lock and `tmplkit diff`: each change class of our fixture pairs (fixtures/lock/<class>/a.jinja,
b.jinja) is said in the words a user sees; text-only edits are no change in behaviour; the lock round-trips,
has a schema, is checked by the audit (flag, configuration), is written atomically; bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tmplkit import atomic
from tmplkit.behaviour import (
    BehaviourLock,
    compare,
    derive_records,
    read_lock,
    write_lock,
)
from tmplkit.cli import main
from tmplkit.errors import InputError
from tmplkit.sources import load_one

ROOT = Path(__file__).resolve().parent.parent
PAIRS = ROOT / "fixtures" / "lock"
CLASSES = ("delimiter-moved", "role-dropped", "system-not-rendered", "reasoning-dropped", "tool-placement",
           "generation-prompt", "verdict-changed", "default-system", "text-only")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def records():
    """{class: (record of a, record of b)}, derived once, in this process."""
    templates = [load_one(str(PAIRS / c / side)) for c in CLASSES for side in ("a.jinja", "b.jinja")]
    derived = derive_records(templates, in_process=True)
    return {c: (derived[2 * i], derived[2 * i + 1]) for i, c in enumerate(CLASSES)}


def messages(records, cls: str, swap: bool = False) -> list[str]:
    a, b = records[cls]
    return [c.message for c in (compare(b, a) if swap else compare(a, b)).changes]


# ---- each change class, in the words a user reads -----------------------------------------------------

def test_a_delimiter_moved(records):
    assert messages(records, "delimiter-moved") == [
        "the tool-response start changed from `<|im_start|>tool\\n` to `<|im_start|>observation\\n`"]


def test_a_role_dropped(records):
    assert messages(records, "role-dropped") == [
        "tool results are no longer rendered", "the tool-response start `<|im_start|>tool\\n` is gone"]


def test_the_system_prompt_no_longer_rendered(records):
    assert messages(records, "system-not-rendered") == [
        "the system message is no longer rendered", "the system start `<|im_start|>system\\n` is gone"]


def test_reasoning_dropped_and_now_kept(records):
    assert messages(records, "reasoning-dropped") == [
        "earlier reasoning is now dropped: agent sessions are no longer prefix-stable"]
    assert messages(records, "reasoning-dropped", swap=True) == [
        "earlier reasoning is now kept: agent sessions are now prefix-stable"]


def test_tool_placement_changed(records):
    assert messages(records, "tool-placement") == [
        "tool responses moved from a turn of their own to inside a user turn",
        "the tool-response start changed from `<|im_start|>tool\\n` to `<|im_start|>user\\n<tool_response>\\n`"]


def test_generation_prompt_changed(records):
    assert messages(records, "generation-prompt") == [
        "the generation prompt changed from `<|im_start|>assistant\\n` to `<|im_start|>assistant\\n<think>\\n`",
        "the generation prompt now opens the reasoning (forced open); before, it left it to the model"]


def test_the_verdict_changed(records):
    said = messages(records, "verdict-changed")
    assert said[0] == ("the verdict changed from pass to impossible: tool responses render exactly like user messages: "
                       "no delimiter tells them apart")
    assert "the tool-response start changed from `<|im_start|>tool\\n` to `<|im_start|>user\\n`" in said


def test_a_default_system_prompt_added(records):
    assert messages(records, "default-system") == [
        "a chat without a system message now gets the template's default system prompt"]
    assert messages(records, "default-system", swap=True) == [
        "a chat without a system message no longer gets a default system prompt"]


def test_text_only_edits_are_no_change_in_behaviour(records):
    a, b = records["text-only"]
    assert a.text_sha256 != b.text_sha256 and a.behaviour() == b.behaviour()
    d = compare(a, b)
    assert d.same and d.changes == () and d.first_render is None
    assert d.headline == "no change in behaviour; the template text changed (+20 -16 lines), every probe renders the same"
    assert compare(a, a).headline == "no change in behaviour (the same template text)"


@pytest.mark.parametrize("cls", CLASSES[:-1])
def test_every_behaviour_change_shows_the_first_differing_render(records, cls):
    d = compare(*records[cls])
    assert not d.same and d.first_render is not None
    first = d.first_render
    assert first["old"] != first["new"] and first["old_digest"] != first["new_digest"]


# ---- the lock ------------------------------------------------------------------------------------------

def _pair(tmp_path: Path, cls: str) -> tuple[Path, Path]:
    """The class's a.jinja copied to tmp_path/templates/chat.jinja; b.jinja's text returned beside it."""
    (tmp_path / "templates").mkdir(exist_ok=True)
    chat = tmp_path / "templates" / "chat.jinja"
    chat.write_text((PAIRS / cls / "a.jinja").read_text())
    return chat, PAIRS / cls / "b.jinja"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["--no-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_lock_round_trips_and_matches_its_schema(capsys, tmp_path, matches_schema):
    chat, _ = _pair(tmp_path, "reasoning-dropped")
    code, _, err = run(capsys, "lock", "--in-process", str(chat), "--lock", "my.lock.json")
    assert code == 0 and "wrote my.lock.json: 1 template locked (1 new, 0 changed behaviour)" in err
    text = (tmp_path / "my.lock.json").read_text()
    data = json.loads(text)
    assert matches_schema("lock", data)
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"  # stable ordering
    assert data["templates"]["chat"]["prefix_stability"]["verdict"] == "stable"
    lock = read_lock(tmp_path / "my.lock.json")
    (fresh,) = derive_records([load_one(str(chat))], in_process=True)
    assert lock.records["chat"].behaviour() == fresh.behaviour()
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json")
    assert code == 0 and "lock my.lock.json: 1 template checked, 0 changed behaviour -> ok" in out


def test_the_audit_fails_when_behaviour_differs_and_one_command_updates_the_lock(capsys, tmp_path, matches_schema):
    chat, b = _pair(tmp_path, "reasoning-dropped")
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "my.lock.json")[0] == 0
    chat.write_text(b.read_text())
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json")
    assert code == 1
    assert "LOCK  chat: earlier reasoning is now dropped: agent sessions are no longer prefix-stable" in out
    assert "LOCK  chat: first differing render: probe 'earlier reasoning'" in out
    assert "1 changed behaviour -> FAILED" in out and "1 template: 1 pass -> FAILED" in out
    # every format says the failure the exit code says (the JSON said ok, JUnit 0 failures, the summary ok)
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json", "--format", "json")
    summary = json.loads(out)["summary"]
    assert matches_schema("audit", json.loads(out))
    assert code == 1 and summary["ok"] is False and summary["checks"][0]["kind"] == "LOCK"
    assert summary["checks"][0]["message"].startswith("earlier reasoning is now dropped")
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json", "--format", "junit")
    assert code == 1 and 'failures="2"' in out and '<testcase classname="tmplkit.lock" name="chat"' in out
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json", "--format", "summary")
    assert code == 1 and out.rstrip().endswith("-> FAILED")
    code, _, err = run(capsys, "lock", "--in-process", str(chat), "--lock", "my.lock.json")
    assert code == 0 and "(0 new, 1 changed behaviour: chat)" in err
    assert run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json")[0] == 0


def test_a_text_only_edit_passes_the_lock(capsys, tmp_path):
    chat, b = _pair(tmp_path, "text-only")
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "my.lock.json")[0] == 0
    chat.write_text(b.read_text())
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "my.lock.json")
    assert code == 0 and "0 changed behaviour -> ok" in out
    assert ("TEXT  chat: no change in behaviour; the template text changed (8089ed54712c -> 4c2a12701744), every probe "
            "renders the same") in out
    code, _, err = run(capsys, "lock", "--in-process", str(chat), "--lock", "my.lock.json")
    assert code == 0 and "(0 new, 0 changed behaviour, 1 text only: chat)" in err


def test_the_configuration_names_the_lock(tmp_path):
    chat, b = _pair(tmp_path, "tool-placement")
    (tmp_path / "pyproject.toml").write_text('[tool.tmplkit]\nsources = ["templates"]\nlock = "ci/tmplkit.lock.json"\n')
    (tmp_path / "ci").mkdir()
    assert main(["lock", "--in-process"]) == 0 and (tmp_path / "ci" / "tmplkit.lock.json").is_file()
    assert main(["audit", "--in-process"]) == 0
    chat.write_text(b.read_text())
    assert main(["audit", "--in-process"]) == 1


def test_the_github_format_annotates_the_changed_template(capsys, tmp_path):
    chat, b = _pair(tmp_path, "system-not-rendered")
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "l.json")[0] == 0
    chat.write_text(b.read_text())
    code, out, _ = run(capsys, "audit", "--in-process", "--format", "github", str(chat), "--lock", "l.json")
    assert code == 1
    assert f"::error file={chat},title=tmplkit lock%3A chat::chat: the system message is no longer rendered" in out


def test_the_lock_keeps_other_entries_unless_fresh(capsys, tmp_path):
    chat, _ = _pair(tmp_path, "text-only")
    other = tmp_path / "templates" / "other.jinja"
    other.write_text((PAIRS / "tool-placement" / "b.jinja").read_text())
    assert run(capsys, "lock", "--in-process", str(chat), str(other), "--lock", "l.json")[0] == 0
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "l.json")[0] == 0
    assert sorted(read_lock(tmp_path / "l.json").records) == ["chat", "other"]
    # the audit of the rest passes and names the entry it did not audit (before: not a word of it)
    code, out, _ = run(capsys, "audit", "--in-process", str(chat), "--lock", "l.json")
    assert code == 0 and ("1 template checked, 0 changed behaviour -> ok; 1 entry of the lock not audited here, kept: "
                          "other (of a template removed from the sources: `tmplkit lock SOURCE... --lock l.json --fresh` "
                          "drops it)") in out, out
    # a name with a line break (a file's name may hold one) stays on the summary's line, in every format
    forged = tmp_path / "templates" / "x\n::error title=forged::all good.jinja"
    forged.write_text(other.read_text())
    assert run(capsys, "lock", "--in-process", str(forged), "--lock", "l.json")[0] == 0
    for fmt in ("text", "github"):
        code, out, err = run(capsys, "audit", "--in-process", str(chat), "--lock", "l.json", "--format", fmt)
        assert code == 0 and "kept: other, x\\\\n::error title=forged::all good (of a template" in out + err, out + err
        assert not any(line.startswith("::error") for line in (out + err).splitlines())
    capsys.readouterr()
    code, _, err = run(capsys, "lock", "--in-process", str(chat), "--lock", "l.json", "--fresh")
    assert code == 0 and sorted(read_lock(tmp_path / "l.json").records) == ["chat"]
    # (the summary said "1 new": --fresh compared with nothing, and named no entry it dropped)
    assert "(0 new, 0 changed behaviour, 2 dropped: other, x\\\\n::error title=forged::all good); 1 in the lock" in err, err
    changed = tmp_path / "templates" / "chat.jinja"
    changed.write_text((PAIRS / "tool-placement" / "b.jinja").read_text())
    code, _, err = run(capsys, "lock", "--in-process", str(changed), "--lock", "l.json", "--fresh")
    assert code == 0 and "(0 new, 1 changed behaviour: chat)" in err, err


# ---- bad input: one line, an exit code ----------------------------------------------------------------

def _one_line_error(capsys, *argv: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.startswith("tmplkit: error: ") and err.count("\n") == 1, err
    return err


def test_a_lock_of_another_layout_a_corrupt_lock_and_a_missing_template(capsys, tmp_path):
    chat, _ = _pair(tmp_path, "text-only")
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 0, "tmplkit_version": "0.1.0", "templates": {}}))
    err = _one_line_error(capsys, "audit", "--in-process", str(chat), "--lock", "old.json")
    assert "a lock of layout 0 (tmplkit 0.1.0)" in err and "--fresh" in err
    (tmp_path / "corrupt.json").write_text('{"schema_version": 1, "templates": {"chat": {"na')
    assert "not valid JSON" in _one_line_error(capsys, "audit", "--in-process", str(chat), "--lock", "corrupt.json")
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": 1, "templates": {"chat": {"name": "chat"}}}))
    assert "not a behaviour record" in _one_line_error(capsys, "audit", "--in-process", str(chat), "--lock", "bad.json")
    (tmp_path / "empty.json").write_text(json.dumps({"schema_version": 1, "tmplkit_version": "0", "templates": {}}))
    err = _one_line_error(capsys, "audit", "--in-process", str(chat), "--lock", "empty.json")
    assert f"empty.json: no entry for chat; add it with `tmplkit lock {chat} --lock empty.json`" in err
    assert "no such lock" in _one_line_error(capsys, "audit", "--in-process", str(chat), "--lock", "missing.json")
    # `tmplkit lock` refuses to update a lock it cannot read (--fresh replaces it)
    assert "a lock of layout 0" in _one_line_error(capsys, "lock", "--in-process", str(chat), "--lock", "old.json")
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "old.json", "--fresh")[0] == 0


def test_two_templates_of_one_name_are_refused(capsys, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    for folder in ("x", "y"):
        (tmp_path / folder / "chat.jinja").write_text((PAIRS / "text-only" / "a.jinja").read_text())
    err = _one_line_error(capsys, "lock", "--in-process", "x/chat.jinja", "y/chat.jinja")
    assert "two templates are named 'chat'" in err
    assert not (tmp_path / "tmplkit.lock.json").exists()


def test_a_lock_is_never_half_written(tmp_path, monkeypatch, records):
    path = tmp_path / "l.json"
    write_lock(path, BehaviourLock().updated([records["text-only"][0]]))
    before = path.read_bytes()

    def boom(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", boom)
    with pytest.raises(InputError):
        write_lock(path, BehaviourLock().updated(list(records["tool-placement"][1:])))
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["l.json"]


# ---- tmplkit diff ---------------------------------------------------------------------------------------

def test_diff_exit_codes_and_formats(capsys, matches_schema):
    a, b = str(PAIRS / "tool-placement" / "a.jinja"), str(PAIRS / "tool-placement" / "b.jinja")
    code, out, _ = run(capsys, "diff", "--in-process", a, b)
    assert code == 1
    assert out.splitlines()[1] == "  - tool responses moved from a turn of their own to inside a user turn"
    code, out, _ = run(capsys, "diff", "--in-process", a, b, "--format", "json")
    data = json.loads(out)
    assert code == 1 and matches_schema("diff", data) and data["same_behaviour"] is False
    assert [c["kind"] for c in data["changes"]] == ["tool_placement", "delimiter"]
    code, out, _ = run(capsys, "diff", "--in-process", a, b, "--format", "markdown")
    assert code == 1 and "| tool_placement | tool responses moved" in out
    text_only = PAIRS / "text-only"
    code, out, _ = run(capsys, "diff", "--in-process", str(text_only / "a.jinja"), str(text_only / "b.jinja"))
    assert code == 0 and out.rstrip().endswith(
        "no change in behaviour; the template text changed (+20 -16 lines), every probe renders the same")
    assert "no such file" in _one_line_error(capsys, "diff", "--in-process", a, "missing.jinja")
    # -q: nothing where nothing differs (before: the report whatever -q said), the changes where they do
    code, out, _ = run(capsys, "-q", "diff", "--in-process", str(text_only / "a.jinja"), str(text_only / "b.jinja"))
    assert code == 0 and out == ""
    code, out, _ = run(capsys, "-q", "diff", "--in-process", a, b)
    assert code == 1 and "tool responses moved" in out
    code, out, _ = run(capsys, "-q", "diff", "--in-process", str(text_only / "a.jinja"), str(text_only / "b.jinja"), "--format", "json")
    assert code == 0 and json.loads(out)["same_behaviour"] is True  # (data a reader parses: written whatever -q says)


def _folders(tmp_path: Path, old: dict, new: dict) -> tuple[str, str]:
    """Two folders of templates: file stem -> fixture pair path (fixtures/lock/<class>/<a|b>.jinja)."""
    for folder, files in (("old", old), ("new", new)):
        (tmp_path / folder).mkdir()
        for stem, fixture in files.items():
            (tmp_path / folder / f"{stem}.jinja").write_text((PAIRS / fixture).read_text())
    return str(tmp_path / "old"), str(tmp_path / "new")


def test_diff_of_two_folders_of_templates_compares_them_by_name(capsys, tmp_path, matches_schema):
    # Each folder's first file was compared (exit 0 "no change in behaviour", b.jinja unseen), then
    # the folders were refused (`--name`): now each name both hold is compared, and a name only one
    # holds is said, removed or added; exit 0 only where all is the same.
    old, new = _folders(tmp_path, {"a": "text-only/a.jinja", "b": "tool-placement/a.jinja", "gone": "role-dropped/a.jinja"},
                        {"a": "text-only/a.jinja", "b": "tool-placement/b.jinja", "added": "role-dropped/b.jinja"})
    code, out, _ = run(capsys, "diff", "--in-process", old, new)
    lines = out.splitlines()
    assert code == 1 and lines[0].endswith("(a): no change in behaviour (the same template text)")
    assert lines[1].endswith("(b): behaviour changed (2 changes)")
    assert "only in the first source (removed): gone" in lines and "only in the second source (added): added" in lines
    assert lines[-1] == ("2 templates compared by name: 1 changed, 1 the same; 1 only in the first source (removed); "
                         "1 only in the second (added)")
    code, out, _ = run(capsys, "diff", "--in-process", old, new, "--format", "json")
    data = json.loads(out)
    assert code == 1 and matches_schema("diff", data) and data["same_behaviour"] is False
    assert [(t["old"]["name"], t["same_behaviour"]) for t in data["templates"]] == [("a", True), ("b", False)]
    assert (data["only_old"], data["only_new"]) == (["gone"], ["added"])
    code, out, _ = run(capsys, "diff", "--in-process", old, new, "--format", "markdown")
    assert code == 1 and "| tool_placement | tool responses moved" in out and "- only in the first source (removed): gone" in out
    # one template asked for: as before
    code, _, _ = run(capsys, "diff", "--in-process", old, new, "--name", "b")
    assert code == 1
    code, _, _ = run(capsys, "diff", "--in-process", old, new, "--name", "a")
    assert code == 0


def test_diff_of_two_folders_that_behave_alike_exits_0_and_one_with_no_name_in_common_is_refused(capsys, tmp_path):
    old, new = _folders(tmp_path, {"a": "text-only/a.jinja", "b": "tool-placement/a.jinja"},
                        {"a": "text-only/b.jinja", "b": "tool-placement/a.jinja"})
    code, out, _ = run(capsys, "diff", "--in-process", old, new)
    assert code == 0 and out.splitlines()[-1] == "2 templates compared by name: 0 changed, 2 the same"
    (tmp_path / "other").mkdir()
    for stem in ("x", "y"):
        (tmp_path / "other" / f"{stem}.jinja").write_text((PAIRS / "text-only" / "a.jinja").read_text())
    err = _one_line_error(capsys, "diff", "--in-process", old, str(tmp_path / "other"))
    assert "no template name in common (the first has a, b; the second x, y); give --name and --name-b" in err
    # a folder against one template: which of the folder's to take is still a guess
    err = _one_line_error(capsys, "diff", "--in-process", old, str(PAIRS / "text-only" / "a.jinja"))
    assert "holds 2 templates and none is the default (a, b); give --name NAME" in err


def test_diff_of_two_folders_pairs_a_file_named_whole_beside_another_of_its_stem(capsys, tmp_path):
    # `date.j2` beside `date.jinja` names both by their whole file names; the other folder's one
    # `date.jinja` is `date`: no name in common, so `date` was never compared (one removed, one added)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    for name, fixture in (("date.jinja", "tool-placement/a.jinja"), ("date.j2", "text-only/a.jinja"),
                          ("same.jinja", "text-only/a.jinja")):
        (tmp_path / "old" / name).write_text((PAIRS / fixture).read_text())
    for name, fixture in (("date.jinja", "tool-placement/b.jinja"), ("same.jinja", "text-only/a.jinja")):
        (tmp_path / "new" / name).write_text((PAIRS / fixture).read_text())
    code, out, _ = run(capsys, "diff", "--in-process", str(tmp_path / "old"), str(tmp_path / "new"))
    lines = out.splitlines()
    assert code == 1 and any(line.endswith("date.jinja (date.jinja) -> " + str(tmp_path / "new" / "date.jinja") +
                                           " (date): behaviour changed (2 changes)") for line in lines), out
    assert "only in the first source (removed): date.j2" in lines
    assert lines[-1] == "2 templates compared by name: 1 changed, 1 the same; 1 only in the first source (removed)"


def test_pairing_by_name_refuses_a_source_with_two_templates_of_one_name():
    from tmplkit.behaviour import pair_by_name

    a = load_one(str(PAIRS / "text-only" / "a.jinja"))
    with pytest.raises(InputError, match="the second source holds two templates named 'a'; .* give --name and --name-b"):
        pair_by_name([a], [a, a])
    assert pair_by_name([a], [a]) == ([(a, a)], [], [])


def _hf_cache(root: Path, repo: str, files: dict[str, str], commit: str = "b" * 40) -> None:
    base = root / "hub" / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    for name, text in files.items():
        (base / "snapshots" / commit / name).parent.mkdir(parents=True, exist_ok=True)
        (base / "snapshots" / commit / name).write_text(text)


def _offline(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**ENV, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "tmplkit", *argv], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)


def test_a_gguf_against_its_upstream_from_the_local_cache(tmp_path, write_gguf):
    upstream = (PAIRS / "delimiter-moved" / "a.jinja").read_text()
    _hf_cache(tmp_path / "hf", "acme/chat-7b", {"chat_template.jinja": upstream})
    same = write_gguf("same.gguf", template=upstream)
    drifted = write_gguf("drifted.gguf", template=(PAIRS / "delimiter-moved" / "b.jinja").read_text())
    proc = _offline(tmp_path, "diff", "--in-process", "hf:acme/chat-7b", str(same))
    assert proc.returncode == 0 and "no change in behaviour" in proc.stdout, proc.stderr
    proc = _offline(tmp_path, "diff", "--in-process", "hf:acme/chat-7b", str(drifted))
    assert proc.returncode == 1 and ("  - the tool-response start changed from `<|im_start|>tool\\n` to "
                                     "`<|im_start|>observation\\n`") in proc.stdout
    proc = _offline(tmp_path, "diff", "--in-process", "hf:acme/other", str(drifted))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "HF_HUB_OFFLINE" in proc.stderr
    assert "Traceback" not in proc.stderr
    # (a name the Hub cannot have said the library's words, "could not fetch (HFValidationError: ...)")
    proc = _offline(tmp_path, "show", "hf:acme/chat 7b")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("tmplkit: error: hf:acme/chat 7b: not a Hub repository name (")
    assert proc.stderr.rstrip().endswith("; give hf:org/name[@revision]")


def test_the_audit_reports_drift_from_a_declared_upstream(tmp_path, write_gguf):
    upstream = tmp_path / "upstream.jinja"
    upstream.write_text((PAIRS / "generation-prompt" / "a.jinja").read_text())
    write_gguf("model.gguf", template=(PAIRS / "generation-prompt" / "b.jinja").read_text())
    (tmp_path / "tmplkit.toml").write_text('sources = ["model.gguf"]\n[upstream]\n"model.gguf" = "upstream.jinja"\n')
    proc = subprocess.run([sys.executable, "-m", "tmplkit", "audit", "--in-process"], env=ENV, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert ("DRIFT model: from its upstream upstream.jinja: the generation prompt changed from "
            "`<|im_start|>assistant\\n` to `<|im_start|>assistant\\n<think>\\n`") in proc.stdout
    (tmp_path / "tmplkit.toml").write_text('sources = ["model.gguf"]\n[upstream]\n"model.gguf" = "hf:acme/none"\n')
    proc = _offline(tmp_path, "audit", "--in-process")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "hf:acme/none" in proc.stderr


def test_a_template_file_kept_beside_its_upstream_is_held_to_it_too(tmp_path):
    # (only a GGUF key was read: a .jinja key was passed over, the audit said ok, its drift unchecked)
    (tmp_path / "upstream.jinja").write_text((PAIRS / "generation-prompt" / "a.jinja").read_text())
    (tmp_path / "ours.jinja").write_text((PAIRS / "generation-prompt" / "b.jinja").read_text())
    (tmp_path / "tmplkit.toml").write_text('sources = ["ours.jinja"]\n[upstream]\n"ours.jinja" = "upstream.jinja"\n')
    proc = subprocess.run([sys.executable, "-m", "tmplkit", "audit", "--in-process"], env=ENV, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "DRIFT ours: from its upstream upstream.jinja: the generation prompt changed from " in proc.stdout


def test_an_upstream_declared_for_a_gguf_that_is_not_there_is_one_line(tmp_path, write_gguf):
    write_gguf("model.gguf", template=(PAIRS / "generation-prompt" / "b.jinja").read_text())
    (tmp_path / "upstream.jinja").write_text((PAIRS / "generation-prompt" / "a.jinja").read_text())
    (tmp_path / "tmplkit.toml").write_text('sources = ["model.gguf"]\n[upstream]\n"modle.gguf" = "upstream.jinja"\n')
    proc = subprocess.run([sys.executable, "-m", "tmplkit", "audit", "--in-process"], env=ENV, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "modle.gguf, which is not a file" in proc.stderr
    assert "(from 'upstream.modle.gguf' in " in proc.stderr  # (as every configured value's error names its file)


def test_two_lock_runs_at_once_on_one_lock_keep_both_entries(tmp_path):
    # each merges into the lock as it is when it writes (it read it before its long work: one run's
    # entries were lost, both exiting 0)
    templates = ROOT / "fixtures" / "templates"
    lock = tmp_path / "r.json"

    def lock_run(name):
        return subprocess.Popen([sys.executable, "-m", "tmplkit", "-q", "--no-config", "lock", str(templates / name),
                                 "--lock", str(lock)], env=ENV, cwd=tmp_path)

    assert lock_run("gemma.jinja").wait(timeout=300) == 0
    runs = [lock_run("chatml.jinja"), lock_run("llama3.jinja")]
    assert [r.wait(timeout=300) for r in runs] == [0, 0]
    assert sorted(json.loads(lock.read_text())["templates"]) == ["chatml", "gemma", "llama3"]


# A template whose every render runs far past any limit a test gives it.
ENDLESS = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
           "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")


def test_a_behaviour_a_limit_stopped_is_never_compared_locked_or_passed(capsys, tmp_path):
    """Two templates stopped by --timeout have no behaviour to compare: `diff` said "no change in
    behaviour" (exit 0) and `lock` wrote their timeouts as behaviour; the audit's lock check passed
    a template it never derived."""
    (tmp_path / "a.jinja").write_text(ENDLESS)
    (tmp_path / "b.jinja").write_text(ENDLESS.replace("<|", "<<"))
    err = _one_line_error(capsys, "diff", "a.jinja", "b.jinja", "--timeout", "1")
    assert "the behaviour of 'a' (a.jinja) was not derived (and 1 more: b)" in err and "nothing was compared" in err
    err = _one_line_error(capsys, "lock", "a.jinja", "--lock", "l.json", "--fresh", "--timeout", "1")
    assert "raise --timeout" in err and "l.json was not written" in err and not (tmp_path / "l.json").exists()
    chat, _ = _pair(tmp_path, "text-only")
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "l.json")[0] == 0
    code, out, _ = run(capsys, "audit", str(chat), "--lock", "l.json", "--timeout", "0.001")
    assert code == 1 and "LOCK  chat: not checked: its behaviour was not derived" in out
    assert "0 templates checked, 0 changed behaviour, 1 not derived" in out and "-> FAILED" in out


@pytest.mark.parametrize("field, value", [("verdict", 7), ("verdict", "great"), ("tool_placement", ["x"]), ("system", 5),
                                          ("default_system", 5), ("earlier_reasoning", 5), ("text_sha256", 5),
                                          ("starts", {"user": 3})])
def test_a_lock_field_of_the_wrong_type_is_a_malformed_lock_not_a_change(capsys, tmp_path, field, value):
    chat, _ = _pair(tmp_path, "text-only")
    assert run(capsys, "lock", "--in-process", str(chat), "--lock", "l.json")[0] == 0
    data = json.loads((tmp_path / "l.json").read_text())
    data["templates"]["chat"][field] = value
    (tmp_path / "l.json").write_text(json.dumps(data))
    err = _one_line_error(capsys, "audit", "--in-process", str(chat), "--lock", "l.json")
    assert "not a behaviour record" in err and f"'{field}'" in err
    data["schema_version"] = True  # (equal to 1 in Python)
    (tmp_path / "l.json").write_text(json.dumps(data))
    assert "a lock of layout True" in _one_line_error(capsys, "lock", "--in-process", str(chat), "--lock", "l.json")


def test_a_record_whose_agent_session_check_was_cut_short_is_no_behaviour(tmp_path, monkeypatch):
    # (`lock --timeout 5` locked {"verdict": "not checked"} with exit 0, and `audit --lock` then
    # compared it with another cut check as "no change"; `diff` called two such templates the same)
    import tmplkit.behaviour._derive as derive_mod
    from tmplkit.auditing import NOT_CHECKED, PrefixStability, analyze_with_prefix_stability
    from tmplkit.behaviour import check_lock, require_derived

    cut = PrefixStability(NOT_CHECKED, n_requests=32, detail="stopped at the time limit (1 s) after 9 of 32 requests")

    def derive(template, session=None, timeout=None):
        analysis, _ = analyze_with_prefix_stability(template, session, timeout)
        return analysis, cut, {}

    monkeypatch.setattr(derive_mod, "derive_behaviour", derive)
    template = load_one(str(PAIRS / "delimiter-moved" / "a.jinja"))
    record = derive_records([template], in_process=True)[0]
    assert record.verdict == "pass" and not record.derived
    assert record.reason.startswith("its agent-session check did not run to the end (stopped at the time limit")
    with pytest.raises(InputError, match="was not derived: its agent-session check did not run to the end .* nothing was"):
        require_derived([record], "nothing was compared")
    locked = derive_records([template], in_process=True, session=None)  # (still cut: the stand-in)
    monkeypatch.undo()
    good = derive_records([template], in_process=True)[0]
    assert good.derived and good.prefix_stability["verdict"] != NOT_CHECKED
    check = check_lock(BehaviourLock({template.name: good}, "0"), locked, "l.json")
    assert not check.ok and check.unchecked and not check.diffs


def test_a_record_no_utf8_json_can_hold_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    # (a file name's byte that is no UTF-8, or a template writing half a UTF-16 pair: a traceback
    # from the lock's writer, exit 1)
    chatml = (Path(__file__).parent.parent / "fixtures" / "templates" / "chatml.jinja").read_text(encoding="utf-8")
    (tmp_path / "x\udcff.jinja").write_text(chatml, encoding="utf-8", errors="surrogateescape")
    (tmp_path / "half.jinja").write_text(chatml.replace("<|im_start|>", "<|im_start\\ud800|>"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d\udcff").mkdir()
    (tmp_path / "d\udcff" / "chat.jinja").write_text(chatml, encoding="utf-8")
    for source, said in (("x\udcff.jinja", "the record of 'x\\udcff' cannot be locked: its name"),
                         ("half.jinja", "the record of 'half' cannot be locked: its behaviour"),
                         ("d\udcff/chat.jinja", "the record of 'chat' cannot be locked: its source")):
        code = main(["--no-config", "lock", source, "--in-process", "-o", "l.json"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and said in err and "Traceback" not in err, err
        assert not (tmp_path / "l.json").exists()


def test_a_lock_reads_the_same_from_whichever_folder_it_is_written(tmp_path, monkeypatch):
    # (written from a subfolder, the configuration's sources were absolute paths in the lock: a
    # committed lock changed with the folder and the machine it was written on)
    chatml = (Path(__file__).parent.parent / "fixtures" / "templates" / "chatml.jinja").read_text(encoding="utf-8")
    (tmp_path / "templates").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "templates" / "chat.jinja").write_text(chatml, encoding="utf-8")
    (tmp_path / "tmplkit.toml").write_text('sources = ["templates"]\nlock = "my.lock.json"\n')
    written = []
    for where in (tmp_path / "sub", tmp_path):
        monkeypatch.chdir(where)
        assert main(["lock", "--in-process"]) == 0
        written.append((tmp_path / "my.lock.json").read_bytes())
    assert written[0] == written[1]
    assert json.loads(written[0])["templates"]["chat"]["source"] == "templates/chat.jinja"
