"""`tmplkit audit --format summary` (what `make audit` prints): the audit on one screen, every
count of what was and was not checked, the failures not expected by name; and the text report's
status column as wide as its widest mark."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tmplkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
EXPECTED = str(ROOT / "fixtures" / "expected_failures.json")


def run(capsys, *argv):
    code = main(["--no-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_summary_fits_one_screen_and_counts_what_was_not_checked(capsys, tmp_path):
    full = tmp_path / "audit.txt"
    code, out, _ = run(capsys, "audit", "--jobs", "1", str(FIXTURES), "--expected-failures", EXPECTED,
                       "--format", "summary", "--report", f"text:{full}")
    lines = out.splitlines()
    n = len(list(FIXTURES.glob("*.jinja")))
    assert code == 0 and lines[0] == f"tmplkit audit: {n} templates" and lines[-1] == "-> ok"
    assert len(lines) <= 20 and max(map(len, lines)) <= 140  # one screen, where the text report is a line per template
    text = "\n".join(lines)
    assert re.search(rf"analysis and text round trip +{n} checked: \d+ pass", text)
    assert re.search(r"token round trip +not checked \(no --tokenizer\)", text)
    assert re.search(r"prefix stability +not checked", text)
    listed = len(json.loads(Path(EXPECTED).read_text()))
    assert re.search(rf"listed as expected failures +{listed} ", text) and re.search(r"failing, not expected +0$", text, re.M)
    assert len(full.read_text().splitlines()) > n  # the whole report beside it


def test_the_summary_names_unexpected_failures_and_fails(capsys):
    code, out, _ = run(capsys, "audit", "--jobs", "1", str(FIXTURES / "chatml.jinja"), str(FIXTURES / "same-text.jinja"),
                       "--format", "summary")
    assert code == 1 and out.splitlines()[-1] == "-> FAILED"
    assert re.search(r"failing, not expected +1\n    [A-Z]+ same-text: ", out)


def test_the_summary_counts_the_token_round_trip(capsys, tiny_hf_folder):
    # one tokenizer for all: the passing templates are checked, the failing one is not (analysis failed)
    code, out, _ = run(capsys, "audit", "--jobs", "1", str(FIXTURES / "chatml.jinja"), str(FIXTURES / "same-text.jinja"),
                       "--tokenizer", str(tiny_hf_folder / "tokenizer.json"), "--format", "summary")
    assert re.search(r"token round trip +1 checked: \d passed, \d failed", out)
    assert re.search(r"not checked: analysis failed +1$", out, re.M) and "no tokenizer" not in out


def test_the_status_column_is_as_wide_as_its_widest_mark(capsys):
    code, out, _ = run(capsys, "audit", "--jobs", "1", str(FIXTURES), "--expected-failures", EXPECTED)
    rows = [ln for ln in out.splitlines() if re.match(r"[A-Z]{4,}", ln)]
    assert any(r.startswith("UNSUPPORTED (expected) ") for r in rows)
    starts = {len(re.match(r"[A-Z]+(?: \(expected\))? +", r).group(0)) for r in rows}
    assert len(starts) == 1  # every name starts in the same column


def test_one_request_one_task_one_turn_are_singular(capsys, tmp_path):
    """'1 request', '1 task', '1 turn' (not '1 requests'): the counts a first run prints."""
    session = tmp_path / "s.json"
    session.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    code, out, _ = run(capsys, "turns", str(FIXTURES / "chatml.jinja"), "--session", str(session), "--no-switches")
    assert code == 0 and "the session has one request" in out and "1 requests" not in out
    logs = ROOT / "fixtures" / "server-logs"
    code, out, _ = run(capsys, "server", "log", str(logs / "0.3.36-cold-lv3.log"))
    assert code == 0 and ": 1 task;" in out


def test_a_mask_with_one_turn_says_turn():
    from types import SimpleNamespace

    from tmplkit.cli._mask import format_mask

    result = SimpleNamespace(text="<u>hi</u><a>yo</a>", text_mask=SimpleNamespace(ranges=[(12, 14)]),
                             mask=[0, 0, 1], turns=())
    assert format_mask(result, False).endswith("-- 1 of 3 tokens learned in 1 turn\n")
