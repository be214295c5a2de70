"""`tmplkit session generate`: its bounds, --tokens and --requests not both, and a generator whose
cost follows the session's length (the same sessions as before, byte for byte)."""

from __future__ import annotations

import hashlib
import json

import pytest

from tmplkit.cli import main
from tmplkit.session import generate_session


def _one_line_error(capsys, *argv: str) -> str:
    assert main(["--no-config", "session", "generate", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("tmplkit: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv, words", [
    (["--tokens", "10000000"], "--tokens must be at most 2000000, got 10000000"),
    (["--requests", "1000"], "--requests must be at most 200, got 1000"),
    (["--tokens", "3000", "--requests", "2"], "give --tokens or --requests, not both"),
    (["--tokens", "100"], "--tokens must be at least 200, got 100"),
    (["--requests", "0"], "--requests must be a positive whole number, got 0"),  # (a count: no "finite")
])
def test_out_of_range_or_conflicting_lengths_are_refused(argv, words, capsys, tmp_path):
    out = tmp_path / "s.json"
    assert words in _one_line_error(capsys, *argv, "-o", str(out))
    assert not out.exists()


def test_requests_alone_and_the_bounds_in_the_help(capsys, tmp_path):
    out = tmp_path / "s.json"
    assert main(["--no-config", "session", "generate", "--requests", "2", "-o", str(out)]) == 0
    assert [m["role"] for m in json.loads(out.read_text())["messages"]].count("user") == 2
    with pytest.raises(SystemExit):
        main(["session", "generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "200 to 2000000" in text and "1 to 200" in text and "not with --tokens" in text


# sha256 of json.dumps(session.to_dict(), indent=1, ensure_ascii=False), from the generator as it
# was before its size became a running sum: the same arguments give the same session.
SESSIONS = [
    (dict(target_tokens=3000, seed=1, style="agent"), "1d476e49ed7d5c303cc4e78c3b44c0c1ad29ff6e394484492787145b1654de3a"),
    (dict(target_tokens=16000, seed=0, style="tool-role"), "5b6410855c8eba8e383f0d1ddf800845e6d45e3f8c8325b1f5ded2284253c25b"),
    (dict(target_tokens=4000, seed=7, style="user-turns"), "7d1a22effc64ed60157242051ac4093ed0cf1097b423737422494fead0906ca3"),
    (dict(target_tokens=16000, seed=2, style="agent", requests=3), "65138338096d9383a4cc5a32ed35a77654d9a6423135c39ff2f93eed514fec75"),
    (dict(target_tokens=200000, seed=5, style="agent"), "be94ce5ca109a7f6ec2d93863c92d64ba822c8e40cd4d99a3318903fc10395c9"),
]


@pytest.mark.parametrize("kwargs, digest", SESSIONS)
def test_the_sessions_are_the_same_as_before(kwargs, digest):
    session = generate_session(**kwargs)
    assert hashlib.sha256(json.dumps(session.to_dict(), indent=1, ensure_ascii=False).encode()).hexdigest() == digest


def test_each_message_is_measured_once(monkeypatch):
    """The length is summed as messages come, not re-summed over the whole session at each step
    (which made 10 million tokens take minutes): the generator serialises a number of messages
    proportional to the session, not to its square."""
    import tmplkit.session._generator as generator

    calls = []

    class CountingJson:
        @staticmethod
        def dumps(obj, **kwargs):
            calls.append(1)
            return json.dumps(obj, **kwargs)

    monkeypatch.setattr(generator, "json", CountingJson)
    session = generate_session(200000, seed=5, style="agent")
    assert len(session.messages) == 571
    assert len(calls) < 4 * len(session.messages)  # each message once, and each tool call's arguments


@pytest.mark.parametrize("kwargs", [dict(target_tokens=10**12), dict(target_tokens=199), dict(target_tokens=2.5e4),
                                    dict(target_tokens=True), dict(requests=0), dict(requests=10**9), dict(requests=2.0)])
def test_the_library_refuses_a_length_it_would_not_end_for(kwargs):
    # (the command line bounded these; the library generated for as long as asked: hours and the memory)
    from tmplkit.errors import InputError

    with pytest.raises(InputError, match="target_tokens|requests"):
        generate_session(**kwargs)


def test_the_command_lines_bounds_are_the_librarys():
    from tmplkit.cli import _session as cli
    from tmplkit.session import _generator as lib

    assert (cli.MIN_TOKENS, cli.MAX_TOKENS, cli.MAX_REQUESTS) == (lib.MIN_TOKENS, lib.MAX_TOKENS, lib.MAX_REQUESTS)
    assert set(cli.STYLES) == set(lib.STYLES)
