"""llama-server's user starts, read off the real server (`tmplkit.server.delimiters`), against
tmplkit's on the server's own render of the probe: a verdict per template in a model publisher's
words, and the table `tmplkit server delimiters` prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._version import __version__
from ..delimiters import split_text
from ..errors import InputError, escape_controls
from ..server_rules import SAVED_SCHEMA_VERSION
from .delimiters import ServerDelimiters, message_opener

__all__ = ["COMPARISON_FAIL_ON", "COMPARISON_SCHEMA_VERSION", "HANDLERS_WITHOUT_DELIMITERS", "VERDICTS", "ComparisonReport",
           "DelimiterComparison", "compare_delimiters", "comparison_failures", "format_comparison_table",
           "verdict_counts"]


COMPARISON_SCHEMA_VERSION = SAVED_SCHEMA_VERSION  # (what `turns --server-delimiters` reads back)


# The verdicts, in the order the table lists them.
VERDICTS = ("agree", "tool results taken for user messages", "other messages taken for user messages",
            "real user messages missed", "no delimiters at all", "refused by llama-server", "not compared")


# The specialized handlers that set no message_delimiters (by the name each logs, common/chat.cpp:
# 1098-1170): llama-server ends no batch at any message of theirs. The others set a list
# (common/parsers/*.cpp, `data.message_delimiters`: gpt-oss.cpp:34, muse-glimmer.cpp:26, kimi-k3.cpp:47,
# ling3.cpp:41, cohere2moe.cpp:57, minimax-m3.cpp:31, deepseek.cpp:108, gemma4.cpp:166,
# minicpm5.cpp:26, qwen3-coder.cpp:32). Only the wording of a verdict uses this table: where the
# server's starts are is read off the server.
HANDLERS_WITHOUT_DELIMITERS = ("Ministral/Magistral Large 3", "Functionary v3.2", "Kimi K2 Thinking", "LFM2", "LFM2.5",
                               "GigaChatV3")


@dataclass(frozen=True)
class DelimiterComparison:
    """llama-server's user starts against tmplkit's on the server's own render of the probe.

    `server` and `tmplkit` are the probe's message indices each opens with a user start; `extra`
    the ones only the server opens, `missed` the ones only tmplkit opens, as (index, role).
    `verdicts` are the VERDICTS that apply ("agree" alone when the two are the same).
    """

    template: str
    verdicts: tuple[str, ...]
    server: tuple[int, ...]
    tmplkit: tuple[int, ...]
    extra: tuple[tuple[int, str], ...]
    missed: tuple[tuple[int, str], ...]
    delimiters: ServerDelimiters
    tmplkit_passed: bool
    unseen: tuple[int, ...] = ()  # messages tmplkit starts at the prompt's first token (never a batch break)

    @property
    def verdict(self) -> str:
        return "; ".join(self.verdicts)

    def advice(self) -> str:
        """What the verdicts mean for a user, in a sentence or two."""
        d = self.delimiters
        if "refused by llama-server" in self.verdicts:
            return f"llama-server refuses this template ({d.error or 'no reason given'})"
        if "not compared" in self.verdicts:
            return d.error or "tmplkit derives no delimiters for this template, so there is nothing to compare"
        if self.verdicts == ("agree",):
            return "llama-server ends batches and takes checkpoints at the same user messages as tmplkit"
        out = []
        tools = [i for i, r in self.extra if r == "tool"]
        other = [f"{i} ({r})" for i, r in self.extra if r != "tool"]
        if tools:
            out.append(f"llama-server takes {len(tools)} tool result(s) for user messages: a batch break and a "
                       "checkpoint at each (the llama.cpp issue 25213 shape); send tmplkit's delimiters with "
                       "/completion (tmplkit request --delimiters-only)")
        if other:
            out.append(f"llama-server starts a user message at message(s) {', '.join(other)}")
        missed = [i for i, r in self.missed if r == "user"]
        if "no delimiters at all" in self.verdicts:
            out.append("llama-server's chat endpoint has no user delimiter for this template: no batch break or "
                       "checkpoint at any message, only near the prompt's end, so a resume goes back to the newest "
                       "end-of-prompt checkpoint it can use, or to the start")
        elif missed:
            out.append(f"llama-server misses {len(missed)} of the {len(self.tmplkit)} user messages tmplkit finds: no "
                       "checkpoint there, so a resume goes back further")
        return "; ".join(out)

    def to_dict(self) -> dict:
        return {"template": self.template, "verdicts": list(self.verdicts),
                "server_user_starts": list(self.server), "tmplkit_user_starts": list(self.tmplkit),
                "extra": [{"message": i, "role": r} for i, r in self.extra],
                "missed": [{"message": i, "role": r} for i, r in self.missed], "unseen": list(self.unseen),
                "tmplkit_passed": self.tmplkit_passed, "advice": self.advice(), "server": self.delimiters.to_dict()}


@dataclass(frozen=True)
class ComparisonReport:
    """The comparison over many templates, with the llama-cpp-python release of the server."""

    rows: tuple[DelimiterComparison, ...]
    llama_cpp_python: str

    def to_dict(self) -> dict:
        return {"schema_version": COMPARISON_SCHEMA_VERSION, "tmplkit_version": __version__,
                "llama_cpp_python": self.llama_cpp_python, "templates": len(self.rows),
                "counts": verdict_counts(self.rows), "results": [r.to_dict() for r in self.rows]}


def compare_delimiters(server: ServerDelimiters, analysis) -> DelimiterComparison:
    """Compare llama-server's user starts with tmplkit's on the server's render of the probe."""
    name = server.template
    passed = analysis.status in ("pass", "pass with warnings")
    if server.status == "refused":
        return DelimiterComparison(name, ("refused by llama-server",), (), (), (), (), server, passed)
    if server.status != "ok" or not analysis.delimiters:
        return DelimiterComparison(name, ("not compared",), (), (), (), (), server, passed)
    messages = server.messages
    opener = message_opener(server.prompt, messages)
    ours: set[int] = set()
    unseen: set[int] = set()
    first_token_end = server.first_token_chars
    for span in split_text(server.prompt, analysis.delimiters):
        if span.role != "user":
            continue
        msg = opener(span.start)
        if msg is None:
            continue
        if span.start < first_token_end:
            unseen.add(msg)
        else:
            ours.add(msg)
    theirs = {s.message for s in server.user_starts if s.message is not None} - unseen
    extra = tuple((i, messages[i]["role"]) for i in sorted(theirs - ours))
    missed = tuple((i, messages[i]["role"]) for i in sorted(ours - theirs))
    verdicts = []
    if not server.user_starts and _has_none(server):
        verdicts.append("no delimiters at all")
    if any(r == "tool" for _, r in extra):
        verdicts.append("tool results taken for user messages")
    if any(r != "tool" for _, r in extra):
        verdicts.append("other messages taken for user messages")
    if missed and "no delimiters at all" not in verdicts:
        verdicts.append("real user messages missed")
    if not verdicts:
        verdicts.append("agree")
    return DelimiterComparison(name, tuple(verdicts), tuple(sorted(theirs)), tuple(sorted(ours)), extra, missed, server,
                               passed, tuple(sorted(unseen)))


