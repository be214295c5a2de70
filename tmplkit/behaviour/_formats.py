"""`tmplkit diff`'s report: text, markdown and JSON (versioned, schema `diff`)."""

from __future__ import annotations

import json

from .._version import __version__
from ._compare import BehaviourDiff, render_line
from ._record import BehaviourRecord

__all__ = ["DIFF_FORMATS", "DIFF_SCHEMA_VERSION", "diff_dict", "format_diff"]

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
