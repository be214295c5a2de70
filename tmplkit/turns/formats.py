"""`tmplkit turns` reports: text, markdown, CSV and JSON over a list of `TurnsReport`."""

from __future__ import annotations

import csv
import io
import json

from .._version import __version__
from ..session import inputs_note
from .cost import SETTINGS

__all__ = ["format_turns", "FORMATS", "TURNS_SCHEMA_VERSION"]

FORMATS = ("text", "json", "markdown", "csv")
# The JSON's layout (tmplkit/schemas/turns.schema.json): raised when a field is removed or changes meaning.
TURNS_SCHEMA_VERSION = 2  # (2: `stable` is null where the session was not studied whole, or at all)


def format_turns(reports, fmt: str = "text") -> str:
    """One report per template in `fmt` (one of FORMATS); the JSON is {schema_version,
    tmplkit_version, reports}."""
    if fmt == "json":
        data = {"schema_version": TURNS_SCHEMA_VERSION, "tmplkit_version": __version__,
                "reports": [r.to_dict() for r in reports]}
        return json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    rows = [_row(r) for r in reports]
    if fmt == "csv":
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=list(_row_keys()), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return out.getvalue()
    if fmt == "markdown":
        head = ["template", "stable", "requests", "first divergence", "cause", "stable with"] + \
            [f"{s} (share)" for s in SETTINGS]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r, row in zip(reports, rows):
            where = _where(row)
            cells = [row["template"], _yes_no(row["stable"], row["error"]), str(row["requests"]), where,
                     row["cause"] or row["error"], row["stable_with"]] + [_share(r, s) for s in SETTINGS]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return "\n".join(lines) + "\n"
    return "".join(_text(r) for r in reports)


def _yes_no(stable: bool | None, error: str = "") -> str:
    if stable is None:
        return "not studied" if error else "not known (stopped)"
    return "yes" if stable else "no"


def _where(row) -> str:
    """Where the first divergence is: its request and token, or its character without a tokenizer."""
    if row["first_request"] == "":
        return ""
    if row["first_token"] == "":
        return f"request {row['first_request']}, character {row['first_position']}"
    return f"request {row['first_request']}, token {row['first_token']}"


def _row_keys():
    return ("template", "stable", "requests", "first_request", "first_position", "first_token", "cause",
            "stable_with", *SETTINGS, "prompt_tokens", "error")


def _row(r) -> dict:
    first = r.first
    row = dict.fromkeys(_row_keys(), "")
    row.update(template=r.template, stable=r.stable, requests=r.n_requests, stable_with=" ".join(r.stable_with),
               error=r.error)
    if first is not None:
        row.update(first_request=first.request, first_position=first.position,
                   first_token="" if first.token_position is None else first.token_position, cause=first.cause)
    if r.cost is not None:
        row["prompt_tokens"] = sum(r.cost.n_tokens)
        for s in SETTINGS:
            if s in r.cost.requests:
                row[s] = r.cost.total(s, first=False)
    return row


def _share(r, setting: str) -> str:
    if r.cost is None or setting not in r.cost.requests:
        return ""
    return f"{r.cost.total(setting, first=False)} ({r.cost.share(setting):.0%})"


def _text(r) -> str:
    if r.error:
        return f"{r.template}: cannot render the session: {r.error}\n"
    requests = f"{r.n_requests} request{'' if r.n_requests == 1 else 's'}"
    head = f"{r.template}: " + {True: f"stable over {requests}", False: f"NOT stable over {requests}",
                                None: f"no divergence in the first {requests} (stopped before the session's end: "
                                      "not known beyond)"}[r.stable]
    if r.one_request:
        head = f"{r.template}: not applicable: the session has one request, so nothing is resumed"
    lines = [head, f"  inputs: {r.inputs} ({inputs_note(r.inputs)})"]
    first = r.first
    if first is not None:
        tok = "" if first.token_position is None else f" (token {first.token_position} of {first.n_held_tokens})"
        lines.append(f"  first divergence: request {first.request}, character {first.position} of {first.n_held} held{tok}: "
                     f"{first.cause}" + (f" ({first.detail})" if first.detail else ""))
        if first.cause in ("other", "generation prompt", "tool calls rewritten", "template text"):
            lines.append(f"    held:    {first.held_text!r}")
            lines.append(f"    request: {first.request_text!r}")
        if first.token_note:
            lines.append(f"    {first.token_note}")
        causes = ", ".join(f"{c} x{n}" for c, n in r.causes().items())
        lines.append(f"  causes: {causes}")
    if r.switches:
        # stable as sent: the other settings are only of interest where they are stable too
        label, none = ("also stable with", "no other setting") if r.stable else ("stable with", "no setting of its switches")
        lines.append(f"  {label}: " + (", ".join(r.stable_with) or none) +
                     f" (tried {', '.join(n for n, _ in r.switches)})")
    if r.cost is not None:
        parts = [f"{s} {r.cost.total(s, first=False)}" for s in SETTINGS if s in r.cost.requests]
        lines.append(f"  tokens recomputed after the first request (of {sum(r.cost.n_tokens[1:])} sent): " + ", ".join(parts))
        if "llama-server" in r.cost.requests:
            lines.append("  " + _server_line(r.cost.requests["llama-server"][1:]))
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def _server_line(per) -> str:
    """How far back llama-server resumes after the first request, and where it starts over."""
    if not per:
        return "llama-server: no request after the first"
    backs = [p.back for p in per]
    full = [str(k + 1) for k, p in enumerate(per) if p.full_reprocess]
    where = f"re-processes the whole prompt at request(s) {', '.join(full)}" if full else "never re-processes the whole prompt"
    return (f"llama-server: resumes up to {max(backs)} tokens before the divergence (total {sum(backs)} over "
            f"{len(per)} request{'' if len(per) == 1 else 's'}), {where}")
