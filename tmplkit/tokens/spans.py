"""Splitting token ids into role spans by start delimiters.

`SpanDetector.split` works on a token list, the piece that decides where a prefill batch may end;
`split_text` (tmplkit.delimiters, re-exported here) does the same on a rendered string. Both follow llama-server's semantics (a span runs from
its delimiter to the next one; tokens before the first belong to none) except that the longest
delimiter always wins at a position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..delimiters import SPAN_ROLES as ROLES
from ..delimiters import Delimiter
from ..errors import InputError

# ---------------------------------------------------------------------------------------------
# Token spans: the same splitting over token ids, fast enough to run on every prompt.


@dataclass(frozen=True)
class TokenSpan:
    """A message span over a token list: `len` tokens from index `pos`, where its delimiter starts."""

    role: str
    pos: int
    len: int

    def to_dict(self) -> dict:
        return {"role": self.role, "pos": self.pos, "len": self.len}


class Spans:
    """The spans `SpanDetector.split` found in `n_tokens` tokens, in order.

    Tokens before the first span belong to none. Lookups are O(1) (`is_user_start`) or
    O(log n) (`last_user_start`).

    >>> spans = SpanDetector([("user", [1]), ("assistant", [2])]).split([0, 1, 5, 2, 5, 5])
    >>> [(s.role, s.pos, s.len) for s in spans]
    [('user', 1, 2), ('assistant', 3, 3)]
    >>> spans.is_user_start(1), spans.last_user_start()
    (True, 1)
    """

    __slots__ = ("n_tokens", "_pos", "_role_idx", "_roles", "_user_set", "_user_pos")

    def __init__(self, n_tokens: int, pos: np.ndarray, role_idx: np.ndarray, roles: tuple[str, ...]):
        self.n_tokens = int(n_tokens)
        self._pos = pos
        self._role_idx = role_idx
        self._roles = roles  # role name of each role index
        self._user_set: frozenset[int] | None = None
        self._user_pos: np.ndarray | None = None

    # --- sequence protocol
    def __len__(self) -> int:
        return len(self._pos)

    def __getitem__(self, i: int) -> TokenSpan:
        n = len(self._pos)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("span index out of range")
        end = int(self._pos[i + 1]) if i + 1 < n else self.n_tokens
        return TokenSpan(self._roles[self._role_idx[i]], int(self._pos[i]), end - int(self._pos[i]))

    def __iter__(self):
        pos = self._pos.tolist()
        roles = [self._roles[k] for k in self._role_idx.tolist()]
        ends = pos[1:] + [self.n_tokens]
        for p, e, r in zip(pos, ends, roles):
            yield TokenSpan(r, p, e - p)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Spans):
            return NotImplemented
        return self.n_tokens == other.n_tokens and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Spans(n_tokens={self.n_tokens}, spans={len(self)})"

    # --- queries
    @property
    def roles(self) -> tuple[str, ...]:
        """The role of each span, in order."""
        return tuple(self._roles[k] for k in self._role_idx.tolist())

    def starts(self, role: str | None = None) -> list[int]:
        """Start positions of the spans of `role` (of all spans when None)."""
        if role is None:
            return self._pos.tolist()
        if role not in self._roles:
            return []
        want = [k for k, r in enumerate(self._roles) if r == role]
        return self._pos[np.isin(self._role_idx, want)].tolist()

    def _users(self) -> np.ndarray:
        if self._user_pos is None:
            self._user_pos = np.asarray(self.starts("user"), dtype=np.int64)
        return self._user_pos

    def is_user_start(self, pos: int) -> bool:
        """Whether a user message's delimiter starts at token index `pos`."""
        if self._user_set is None:
            self._user_set = frozenset(self._users().tolist())
        return pos in self._user_set

    def last_user_start(self, before: int | None = None) -> int | None:
        """The last user start (strictly before `before` when given), or None."""
        users = self._users()
        k = len(users) if before is None else int(np.searchsorted(users, before, side="left"))
        return int(users[k - 1]) if k > 0 else None

    def to_dict(self) -> dict:
        return {"n_tokens": self.n_tokens, "spans": [s.to_dict() for s in self]}

    def joined(self, at: int, tail: Spans, n_tokens: int) -> Spans:
        """These spans' starts before token `at`, then `tail`'s (spans of the tokens from `at` on,
        by the same roles), as the spans of `n_tokens` tokens."""
        if tail._roles != self._roles:  # (a caller's mistake, kept under `python -O` too)
            raise ValueError(f"spans of other roles cannot be joined: {tail._roles} after {self._roles}")
        if not 0 <= at <= n_tokens or tail.n_tokens != n_tokens - at:
            raise ValueError(f"spans of {tail.n_tokens} tokens from token {at} do not make {n_tokens} tokens")
        k = int(np.searchsorted(self._pos, at, side="left"))
        return Spans(n_tokens, np.concatenate((self._pos[:k], tail._pos.astype(np.int64) + at)),
                     np.concatenate((self._role_idx[:k], tail._role_idx)).astype(np.int8), self._roles)


