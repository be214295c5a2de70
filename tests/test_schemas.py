"""Every JSON tmplkit prints validates against the JSON Schema shipped for it (tmplkit/schemas),
each schema is a real one (required keys, types, the statuses and roles as enums), and
`tmplkit schema` prints them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from tmplkit.cli import main
from tmplkit.schemas import SCHEMA_DIR, load_schema, schema_names

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
TURNS = ROOT / "fixtures" / "turns"
LOGS = ROOT / "fixtures" / "server-logs"
CHATML = str(FIXTURES / "chatml.jinja")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hello world"}, {"role": "user", "content": "result"}]
# Outputs that are someone else's format (a llama-server request body, an OpenAI-style session).
UNVERSIONED = {"request", "session"}
# The layouts past their first: the table's 2 (a row that did not pass: null delimiters, a reason).
SCHEMA_VERSIONS = {"table": 2, "turns": 2, "server-log": 3}


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def run_json(capsys, *argv: str, code: int = 0):
    assert main(["--no-config", *argv]) == code
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def tiny_hf(tiny_hf_folder) -> str:
    return str(tiny_hf_folder / "tokenizer.json")


@pytest.fixture
def conversation(tmp_path) -> str:
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(CONVERSATION))
    return str(path)


# ---- the schemas themselves -----------------------------------------------------------------------

def test_every_schema_is_valid_and_describes_something():
    assert set(schema_names()) >= {"audit", "table", "turns", "spans", "request", "engine-parity",
                                   "server-delimiters", "server-log", "prefill", "replay", "session"}
    for name in schema_names():
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"].endswith("2020-12/schema") and schema["title"] and schema["description"]
        top = schema if "oneOf" not in schema else schema["oneOf"][0]
        assert top["type"] == "object" and top["required"], name
        if name not in UNVERSIONED:
            assert top["required"][0] == "schema_version"
            assert top["properties"]["schema_version"]["const"] == SCHEMA_VERSIONS.get(name, 1), name


def test_the_schemas_reject_what_the_outputs_must_not_be():
    audit = load_schema("audit")
    result = audit["$defs"]["analysis"]
    assert result["properties"]["status"]["enum"][:2] == ["pass", "fail"]
    assert "user" in audit["$defs"]["delimiter"]["properties"]["role"]["enum"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 1, "tmplkit_version": "0", "summary": {}, "results": []}, audit)
    with pytest.raises(jsonschema.ValidationError):
        # the table's layout 1 (failing rows listed their unproven delimiters) is not this one
        jsonschema.validate({"schema_version": 1, "tmplkit_version": "0", "rows": []}, load_schema("table"))


def test_the_schemas_are_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"schemas/*.schema.json"' in pyproject
    assert SCHEMA_DIR == ROOT / "tmplkit" / "schemas"


def test_schema_command(capsys, tmp_path):
    assert main(["schema"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(schema_names())
    assert json.loads(run_json_text(capsys, "schema", "turns")) == load_schema("turns")
    assert main(["schema", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give one of audit," in err
    # a name is never a path (it read any *.schema.json: `schema ../../x`)
    (tmp_path / "outside.schema.json").write_text("{}", encoding="utf-8")
    name = os.path.relpath(tmp_path / "outside", SCHEMA_DIR)
    assert main(["schema", name]) == 2 and "no JSON Schema named" in capsys.readouterr().err
    # --help names every schema (it left `mask` out)
    with pytest.raises(SystemExit):
        main(["schema", "--help"])
    named = " ".join(capsys.readouterr().out.split())
    assert all(f" {name}," in named or f" {name}." in named for name in schema_names()), named


def run_json_text(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


# ---- every output against its schema ----------------------------------------------------------------

def test_audit_json(capsys, matches_schema, tmp_path):
    # Every status the fixtures give (pass, fail, impossible, unsupported), warnings, expected failures.
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps({"same-text": "renders no chat"}))
    data = run_json(capsys, "audit", "--in-process", "--format", "json", "--expected-failures", str(expected),
                    str(FIXTURES), code=1)
    assert {r["status"] for r in data["results"]} >= {"pass", "fail", "impossible", "unsupported"}
    assert matches_schema("audit", data)


def test_audit_json_with_prefix_stability(capsys, matches_schema):
    data = run_json(capsys, "audit", "--in-process", "--format", "json", "--prefix-stability", "report", CHATML,
                    str(TURNS / "date.jinja"))
    assert {r["prefix_stability"]["verdict"] for r in data["results"]} == {"stable", "unstable"}
    assert matches_schema("audit", data)


def test_audit_json_with_a_token_round_trip(capsys, matches_schema, tiny_hf):
    data = run_json(capsys, "audit", "--in-process", "--format", "json", "--tokenizer", tiny_hf, CHATML)
    assert data["results"][0]["token_round_trip"]["passed"] is True
    assert matches_schema("audit", data)


def test_table_json(capsys, matches_schema):
    data = run_json(capsys, "table", "--format", "json", "--jobs", "1", CHATML, str(FIXTURES / "same-text.jinja"),
                    code=1)  # (same-text fails: the table exits 1, as the audit)
    assert [r["name"] for r in data["rows"]] == ["chatml", "same-text"]
    assert matches_schema("table", data) and data["schema_version"] == 2
    # a template that did not pass: no delimiters (unproven), and why
    bad = data["rows"][1]
    assert bad["status"] != "pass" and bad["user_start"] is None and bad["reason"]


def test_turns_json(capsys, matches_schema, tiny_hf):
    data = run_json(capsys, "turns", "--format", "json", str(TURNS / "date.jinja"), str(TURNS / "stable.jinja"))
    assert [r["stable"] for r in data["reports"]] == [False, True]
    assert matches_schema("turns", data)
    with_tokens = run_json(capsys, "turns", "--format", "json", "--no-switches", "--tokenizer", tiny_hf, CHATML)
    assert with_tokens["reports"][0]["cost"] is not None
    assert matches_schema("turns", with_tokens)
    # ids that part where the text does not (Llama 3's header on another vocabulary): the cause
    # "token ids", which the schema lacked
    ids = run_json(capsys, "turns", "--format", "json", "--no-switches", "--tokenizer", "vocab:qwen35",
                   str(TURNS / "always-header.jinja"))
    assert ids["reports"][0]["first_divergence"]["cause"] == "token ids"
    assert matches_schema("turns", ids)


def test_spans_json(capsys, matches_schema, tiny_hf, conversation, tmp_path):
    data = run_json(capsys, "spans", conversation, "--template", CHATML, "--tokenizer", tiny_hf)
    assert data["message_roles"] == ["system", "user", "assistant", "user"]
    assert matches_schema("spans", data)
    # Reasoning markers are spans of their own (roles reasoning / reasoning_end), opening no message.
    thinking = tmp_path / "thinking.json"
    thinking.write_text(json.dumps([{"role": "user", "content": "hello"},
                                    {"role": "assistant", "content": "world", "reasoning_content": "result"},
                                    {"role": "user", "content": "hello"}]))
    data = run_json(capsys, "spans", str(thinking), "--template", str(FIXTURES / "reasoning.jinja"), "--tokenizer", tiny_hf)
    assert "reasoning_end" in {s["role"] for s in data["spans"]} and matches_schema("spans", data)
    # A developer message is the client's role (the template is given it as system)
    developer = tmp_path / "developer.json"
    developer.write_text(json.dumps([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hello"}]))
    data = run_json(capsys, "spans", str(developer), "--template", CHATML, "--tokenizer", tiny_hf)
    assert data["message_roles"] == ["developer", "user"] and matches_schema("spans", data)
    assert matches_schema("session", {"messages": json.loads(developer.read_text())})


def test_request_json(capsys, matches_schema, tiny_hf, conversation):
    body = run_json(capsys, "request", conversation, "--template", CHATML, "--tokenizer", tiny_hf, "--n-predict", "4")
    assert body["cache_prompt"] is True and matches_schema("request", body)
    only = run_json(capsys, "request", "--delimiters-only", "--template", CHATML, "--tokenizer", tiny_hf)
    assert only == body["message_delimiters"] and matches_schema("request", only)


def test_session_json(capsys, matches_schema):
    data = run_json(capsys, "session", "generate", "--tokens", "2000", "--style", "tool-role")
    assert matches_schema("session", data)


def test_server_log_json(capsys, matches_schema):
    for log in ("0.3.33-session-lv4.log", "0.3.36-cold-lv3.log", "0.3.36-no-checkpoints-lv4.log"):
        data = run_json(capsys, "server", "log", str(LOGS / log), "--format", "json")
        assert data["tasks"] and matches_schema("server-log", data)


def test_engine_parity_json(matches_schema):
    from tmplkit.server.parity import EngineComparison, parity_report

    rows = [EngineComparison("a", "round trip", "identical", round_trip=True),
            EngineComparison("b", "generation prompt", "differs", at=3, ours="x", theirs="y", round_trip=False),
            EngineComparison("c", "round trip", "refused", error="bad template")]
    data = parity_report(rows)
    assert data["schema_version"] == 1 and len(data["rows"]) == 3
    assert matches_schema("engine-parity", json.loads(json.dumps(data)))


def test_prefill_and_replay_json(matches_schema):
    from tmplkit.prefill.report import CheckpointRecord, Comparison, DecodeCall, PolicyResult, PrefillReport
    from tmplkit.replay import ReplayedRequest, SessionReplay

    report = PrefillReport("m.gguf", "gated", True, 100, 0, 100, 1.0, 0.9, 0.1,
                           decode_calls=(DecodeCall(0, 64, "user start", 0.5, "user start"), DecodeCall(64, 36, "end", 0.4)),
                           checkpoints=(CheckpointRecord(64, 0, 63, 1024, 0.01, "user start"),))
    comp = Comparison("m.gguf", "s.json", "chatml", 100, {"n_batch": 64}, (PolicyResult("gated", (report,)),))
    assert matches_schema("prefill", json.loads(json.dumps(comp.to_dict())))
    req = ReplayedRequest(0, 100, 0, 100, None, 100, 1.0, 0.2, 10, (64,))
    replay = SessionReplay("m.gguf", "chatml", {"kind": "swa"}, {"tmplkit": (req,)}, (100,))
    assert matches_schema("replay", json.loads(json.dumps(replay.to_dict())))


def test_mask_json(capsys, matches_schema, tiny_hf):
    chat = str(ROOT / "fixtures" / "masks" / "chat.json")
    from tmplkit.masks import text_mask
    from tmplkit.sources import load_one

    text = text_mask(load_one(CHATML), chat).to_dict()  # (the library's mask of the text alone)
    assert text["turns"] and "input_ids" not in text and matches_schema("mask", text)
    tokens = run_json(capsys, "mask", CHATML, "--session", chat, "--tokenizer", tiny_hf, "--format", "json")
    assert tokens["n_masked"] == sum(tokens["assistant_masks"]) > 0 and matches_schema("mask", tokens)
