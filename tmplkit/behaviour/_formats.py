"""`tmplkit diff`'s report: text, markdown and JSON (versioned, schema `diff`)."""

from __future__ import annotations

import json

from .._version import __version__
from ._compare import BehaviourDiff, render_line
from ._record import BehaviourRecord

__all__ = ["DIFF_FORMATS", "DIFF_SCHEMA_VERSION", "diff_dict", "diff_set_dict", "format_diff", "format_diff_set"]

# The diff JSON's layout; raised when a field is removed or changes meaning.
DIFF_SCHEMA_VERSION = 1
DIFF_FORMATS = ("text", "markdown", "json")


def diff_dict(old: BehaviourRecord, new: BehaviourRecord, diff: BehaviourDiff) -> dict:
    """The diff JSON: the two records and what changed."""
    return {"schema_version": DIFF_SCHEMA_VERSION, "tmplkit_version": __version__, **diff.to_dict(),
            "old": {"name": old.name, "source": old.source}, "new": {"name": new.name, "source": new.source},
            "records": {"old": old.to_dict(), "new": new.to_dict()}}


def _text(old: BehaviourRecord, new: BehaviourRecord, diff: BehaviourDiff) -> str:
    lines = [f"{old.source} ({old.name}) -> {new.source} ({new.name}): {diff.headline}"]
    lines += [f"  - {c.message}" for c in diff.changes]
    if diff.changes and diff.first_render:
        lines.append(f"  first differing render: {render_line(diff.first_render)}")
    if diff.changes and diff.text_change:
        lines.append(f"  ({diff.text_change})")
    return "\n".join(lines) + "\n"


def _markdown(old: BehaviourRecord, new: BehaviourRecord, diff: BehaviourDiff) -> str:
    lines = [f"### `{old.source}` -> `{new.source}`", "", f"**{diff.headline}**", ""]
    if diff.changes:
        lines += ["| change | what |", "| --- | --- |"]
        lines += [f"| {c.kind} | {c.message.replace('|', '&#124;')} |" for c in diff.changes]
        lines.append("")
    if diff.changes and diff.first_render:
        lines += ["first differing render: " + render_line(diff.first_render).replace("|", "&#124;"), ""]
    if diff.changes and diff.text_change:
        lines += [f"({diff.text_change})", ""]
    return "\n".join(lines)


def format_diff(old: BehaviourRecord, new: BehaviourRecord, diff: BehaviourDiff, fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(diff_dict(old, new, diff), indent=2, ensure_ascii=False) + "\n"
    return _markdown(old, new, diff) if fmt == "markdown" else _text(old, new, diff)


def diff_set_dict(pairs, only_old, only_new) -> dict:
    """The diff JSON of two sources of several templates compared by name: each pair's diff (as
    `diff_dict`, without the versions), and the names only one source has."""
    same = all(d.same for _, _, d in pairs) and not only_old and not only_new
    return {"schema_version": DIFF_SCHEMA_VERSION, "tmplkit_version": __version__, "same_behaviour": same,
            "headline": _set_headline(pairs, only_old, only_new),
            "templates": [{k: v for k, v in diff_dict(a, b, d).items() if k not in ("schema_version", "tmplkit_version")}
                          for a, b, d in pairs],
            "only_old": list(only_old), "only_new": list(only_new)}


def _set_headline(pairs, only_old, only_new) -> str:
    changed = sum(not d.same for _, _, d in pairs)
    words = [f"{len(pairs)} template{'s' if len(pairs) != 1 else ''} compared by name: {changed} changed, "
             f"{len(pairs) - changed} the same"]
    if only_old:
        words.append(f"{len(only_old)} only in the first source (removed)")
    if only_new:
        words.append(f"{len(only_new)} only in the second (added)")
    return "; ".join(words)


def format_diff_set(pairs, only_old, only_new, fmt: str = "text") -> str:
    """`tmplkit diff` of two sources of several templates: each pair (`pairs`: old record, new
    record, BehaviourDiff) as `format_diff` writes it, the names only one source has, and a headline."""
    if fmt == "json":
        return json.dumps(diff_set_dict(pairs, only_old, only_new), indent=2, ensure_ascii=False) + "\n"
    one = _markdown if fmt == "markdown" else _text
    parts = [one(a, b, d) for a, b, d in pairs]
    bullet = "- " if fmt == "markdown" else ""
    alone = [f"{bullet}{where}: {', '.join(names)}\n" for names, where in (
        (only_old, "only in the first source (removed)"), (only_new, "only in the second source (added)")) if names]
    if alone:
        parts.append("".join(alone))
    headline = _set_headline(pairs, only_old, only_new)
    parts.append(f"**{headline}**\n" if fmt == "markdown" else headline + "\n")
    return ("\n" if fmt == "markdown" else "").join(parts)
