"""A small, bounded reader for GGUF metadata (the key/value header), for untrusted files.

gguf-py's GGUFReader parses every tensor and array element into numpy views: correct, but it takes
seconds on a 150k-token vocabulary and trusts the counts it reads. Here we read only the key/value
section through mmap, check every length against the bytes left before using it, and keep only the
values we are asked for, so a 20 GB model loads its chat template quickly and a corrupted file
ends in a GGUFError, never in a huge allocation. The value type codes are those of gguf-py's
GGUFValueType (a test checks they agree); importing gguf itself costs more than the whole parse.
`Keys` names every metadata key tmplkit reads, once; `sources.load_gguf`, the tokenizer adapters
and the tiny-model builder all use it.
"""

from __future__ import annotations

import mmap
import stat
import struct
from collections.abc import Callable
from enum import IntEnum
from pathlib import Path

from ..errors import GGUFError, one_line

__all__ = ["GGUF_MAGIC", "GGUFValueType", "Keys", "holds_no_weights", "read_metadata"]

GGUF_MAGIC = 0x46554747  # b"GGUF" read as little-endian uint32


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class Keys:
    """Every GGUF metadata key tmplkit reads or writes, named once (names as in gguf-py's Keys;
    a test checks the values agree)."""

    class Tokenizer:
        MODEL = "tokenizer.ggml.model"
        LIST = "tokenizer.ggml.tokens"
        BOS_ID = "tokenizer.ggml.bos_token_id"
        EOS_ID = "tokenizer.ggml.eos_token_id"
        EOT_ID = "tokenizer.ggml.eot_token_id"
        EOM_ID = "tokenizer.ggml.eom_token_id"
        FIM_PAD_ID = "tokenizer.ggml.fim_pad_token_id"
        FIM_REP_ID = "tokenizer.ggml.fim_rep_token_id"
        FIM_SEP_ID = "tokenizer.ggml.fim_sep_token_id"
        CHAT_TEMPLATE = "tokenizer.chat_template"
        CHAT_TEMPLATE_N = "tokenizer.chat_template.{name}"
        CHAT_TEMPLATES = "tokenizer.chat_templates"  # a list of the named templates, not a template
        PREFIX = "tokenizer."


_SCALARS: dict[int, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("B"),
    GGUFValueType.INT8: struct.Struct("b"),
    GGUFValueType.UINT16: struct.Struct("H"),
    GGUFValueType.INT16: struct.Struct("h"),
    GGUFValueType.UINT32: struct.Struct("I"),
    GGUFValueType.INT32: struct.Struct("i"),
    GGUFValueType.FLOAT32: struct.Struct("f"),
    GGUFValueType.BOOL: struct.Struct("?"),
    GGUFValueType.UINT64: struct.Struct("Q"),
    GGUFValueType.INT64: struct.Struct("q"),
    GGUFValueType.FLOAT64: struct.Struct("d"),
}
_MAX_KEY_LEN = 65536  # llama.cpp keys are short; a longer one means a corrupted length field


class _Cursor:
    def __init__(self, buf, path: Path, endian: str):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path
        self.endian = endian
        self.structs = {t: struct.Struct(endian + s.format) for t, s in _SCALARS.items()}
        self.u32 = struct.Struct(endian + "I")
        self.u64 = struct.Struct(endian + "Q")

    def fail(self, what: str) -> GGUFError:
        # `what` may quote a key read from the file: keep the message on one line and short.
        what = "".join(c if c.isprintable() else repr(c)[1:-1] for c in what)
        if len(what) > 300:
            what = what[:300] + "..."
        return GGUFError(
            f"{self.path}: corrupted or truncated GGUF ({what} at byte {self.pos} of {self.size}); "
            "re-download or re-convert the file"
        )

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} needs {n} bytes, {self.size - self.pos} left")

    def unpack(self, st: struct.Struct, what: str):
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def count(self, what: str, min_item: int, width64: bool = True) -> int:
        n = self.unpack(self.u64 if width64 else self.u32, what)
        # Every item takes at least `min_item` bytes: a count that cannot fit is corruption.
        if n * max(min_item, 1) > self.size - self.pos:
            raise self.fail(f"{what} {n} exceeds the file size")
        return n

    def string_bytes(self, what: str, width64: bool) -> bytes:
        n = self.count(f"{what} length", 1, width64)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def skip_string(self, width64: bool) -> None:
        n = self.count("string length", 1, width64)
        self.pos += n


def holds_no_weights(path: str | Path) -> bool:
    """Whether the GGUF at `path` holds no tensor and is no first file of a split model (which may
    hold none): a vocabulary only, which serves a tokenizer and runs nothing. GGUFError where the
    file is no sound GGUF."""
    meta = read_metadata(path, lambda key: key == "split.count")
    return meta["__n_tensors__"] == 0 and not (isinstance(meta.get("split.count"), int) and meta["split.count"] > 1)


def read_metadata(
    path: str | Path,
    want: Callable[[str], bool],
    pick: dict[str, Callable[[dict], set[int]]] | None = None,
) -> dict:
    """Return {key: value} for the metadata keys where want(key) is true.

    Strings are returned as raw bytes (the caller decides how to treat invalid UTF-8), numeric
    arrays as lists. Arrays of strings are never read whole: `pick[key](metadata)` names the
    indices wanted once all keys are read, and the value becomes {index: bytes}.
    The special keys "__version__" and "__n_tensors__" hold the GGUF version and its tensor count.
    """
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block open() until a writer comes
            raise GGUFError(f"{p}: not a regular file; give a .gguf model file")
        f = p.open("rb")
    except OSError as exc:
        raise GGUFError(f"{p}: cannot open ({exc.strerror or exc}); check the path and permissions") from None
    with f:
        size = st.st_size
        if size < 4:  # (before the mapping: its error would wrap this one)
            raise GGUFError(f"{p}: not a GGUF file ({size} bytes, too short for the GGUF magic); give a .gguf model file")
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise GGUFError(f"{p}: cannot map the file ({exc}); check that it is a regular, readable file") from None
        try:
            out = _parse(buf, p, want)
            for key, indices in (pick or {}).items():
                if isinstance(out.get(key), _StringArray):
                    out[key] = out[key].pick({i for i in indices(out) if isinstance(i, int) and i >= 0})
            return out
        finally:
            buf.close()