def split_resumed(split, tokens: Sequence[int], before: Spans | None, same: int, longest: int, *,
                  greedy: bool = True) -> Spans:
    """`split(tokens)` where the first `same` of `tokens` are those `before` was split from: the
    spans that lie inside them kept, only the rest split again (a session's requests share all but
    their ends, so each costs its new ids, not its length). `longest`: the most ids a delimiter has.

    `greedy` (`SpanDetector.split`: matching resumes after a match) restarts at a start of `before`
    at or before `same - longest`: every match there and before lies inside the shared ids, and the
    scan from a start is the whole scan's. Otherwise (the server's split, a match at every position
    on its own) it restarts `longest - 1` ids before `same`. tests/test_spans.py holds both equal
    to a whole split."""
    n = len(tokens)
    at = 0
    if before is not None and 0 < longest <= same <= min(n, before.n_tokens):
        if greedy:
            k = int(np.searchsorted(before._pos, same - longest, side="right"))
            at = int(before._pos[k - 1]) if k else 0
        else:
            at = same - longest + 1
    if at <= 0 or before is None:
        return split(tokens if isinstance(tokens, np.ndarray) else np.fromiter(tokens, dtype=np.int32, count=n))
    rest = tokens[at:] if isinstance(tokens, np.ndarray) else np.fromiter(tokens[at:], dtype=np.int32, count=n - at)
    return before.joined(at, split(rest), n)


def _normalize_skips(skips, n: int) -> list[tuple[int, int]]:
    """Skips as sorted, disjoint (start, end) pairs in [0, n), dropping those a reader never reaches.

    Like the reference loop, a skip that starts inside an earlier one is jumped over with it.
    """
    if not skips:
        return []
    items = skips.items() if isinstance(skips, dict) else skips
    out: list[tuple[int, int]] = []
    reach = -1
    for start, length in sorted((int(s), int(size)) for s, size in items):
        if length <= 0 or start < 0 or start >= n or start < reach:
            continue
        end = min(n, start + length)
        out.append((start, end))
        reach = end
    return out


def _pair(d) -> tuple:
    """A delimiter given as a (role, ids or text) pair, or as a dict of the library's own forms
    (`TokenDelimiters.message_delimiters`: role and delimiter; `id_lists`: role and ids)."""
    if isinstance(d, Mapping):
        for key in ("delimiter", "ids", "text"):
            if "role" in d and key in d:
                return d["role"], d[key]
        raise InputError(f"a delimiter given as {dict(d)!r}: give {{'role', 'delimiter'}} or {{'role', 'ids'}}, or a "
                         "(role, ids) pair")
    if isinstance(d, (str, bytes)) or not isinstance(d, Sequence) or len(d) != 2:
        raise InputError(f"a delimiter given as {d!r}: give a (role, ids) or (role, text) pair")
    return d[0], d[1]


def _token_array(tokens) -> np.ndarray:
    """`tokens` as int32 ids, in one line where they are not (a float, a string, an id past int32)."""
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as exc:
        raise InputError(f"token ids must be a list of integers ({exc})") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InputError(f"token ids must be a flat list of integers, got {arr.dtype} values")
    low, high = np.iinfo(np.int32).min, np.iinfo(np.int32).max  # (a placeholder id may be negative: llama.cpp's -1)
    if int(arr.min()) < low or int(arr.max()) > high:
        raise InputError(f"token ids must be 32-bit integers, got {int(arr.min())}..{int(arr.max())}")
    return arr.astype(np.int32, copy=False)


