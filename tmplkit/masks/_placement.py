"""The three ways generation tags are placed, in order of preference: tags in place around each
kind of turn (`in_place`), the message loop's body captured and printed back in pieces
(`captured`), the whole render captured between marks (`marked`). Each returns a copy only where
`proves` holds on it. `coverage` and `loose` say which traced marks are reached exactly at the
masked turns' starts and ends."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import TmplkitError
from ._lexer import Place, Tag, compiles, message_loops, place_at, with_edits
from ._proof import AnnotationError, proves
from ._tracing import harmless, marked_place, trace

__all__: list[str] = []  # private to the annotation


_MAX_PAIRS = 80


def in_place(src: str, places, marks, starts, ends, want: set, cases) -> tuple[list | None, str]:
    """A (start place, end place, guard) for each kind of turn, each proved alone, together every
    masked turn; (None, why) where they do not cover every turn."""
    groups = _groups(places, marks, starts, ends)
    chosen: list[tuple[Place, Place, str]] = []
    covered: set = set()
    why = ""
    for turns in sorted(groups, key=len, reverse=True):
        if turns & covered:
            continue
        pair, why = _first_proved(src, [(places[marks[s][0]], places[marks[e][0]], marks[s][1]) for s, e in groups[turns]],
                                  chosen, cases, turns)
        if pair is not None:
            chosen.append(pair)
            covered |= turns
    return (chosen, "") if covered == want else (None, why)


def _groups(places, marks, starts: dict[int, frozenset], ends: dict[int, frozenset]) -> dict[frozenset, list]:
    """The (start, end) mark pairs by the turns they cover: the same turns, the same loop variable,
    the end after the start; each group's pairs in order of preference (no `+` on the start tag,
    unguarded, shortest)."""
    by_turns: dict[tuple, list[int]] = {}
    for e, turns in ends.items():
        by_turns.setdefault((turns, marks[e][1]), []).append(e)
    groups: dict[frozenset, list] = {}
    for s, turns in starts.items():
        for e in by_turns.get((turns, marks[s][1]), ()):
            a, b = places[marks[s][0]], places[marks[e][0]]
            if a.end <= b.start and not (a.expr or b.expr):  # a tag cannot go inside a set value
                groups.setdefault(turns, []).append((s, e))

    def preference(se):
        a, b = places[marks[se[0]][0]], places[marks[se[1]][0]]
        return ("+" in (a.left, a.right), bool(marks[se[0]][1]), b.start - a.start)

    for pairs in groups.values():
        pairs.sort(key=preference)
    return groups


def _first_proved(src: str, pairs, chosen, cases, turns: frozenset):
    """The first of `pairs` (start place, end place, guard) that, alone, gives exactly the masks of
    `turns`, and overlaps none of `chosen`; (None, why) where none does."""
    why = ""
    for pair in pairs[:_MAX_PAIRS]:
        if any(pair[0].start < c[1].end and c[0].start < pair[1].end for c in chosen):
            continue
        text = wrapped_all(src, [pair])
        if not compiles(text):
            why = "the turn's start and end lie in different blocks of the template"
            continue
        why = proves(text, cases, turns) or ""
        if not why:
            return pair, ""
    return None, why


def captured(src: str, tags: Sequence[Tag], cases) -> str | None:
    """Where no place in the source marks each turn (its opening printed inside a tool-call loop,
    its end in the same expression as the next turn's header): the message loop's body captured
    (`{% set %}...{% endset %}`) and printed back in pieces, the assistant's generated part inside
    the tags: the header the turn's iteration starts with (the longest of those seen that it
    starts with), the turn, the whitespace after it (or a constant ending). None where no loop's
    iterations hold the turns so, or the copy does not prove."""
    for opener, closer, name in message_loops(src, tags):
        ps = place_at(src, opener.end, None, opener)
        pe = place_at(src, closer.start, closer, None)
        found = _iterations(ps, pe, cases)
        if not found:
            continue
        heads = sorted({body[:k] for body, k, _ in found}, key=len, reverse=True)
        tails = {body[k2:] for body, _, k2 in found}
        blank = all(t.isspace() or not t for t in tails)
        if not (blank or len(tails) == 1):
            continue
        if any(next(h for h in heads if body.startswith(h)) != body[:k] for body, k, _ in found):
            continue  # the longest header seen is not always the turn's own
        said = _message_texts(cases)
        if any(w in h for h in (*heads, *tails) for w in said):
            continue  # a header that holds a message's text (its reasoning) is no constant of the template
        text = _with_capture(src, ps, pe, name, heads, None if blank else tails.pop())
        if compiles(text) and proves(text, cases) is None:
            return text
    return None


def _message_texts(cases) -> set[str]:
    """The contents and reasoning of the check conversations' messages (three characters or more)."""
    out: set[str] = set()
    for server, _ in cases:
        for m in server.messages:
            out.update(v for k in ("content", "reasoning_content", "thinking", "reasoning")
                       if isinstance(v := m.get(k), str) and len(v.strip()) >= 3)
    return out


