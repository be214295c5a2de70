"""How large a value an operation is about to build, known before it builds it.

The render limits check each value a template builds (`_limits._check_size`), but only once it is
built: a join of a thousand references to one 1 MB string, the text of such a list (`|string`,
`|tojson`, `%`), bytes repeated, a sum of lists or a translation table that writes 1,000 characters
for one have allocated a gigabyte by then, and in a caller's own process (no worker's memory limit)
that is the machine's memory. These estimate the result from what the operation is given, so
the limit refuses it first (`_check_planned`). An estimate counts at least what the result holds
and stops counting once past `limit`: walking a container costs no more than the limit allows.
"""

from __future__ import annotations

__all__: list[str] = []  # private to the sandbox (_jinja)

_SCALAR = 8  # characters counted for a number, a boolean or None in a container's text (at least 1)


# The sizes of containers counted before (id -> (the container, its size)), kept with the container
# so that its id names no other: a template prints the same tools and arguments at every request
# of a session. A container changed since (the sandbox's templates cannot change one) is counted
# low; the value built is still checked once built.
_SIZES: dict[int, tuple[object, int]] = {}
_SIZES_KEPT = 4096


def text_size(value, limit: int) -> int:
    """At least the length of `str(value)` (or its JSON), counted up to just past `limit`."""
    if not isinstance(value, (dict, list, tuple)):
        return _walk(value, limit)
    hit = _SIZES.get(id(value))
    if hit is not None and hit[0] is value:
        return hit[1]
    total = _walk(value, limit)
    if total <= limit:
        if len(_SIZES) >= _SIZES_KEPT:
            _SIZES.clear()
        _SIZES[id(value)] = (value, total)
    return total


def _walk(value, limit: int) -> int:
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v) + 2  # (quoted in a container's text)
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)
            if total <= limit:  # (a container already past the limit is not copied onto the stack)
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            total += 2 + 2 * len(v)
            if total <= limit:
                stack.extend(v)
        else:
            total += _SCALAR
    return total


def joined_size(items, sep, limit: int) -> int:
    """At least the length of `sep.join(items)` (each item as its text), where `items` is a sequence."""
    if not isinstance(items, (list, tuple)):
        return 0  # (an iterator or a string: its size is its own, already within the limit)
    gaps = len(sep) * max(0, len(items) - 1) if isinstance(sep, str) else 0
    total = gaps
    for item in items:
        if total > limit:
            break
        total += len(item) if isinstance(item, str) else text_size(item, limit - total)
    return total


def sequence_sum_size(items, start) -> int:
    """The length of a sum of sequences (`[[...], ...]|sum(start=[])`, a list concatenated each step)."""
    if not isinstance(start, (list, tuple, str)) or not isinstance(items, (list, tuple)):
        return 0
    return len(start) + sum(len(i) for i in items if isinstance(i, (list, tuple, str)))


def translated_size(text: str, table) -> int:
    """At least the length of `text.translate(table)`: each character at most its longest replacement."""
    if not isinstance(table, dict):
        return 0
    longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
    return len(text) * max(1, longest)
