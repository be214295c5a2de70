"""Two behaviour records compared, and the difference said in a publisher's words.

`compare(old, new)` lists each change (`Change`: a kind and a sentence) in the order a reviewer
reads them: the verdict, the roles no longer rendered, where the system prompt and tool responses
go, every role's delimiter, the generation prompt under each thinking switch, reasoning, prefix
stability; then the first probe whose render differs. A text edit that renders the same on every
probe is no change in behaviour: `BehaviourDiff.text_change` names it apart.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..auditing._formats import show
from ..errors import InputError
from ..sources.templates import FOLDER_SUFFIXES
from ._probes import PROBE_NAMES, SETTINGS_DEFAULT
from ._record import BehaviourRecord

__all__ = ["CHANGE_KINDS", "BehaviourDiff", "Change", "compare", "render_line", "shown", "text_change"]

CHANGE_KINDS = ("verdict", "role", "system", "delimiter", "tool_placement", "generation_prompt", "reasoning",
                "prefix_stability", "render")
_START_WORDS = {"system": "system start", "user": "user start", "assistant": "assistant start",
                "tool": "tool-response start", "tool_next": "start of each further tool response",
                "reasoning": "reasoning start", "reasoning_end": "reasoning end"}
_ROLE_GONE = {"system": "the system message is no longer rendered", "user": "user messages are no longer rendered",
              "assistant": "assistant messages are no longer rendered", "tool": "tool results are no longer rendered"}
_ROLE_BACK = {"system": "the system message is now rendered", "user": "user messages are now rendered",
              "assistant": "assistant messages are now rendered", "tool": "tool results are now rendered"}
_SYSTEM_WORDS = {"own_turn": "a turn of its own", "as_user": "a user turn of its own",
                 "inside_user": "inside the first user turn", "inside_assistant": "inside the assistant turn",
                 "preamble": "a preamble before any delimiter", "dropped": "not rendered", None: "unknown"}
_TOOL_WORDS = {"own_role": "a turn of their own", "inside_user": "inside a user turn",
               "inside_assistant": "inside the assistant turn", "dropped": "not rendered", "unknown": "unknown"}
_GENERATION_WORDS = {"open": "opens the reasoning (forced open)", "closed": "closes the reasoning (forced closed)",
                     "model": "leaves reasoning to the model", None: "has no reasoning markup"}
_GENERATION_BEFORE = {"open": "opened it", "closed": "closed it", "model": "left it to the model", None: "had no reasoning markup"}


def shown(text: str | None) -> str:
    """A delimiter as a reviewer reads it: in backticks, with newlines and tabs escaped.

    >>> print(shown("<|im_start|>user\\n"))
    `<|im_start|>user\\n`
    """
    return "none" if text is None else f"`{show(text)}`"


@dataclass(frozen=True)
class Change:
    kind: str
    message: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class BehaviourDiff:
    """What changed from `old` to `new`. `changes` empty: the same behaviour (exit 0);
    `text_change`: the text edit, said apart ('' when the texts are the same); `first_render`: the
    first probe whose render differs ({probe, position, old, new}; old/new None where unknown)."""

    old: str
    new: str
    changes: tuple[Change, ...] = ()
    text_change: str = ""
    first_render: dict | None = None
    differing_renders: tuple[str, ...] = field(default=())

    @property
    def same(self) -> bool:
        return not self.changes

    @property
    def headline(self) -> str:
        if self.changes:
            n = len(self.changes)
            return f"behaviour changed ({n} change{'s' if n != 1 else ''})"
        if self.text_change:
            return f"no change in behaviour; {self.text_change}, every probe renders the same"
        return "no change in behaviour (the same template text)"

    def to_dict(self) -> dict:
        return {"old": self.old, "new": self.new, "same_behaviour": self.same, "headline": self.headline,
                "changes": [c.to_dict() for c in self.changes], "text_change": self.text_change,
                "first_render": dict(self.first_render) if self.first_render else None,
                "differing_renders": list(self.differing_renders)}


def _roles(old: BehaviourRecord, new: BehaviourRecord) -> list[Change]:
    out = []
    for role in ("system", "user", "assistant", "tool"):
        a, b = old.rendered.get(role), new.rendered.get(role)
        if a is True and b is False:
            out.append(Change("role" if role != "system" else "system", _ROLE_GONE[role]))
        elif a is False and b is True:
            out.append(Change("role" if role != "system" else "system", _ROLE_BACK[role]))
    return out


def _moved(what: str, words: dict, old: str | None, new: str | None) -> str:
    """`what` (the system message, tool responses) moved from `old` to `new`, said in words."""
    if old == "rejected":
        return f"the template now accepts {what} ({words.get(new, new)})"
    if new == "rejected":
        return f"the template now refuses {what} (before: {words.get(old, old)})"
    return f"{what} moved from {words.get(old, old)} to {words.get(new, new)}"


def _placements(old: BehaviourRecord, new: BehaviourRecord, said: set[str]) -> list[Change]:
    out = []
    if old.system != new.system and not (new.system == "dropped" and "system" in said):
        out.append(Change("system", _moved("the system message", _SYSTEM_WORDS, old.system, new.system)))
    if old.default_system is not None and new.default_system is not None and old.default_system != new.default_system:
        out.append(Change("system", "a chat without a system message now gets the template's default system prompt"
                          if new.default_system else "a chat without a system message no longer gets a default system prompt"))
    if old.tool_placement != new.tool_placement and not (new.tool_placement == "dropped" and "tool" in said):
        out.append(Change("tool_placement", _moved("tool responses", _TOOL_WORDS, old.tool_placement, new.tool_placement)))
    return out


def _starts(old: BehaviourRecord, new: BehaviourRecord) -> list[Change]:
    out = []
    for role, word in _START_WORDS.items():
        a, b = old.starts.get(role), new.starts.get(role)
        if a == b:
            continue
        if a is None:
            out.append(Change("delimiter", f"there is now a {word}: {shown(b)}"))
        elif b is None:
            out.append(Change("delimiter", f"the {word} {shown(a)} is gone"))
        else:
            out.append(Change("delimiter", f"the {word} changed from {shown(a)} to {shown(b)}"))
    starts = {t for t in (*old.starts.values(), *new.starts.values()) if t}
    added = [d for d in new.delimiters if d not in old.delimiters and d[1] not in starts]
    removed = [d for d in old.delimiters if d not in new.delimiters and d[1] not in starts]
    if added or removed:
        parts = [f"added {shown(t)} ({r})" for r, t in added] + [f"removed {shown(t)} ({r})" for r, t in removed]
        out.append(Change("delimiter", "the delimiters a server splits by also changed: " + ", ".join(parts)))
    return out


def _prompt_change(label: str, a: str | None, b: str | None) -> str:
    """A generation prompt's change; None is a render with it that does not extend the one without."""
    if b is None:
        return f"{label} no longer extends the conversation as rendered (it was {shown(a)})"
    if a is None:
        return f"{label} now extends the conversation as rendered: {shown(b)}"
    return f"{label} changed from {shown(a)} to {shown(b)}"


