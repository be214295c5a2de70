"""Engine parity: a template rendered by llama-server's own C++ Jinja engine and by tmplkit.

tmplkit renders as transformers does (tests/test_parity.py). llama-server renders with its own
engine and its own message handling (common/chat.cpp: content trimmed, a system message folded
where the template has no system role, tool-call arguments parsed for templates that want
objects), so a template may render differently there. For each template this sends the analysis's
round-trip conversation, without and with the generation prompt, to llama-server's
`/apply-template` (started with `--jinja --chat-template-file`, on any small model: the
template's BOS/EOS are then that model's, and tmplkit's side renders with the same, in its server
setting: llama.cpp's `enable_thinking` as tmplkit decides it, `session.server_thinking`), compares
the two texts byte for byte, and splits llama.cpp's render with tmplkit's delimiters: the round
trip holds there when it passed on tmplkit's render and the spans' roles are the same on both.

    >>> rows = engine_parity(load_one("Qwen3.5-4B.jinja"), llama_server_binary(), tiny_model_path("qwen35"))  # doctest: +SKIP
    >>> [(r.variant, r.status) for r in rows]                                                                  # doctest: +SKIP
    [('round trip', 'identical'), ('generation prompt', 'identical')]
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from .._version import __version__
from ..analysis import analyze
from ..delimiters import ROLES, split_text
from ..errors import InputError, TmplkitError
from ..session import Conversation, render_conversation
from ..sources.templates import ChatTemplate, gguf_special_tokens
from .delimiter_comparison import markdown_cell
from .process import ServerRefused, TemplateRefused, check_server_model, log_path, start_with_template

__all__ = ["PARITY_FAIL_ON", "PARITY_SCHEMA_VERSION", "EngineComparison", "engine_parity", "format_parity_table",
           "parity_failures", "parity_report"]

# The JSON's layout (tmplkit/schemas/engine-parity.schema.json).
PARITY_SCHEMA_VERSION = 1

_EXCERPT = 40  # characters shown on each side of the first difference


@dataclass(frozen=True)
class EngineComparison:
    """One conversation of one template, rendered by both engines.

    `status`: "identical", "differs" (`at` is the first differing character, `ours`/`theirs` the
    texts around it), "refused" (llama-server's error in `error`: it would not start with the
    template, or answered its request with an error) or "unrendered" (tmplkit's own render failed:
    nothing to compare). `round_trip`: the round trip passed on tmplkit's render
    and holds on llama.cpp's (None when llama.cpp gave no render to split).
    """

    template: str
    variant: str
    status: str
    at: int | None = None
    ours: str = ""
    theirs: str = ""
    error: str | None = None
    round_trip: bool | None = None

    def to_dict(self) -> dict:
        return {"template": self.template, "variant": self.variant, "status": self.status, "at": self.at,
                "ours": self.ours, "theirs": self.theirs, "error": self.error, "round_trip": self.round_trip}


# What `engine-parity --fail-on` fails on: "differs" (a render llama-server writes otherwise);
# "unchecked" also a render not compared (refused by llama-server, or not rendered by tmplkit).
PARITY_FAIL_ON = ("differs", "unchecked")


def parity_failures(rows, fail_on: str) -> tuple[EngineComparison, ...]:
    """The rows that fail a gate on `fail_on` (one of PARITY_FAIL_ON), in order.

        >>> [r.status for r in parity_failures(rows, "unchecked")]   # doctest: +SKIP
        ['differs', 'refused']
    """
    if fail_on not in PARITY_FAIL_ON:
        raise InputError(f"fail_on must be one of {', '.join(PARITY_FAIL_ON)}, got {fail_on!r}")
    failing = ("differs",) if fail_on == "differs" else ("differs", "refused", "unrendered")
    return tuple(r for r in rows if r.status in failing)


def parity_report(rows) -> dict:
    """What `tmplkit engine-parity --format json` prints: {schema_version, tmplkit_version, rows}."""
    return {"schema_version": PARITY_SCHEMA_VERSION, "tmplkit_version": __version__, "rows": [r.to_dict() for r in rows]}


_SERVER_ARGS = ("--jinja", "--no-prefill-assistant", "-c", "1024", "-np", "1", "-t", "1", "--no-warmup")


def engine_parity(template, binary, model, *, analysis=None, log_dir=None,
                  startup_s: float = 120, request_s: float = 120) -> tuple[EngineComparison, ...]:
    """Render the round-trip conversation of `template` (without, then with the generation
    prompt) with llama-server `binary` on `model` and with tmplkit; compare.

    Starts one llama-server for the template (its text in a temporary file); its log goes to
    `log_dir` (default: a temporary folder, removed). A server that cannot run, cannot load the
    model, is not ready within `startup_s` seconds or does not answer a request within `request_s`
    raises ModelError (nothing was compared); only the template's own refusal is a "refused" row.
    """
    check_server_model(model)
    if analysis is None:
        analysis = analyze(template)
    rt = analysis.round_trip
    if rt is None or not rt.messages:  # (None: the analysis ended at a limit, in its worker)
        why = "; ".join(rt.problems[:1]) if rt is not None else "; ".join(analysis.errors[:1])
        return (EngineComparison(template.name, "round trip", "unrendered", error=why or "no round trip"),)
    bos, eos = gguf_special_tokens(model)  # llama-server's bos_token / eos_token are the model's
    ours_template = ChatTemplate(template.text, template.name, template.source, bos, eos)
    with tempfile.TemporaryDirectory(prefix="tmplkit-parity-") as tmp:
        path = Path(tmp) / "template.jinja"
        path.write_text(template.text, encoding="utf-8")
        log = log_path(log_dir or tmp, template.name)
        try:
            server = start_with_template(binary, model, _SERVER_ARGS, path, log=log, startup_s=startup_s,
                                         keep_log=log_dir is not None)
        except TemplateRefused as exc:  # llama-server refuses the template at start
            return (EngineComparison(template.name, "round trip", "refused", error=exc.reason),)
        with server:
            return tuple(_compare(server, ours_template, analysis, gen, request_s) for gen in (False, True))


def _compare(server, template, analysis, add_generation_prompt: bool, request_s: float) -> EngineComparison:
    rt = analysis.round_trip
    variant = "generation prompt" if add_generation_prompt else "round trip"
    kwargs = dict(rt.render_kwargs, add_generation_prompt=add_generation_prompt)
    tools = kwargs.pop("tools", None)
    kwargs.pop("add_generation_prompt")
    row = EngineComparison(template.name, variant, "identical")
    now = datetime.now()
    try:
        conversation = Conversation(tuple(rt.messages), tuple(tools) if tools else None)
        ours = render_conversation(template, conversation, add_generation_prompt=add_generation_prompt,
                                   kwargs=kwargs, clock=lambda: now)  # (its date variables at `now`)
    except TmplkitError as exc:
        return replace(row, status="unrendered", error=str(exc))
    body = {"messages": list(rt.messages), "add_generation_prompt": add_generation_prompt}
    if tools is not None:
        body["tools"] = tools
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    try:
        theirs = server.post_for("/apply-template", body, "prompt", timeout=request_s,
                                 longer="--request-timeout")
    except ServerRefused as exc:  # its error answer to the template's request (no answer at all: raised)
        return replace(row, status="refused", error=str(exc))
    row = replace(row, round_trip=_round_trip_holds(theirs, ours, analysis))
    if theirs == ours:
        return row
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    lo = max(0, at - _EXCERPT)
    return replace(row, status="differs", at=at, ours=ours[lo:at + _EXCERPT], theirs=theirs[lo:at + _EXCERPT])


def _round_trip_holds(theirs: str, ours: str, analysis) -> bool:
    """The round trip passed on tmplkit's render, and tmplkit's delimiters split llama.cpp's render
    into the same message roles as tmplkit's (the generation prompt adds an assistant span to both).
    Reasoning spans are left out: where llama.cpp renders a past turn's reasoning that
    transformers drops, the messages still start where they should."""
    def roles(text: str) -> tuple[str, ...]:
        return tuple(s.role for s in split_text(text, analysis.delimiters) if s.role in ROLES)

    return analysis.round_trip.passed and roles(theirs) == roles(ours)


def format_parity_table(rows) -> str:
    """A markdown table: one row per template and variant, then the counts."""
    lines = ["| template | variant | llama.cpp render | round trip on it | first difference (tmplkit / llama.cpp) |",
             "|---|---|---|---|---|"]
    for r in rows:
        rt = {True: "pass", False: "fail", None: "-"}[r.round_trip]
        detail = f"at {r.at}: `{markdown_cell(r.ours)}` / `{markdown_cell(r.theirs)}`" if r.status == "differs" else markdown_cell(r.error or "")
        lines.append(f"| {r.template} | {r.variant} | {r.status} | {rt} | {detail} |")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    passed = sum(1 for r in rows if r.round_trip)
    lines.append("")
    lines.append(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f"; round trip holds on llama.cpp's render: {passed} of {len(rows)}")
    return "\n".join(lines) + "\n"