def _iterations(ps: Place, pe: Place, cases) -> list[tuple[str, int, int]]:
    """For each masked turn, the output of the loop iteration that holds it, with where in that
    output the turn starts and ends; [] where a turn is not inside one iteration."""
    out = []
    for server, mask in cases:
        try:
            text, fires = trace(server, [ps, pe], [(0, ""), (1, "")], [0, 1])
        except TmplkitError:
            return []
        if text != mask.text:
            return []
        begins, ends = fires.get(0, []), fires.get(1, [])
        for a, b in mask.ranges:
            bs = max((f for f in begins if f <= a), default=-1)
            be = min((f for f in ends if f >= b), default=-1)
            if bs < 0 or be < 0 or any(bs < f < be for f in begins):
                return []
            out.append((text[bs:be], a - bs, b - bs))
    return out


def _with_capture(src: str, ps: Place, pe: Place, name: str, heads: Sequence[str], tail: str | None) -> str:
    n = "-1"
    for h in reversed(heads):  # the longest header the body starts with
        n = f"{len(h)} if _tk_body.startswith({json.dumps(h, ensure_ascii=False)}) else ({n})"
    if tail is not None:
        t = json.dumps(tail, ensure_ascii=False)
        kept = f"{{%- set _tk_kept = _tk_body[_tk_n:_tk_body|length - {len(tail)}] if _tk_body.endswith({t}) else '' %}}"
    else:
        kept = "{%- set _tk_kept = _tk_body[_tk_n:].rstrip() %}"
    cut = (f"{{%- set _tk_n = {n} %}}{{%- if {name}.role == 'assistant' and _tk_n >= 0 %}}{kept}"
           "{{ _tk_body[:_tk_n] }}{% generation %}{{ _tk_kept }}{% endgeneration %}"
           "{{ _tk_body[_tk_n + _tk_kept|length:] }}")
    body = src[ps.start:pe.start]
    return (src[:ps.start] + f"{{%{ps.left} set _tk_body {ps.right}%}}" + body + f"{{%{pe.left} endset %}}"
            + cut + "{%- else %}{{ _tk_body }}{%- endif %}" + src[pe.start:])


# The marks of `marked`, as the annotated copy spells them (Jinja unescapes string literals): private
# use characters around a name, text no conversation holds by chance (one that does renders otherwise).
_START, _END = "\\ue000tk-start\\ue001", "\\ue000tk-end\\ue001"