def _setting_label(setting: str) -> str:
    return "the generation prompt" if setting == SETTINGS_DEFAULT else f"with {setting}, the generation prompt"


def _generation(old: BehaviourRecord, new: BehaviourRecord) -> list[Change]:
    out = []
    switches = lambda r: {s.split("=")[0] for s in r.generation if s != SETTINGS_DEFAULT}  # noqa: E731
    for name in sorted(switches(new) - switches(old)):
        out.append(Change("generation_prompt", f"the thinking switch {name} now changes the generation prompt"))
    for name in sorted(switches(old) - switches(new)):
        out.append(Change("generation_prompt", f"the thinking switch {name} no longer changes the generation prompt"))
    for setting in [s for s in old.generation if s in new.generation]:
        a, b = old.generation[setting], new.generation[setting]
        label = _setting_label(setting)
        if a.get("prompt") != b.get("prompt"):
            out.append(Change("generation_prompt", _prompt_change(label, a.get("prompt"), b.get("prompt"))))
        if a.get("reasoning") != b.get("reasoning"):
            out.append(Change("reasoning", f"{label} now {_GENERATION_WORDS.get(b.get('reasoning'))}; "
                                           f"before, it {_GENERATION_BEFORE.get(a.get('reasoning'))}"))
    return out


def _stability(record: BehaviourRecord) -> str:
    return record.prefix_stability.get("verdict", "")