def _parse(buf, path: Path, want: Callable[[str], bool]) -> dict:
    magic = struct.unpack_from("<I", buf, 0)[0]
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF'); give a .gguf model file")
    if len(buf) < 8:
        raise GGUFError(f"{path}: truncated GGUF (no version field); re-download the file")
    version = struct.unpack_from("<I", buf, 4)[0]
    endian = "<"
    if version & 0xFFFF == 0 and version != 0:  # a big-endian file reads as a huge little-endian number
        version = struct.unpack_from(">I", buf, 4)[0]
        endian = ">"
    if version not in (1, 2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version} (known: 1, 2, 3); convert the file with a current llama.cpp")
    cur = _Cursor(buf, path, endian)
    cur.pos = 8
    wide = version >= 2  # GGUF v1 used 32-bit counts and lengths
    n_tensors = cur.count("tensor count", 0, wide)
    n_kv = cur.count("metadata count", 8, wide)
    out: dict = {"__version__": version, "__n_tensors__": n_tensors}
    seen: set[bytes] = set()
    for _ in range(n_kv):
        raw_key = cur.string_bytes("key", wide)
        if len(raw_key) > _MAX_KEY_LEN:
            raise cur.fail(f"key of {len(raw_key)} bytes")
        key = raw_key.decode("utf-8", errors="replace")
        # (a damaged file's key may hold a line break or an escape: the message is one line, as said)
        named = one_line(key)
        if raw_key in seen:  # (llama.cpp and gguf-py refuse the file; the last value would be read here)
            raise GGUFError(f"{path}: the metadata key '{named}' appears twice, which llama.cpp refuses; the file is "
                            "corrupted: re-convert or re-download it")
        seen.add(raw_key)
        vtype = cur.unpack(cur.u32, f"type of '{named}'")
        keep = want(key)
        out_value = _read_value(cur, vtype, named, keep, wide)
        if keep:
            out[key] = out_value
    return out


def _read_value(cur: _Cursor, vtype: int, key: str, keep: bool, wide: bool):
    """The value of type `vtype` at the cursor (None where not `keep`); `key` as messages name it."""
    if vtype in cur.structs:
        return cur.unpack(cur.structs[vtype], f"value of '{key}'")
    if vtype == GGUFValueType.STRING:
        if keep:
            return bytes(cur.string_bytes(f"value of '{key}'", wide))
        cur.skip_string(wide)
        return None
    if vtype == GGUFValueType.ARRAY:
        etype = cur.unpack(cur.u32, f"element type of '{key}'")
        if etype in cur.structs:
            st = cur.structs[etype]
            n = cur.count(f"length of array '{key}'", st.size, wide)
            start = cur.pos
            cur.pos += n * st.size
            if keep:
                return [st.unpack_from(cur.buf, start + i * st.size)[0] for i in range(n)]
            return None
        if etype == GGUFValueType.STRING:
            n = cur.count(f"length of array '{key}'", 8 if wide else 4, wide)
            start = cur.pos
            cur.pos = _skip_strings(cur, n, wide, key)
            return _StringArray(cur.buf, start, n, cur.endian, wide, cur.path) if keep else None
        raise cur.fail(f"array '{key}' of unsupported element type {etype}")
    raise cur.fail(f"unknown value type {vtype} for '{key}'")


def _skip_strings(cur: _Cursor, n: int, wide: bool, key: str) -> int:
    # A tight loop: vocabularies hold 100k+ strings (tokens, merges) that we only step over.
    unpack = (cur.u64 if wide else cur.u32).unpack_from
    width = 8 if wide else 4
    buf, pos, limit = cur.buf, cur.pos, cur.size - width
    for _ in range(n):
        if pos > limit:
            cur.pos = pos
            raise cur.fail(f"array '{key}' runs past the end of the file")
        pos += width + unpack(buf, pos)[0]
    if pos > cur.size:
        cur.pos = cur.size
        raise cur.fail(f"array '{key}' runs past the end of the file")
    return pos


class _StringArray:
    """Strings of a GGUF array, read on demand (a vocabulary has 100k+ of them)."""

    def __init__(self, buf, start: int, n: int, endian: str, wide: bool, path: Path):
        self._buf, self._start, self._n, self._wide = buf, start, n, wide
        self._len = struct.Struct(endian + ("Q" if wide else "I"))
        self._path = path

    def __len__(self) -> int:
        return self._n

    def pick(self, indices: set[int]) -> dict[int, bytes]:
        """Return {index: bytes} for the wanted indices, in one pass (the buffer must still be open)."""
        found: dict[int, bytes] = {}
        if not indices:
            return found
        last = max(indices)
        pos = self._start
        unpack, width, buf = self._len.unpack_from, self._len.size, self._buf
        for i in range(min(self._n, last + 1)):
            n = unpack(buf, pos)[0]
            if i in indices:
                found[i] = bytes(buf[pos + width:pos + width + n])
            pos += width + n
        return found