def marked(src: str, places, marks, fired: Sequence[dict[int, list[int]]], want: set, cases) -> tuple[str | None, str]:
    """Where the turns' starts and ends are reached in different blocks (a tool-call turn that ends
    in the next message's iteration, a turn whose end differs by its kind): a mark at each of a set
    of places that together start every masked turn (and a set for the ends), the whole render
    captured and printed back without the marks, the part from the last start mark before each end
    mark to it inside the tags. (None, why) where no marks cover every turn or the copy does not
    prove."""
    pair, why = _chosen_marks(places, marks, fired, want, cases)
    if pair is None:
        return None, why
    at: dict[int, list[tuple[str, str]]] = {}
    for chosen, code in ((pair[1], _END), (pair[0], _START)):  # a turn's end before the next one's start
        for m in chosen:
            at.setdefault(marks[m][0], []).append((code, marks[m][1]))
    edits = [(places[i], marked_place(places[i], items)) for i, items in at.items()]
    body = with_edits(src, edits)
    body = body[:-1] if body.endswith("\n") else body  # Jinja drops one newline at the template's end
    text = (f"{{% set _tk_out +%}}{body}{{%+ endset %}}"
            f"{{% for _tk_part in _tk_out.split('{_END}') %}}{{% set _tk_cut = _tk_part.split('{_START}') %}}"
            "{% if loop.last or _tk_cut|length == 1 %}{{ _tk_cut|join('') }}{% else %}{{ _tk_cut[:-1]|join('') }}"
            "{% generation %}{{ _tk_cut[-1] }}{% endgeneration %}{% endif %}{% endfor %}")
    why = proves(text, cases) or "" if compiles(text) else "the marked copy does not compile"
    return (None, why) if why else (text, "")


def _cover(places, marks, found: dict[int, tuple[frozenset, int]], want: set) -> list[int] | None:
    """Marks whose turns are together every masked turn (those reached between turns least often
    first, then the widest, unguarded before guarded, no `+` before one with); None where none do."""
    order = sorted(found, key=lambda m: (found[m][1], -len(found[m][0]), bool(marks[m][1]),
                                         "+" in (places[marks[m][0]].left, places[marks[m][0]].right), m))
    chosen: list[int] = []
    covered: set = set()
    for m in order:
        if found[m][0] <= covered:
            continue
        chosen.append(m)
        covered |= found[m][0]
    return chosen if covered == want else None


def wrapped_all(src: str, pairs) -> str:
    for s, e, guard in sorted(pairs, key=lambda p: p[0].start, reverse=True):
        src = _wrapped(src, s, e, guard)
    return src


def _wrapped(src: str, s: Place, e: Place, guard: str) -> str:
    """`src` with the generation tags at `s` and `e`; with a `guard` (a loop variable) the part
    between is written twice: `{% if guard.role == 'assistant' %}{% generation %}PART{% endgeneration
    %}{% else %}PART{% endif %}`, for a line of the template that prints every role's turn."""
    if not guard:
        return with_edits(src, [(s, s.tag("generation")), (e, e.tag("endgeneration"))])
    part = src[s.end:e.start]
    return (src[:s.start] + f"{s.before}{{%{s.left} if {guard}.role == 'assistant' %}}{{% generation {s.right}%}}"
            + s.after + part + f"{e.before}{{%{e.left} endgeneration %}}{{% else {s.right}%}}{s.after}"
            + part + f"{e.before}{{%{e.left} endif {e.right}%}}{e.after}" + src[e.end:])


def _chosen_marks(places, marks, fired, want: set, cases, tries: int = 8) -> tuple[tuple[list[int], list[int]] | None, str]:
    """Start and end marks that cover every masked turn and, by where they are reached, give no
    region besides the turns: where a stray start mark and a stray end mark (a user's content and
    its end of turn) make one, the start mark is left out (or, where the turns then lack a start,
    the end mark) and the cover chosen again. (None, why) where none do."""
    found = {"start": loose(fired, cases, want, "start"), "end": loose(fired, cases, want, "end")}
    for _ in range(tries):
        chosen_s, chosen_e = _cover(places, marks, found["start"], want), _cover(places, marks, found["end"], want)
        if chosen_s is None or chosen_e is None:
            return None, _uncovered(found["start" if chosen_s is None else "end"], want, cases,
                                    "start" if chosen_s is None else "end")
        stray = _stray_region(chosen_s, chosen_e, fired, cases)
        if stray is None:
            return (chosen_s, chosen_e), ""
        side = "start" if _cover(places, marks, {m: v for m, v in found["start"].items() if m != stray[0]}, want) else "end"
        found[side].pop(stray[0] if side == "start" else stray[1])
    return None, "every place reached at the masked turns' starts is reached before other text that an end mark closes"