def _reasoning_and_prefix(old: BehaviourRecord, new: BehaviourRecord) -> list[Change]:
    out = []
    a, b = old.earlier_reasoning, new.earlier_reasoning
    lost = _stability(old) == "stable" and _stability(new) == "unstable"
    won = _stability(old) == "unstable" and _stability(new) == "stable"
    said_prefix = False
    if a != b:
        if b == "dropped" and a == "kept":
            said_prefix = lost
            out.append(Change("reasoning", "earlier reasoning is now dropped" +
                              (": agent sessions are no longer prefix-stable" if lost else "")))
        elif b == "kept" and a == "dropped":
            said_prefix = won
            out.append(Change("reasoning", "earlier reasoning is now kept" + (": agent sessions are now prefix-stable" if won else "")))
        elif b is None:
            out.append(Change("reasoning", "reasoning is no longer rendered in assistant turns"))
        else:
            out.append(Change("reasoning", f"assistant turns now render reasoning ({b} in earlier turns)"))
    if old.prefix_stability != new.prefix_stability and not said_prefix:
        p = new.prefix_stability
        where = f" ({p.get('cause')} at request {p.get('request')})" if p.get("verdict") == "unstable" else ""
        if lost:
            message = f"agent sessions are no longer prefix-stable{where}"
        elif won:
            message = "agent sessions are now prefix-stable"
        else:
            message = f"prefix stability changed from {_label(old.prefix_stability)} to {_label(p)}"
        out.append(Change("prefix_stability", message))
    return out


def _label(p: dict) -> str:
    v = p.get("verdict", "")
    return f"unstable ({p.get('cause')} at request {p.get('request')})" if v == "unstable" else v


def _probe_order(name: str) -> tuple[int, str, int]:
    """Probes in the order they are defined, the default setting's first."""
    base, _, setting = name.partition(" [")
    return (bool(setting), setting, PROBE_NAMES.index(base) if base in PROBE_NAMES else len(PROBE_NAMES))


def _first_render(old: BehaviourRecord, new: BehaviourRecord) -> tuple[tuple[str, ...], dict | None]:
    names = sorted({*new.renders, *old.renders}, key=_probe_order)
    differing = tuple(n for n in names if old.renders.get(n) != new.renders.get(n))
    if not differing:
        return (), None
    probe = differing[0]
    a, b = old.texts.get(probe), new.texts.get(probe)
    if a is None or b is None:
        return differing, {"probe": probe, "position": None, "old": _excerpt(a, 0), "new": _excerpt(b, 0),
                           "old_digest": old.renders.get(probe), "new_digest": new.renders.get(probe)}
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return differing, {"probe": probe, "position": pos, "old": _excerpt(a, pos), "new": _excerpt(b, pos),
                       "old_digest": old.renders.get(probe), "new_digest": new.renders.get(probe)}


def _excerpt(text: str | None, pos: int, before: int = 30, after: int = 50) -> str | None:
    if text is None:
        return None
    start = max(0, pos - before)
    return ("..." if start else "") + text[start:pos + after] + ("..." if pos + after < len(text) else "")


def render_line(first: dict) -> str:
    """The first differing render in one line: the probe, where, and the text either side (or the
    digest the lock holds, where the old text is not known)."""
    where = f" at character {first['position']}" if first.get("position") is not None else ""
    new = json.dumps(first["new"], ensure_ascii=False) if first.get("new") is not None else first.get("new_digest")
    if first.get("old") is None:
        return f"probe '{first['probe']}'{where}: now {new} (the lock holds its digest {str(first.get('old_digest'))[:19]})"
    return f"probe '{first['probe']}'{where}: was {json.dumps(first['old'], ensure_ascii=False)}, now {new}"