def _has_none(server: ServerDelimiters) -> bool:
    """The server has no user delimiter for the template (not: it has one that matches nothing)."""
    if server.route == "autoparser":
        return not any(d.role == "user" for d in server.delimiters or ())
    return server.handler in HANDLERS_WITHOUT_DELIMITERS


def format_comparison_table(rows: Sequence[DelimiterComparison]) -> str:
    """A markdown table: one row per template, then the counts per verdict."""
    lines = ["| template | vocab | llama-server's delimiters | user starts (server / tmplkit) | verdict |",
             "|---|---|---|---|---|"]
    for r in rows:
        d = r.delimiters
        if d.route == "specialized" and d.handler in HANDLERS_WITHOUT_DELIMITERS:
            how = f"{d.handler} handler: none"
        elif d.route == "specialized":
            how = f"{d.handler or 'unnamed'} handler: hard-coded, not logged"
        elif d.route == "autoparser":
            how = "autoparser: " + (", ".join(f"{x.role} `{markdown_cell(x.delimiter)}`" for x in d.delimiters or ()) or "none")
        else:
            how = "-"
        lines.append(f"| {r.template} | {d.vocab} | {how} | {len(r.server)} / {len(r.tmplkit)} | {r.verdict} |")
    lines.append("")
    lines.append(", ".join(f"{k}: {v}" for k, v in verdict_counts(rows).items() if v))
    return "\n".join(lines) + "\n"


# What `server delimiters --fail-on` fails on: "differs" (llama-server starts user messages
# elsewhere than tmplkit, or has no delimiters); "unchecked" also a template not compared (refused by
# llama-server, or no delimiters from tmplkit to compare).
COMPARISON_FAIL_ON = ("differs", "unchecked")
_UNCHECKED = ("refused by llama-server", "not compared")


def comparison_failures(rows: Sequence[DelimiterComparison], fail_on: str) -> tuple[DelimiterComparison, ...]:
    """The rows that fail a gate on `fail_on` (one of COMPARISON_FAIL_ON), in order."""
    if fail_on not in COMPARISON_FAIL_ON:
        raise InputError(f"fail_on must be one of {', '.join(COMPARISON_FAIL_ON)}, got {fail_on!r}")
    return tuple(r for r in rows if r.verdicts != ("agree",)
                 and (fail_on == "unchecked" or not set(r.verdicts) & set(_UNCHECKED)))


def verdict_counts(rows: Sequence[DelimiterComparison]) -> dict[str, int]:
    """Templates per verdict (a template with two verdicts counts in both)."""
    out = dict.fromkeys(VERDICTS, 0)
    for r in rows:
        for v in r.verdicts:
            out[v] += 1
    return out


def markdown_cell(text: str) -> str:
    """A template's text in a markdown table's code cell: line breaks, pipes and backticks kept from
    ending it, the control characters a terminal acts on shown, not run."""
    return escape_controls(text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'"))