class SpanDetector:
    """Splits token lists into message spans by role delimiters given as token ids.

    `delimiters` is a `TokenDelimiters` (from `token_delimiters`), or (role, ids) pairs, or
    (role, text) pairs / `Delimiter`s together with a `tokenizer` that tokenizes each text on
    its own (llama-server's way, which `token_delimiters` improves on). At every position the
    delimiter with the most tokens wins; after a match, matching resumes after it.

    >>> det = SpanDetector([("user", [7, 1]), ("tool", [7, 1, 9])])
    >>> [(s.role, s.pos, s.len) for s in det.split([3, 7, 1, 9, 4, 7, 1, 4])]
    [('tool', 1, 4), ('user', 5, 3)]
    """

    def __init__(self, delimiters, tokenizer=None):
        items: list[tuple[str, tuple[int, ...]]] = []
        source = getattr(delimiters, "delimiters", delimiters)
        for d in source:
            if hasattr(d, "ids"):
                role, seq = d.role, d.ids
                items.extend((str(role), tuple(int(t) for t in alt)) for alt in getattr(d, "alternatives", ()) if alt)
            elif isinstance(d, Delimiter):
                role, seq = d.role, d.text
            else:
                role, seq = _pair(d)
            if isinstance(seq, str):
                if tokenizer is None:
                    raise InputError(f"delimiter {seq!r} is text; give a tokenizer, or token ids")
                seq = tokenizer.tokenize(seq)
            seq = tuple(int(t) for t in seq)
            if seq:
                items.append((str(role), seq))
        rank = {r: i for i, r in enumerate(ROLES)}
        # Most tokens first; ties by role order, then ids. The first of equal id sequences wins.
        items.sort(key=lambda it: (-len(it[1]), rank.get(it[0], len(ROLES)), it[1]))
        unique: dict[tuple[int, ...], str] = {}
        for role, seq in items:
            unique.setdefault(seq, role)
        self.delimiters: tuple[tuple[str, tuple[int, ...]], ...] = tuple((r, s) for s, r in unique.items())
        self.roles: tuple[str, ...] = tuple(dict.fromkeys(r for r, _ in self.delimiters))
        role_index = {r: i for i, r in enumerate(self.roles)}
        # Group by first id so each distinct first id costs one pass over the tokens.
        groups: dict[int, list[tuple[int, np.ndarray, int]]] = {}
        for prio, (role, seq) in enumerate(self.delimiters):
            groups.setdefault(seq[0], []).append((prio, np.asarray(seq, dtype=np.int64), role_index[role]))
        self._groups = [(first, g) for first, g in groups.items()]
        self._prio_role = np.array([role_index[r] for r, _ in self.delimiters], dtype=np.int8)
        self._prio_len = np.array([len(s) for _, s in self.delimiters], dtype=np.int64)
        self.longest = max((len(s) for _, s in self.delimiters), default=0)  # the most ids a delimiter has

    def split(self, tokens, skips=None) -> Spans:
        """Spans of `tokens` (a list or 1-D integer array).

        `skips` maps a start index to a length: a region (a media chunk) that is jumped over
        without matching and counts inside the surrounding span. A delimiter never matches
        across a skipped region.
        """
        tok = tokens if isinstance(tokens, np.ndarray) else _token_array(tokens)
        n = len(tok)
        empty = Spans(n, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8), self.roles)
        if n == 0 or not self.delimiters:
            return empty
        found_pos: list[np.ndarray] = []
        found_prio: list[np.ndarray] = []
        for first, group in self._groups:
            cand = np.flatnonzero(tok == first)
            if not len(cand):
                continue
            for prio, seq, _ in group:
                L = len(seq)
                c = cand[cand <= n - L] if L > 1 else cand
                for k in range(1, L):
                    if not len(c):
                        break
                    c = c[tok[c + k] == seq[k]]
                if len(c):
                    found_pos.append(c)
                    found_prio.append(np.full(len(c), prio, dtype=np.int64))
        if not found_pos:
            return empty
        pos = np.concatenate(found_pos)
        prio = np.concatenate(found_prio)
        regions = _normalize_skips(skips, n)
        if regions:
            covered = np.zeros(n + 1, dtype=np.int64)
            for s, e in regions:
                covered[s] += 1
                covered[e] -= 1
            prefix = np.concatenate(([0], np.cumsum(np.cumsum(covered[:-1]) > 0)))
            ok = prefix[pos + self._prio_len[prio]] == prefix[pos]
            pos, prio = pos[ok], prio[ok]
            if not len(pos):
                return empty
        # Sort by position, then priority (most tokens first); keep the best match per position.
        order = np.lexsort((prio, pos))
        pos, prio = pos[order], prio[order]
        if len(pos) > 1:
            first_at = np.concatenate(([True], pos[1:] != pos[:-1]))
            pos, prio = pos[first_at], prio[first_at]
        lens = self._prio_len[prio]
        ends = pos + lens
        if len(pos) > 1 and not np.all(pos[1:] >= np.maximum.accumulate(ends)[:-1]):
            keep = np.zeros(len(pos), dtype=bool)
            reach = -1
            for i, (p, e) in enumerate(zip(pos.tolist(), ends.tolist())):
                if p >= reach:
                    keep[i] = True
                    reach = e
            pos, prio = pos[keep], prio[keep]
        return Spans(n, pos, self._prio_role[prio], self.roles)


def split_reference(tokens, delimiters, skips=None) -> list[TokenSpan]:
    """The straightforward loop `SpanDetector.split` must agree with (kept for tests and the bench).

    `delimiters` are (role, ids) pairs; at each position the one with the most tokens wins
    (ties: role order, then ids), as in SpanDetector.
    """
    rank = {r: i for i, r in enumerate(ROLES)}
    ordered = sorted(((r, list(s)) for r, s in delimiters if len(s)),
                     key=lambda it: (-len(it[1]), rank.get(it[0], len(ROLES)), it[1]))
    tokens = list(tokens)
    n = len(tokens)
    skip_at = {int(s): int(count) for s, count in (skips.items() if isinstance(skips, dict) else (skips or []))
               if int(count) > 0}
    starts: list[tuple[int, str]] = []
    i = 0
    while i < n:
        if i in skip_at:
            i += skip_at[i]
            continue
        for role, seq in ordered:
            L = len(seq)
            if tokens[i:i + L] == seq and not any(j in skip_at for j in range(i + 1, i + L)):
                starts.append((i, role))
                i += L
                break
        else:
            i += 1
    return [TokenSpan(role, p, (starts[k + 1][0] if k + 1 < len(starts) else n) - p)
            for k, (p, role) in enumerate(starts)]