def _uncovered(found: dict[int, tuple[frozenset, int]], want: set, cases, side: str) -> str:
    """Why no marks cover the turns' starts (ends): the first turn none is reached at."""
    c, k = min(want - set().union(*(v for v, _ in found.values())))
    mask = cases[c][1]
    at = mask.turns[k].start if side == "start" else mask.turns[k].end
    return (f"no place in the source is reached at every masked turn's {side} and never inside a turn "
            f"(none at the {side} of the turn after {mask.text[max(at - 40, 0):at]!r})")


def _stray_region(chosen_s: Sequence[int], chosen_e: Sequence[int], fired, cases) -> tuple[int, int] | None:
    """The start and end mark of the first region the marks give that is no masked turn (None: none)."""
    for (_, mask), fires in zip(cases, fired):
        events = sorted([(x, 0, m) for m in chosen_e for x in fires.get(m, [])]
                        + [(x, 1, m) for m in chosen_s for x in fires.get(m, [])])
        turns = {(t.start, t.end) for t in mask.turns if t.end > t.start}
        opened: tuple[int, int] | None = None
        for x, kind, m in events:
            if kind == 1:
                opened = (x, m)
            elif opened is not None:
                if (opened[0], x) not in turns:
                    return opened[1], m
                opened = None
    return None


def coverage(places: Sequence[Place], marks: Sequence[tuple[int, str]], cases):
    """For each mark reached only where masked turns start, the (case, turn) pairs it starts
    (likewise for ends), and every masked (case, turn)."""
    starts: dict[int, set] = {}
    ends: dict[int, set] = {}
    bad: set[int] = set()
    want: set = set()
    fired: list[dict[int, list[int]]] = []
    keep = list(range(len(marks)))
    for c, (server, mask) in enumerate(cases):
        keep = harmless(server, places, marks, keep, mask.text)
        text, fires = trace(server, places, marks, keep)
        if text != mask.text:
            raise AnnotationError(f"template '{server.template.name}': marking its source changes its render")
        at_s = {t.start: (c, k) for k, t in enumerate(mask.turns) if t.end > t.start}
        at_e = {t.end: (c, k) for k, t in enumerate(mask.turns) if t.end > t.start}
        want |= set(at_s.values())
        for m in set(range(len(marks))) - set(keep):
            bad.add(m)
        for m in keep:
            f = fires.get(m, [])
            for at, found in ((at_s, starts), (at_e, ends)):
                if all(x in at for x in f):
                    found.setdefault(m, set()).update(at[x] for x in f)
                else:
                    found[m] = found.get(m, set()) | {None}
        fired.append(fires)
    clean = {m: frozenset(v) for m, v in starts.items() if m not in bad and v and None not in v}
    clean_e = {m: frozenset(v) for m, v in ends.items() if m not in bad and v and None not in v}
    fired = [{m: f for m, f in fires.items() if m not in bad} for fires in fired]
    return clean, clean_e, want, fired


def loose(fired: Sequence[dict[int, list[int]]], cases, want: set, side: str) -> dict[int, tuple[frozenset, int]]:
    """For each mark, the masked turns it starts (`side` "start") or ends under `marked`'s rule (a
    turn is what lies between the last start mark and the next end mark), and how often it is
    reached between the turns (harmless alone, a stray region beside a stray mark of the other
    side: the proof holds it); a mark reached inside a turn or at its other end is left out."""
    out: dict[int, set] = {}
    strays: dict[int, int] = {}
    inside: set[int] = set()
    for c, ((_, mask), fires) in enumerate(zip(cases, fired)):
        turns = [(k, t.start, t.end) for k, t in enumerate(mask.turns) if t.end > t.start]
        edge = {(t[1] if side == "start" else t[2]): t[0] for t in turns}
        for m, at in fires.items():
            if any((a < x <= b) if side == "start" else (a <= x < b) for _, a, b in turns for x in at):
                inside.add(m)
                continue
            out.setdefault(m, set()).update((c, edge[x]) for x in at if x in edge)
            strays[m] = strays.get(m, 0) + sum(x not in edge for x in at)
    return {m: (frozenset(v), strays[m]) for m, v in out.items() if m not in inside and v and v <= want}
