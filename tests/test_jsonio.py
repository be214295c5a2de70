"""The one reader of users' text and JSON files: every check, every option, one-line errors."""

from __future__ import annotations

import io
import json
import os

import pytest

from tmplkit.errors import InputError, SourceError, TmplkitError
from tmplkit.jsonio import parse_json, read_json, read_text


def _one_line(exc: BaseException, where) -> str:
    message = str(exc)
    assert "\n" not in message and message.startswith(f"{where}: "), message
    return message


def test_reads_paths_and_open_files(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"a": [1, "x"]}', encoding="utf-8")
    assert read_json(p) == {"a": [1, "x"]}
    assert read_json(str(p)) == {"a": [1, "x"]}
    with open(p, "rb") as f:
        assert read_json(f) == {"a": [1, "x"]}
    assert read_json(io.StringIO("[1]")) == [1]
    assert read_json(io.BytesIO(b"[2]")) == [2]
    with pytest.raises(InputError, match=r"^<stdin>: not valid JSON"):
        read_json(io.StringIO("[1"))


def test_the_error_class_is_the_callers(tmp_path):
    with pytest.raises(SourceError) as info:
        read_json(tmp_path / "missing.json", error=SourceError)
    assert "cannot read (No such file or directory)" in _one_line(info.value, tmp_path / "missing.json")


def test_bom_is_stripped_or_refused(tmp_path):
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf[1]")
    assert read_json(p) == [1]
    with pytest.raises(InputError) as info:
        read_json(p, strip_bom=False)
    assert "not valid JSON (it starts with a UTF-8 byte-order mark)" in _one_line(info.value, p)
    # Text keeps it unless asked: transformers keeps a .jinja template's BOM as a character.
    assert read_text(p) == "\ufeff[1]"
    assert read_text(p, strip_bom=True) == "[1]"
    assert read_json(io.StringIO("\ufeff[3]")) == [3]


def test_pipes_devices_and_folders_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError) as info:
        read_json(fifo)  # would wait for a writer forever if it were opened for a blocking read
    assert "not a regular file" in _one_line(info.value, fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_text("/dev/zero")  # would never end
    with pytest.raises(InputError) as info:
        read_json(tmp_path, what="a conversation")
    assert "is a folder; give a conversation as a file" in _one_line(info.value, tmp_path)


def test_size_limit(tmp_path):
    p = tmp_path / "big.json"
    p.write_text("[" + "1," * 100 + "1]")
    assert len(read_json(p, max_bytes=1000)) == 101
    with pytest.raises(InputError) as info:
        read_json(p, max_bytes=100)
    assert "over the limit of 100 bytes" in _one_line(info.value, p)
    with pytest.raises(InputError, match="over the limit of 10 bytes"):
        read_json(io.BytesIO(b"[" + b"1," * 20 + b"1]"), max_bytes=10)


def test_depth_limit_counts_brackets_outside_strings_only(tmp_path):
    deep = "[" * 11 + "]" * 11
    assert parse_json(deep, max_depth=11) == json.loads(deep)
    with pytest.raises(InputError, match=r"nested too deeply for a conversation \(more than 10 levels\)"):
        parse_json(deep, what="a conversation", max_depth=10)
    brackets_in_strings = json.dumps([["[[[[{{{{", "]]]]\\\"[[[["]] * 20)
    assert len(parse_json(brackets_in_strings, max_depth=2)) == 20
    with pytest.raises(InputError, match="nested too deeply"):  # past Python's own recursion limit
        parse_json("[" * 100_000 + "]" * 100_000, max_depth=None)
    with pytest.raises(InputError, match=r"\(more than 10 levels\); fix the value$"):  # (an option's value is no file)
        parse_json(deep, what="template variables", where="--template-kwargs", max_depth=10)


@pytest.mark.parametrize("data,expected", [
    (b"", "empty file; give a JSON file"),
    (b"  \n", "empty file"),
    (b'["caf\xe9"]', "not valid UTF-8 at byte 5; save the file as UTF-8"),
    (b"{'a': 1}", "not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes); fix the JSON"),
    (b"[1]\n[2]", "give one JSON value (JSON Lines is not supported)"),
])
def test_bad_content(tmp_path, data, expected):
    p = tmp_path / "x.json"
    p.write_bytes(data)
    with pytest.raises(TmplkitError) as info:
        read_json(p)
    assert expected in _one_line(info.value, p)
