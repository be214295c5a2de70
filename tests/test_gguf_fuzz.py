"""Corrupted GGUF files: every one ends in a one-line TmplkitError naming the file and the problem,
without a traceback, a hang, or an allocation larger than the file.

Inputs: GGUFs built byte by byte here (so lengths and counts can lie), GGUFs written with
gguf.GGUFWriter, hypothesis-generated and -mutated files, and truncations and length-field
corruptions of the real vocab GGUFs of the corpus.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tmplkit.errors import GGUFError, TmplkitError
from tmplkit.sources import corpus, load, load_gguf

# What a message must say: the problem, in words a user can act on.
PROBLEM = re.compile(
    r"corrupted|truncated|not a GGUF|unsupported GGUF version|not valid UTF-8|no chat template|is not a string"
    r"|cannot (open|map|read)|not a regular file|exceeds|runs past"
)
# Allocation allowance on top of the file size: the Python objects of a parse and of its error.
OVERHEAD = 64 * 1024

STRING, ARRAY = 8, 9
SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


# --- building GGUF bytes by hand ------------------------------------------------------------------


def _s(b: bytes, e: str = "<", wide: bool = True) -> bytes:
    return struct.pack(e + ("Q" if wide else "I"), len(b)) + b


def _value(vtype: int, value, e: str = "<", wide: bool = True) -> bytes:
    if vtype == STRING:
        return _s(value if isinstance(value, bytes) else value.encode(), e, wide)
    if vtype == ARRAY:
        etype, items = value
        body = b"".join(_value(etype, v, e, wide) for v in items)
        return struct.pack(e + "I", etype) + struct.pack(e + ("Q" if wide else "I"), len(items)) + body
    return struct.pack(e + SCALAR_FMT.get(vtype, "I"), value)  # an unknown type: 4 bytes of anything


def gguf_bytes(kvs, *, magic=b"GGUF", version=3, n_tensors=0, n_kv=None, endian="<") -> bytes:
    wide = version >= 2
    cnt = "Q" if wide else "I"
    out = magic + struct.pack(endian + "I", version)
    out += struct.pack(endian + cnt, n_tensors) + struct.pack(endian + cnt, len(kvs) if n_kv is None else n_kv)
    for key, vtype, value in kvs:
        out += _s(key.encode() if isinstance(key, str) else key, endian, wide)
        out += struct.pack(endian + "I", vtype) + _value(vtype, value, endian, wide)
    return out


TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
GOOD_KVS = [
    ("general.architecture", STRING, "llama"),
    ("tokenizer.ggml.tokens", ARRAY, (STRING, [b"<unk>", b"<s>", b"</s>", b"hi"])),
    ("tokenizer.ggml.bos_token_id", 4, 1),
    ("tokenizer.ggml.eos_token_id", 4, 2),
    ("tokenizer.chat_template", STRING, TEMPLATE),
]


# --- the check every case goes through ------------------------------------------------------------


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds: float = 20.0):
    """Fail (instead of hanging the suite) if loading takes this long: a guard, not a benchmark."""
    def on_alarm(signum, frame):
        raise Hang(f"loading did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_load(path: Path, loader=load_gguf, measure: bool = True):
    """Load `path`; return the templates, or the TmplkitError, after checking the rules above."""
    size = path.stat().st_size if path.is_file() else 0
    if measure:
        tracemalloc.start()
    try:
        with no_hang():
            result = loader(path)
    except TmplkitError as exc:
        result = exc
    except Hang:
        raise
    except BaseException as exc:  # anything else is a bug: it would reach the user as a traceback
        raise AssertionError(f"{path.name}: {type(exc).__name__} escaped: {exc}") from exc
    finally:
        if measure:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    if measure:
        assert peak <= size + OVERHEAD, f"{path.name}: peak allocation {peak} for a file of {size} bytes"
    if isinstance(result, TmplkitError):
        message = str(result)
        assert "\n" not in message, message
        assert str(path) in message, message
        assert PROBLEM.search(message), message
        assert len(message) < 1000, message
    return result


def write(tmp_path: Path, data: bytes, name: str = "model.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


# Warm the imports so tracemalloc measures the parse, not module loading.
_ = load_gguf


@pytest.fixture(autouse=True, scope="module")
def _warm(tmp_path_factory):
    p = tmp_path_factory.mktemp("warm") / "w.gguf"
    p.write_bytes(gguf_bytes(GOOD_KVS))
    load_gguf(p)
    with contextlib.suppress(TmplkitError):
        load_gguf(write(p.parent, b"GGUF\x03\x00\x00\x00", "bad.gguf"))
    with contextlib.suppress(TmplkitError):  # (the refusal of a key given twice: its first call allocated 66 kB)
        load_gguf(write(p.parent, gguf_bytes([("k", 4, 1), ("k", 4, 1)]), "twice.gguf"))


# --- hand-made corruptions ------------------------------------------------------------------------


def test_the_hand_built_file_is_valid(tmp_path):
    (t,) = check_load(write(tmp_path, gguf_bytes(GOOD_KVS)))
    assert t.text == TEMPLATE and t.bos_token == "<s>" and t.eos_token == "</s>"
    (t,) = check_load(write(tmp_path, gguf_bytes(GOOD_KVS, version=1), "v1.gguf"))
    assert t.text == TEMPLATE
    (t,) = check_load(write(tmp_path, gguf_bytes(GOOD_KVS, endian=">"), "be.gguf"))
    assert t.text == TEMPLATE


def _replace(kvs, key, vtype, value):
    return [(k, vtype, value) if k == key else (k, t, v) for k, t, v in kvs]


HUGE = 2 ** 64 - 1
CASES = {
    "empty": b"",
    "three bytes": b"GGU",
    "magic only": b"GGUF",
    "wrong magic": b"GGML" + gguf_bytes(GOOD_KVS)[4:],
    "text file": b"{% for m in messages %}{{ m.content }}{% endfor %}",
    "zip file": b"PK\x03\x04" + b"\x00" * 100,
    "version 0": gguf_bytes(GOOD_KVS, version=0),
    "version 4": gguf_bytes(GOOD_KVS, version=4),
    "version huge": gguf_bytes(GOOD_KVS, version=0xFFFFFFFF),
    "no counts": b"GGUF\x03\x00\x00\x00",
    "kv count huge": gguf_bytes(GOOD_KVS, n_kv=HUGE),
    "kv count one too many": gguf_bytes(GOOD_KVS, n_kv=len(GOOD_KVS) + 1),
    "tensor count huge": gguf_bytes(GOOD_KVS, n_tensors=HUGE),
    "no kv": gguf_bytes([]),
    "key length huge": gguf_bytes(GOOD_KVS)[:24] + struct.pack("<Q", HUGE) + gguf_bytes(GOOD_KVS)[32:],
    "key length 2**63": gguf_bytes(GOOD_KVS)[:24] + struct.pack("<Q", 2 ** 63) + gguf_bytes(GOOD_KVS)[32:],
    "key of 100k bytes": gguf_bytes([("k" * 100_000, 4, 1)] + GOOD_KVS),
    "key with newline": gguf_bytes([("bad\nkey", 99, 0)]),
    "unknown value type": gguf_bytes([("general.x", 13, 0)] + GOOD_KVS),
    "unknown array type": gguf_bytes([("general.x", ARRAY, (13, []))] + GOOD_KVS),
    "array of arrays": gguf_bytes([("general.x", ARRAY, (ARRAY, []))] + GOOD_KVS),
    "template not utf-8": gguf_bytes(_replace(GOOD_KVS, "tokenizer.chat_template", STRING, b"{{ '\xff\xfe' }}")),
    "template is a number": gguf_bytes(_replace(GOOD_KVS, "tokenizer.chat_template", 4, 7)),
    "template is an array": gguf_bytes(_replace(GOOD_KVS, "tokenizer.chat_template", ARRAY, (STRING, [b"x"]))),
    "named template is an array": gguf_bytes(GOOD_KVS + [("tokenizer.chat_template.rag", ARRAY, (4, [1, 2]))]),
    "no template": gguf_bytes(GOOD_KVS[:-1]),
    "bos id is an array": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.bos_token_id", ARRAY, (4, [1, 2]))),
    "bos id is a string": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.bos_token_id", STRING, "1")),
    "bos id is a float": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.bos_token_id", 6, 1.0)),
    "bos id out of range": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.bos_token_id", 10, 2 ** 63)),
    "bos id negative": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.bos_token_id", 5, -1)),
    "tokens is a string": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.tokens", STRING, "<s>")),
    "tokens is a number array": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.tokens", ARRAY, (4, [1, 2, 3]))),
    "tokens count huge": gguf_bytes(GOOD_KVS).replace(struct.pack("<IQ", STRING, 4), struct.pack("<IQ", STRING, HUGE)),
    "token length huge": gguf_bytes(GOOD_KVS).replace(_s(b"<unk>"), struct.pack("<Q", 2 ** 62) + b"<unk>"),
    "template length past end": gguf_bytes(GOOD_KVS).replace(_s(TEMPLATE.encode()), struct.pack("<Q", len(TEMPLATE) + 1) + TEMPLATE.encode()),
    "template token invalid utf-8 bos": gguf_bytes(_replace(GOOD_KVS, "tokenizer.ggml.tokens", ARRAY, (STRING, [b"\xff", b"\xfe\xff", b"x"]))),
    "big-endian garbage": b"GGUF\x00\x00\x00\x03" + b"\xff" * 40,
    "v1 count huge": gguf_bytes(GOOD_KVS, version=1, n_kv=2 ** 32 - 1),
    # (both loaded: the last value read as the template, which llama.cpp and gguf-py refuse; a name
    # that wrote a line of its own into the text report)
    "template key twice": gguf_bytes(GOOD_KVS + [("tokenizer.chat_template", STRING, "{{ 1 }}")]),
    "template name with a newline": gguf_bytes(GOOD_KVS + [("tokenizer.chat_template.x\nFAIL  forged", STRING, "{{ 1 }}")]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_corrupted_file(tmp_path, name):
    path = write(tmp_path, CASES[name], name.replace(" ", "_") + ".gguf")
    result = check_load(path)
    if name in ("bos id out of range", "bos id negative", "bos id is a float", "bos id is a string",
                "bos id is an array", "tokens is a string", "tokens is a number array",
                "template token invalid utf-8 bos"):
        # Harmless corruption of a value we only look up: the template still loads, BOS unknown or replaced.
        assert isinstance(result, list) and result[0].text == TEMPLATE, result
    else:
        assert isinstance(result, TmplkitError), f"{name}: loaded {result!r}"
    # Through load() too: same outcome.
    again = check_load(path, load, measure=False)
    assert type(again) is type(result)


def test_utf8_error_names_the_key(tmp_path):
    path = write(tmp_path, CASES["template not utf-8"])
    err = check_load(path)
    assert isinstance(err, GGUFError)
    assert "'tokenizer.chat_template' is not valid UTF-8 at byte 4" in str(err)


@pytest.mark.parametrize("key", [b"a\nb", b"\n\t", b"x\r\x1b[2J"])
def test_a_key_given_twice_is_named_on_one_line(tmp_path, key):
    # (a fuzzed file's key '\n\t' given twice made a message of two lines)
    err = check_load(write(tmp_path, gguf_bytes([(key, 4, 1), (key, 4, 1)])))
    assert isinstance(err, GGUFError) and "appears twice" in str(err)
    assert not any(c in str(err) for c in "\n\r\x1b")  # (check_load holds it to one line; no escape acts)


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert isinstance(check_load(fifo, measure=False), TmplkitError)  # must not block waiting for a writer
    assert isinstance(check_load(fifo, load, measure=False), TmplkitError)
    folder = tmp_path / "dir.gguf"
    folder.mkdir()
    assert isinstance(check_load(folder, measure=False), TmplkitError)
    assert isinstance(check_load(tmp_path / "missing.gguf", measure=False), TmplkitError)


def test_writer_made_files_round_trip(write_gguf):
    p = write_gguf(named={"tool_use": "{{ 'T' }}", "rag": "{{ 'R' }}"})
    names = [t.name for t in check_load(p)]
    assert names == ["model", "model:rag", "model:tool_use"]


def test_every_single_byte_corruption_of_a_small_file(write_gguf, tmp_path):
    """Every byte of a writer-made GGUF set to 0x00, 0xFF and +1 in turn: 3 x size cases."""
    src = write_gguf(named={"tool_use": "{% if tools %}T{% endif %}"})
    data = bytearray(src.read_bytes())
    p = tmp_path / "flip.gguf"
    outcomes = {"ok": 0, "error": 0}
    for i in range(len(data)):
        for new in {0x00, 0xFF, (data[i] + 1) & 0xFF} - {data[i]}:
            mutated = bytearray(data)
            mutated[i] = new
            p.write_bytes(mutated)
            result = check_load(p, measure=(i % 7 == 0))
            outcomes["ok" if isinstance(result, list) else "error"] += 1
    assert outcomes["error"] > 0 and sum(outcomes.values()) >= 2 * len(data)


def test_every_truncation_of_a_small_file(write_gguf, tmp_path):
    src = write_gguf()
    data = src.read_bytes()
    full = check_load(src)
    p = tmp_path / "cut.gguf"
    for n in range(len(data)):
        p.write_bytes(data[:n])
        result = check_load(p, measure=(n % 5 == 0))
        # Cut inside the metadata: an error; cut only in the padding after it: the same templates.
        assert isinstance(result, TmplkitError) or [t.text for t in result] == [t.text for t in full]


# --- hypothesis -----------------------------------------------------------------------------------

_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])

_scalar_kv = st.tuples(st.sampled_from(list(SCALAR_FMT)), st.integers(0, 255)).map(
    lambda t: (t[0], float(t[1]) if SCALAR_FMT[t[0]] in "fd" else (bool(t[1] & 1) if t[0] == 7 else t[1] % 128)))
_kv = st.one_of(
    st.tuples(st.text(max_size=40), st.just(STRING), st.binary(max_size=60)),
    st.tuples(st.text(max_size=40), _scalar_kv).map(lambda t: (t[0], t[1][0], t[1][1])),
    st.tuples(st.text(max_size=40), st.just(ARRAY), st.tuples(st.just(STRING), st.lists(st.binary(max_size=10), max_size=5))),
    st.tuples(st.text(max_size=40), st.just(ARRAY), st.tuples(st.just(4), st.lists(st.integers(0, 2 ** 32 - 1), max_size=5))),
    st.tuples(st.sampled_from(["tokenizer.chat_template", "tokenizer.chat_template.x", "tokenizer.ggml.bos_token_id",
                               "tokenizer.ggml.tokens"]), st.just(STRING), st.binary(max_size=40)),
)


@st.composite
def gguf_files(draw):
    kvs = draw(st.lists(_kv, max_size=8))
    data = bytearray(gguf_bytes(kvs, version=draw(st.sampled_from([1, 2, 3]))))
    # Then lie: overwrite some 8-byte fields with absurd numbers, flip bytes, truncate.
    for _ in range(draw(st.integers(0, 3))):
        if len(data) > 16:
            at = draw(st.integers(8, len(data) - 8))
            data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from([0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 63, HUGE, len(data)])))
    for _ in range(draw(st.integers(0, 4))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    return bytes(data)


@_FUZZ
@given(data=gguf_files())
def test_fuzzed_structured_files(tmp_path, data):
    check_load(write(tmp_path, data, "fuzz.gguf"))


@_FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.binary(max_size=200).map(lambda b: b"GGUF" + b),
                      st.binary(max_size=200).map(lambda b: b"GGUF\x03\x00\x00\x00" + b)))
def test_fuzzed_random_bytes(tmp_path, data):
    result = check_load(write(tmp_path, data, "rand.gguf"))
    assert isinstance(result, (TmplkitError, list))


# --- the real vocab GGUFs of the corpus -----------------------------------------------------------


def _field_offsets(path: Path):
    """Start offsets of every metadata key/value, and of the length and count fields within them.

    A small walker of our own over a valid v3 file (gguf-py's reader takes seconds on a big vocabulary).
    """
    data = path.read_bytes()
    u32, u64 = struct.Struct("<I"), struct.Struct("<Q")
    (n_kv,) = u64.unpack_from(data, 16)
    pos = 24
    starts, lengths = [], []

    def skip_value(vtype, pos):
        if vtype == STRING:
            lengths.append(pos)
            return pos + 8 + u64.unpack_from(data, pos)[0]
        if vtype == ARRAY:
            etype = u32.unpack_from(data, pos)[0]
            lengths.append(pos + 4)
            (n,) = u64.unpack_from(data, pos + 4)
            pos += 12
            if etype == STRING:
                for i in range(n):
                    if i < 3:
                        lengths.append(pos)
                    pos += 8 + u64.unpack_from(data, pos)[0]
                return pos
            return pos + n * struct.calcsize(SCALAR_FMT[etype])
        return pos + struct.calcsize(SCALAR_FMT[vtype])

    for _ in range(n_kv):
        starts.append(pos)
        lengths.append(pos)
        pos += 8 + u64.unpack_from(data, pos)[0]
        vtype = u32.unpack_from(data, pos)[0]
        pos = skip_value(vtype, pos + 4)
    return starts, lengths


@pytest.mark.corpus
@pytest.mark.parametrize("vocab", ["phi-3", "qwen35"])
def test_truncations_of_a_real_gguf(tmp_path, vocab):
    src = corpus.vocab_path(vocab)
    full = [t.text for t in load_gguf(src)]
    size = src.stat().st_size
    starts, _ = _field_offsets(src)
    rng = random.Random(25213)
    offsets = set(range(0, 64)) | {s + d for s in starts for d in (-1, 0, 1, 9)} | {rng.randrange(size) for _ in range(60)}
    offsets = sorted((o for o in offsets if 0 <= o < size), reverse=True)
    p = tmp_path / f"{vocab}-cut.gguf"
    shutil.copyfile(src, p)
    errors = 0
    for i, n in enumerate(offsets):  # cut ever shorter, in place
        os.truncate(p, n)
        # tracemalloc slows a parse tenfold: measure a sample of the cuts.
        result = check_load(p, measure=(i % 20 == 0))
        if isinstance(result, TmplkitError):
            errors += 1
        else:
            assert [t.text for t in result] == full
    assert errors >= len(offsets) - 2


@pytest.mark.corpus
def test_length_fields_of_a_real_gguf(tmp_path):
    src = corpus.vocab_path("phi-3")
    _, length_fields = _field_offsets(src)
    p = tmp_path / "phi3-lengths.gguf"
    shutil.copyfile(src, p)
    original = p.read_bytes()
    size = len(original)
    tried = 0
    with p.open("r+b") as f:
        for at in length_fields:
            old = original[at:at + 8]
            (value,) = struct.unpack("<Q", old)
            for new in {HUGE, 2 ** 63, 2 ** 32, size, size - at, value + 1, max(value - 1, 0), 0} - {value}:
                f.seek(at)
                f.write(struct.pack("<Q", new))
                f.flush()
                check_load(p, measure=(tried % 8 == 0))
                tried += 1
            f.seek(at)
            f.write(old)
            f.flush()
    assert tried > 100


@pytest.mark.corpus
def test_real_template_made_invalid_utf8(tmp_path):
    src = corpus.vocab_path("phi-3")
    data = bytearray(src.read_bytes())
    text = load_gguf(src)[0].text.encode()
    at = bytes(data).index(text)
    data[at + 3] = 0xFF
    p = write(tmp_path, bytes(data), "phi3-bad-utf8.gguf")
    err = check_load(p)
    assert isinstance(err, GGUFError) and "not valid UTF-8 at byte 3" in str(err)


# --- through the command line: one line on stderr, exit code 2, no traceback -----------------------


@pytest.mark.parametrize("name", ["key length huge", "template not utf-8", "wrong magic", "version 4"])
def test_cli_reports_one_line(tmp_path, name):
    path = write(tmp_path, CASES[name], "bad.gguf")
    proc = subprocess.run([sys.executable, "-m", "tmplkit.cli", "show", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tmplkit: error: ") and str(path) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