def text_change(old: BehaviourRecord, new: BehaviourRecord) -> str:
    """The text edit in words ('' when the texts are the same)."""
    if old.text_sha256 == new.text_sha256:
        return ""
    if old.template_text and new.template_text:
        lines = list(difflib.unified_diff(old.template_text.splitlines(), new.template_text.splitlines(), lineterm="", n=0))
        plus = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
        minus = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
        return f"the template text changed (+{plus} -{minus} lines)"
    return f"the template text changed ({old.text_sha256[7:19]} -> {new.text_sha256[7:19]})"


def compare(old: BehaviourRecord, new: BehaviourRecord) -> BehaviourDiff:
    """The behaviour difference from `old` to `new` (see BehaviourDiff)."""
    changes: list[Change] = []
    if old.verdict != new.verdict:
        why = f": {new.reason}" if new.reason else ""
        changes.append(Change("verdict", f"the verdict changed from {old.verdict} to {new.verdict}{why}"))
    roles = _roles(old, new)
    said = {role for role in ("system", "user", "assistant", "tool") if old.rendered.get(role) and new.rendered.get(role) is False}
    changes += roles + _placements(old, new, said) + _starts(old, new) + _generation(old, new) + _reasoning_and_prefix(old, new)
    differing, first = _first_render(old, new)
    if differing and not changes:
        n = len(differing)
        changes.append(Change("render", f"the rendered text changed on {n} probe{'s' if n != 1 else ''} "
                                        f"({', '.join(differing[:4])}{', ...' if n > 4 else ''})"))
    return BehaviourDiff(old.name, new.name, tuple(changes), text_change(old, new), first, differing)


def pair_by_name(old: Sequence, new: Sequence) -> tuple[list[tuple], list[str], list[str]]:
    """Two sources' templates paired by name, in `old`'s order; the names only `old` has and those
    only `new` has. Of those, two template files of folders with one file name are a pair too (a
    folder names its `a.jinja` so beside an `a.j2`, and `a` alone). InputError where a source holds
    two templates of one name: which to compare would be a guess."""
    for templates, which in ((old, "first"), (new, "second")):
        seen: set = set()
        for t in templates:
            if t.name in seen:
                raise InputError(f"the {which} source holds two templates named '{t.name}'; templates are compared "
                                 "by name: give --name and --name-b to compare two of them")
            seen.add(t.name)
    by_name = {t.name: t for t in new}
    pairs = [(t, by_name[t.name]) for t in old if t.name in by_name]
    olds = {t.name for t in old}
    only_old = [t for t in old if t.name not in by_name]
    only_new = [t for t in new if t.name not in olds]
    # A folder names a template by its file's whole name where two of its files share a stem
    # (`date.j2`, `date.jinja`): the other folder's `date` is one of them, and the file names say which.
    news_by_file = _by_file(only_new)
    for file, t in _by_file(only_old).items():
        match = news_by_file.get(file)
        if match is not None:
            pairs.append((t, match))
            only_old.remove(t)
            only_new.remove(match)
    order = {id(t): i for i, t in enumerate(old)}
    pairs.sort(key=lambda pair: order[id(pair[0])])
    return pairs, [t.name for t in only_old], [t.name for t in only_new]


def _file_name(t) -> str | None:
    """The template file's name where `t` is one file of a folder's (`date.jinja`), else None."""
    path = Path(t.source) if t.source else None
    return path.name if path is not None and path.suffix in FOLDER_SUFFIXES else None


def _by_file(templates) -> dict:
    """File name -> template, for the templates whose file name is theirs alone among `templates`."""
    names = [_file_name(t) for t in templates]
    counts = Counter(names)
    return {n: t for n, t in zip(names, templates) if n is not None and counts[n] == 1}
