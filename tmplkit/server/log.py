"""Reading a llama-server log as a user has it: per task, how its prompt was prefilled.

`read_server_log(text)` reads the lines the server prints and reports, per task (one request),
its decode calls and batch sizes, the batches that ended early and where, the tokens reused and
reprocessed, the checkpoints created and restored, and whether the pattern is batch fragmentation
at message starts (llama.cpp issue 25213) or a resume from too far back.

The lines and the verbosity each needs (the pinned llama.cpp, tools/server/server-context.cpp of
llama-cpp-python 0.3.36; 0.3.33 prints the same text). At the default verbosity (3, info):

- `processing task` (launch_slot_, 1810) opens a task; `selected slot by LCP similarity,
  f_sim_best = S (> T thold), f_keep = K` (get_available_slot, 1582; `sim_best` in 0.3.33) comes
  just before it: S is the common prefix with what the slot holds, over the new prompt's length.
- `prompt processing, n_tokens = K, progress = F, ...` (print_timings_pp, 588-599): printed before
  each batch, but only once the prompt has taken 3 s; K tokens processed so far, F the share of the
  prompt in memory.
- `prompt eval time = X ms / P tokens (...)` and `eval time = Y ms / G tokens` (print_timings,
  602-622): P tokens processed, G generated.
- `stop processing: n_tokens = M` (release, 518): the memory holds the prompt and all but the last
  of the G tokens generated, so the prompt had M - G + 1 tokens.
- `erasing old context checkpoint (..., n_tokens = N, ...)` (warning, 2316).

At `-lv 4` (trace) every batch and checkpoint is there: `new prompt, ..., task.n_tokens = N` (3126),
` - checking sim = S (L/N)` (1568: L the common prefix), `cached n_tokens = C, memory_seq_rm [C,
end)` (3423, before each batch: it starts at C), `created context checkpoint i of M (..., n_tokens
= N, ...)` (2349), `restored context checkpoint (..., n_tokens = N, n_past = P, ...)` (3357) and
`forcing full prompt re-processing` (3361), `init sampler, ..., total = N` (388: the prompt's N
tokens, once all are in memory; its length where a paste lacks the task's first and last lines). At `-lv 5` also `main/do_checkpoint = yes|no, pos_min
= A, pos_max = B` (3610, before each batch: it starts at B + 1). From the server's start:
`llama_context: n_batch = ...`, `n_ubatch = ...` and (trace) `context checkpoints enabled, max =
M, min spacing = S` (1347).

    >>> log = read_server_log(Path("server.log").read_text())     # doctest: +SKIP
    >>> [t.pattern for t in log.tasks]                             # doctest: +SKIP
    ['fragmented', 'none', 'resumed too far back']

A log pasted from a router (`llama-server --models-dir DIR`, no `-m`: server-models.cpp) has every
line of a spawned server prefixed with its port (`LOG("[%5d] %s", port, line)`), and the options it
spawned it with one per line on the router's `load:` lines (`SRV_INF("  %s\n", arg)`, long names:
`--ubatch-size`, `2048`): tasks are kept apart per port and n_batch / n_ubatch read from those
options. Batch or progress lines cut out of the middle of a prompt (a jump of more than n_batch
tokens between two of them) are a gap, not a batch. A log of an older server (`n_past = `,
`n_prompt_tokens = ` lines) is refused in one line.

A log as a user pastes it: colour and erase-line codes, tabs and no-break spaces, a collector's
prefix (journalctl, docker compose, kubectl) are read through. A batch of a task that ran while
another slot's task did is shared (the server fills one batch from every slot at work, a generating
slot adding a token): its early end is no break and is not counted (`shared_ends`). An info-level
task without its `stop processing` line counts its positions from the first token it processed
(`relative`), its end implied where its batches end where the server ends them near a prompt's
end (`implied_end`). A task line held twice (a `--log-file` and a `tee` of stderr into one file) or batches
that do not move forward are refused; each run of an appended log is read with its own batch sizes;
a log that begins inside a task says so (from its `new prompt` line, the task is read).

`locate_breaks(log, template, session, tokenizer)` says which message of the session each early
batch end, checkpoint and restore fell on.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import InputError

__all__ = ["ANSI", "FAR_BACK_TOKENS", "LOG_MAX_BYTES", "LOG_SCHEMA_VERSION", "ServerLog", "TaskPrefill", "decode_log", "format_server_log",
           "read_server_log"]

LOG_SCHEMA_VERSION = 3  # (3: each task's `relative` and `shared_ends`)
# The most of a log read at once (its lines take a few times that in memory): far above a session's
# lines at -lv 4; a bigger file is a server's weeks of output, or no log (a model given by mistake).
LOG_MAX_BYTES = 1 << 30

# A resume "went too far back" when it recomputed at least this many tokens the new prompt shared
# with what the slot held (or started over from position 0 with at least this many shared).
FAR_BACK_TOKENS = 1024
# llama-server's defaults (-b, -ub), for a log that does not show them.
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512

# A terminal's escape sequences a pasted log carries: colours (`m`), and the erase-line (`K`) that
# `grep --color` writes after each match.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Spaces a paste makes of the server's: a tab (an editor), a no-break space (a web page copied).
_SPACES = ("\t", "\u00a0", "\u202f", "\u2007")
_SLOT = re.compile(r"slot +\S+: id +(\d+) \| task (-?\d+) \| (.*)$")
_N_BATCH = re.compile(r"llama_context: n_batch\s+= (\d+)")
_N_UBATCH = re.compile(r"llama_context: n_ubatch\s+= (\d+)")
_CKPT_CONFIG = re.compile(r"context checkpoints enabled, max = (\d+), min spacing = (\d+)")
_CKPT_OFF = re.compile(r"context checkpoints disabled")
_VERBOSITY = re.compile(r"verbosity = (\d+) \(adjust with")
# A router's prefix: the spawned server's port, at the line's start or after a prefix a log
# collector adds (docker's or journald's timestamp), within the line's first characters.
_INSTANCE = re.compile(r"(?:^|\s)\[ *(\d+)\] ?")
_INSTANCE_WITHIN = 80
# What follows a router's prefix: the spawned server's line (its timestamp, or its own prefix).
_TIMESTAMP = r"\d+\.\d\d\.\d\d\d\.\d\d\d [A-Z] "  # llama.cpp's log timestamp and level: 0.00.920.495 I
_CHILD_LINE = re.compile(rf"{_TIMESTAMP}|slot |srv |[A-Za-z_][\w.]*:")
_SPAWN = re.compile(r"spawning server instance with name=\S* on port (\d+)")
# One option of the spawned server's command line (three spaces in, as the server writes it; any
# whitespace, as a paste may leave it: a squeezed line is read too)
_LOAD_ARG = re.compile(r"srv\s+load:\s+(\S.*?)\s*$")
_OPTION_OF = {"-b": "n_batch", "--batch-size": "n_batch", "-ub": "n_ubatch", "--ubatch-size": "n_ubatch"}
# Lines of llama-server releases before the ones tmplkit reads (b4xxx and older: `n_past = `, the
# prompt's length as `n_prompt_tokens = `), which this reader would read as no batch at all.
_OLD_FORMAT = re.compile(r"n_prompt_tokens = \d+|n_past=\d+|(?:progress|prompt done|stop processing): n_past = \d+")
_SERVER_MARKS = re.compile(r"llama_server:|load_model:|srv +\S+:|slot +\S+: id +\d+ \|")

# The server prints a 'prompt processing' line before a batch only once a prompt has taken this long
# (print_timings_pp).
PROGRESS_AFTER_S = 3.0

_TASK_LINES = {
    "start": re.compile(r"^processing task"),
    "lcp_info": re.compile(r"selected slot by LCP similarity, (?:f_)?sim_best = ([\d.]+) \(> [\d.]+ thold\), f_keep = ([\d.]+)"),
    "lcp_trace": re.compile(r"-\s*checking sim = [\d.]+ \((\d+)/(\d+)\)"),
    "new_prompt": re.compile(r"new prompt, n_ctx_slot = \d+, n_keep = -?\d+, task\.n_tokens = (\d+)"),
    "cached": re.compile(r"cached n_tokens = (\d+), memory_seq_rm \["),
    "do_checkpoint": re.compile(r"main/do_checkpoint = (?:yes|no), pos_min = -?\d+, pos_max = (-?\d+)"),
    "progress": re.compile(r"prompt processing, n_tokens = +(\d+), progress = ([\d.]+)"),
    "created": re.compile(r"created context checkpoint \d+ of \d+ \(.*?n_tokens = (\d+)"),
    "restored": re.compile(r"restored context checkpoint \(.*?n_tokens = (\d+), n_past = (\d+)"),
    "full": re.compile(r"forcing full prompt re-processing"),
    "erased": re.compile(r"erasing old context checkpoint \(.*?n_tokens = (\d+)"),
    "prompt_eval": re.compile(r"prompt eval time = +([\d.]+) ms / +(\d+) tokens \(.*?([\d.]+) tokens per second\)"),
    "eval": re.compile(r"^ *eval time = +[\d.]+ ms / +(\d+) tokens"),
    "stop": re.compile(r"stop processing: n_tokens = (\d+)"),
    # (trace: printed once the whole prompt is in memory, `total` its tokens: init_sampler, 388)
    "sampler": re.compile(r"init sampler, took [\d.]+ ms, tokens: text = \d+, total = (\d+)"),
}


@dataclass(frozen=True)
class TaskPrefill:
    """One task (request) of a llama-server log: how its prompt was prefilled.

    `level` is "trace" when the log has a line per batch and per checkpoint (`-lv 4` or more),
    else "info" (the default): then `batch_starts` holds only the batches after the prompt's
    first 3 s (`batches_complete` False) and the checkpoint fields are None (not logged).
    Positions are token indices in the prompt. `n_common` is the prefix the prompt shared with
    what the slot held (exact at trace; from the similarity line at info, to a few tokens).
    """

    task: int
    slot: int
    level: str
    n_prompt: int | None
    n_reused: int | None
    n_processed: int | None
    n_generated: int | None
    n_common: int | None
    batch_starts: tuple[int, ...]
    batches_complete: bool
    n_batch: int
    n_ubatch: int | None
    checkpoints_created: tuple[int, ...] | None
    checkpoints_restored: tuple[int, ...] | None
    full_reprocess: bool | None
    checkpoints_erased: tuple[int, ...] = ()
    prompt_ms: float | None = None
    prompt_tps: float | None = None
    instance: int | None = None  # the port a router prefixed the task's lines with (None: no router)
    # The log holds the task's end (its 'prompt eval time' or 'stop processing' line). A log cut
    # before it (pasted in part) shows the batches up to its last line only: the last one's end is
    # unknown, and at info level (no prompt length) positions count from the first token processed.
    ended: bool = True
    # Positions count from the first token the task processed, not from the prompt's start: an
    # info-level log without the task's 'stop processing' line (or cut before its end) does not say
    # how many tokens it reused.
    relative: bool = False
    # Where a batch of this task ended while another slot's task ran (the server fills one batch from
    # every slot processing at once): an early end that cannot be told from a break, not counted.
    shared_ends: tuple[int, ...] = ()
    # Whether n_batch is the log's (its start lines, or a router's options), not the default taken:
    # at -lv 4 a batch larger than the default then says the server ran with a larger -b, not a cut.
    n_batch_logged: bool = field(default=True, compare=False)
    # Where the prompt ended, where the log does not say it (no prompt length, no tokens processed)
    # but its batches do: they end where the server ends batches near a prompt's end.
    implied_end: int | None = None
    # An info-level task whose prompt took long enough to print batch lines, none of them in the log
    # (cut out of the paste): whether its batches ended early is not known (`pattern` says so).
    batches_cut: bool = False

    @property
    def _end(self) -> int | None:
        """Where the prompt ends, in the positions of `batch_starts`."""
        return self.n_processed if self.relative else self.n_prompt

    @property
    def gaps(self) -> tuple[tuple[int, int], ...]:
        """Stretches of the prompt whose lines are not in the log (cut out by whoever pasted it):
        between two batch lines more than n_batch tokens apart, which no batch can be (at -lv 4, where
        the log shows n_batch: else the batch says the server's -b was larger than the default)."""
        if self.batches_complete and not self.n_batch_logged:
            return ()
        return tuple((s, e) for s, e in zip(self.batch_starts, self.batch_ends) if e - s > self.n_batch)

    @property
    def batch_ends(self) -> tuple[int, ...]:
        """Where each batch of `batch_starts` ended (the next one's start, or the prompt's end)."""
        end = self._end if self.ended else None
        ends = list(self.batch_starts[1:])
        if self.batch_starts and end is not None:
            ends.append(end)
        return tuple(ends)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(e - s for s, e in zip(self.batch_starts, self.batch_ends))

    @property
    def decode_calls(self) -> int | None:
        """Prompt batches (decode calls); None when the log does not show them all."""
        return len(self.batch_starts) if self.batches_complete and self.ended and not self.gaps else None

    @property
    def early_ends(self) -> tuple[int, ...]:
        """Where a batch ended before n_batch tokens and before the prompt's end (not for sharing
        the batch with another slot)."""
        n, shared = self._end, set(self.shared_ends)
        return tuple(e for s, e in zip(self.batch_starts, self.batch_ends)
                     if e - s < self.n_batch and (n is None or e < n) and e not in shared)

    @property
    def near_end(self) -> tuple[int, ...]:
        """The two positions llama-server ends a batch at so that it can checkpoint near the end of
        a prompt (n - 4 - n_ubatch and n - 4; server-context.cpp:3540-3559, PR 20288), the prompt's
        end `implied_end` where the log does not say it."""
        n = self._end if self._end is not None else self.implied_end
        if n is None:
            return ()
        ub = self.n_ubatch if self.n_ubatch is not None else DEFAULT_N_UBATCH
        return tuple(p for p in (n - min(self.n_batch, 4 + ub), n - min(self.n_batch, 4)) if p > 0)

    @property
    def mid_breaks(self) -> tuple[int, ...]:
        """The early batch ends that are not the near-end ones."""
        near = set(self.near_end)
        return tuple(e for e in self.early_ends if e not in near)

    @property
    def breaks_without_checkpoint(self) -> tuple[int, ...] | None:
        """Mid-prompt early batch ends where no checkpoint was taken (None: not logged)."""
        if self.checkpoints_created is None:
            return None
        taken = set(self.checkpoints_created)
        return tuple(e for e in self.mid_breaks if e not in taken)

    @property
    def went_back(self) -> int | None:
        """Tokens the prompt shared with the slot's memory that were computed again."""
        if self.n_common is None or self.n_reused is None:
            return None
        return max(0, self.n_common - self.n_reused)

    @property
    def pattern(self) -> str:
        """'fragmented' (batches ended early at many places mid-prompt: the 25213 pattern),
        'resumed too far back' (at least FAR_BACK_TOKENS shared tokens recomputed), both joined
        by ' and ', 'not known' where the log's batch lines of the task were cut out
        (`batches_cut`), or 'none'."""
        found = []
        if self._fragmented():
            found.append("fragmented")
        back = self.went_back
        if back is not None and back >= FAR_BACK_TOKENS:
            found.append("resumed too far back")
        return " and ".join(found) or ("not known" if self.batches_cut else "none")

    def _fragmented(self) -> bool:
        """At least 3 mid-prompt breaks, and at least twice the decode calls the batches shown
        needed (their tokens in n_batch batches, plus the near-end ones); a gap (lines cut out)
        is no batch and counts neither way."""
        shared = set(self.shared_ends)
        sizes = [n for n, e in zip(self.batch_sizes, self.batch_ends) if n <= self.n_batch and e not in shared]
        if len(self.mid_breaks) < 3 or not sizes:
            return False
        first = self.batch_starts[0]
        least = -(-sum(sizes) // self.n_batch) + sum(1 for p in self.near_end if p > first)
        return len(sizes) >= 2 * least

    def findings(self) -> list[str]:
        """What the task's log shows, in sentences a user can act on."""
        out = []
        mid, no_ckpt = self.mid_breaks, self.breaks_without_checkpoint
        calls = self.decode_calls
        if self._fragmented():
            seen = "" if self.batches_complete else " (of the batches after the first 3 s, all this log level shows)"
            if self.gaps:
                seen += f" (the batch lines of {sum(e - s for s, e in self.gaps)} tokens are not in the log)"
            s = (f"batch fragmentation: {len(mid)} batches ended before n_batch = {self.n_batch} mid-prompt{seen}"
                 + (f", {calls} decode calls for {self.n_processed} tokens" if calls is not None else ""))
            if no_ckpt is not None:
                s += f"; {len(no_ckpt)} of those breaks took no checkpoint"
            s += (": the llama.cpp issue 25213 pattern, a batch ended at every message start the server took for a "
                  "user message (with Qwen-style templates every tool result); the fixed server (llama.cpp PR 25420, "
                  "in llama-cpp-python 0.3.36) ends a batch there only where it takes a checkpoint, at most one per "
                  "--checkpoint-min-step tokens: upgrade, or send delimiters that keep tool results apart "
                  "(tmplkit request --delimiters-only)")
            out.append(s)
        back = self.went_back
        if back is not None and back >= FAR_BACK_TOKENS:
            where = ("started over from position 0" if self.n_reused == 0 else
                     f"resumed at {self.n_reused}")
            out.append(f"resumed from too far back: the prompt shared {self.n_common} tokens with the slot's memory but it "
                       f"{where}, recomputing {back} of them: no checkpoint near the point where the prompt changed "
                       "(a user message the server did not take for one, or checkpoints too far apart: -cms, -ctxcp)")
        if self.full_reprocess:
            out.append("llama-server forced full prompt re-processing: no checkpoint it could restore")
        if self.shared_ends:
            out.append(f"{len(self.shared_ends)} of its batches ran while another slot's task did (slots processing at "
                       "once fill one batch together): their early ends cannot be told from breaks at messages and are "
                       "not counted; a log of one request at a time shows them")
        return out

    def to_dict(self) -> dict:
        return {"task": self.task, "slot": self.slot, "level": self.level, "n_prompt": self.n_prompt,
                "n_reused": self.n_reused, "n_processed": self.n_processed, "n_generated": self.n_generated,
                "n_common": self.n_common, "went_back": self.went_back, "n_batch": self.n_batch,
                "n_ubatch": self.n_ubatch, "decode_calls": self.decode_calls, "ended": self.ended,
                "batches_complete": self.batches_complete, "batch_starts": list(self.batch_starts),
                "batch_sizes": list(self.batch_sizes), "early_ends": list(self.early_ends),
                "near_end": list(self.near_end), "mid_breaks": list(self.mid_breaks),
                "breaks_without_checkpoint": _list_or_none(self.breaks_without_checkpoint),
                "checkpoints_created": _list_or_none(self.checkpoints_created),
                "checkpoints_restored": _list_or_none(self.checkpoints_restored),
                "checkpoints_erased": list(self.checkpoints_erased), "full_reprocess": self.full_reprocess,
                "prompt_ms": self.prompt_ms, "prompt_tps": self.prompt_tps, "instance": self.instance,
                "relative": self.relative, "shared_ends": list(self.shared_ends),
                "gaps": [list(g) for g in self.gaps], "pattern": self.pattern,
                "findings": self.findings()}


def _total(counts) -> int | None:
    """The sum of `counts`, or None where one of them is not known."""
    counts = list(counts)
    return None if any(c is None for c in counts) else sum(counts)


def _list_or_none(x):
    return None if x is None else list(x)


@dataclass(frozen=True)
class ServerLog:
    """A llama-server log: the server's batch settings (None: not in the log) and its tasks."""

    source: str
    verbosity: int | None
    n_batch: int | None
    n_ubatch: int | None
    checkpoints_max: int | None
    checkpoint_min_step: int | None
    tasks: tuple[TaskPrefill, ...]
    notes: tuple[str, ...] = ()
    # Where the breaks fell in the session: `TaskLocation`s of `tmplkit.server.log_breaks.locate_breaks`
    # (which places them on a session, a layer this parser does not read), each with `task` and `to_dict()`.
    locations: tuple = ()

    def summary(self) -> dict:
        patterns: dict[str, int] = {}
        for t in self.tasks:
            patterns[t.pattern] = patterns.get(t.pattern, 0) + 1
        return {"tasks": len(self.tasks), "patterns": patterns,
                "decode_calls": (_total(t.decode_calls for t in self.tasks)
                                 if all(t.batches_complete for t in self.tasks) else None),
                # (None where a task's count is not known: a log cut before its end)
                "tokens_processed": _total(t.n_processed for t in self.tasks),
                "tokens_reused": _total(t.n_reused for t in self.tasks),
                "mid_breaks": sum(len(t.mid_breaks) for t in self.tasks),
                "checkpoints_created": (sum(len(t.checkpoints_created or ()) for t in self.tasks)
                                        if all(t.checkpoints_created is not None for t in self.tasks) else None),
                "checkpoints_restored": (sum(len(t.checkpoints_restored or ()) for t in self.tasks)
                                         if all(t.checkpoints_restored is not None for t in self.tasks) else None)}

    def to_dict(self) -> dict:
        return {"schema_version": LOG_SCHEMA_VERSION, "source": self.source, "verbosity": self.verbosity,
                "n_batch": self.n_batch, "n_ubatch": self.n_ubatch, "checkpoints_max": self.checkpoints_max,
                "checkpoint_min_step": self.checkpoint_min_step, "notes": list(self.notes),
                "summary": self.summary(), "tasks": [t.to_dict() for t in self.tasks],
                "locations": [loc.to_dict() for loc in self.locations]}


@dataclass
class _Task:
    task: int
    slot: int
    lcp_info: tuple[float, float] | None = None
    lcp: int | None = None
    # The server's batch sizes when the task began (a log of two runs may hold two settings)
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_prompt_trace: int | None = None
    n_prompt_sampled: int | None = None  # (its 'init sampler' line: the prompt's tokens, once all are in memory)
    cached: list[int] = field(default_factory=list)
    do_ckpt: list[int] = field(default_factory=list)
    progress: list[tuple[int, float]] = field(default_factory=list)
    # The log line of each batch line above, and of the task's last line (while another slot's task
    # runs, from its first batch to its end, the server fills each batch from both slots: a batch
    # of this task ends early for that, not at a message)
    lines: dict[str, list[int]] = field(default_factory=lambda: {"cached": [], "do_ckpt": [], "progress": []})
    last_line: int = -1
    start_line: int = -1  # its 'processing task' line (or 'new prompt', where the log begins there)
    headless: bool = False  # read from its 'new prompt' line: the lines before (what it shared) are not in the log
    created: list[int] = field(default_factory=list)
    restored: list[tuple[int, int]] = field(default_factory=list)
    full: bool = False
    erased: list[int] = field(default_factory=list)
    prompt_eval: tuple[float, int, float] | None = None
    n_gen: int | None = None
    stop: int | None = None
    unread: list[str] = field(default_factory=list)  # (lines opening as one of `_OPENINGS` that did not match)


# How the task lines this reader counts on open: one that opens so and does not match its pattern
# is another version's wording, or damaged, and the count it stands for would be short without a word.
_OPENINGS = ("cached n_tokens", "prompt processing", "created context checkpoint", "restored context checkpoint",
             "erasing old context checkpoint", "prompt eval time", "stop processing")


def _read_task_line(t: _Task, msg: str, at: int = -1) -> None:
    """One line of a known task (line `at` of the log): the batch, checkpoint and timing facts it
    states, into `t`."""
    if (g := _TASK_LINES["new_prompt"].search(msg)) is not None:
        t.n_prompt_trace = _int(g.group(1))
    elif (g := _TASK_LINES["cached"].search(msg)) is not None:
        t.cached.append(_int(g.group(1)))
        t.lines["cached"].append(at)
    elif (g := _TASK_LINES["do_checkpoint"].search(msg)) is not None:
        t.do_ckpt.append(_int(g.group(1)) + 1)
        t.lines["do_ckpt"].append(at)
    elif (g := _TASK_LINES["progress"].search(msg)) is not None:
        t.progress.append((_int(g.group(1)), float(g.group(2))))
        t.lines["progress"].append(at)
    elif (g := _TASK_LINES["created"].search(msg)) is not None:
        t.created.append(_int(g.group(1)))
    elif (g := _TASK_LINES["restored"].search(msg)) is not None:
        t.restored.append((_int(g.group(1)), _int(g.group(2))))
    elif _TASK_LINES["full"].search(msg):
        t.full = True
    elif (g := _TASK_LINES["erased"].search(msg)) is not None:
        t.erased.append(_int(g.group(1)))
    elif (g := _TASK_LINES["prompt_eval"].search(msg)) is not None:
        t.prompt_eval = (float(g.group(1)), _int(g.group(2)), float(g.group(3)))
    elif (g := _TASK_LINES["eval"].search(msg)) is not None:
        t.n_gen = _int(g.group(1))
    elif (g := _TASK_LINES["stop"].search(msg)) is not None:
        t.stop = _int(g.group(1))
    elif (g := _TASK_LINES["sampler"].search(msg)) is not None:
        if t.n_prompt_sampled is None:  # (the first: a slot that copies its state prints the line again)
            t.n_prompt_sampled = _int(g.group(1))
    elif _opens_as_counted(msg.strip()):
        t.unread.append(msg.strip())


def _opens_as_counted(text: str) -> bool:
    """Whether a line opens as one this reader counts on, or is such a line's beginning alone (a line
    another process's write split in two: `cached n_tok`, then `ens = 602` on a line of its own)."""
    return text.startswith(_OPENINGS) or (len(text) >= 8 and any(o.startswith(text) for o in _OPENINGS))


def decode_log(data: bytes, source: str = "<log>") -> str:
    """A log's bytes as text: UTF-8 (a byte that is not: replaced), or UTF-16 where it says so by
    its byte-order mark or has the zero bytes of one without it (PowerShell's `>` writes it).
    InputError for a compressed log (`server.log.gz`)."""
    for magic, kind, cat in ((b"\x1f\x8b", "gzip", "zcat"), (b"\x28\xb5\x2f\xfd", "zstd", "zstdcat"),
                             (b"\xfd7zXZ\x00", "xz", "xzcat"), (b"BZh", "bzip2", "bzcat")):
        if data.startswith(magic):
            raise InputError(f"{source}: a compressed file ({kind}), not the log's text; decompress it first, e.g. "
                             f"`{cat} {'LOG' if source.startswith('<') else source} | tmplkit server log -`")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", "replace")
    head = data[:4096]
    if len(head) >= 8 and head[1::2].count(0) > len(head) // 4 and head[::2].count(0) == 0:
        return data.decode("utf-16-le", "replace")
    if len(head) >= 8 and head[::2].count(0) > len(head) // 4 and head[1::2].count(0) == 0:
        return data.decode("utf-16-be", "replace")
    return data.decode("utf-8", "replace").removeprefix("\ufeff")


# A token count past what llama.cpp holds (int32): no server printed it; the log was edited or damaged.
_MAX_TOKENS = (1 << 31) - 1


class _Damaged(ValueError):
    """A number of more digits than Python converts (a count past int32 is refused after reading,
    with the task it is in: `_refuse_implausible`)."""


def _int(digits: str) -> int:
    if len(digits) > sys.get_int_max_str_digits() > 0:
        raise _Damaged(digits)
    return int(digits)


def read_server_log(text: str, source: str = "<log>") -> ServerLog:
    """Read a llama-server log (any verbosity; with or without its start lines; a single server's
    or a router's, its spawned servers' lines prefixed with their port) task by task.

    Raises InputError, in one line, for a text that is not a llama-server log, one of an older
    server's format, one that holds no task (or only one it begins inside), and one that holds a
    line twice or a task whose batches do not move forward (each would count as a break). A last
    line with no end that the log cannot be read with (cut as the server wrote it, or copied in
    part) is left out, with a note.
    """
    try:
        return _read_server_log(text, source)
    except InputError as whole:
        cut = _without_open_line(text)
        if cut is None:
            raise
        try:
            log = _read_server_log(cut, source)
        except InputError:
            raise whole from None  # (the last line was not what broke it: the whole log's error)
        note = ("the log's last line has no end and cannot be read as it stands (a log cut while it was written, or "
                "copied in part): left out, so the last task's figures may be incomplete")
        return replace(log, notes=log.notes + (note,))


def _without_open_line(text: str) -> str | None:
    """`text` without its last line, where that line has no end and others come before it; else None."""
    if not text or text.endswith(("\n", "\r")):
        return None
    end = max(text.rfind("\n"), text.rfind("\r"))
    return text[:end + 1] if end >= 0 and text[:end].strip() else None


def _read_server_log(text: str, source: str) -> ServerLog:
    # llama-server writes no NUL: a run of them is a log emptied while the server wrote on into it
    # (`: > server.log`, logrotate's copytruncate), left out; a binary file is no log below.
    # (a tab or a no-break space where the server wrote spaces, as an editor or a paste makes them: a space)
    for space in _SPACES:  # (on the whole text: a replace is C speed, a translate per line is not)
        text = text.replace(space, " ")
    lines = [ANSI.sub("", ln) for ln in text.replace("\x00", "").splitlines()]
    if not any(ln.strip() for ln in lines):
        raise InputError(f"{source}: the log is empty; give the output of llama-server itself (its stderr, or "
                         "--log-file) once it has served a request")
    _refuse_older_format(lines, source)
    if not any(_SERVER_MARKS.search(ln) for ln in lines):
        raise InputError(f"{source}: not a llama-server log (no 'srv ...:' or 'slot ...: id N | task N |' line); "
                         "give the output of llama-server itself (its stderr, or --log-file)")
    _refuse_wrapped(lines, source)  # (after: a binary file's bytes fall in lines of one length too)
    servers: dict[int | None, _Server] = {}
    tasks: dict[tuple[int | None, int, int], _Task] = {}  # (instance, run, task id)
    # A server started again into the same log (an appended --log-file) counts its tasks from 0
    # again: a task id seen before starts the instance's next run, read apart from the last.
    runs: dict[int | None, int] = {}
    spawning: list[int] = []  # the port of the instance the router's `load:` lines are about
    orphans: dict[tuple[int | None, int], int] = {}
    try:
        order = _read_lines(lines, servers, tasks, runs, spawning, orphans, source)
    except _Damaged as exc:
        raise InputError(f"{source}: a number of {len(str(exc).lstrip('-'))} digits, more than llama-server prints: the "
                         "log was edited or damaged; give the log as llama-server wrote it") from None
    if not order and orphans:
        (_, begun), at = next(iter(orphans.items()))
        raise InputError(f"{source}: the log begins inside task {begun} (line {at + 1} is one of its batch or timing lines, "
                         "its 'processing task' line is not in the log): give the log from the task's start")
    if not order:
        raise InputError(f"{source}: a llama-server log with no task in it (no 'processing task' line): it holds no "
                         "request, or it was cut before the first one")
    if not any(_has_facts(tasks[k]) for k in order):
        raise InputError(f"{source}: {len(order)} task{'s' if len(order) != 1 else ''} but none of the lines it "
                         "reads a task from ('prompt processing, n_tokens = ', 'prompt eval time = ', 'stop processing: "
                         "n_tokens = ', or at -lv 4 'cached n_tokens = '): a log cut right after its task began (give "
                         "the log up to the task's 'prompt eval time' line), or a log format tmplkit does not read")
    _refuse_implausible(tasks, source)
    _refuse_implausible_settings(servers, source)
    _refuse_unread_batches(tasks, servers, order, source)
    _refuse_unread_lines(tasks, order, source)
    _refuse_repeated_batches(tasks, order, source)
    others = _others_running(tasks, order)
    out = tuple(_finish(tasks[k], servers[k[0]], k[0], others[k]) for k in order)
    _refuse_short_prompts(out, source)
    first = servers[order[0][0]]
    headless = [tasks[k].task for k in order if tasks[k].headless]
    notes = _notes(first) + _reading_notes(out, runs, orphans, headless, text)
    head = tasks[order[0]]  # (the first task's run: a log of two runs says so in a note)
    return ServerLog(source, first.verbosity, head.n_batch if head.n_batch is not None else first.n_batch,
                     head.n_ubatch if head.n_ubatch is not None else first.n_ubatch, first.ck_max, first.ck_step, out,
                     tuple(notes))


def _reading_notes(out: tuple[TaskPrefill, ...], runs: dict, orphans: dict, headless: list[int], text: str) -> list[str]:
    """What the reader of the report should know of how the log was read: runs, cuts, tasks begun
    before the log does."""
    notes = []
    if any(runs.values()):
        n = 1 + max(runs.values())
        differ = len({(t.n_batch, t.n_ubatch) for t in out}) > 1
        notes.append(f"the log holds {n} runs of the server (its task ids start again): each run's tasks are read apart, "
                     "in the order of the log" + (", each with its run's batch sizes (they differ)" if differ else ""))
    if headless:
        notes.append(f"the log begins at task {headless[0]}'s 'new prompt' line: how much of its prompt the slot held "
                     "before it is not known")
    if orphans:
        ids = ", ".join(str(task) for _, task in orphans)
        notes.append(f"the log begins inside task{'s' if len(orphans) > 1 else ''} {ids} (no 'processing task' line): "
                     "not read; give the log from the task's start to read it")
    cut = [t for t in out if not t.ended and (t.batch_starts or t.n_prompt is not None)]
    if cut:
        counted = " (its positions count from the first token it processed: the tokens reused are not known)" \
            if any(t.relative for t in cut) else ""
        notes.append(f"the log ends before task {cut[-1].task} does (no 'prompt eval time' line): the batches up to its "
                     f"last line are read, what came after is not known{counted}")
    elif out and not out[-1].ended and not out[-1].batch_starts:
        notes.append(f"the log ends as task {out[-1].task} begins: nothing of it is read")
    unstopped = [t.task for t in out if t.ended and t.relative]
    if unstopped:
        notes.append(f"task{'s' if len(unstopped) > 1 else ''} {', '.join(map(str, unstopped))}: its 'prompt eval time', "
                     "'eval time' or 'stop processing' line is not in the log (a log cut at its end?), so its prompt's "
                     "length and the tokens it reused are not known: its positions count from the first token it processed")
    notes += [f"task {t.task}: its prompt took {(t.prompt_ms or 0) / 1000:.1f} s, yet no 'prompt processing' line is in "
              f"the log (the server prints one before each batch from {PROGRESS_AFTER_S:.0f} s on): those lines were cut "
              "out, so its breaks are not known (pattern 'not known')" for t in out if t.batches_cut]
    implied = [str(t.task) for t in out if t.implied_end is not None]
    if implied:
        notes.append(f"task{'s' if len(implied) > 1 else ''} {', '.join(implied)}: its batches end where the server ends "
                     "them near a prompt's end (n - 4 - n_ubatch and n - 4, the last at progress 1.00): those two are "
                     "not counted as breaks")
    wide = max((max(t.batch_sizes, default=0) for t in out if t.batches_complete and not t.n_batch_logged), default=0)
    if wide > min(t.n_batch for t in out):
        notes.append(f"batches of up to {wide} tokens, more than the n_batch taken: the server ran with -b {wide} or more "
                     "(or lines were cut out); give the log from the server's start, whose lines say its n_batch")
    if text and not text.endswith(("\n", "\r")):
        notes.append("the log's last line has no end (a log cut while it was written, or copied in part): the last "
                     "task's figures may be incomplete")
    return notes


def _refuse_repeated_batches(tasks: dict, order: list, source: str) -> None:
    """A task whose batch lines do not move forward (a batch starting where the one before did, or
    before it): no server prints that; a line held twice, or two logs' lines mixed, and each such
    line would count as a batch and a break."""
    for k in order:
        t = tasks[k]
        for values in (t.cached, t.do_ckpt, [n for n, _ in t.progress]):
            bad = next((i for i in range(1, len(values)) if values[i] <= values[i - 1]), None)
            if bad is not None:
                raise InputError(f"{source}: task {t.task} has a batch at {values[bad]} right after one at {values[bad - 1]}, "
                                 "which no server prints (a line held twice, or two logs mixed): give the log as "
                                 "llama-server wrote it, once")


def _others_running(tasks: dict, order: list) -> dict:
    """Per task, the other tasks of its server and run that ran at the same time: (from, to, slot),
    in log lines. A task runs from its first batch line where the log shows each batch (-lv 4; a
    task that waits for room in the batch before that takes none), else from its 'processing task'
    line (the default verbosity shows no batch of a prompt's first 3 s), to its last line (the turn
    it generates adds a token to each batch). (A sweep over the tasks in the order they start: a log
    of thousands of tasks one after another compares each with its neighbours only.)"""
    def span(t: _Task) -> tuple[int, int, int]:
        trace = t.lines["cached"] or t.lines["do_ckpt"]
        return (min(trace) if trace else t.start_line, t.last_line, t.slot)

    spans = {k: span(tasks[k]) for k in order}
    out: dict = {k: [] for k in order}
    by_start = sorted(spans, key=lambda k: spans[k][0])
    active: list = []  # the tasks begun before, still running
    for i, k in enumerate(by_start):
        first, last, _ = spans[k]
        active = [o for o in active if spans[o][1] > first]
        later, j = [], i + 1
        while j < len(by_start) and spans[by_start[j]][0] < last:
            later.append(by_start[j])
            j += 1
        out[k] = [spans[o] for o in active + later if o[:2] == k[:2]]
        active.append(k)
    return out


def _shared(slot: int, line: int, next_line: int, others: Sequence[tuple[int, int, int]]) -> bool:
    """Whether the batch whose line is `line` (the task's next at `next_line`) was made while another
    slot's task ran: its prompt's batches, or the token a turn it generates adds to each batch. The
    server fills a batch slot by slot in id order, so a lower slot's line of the same batch comes
    before this one (one begun after it is in a later batch), a higher slot's after it."""
    return any((a < line if s < slot else a < next_line) and b > line for a, b, s in others)


def _read_lines(lines: list[str], servers: dict, tasks: dict, runs: dict, spawning: list[int],
                orphans: dict | None = None, source: str = "<log>") -> list:
    """Every line into `servers` and `tasks` (see `read_server_log`); the tasks' keys in the log's
    order. `orphans`: (instance, task id) -> the first line of a task whose start is not in the log
    (the log begins inside it). InputError for a task line the log holds twice in a row."""
    order: list[tuple[int | None, int, int]] = []
    prev = ""
    for at, raw in enumerate(lines):
        if raw == prev and _SLOT.search(raw) and _STAMPED.search(raw):
            # (no server writes one line twice to the microsecond: a log written twice into one file,
            # `--log-file` and a `tee` of its stderr, counts every batch twice, a break at each)
            raise InputError(f"{source}: line {at + 1} is the line before it again, timestamp and all: the log holds its "
                             "lines twice (a --log-file and a tee of the server's stderr into one file?); give one copy")
        prev = raw
        g = _INSTANCE.search(raw, 0, _INSTANCE_WITHIN)
        if g is not None and g.start() > 0 and not _CHILD_LINE.match(raw, g.end()):
            g = None  # (a bracketed number inside a line, not a router's prefix after a collector's)
        inst, ln = (_int(g.group(1)), raw[g.end():]) if g is not None else (None, raw)
        srv = servers.setdefault(inst, _Server())
        m = _SLOT.search(ln)
        if m is None:
            _read_server_line(ln, srv, servers, spawning)
            continue
        slot, task_id, msg = _int(m.group(1)), _int(m.group(2)), m.group(3)
        if (g := _TASK_LINES["lcp_info"].search(msg)) is not None:
            srv.pending_lcp[slot] = (float(g.group(1)), float(g.group(2)))
        elif (g := _TASK_LINES["lcp_trace"].search(msg)) is not None:
            srv.pending_trace_lcp[slot] = _int(g.group(1))
        elif _TASK_LINES["start"].search(msg) or (task_id >= 0 and (inst, runs.get(inst, 0), task_id) not in tasks
                                                   and _TASK_LINES["new_prompt"].search(msg)):
            # (a log pasted from a task's second line, its 'new prompt': the task is whole from there)
            if (inst, runs.get(inst, 0), task_id) in tasks:
                runs[inst] = runs.get(inst, 0) + 1
            key = (inst, runs.get(inst, 0), task_id)
            tasks[key] = _Task(task_id, slot, srv.pending_lcp.pop(slot, None), srv.pending_trace_lcp.pop(slot, None),
                               srv.n_batch, srv.n_ubatch)
            order.append(key)
            _read_task_line(tasks[key], msg, at)  # (a 'new prompt' line read; 'processing task' says nothing more)
            tasks[key].headless = not _TASK_LINES["start"].search(msg)
            tasks[key].start_line = tasks[key].last_line = at
        elif (key := (inst, runs.get(inst, 0), task_id)) in tasks:
            _read_task_line(tasks[key], msg, at)
            tasks[key].last_line = at
        elif orphans is not None and task_id >= 0 and (inst, task_id) not in orphans:
            probe = _Task(task_id, slot)  # (a task whose start is not in the log: its lines say what it was)
            _read_task_line(probe, msg, at)
            if _has_facts(probe):
                orphans[(inst, task_id)] = at
    return order


_STAMPED = re.compile(_TIMESTAMP)


@dataclass
class _Server:
    """What the log says about one server (a router's spawned instance, or the only one)."""

    n_batch: int | None = None
    n_ubatch: int | None = None
    ck_max: int | None = None
    ck_step: int | None = None
    ck_off: bool = False
    verbosity: int | None = None
    options: list[str] = field(default_factory=list)
    pending_lcp: dict[int, tuple[float, float]] = field(default_factory=dict)  # slot -> the selection line before its next task
    pending_trace_lcp: dict[int, int] = field(default_factory=dict)


def _read_server_line(ln: str, srv: _Server, servers: dict, spawning: list[int]) -> None:
    """A line of no task: the server's settings, or a router spawning an instance with its options."""
    if (g := _SPAWN.search(ln)) is not None:
        spawning[:] = [_int(g.group(1))]
    elif spawning and (g := _LOAD_ARG.search(ln)) is not None:
        child = servers.setdefault(spawning[0], _Server())
        child.options.append(g.group(1))
        _apply_options(child)
    elif (g := _N_BATCH.search(ln)) is not None:
        srv.n_batch = _int(g.group(1))
    elif (g := _N_UBATCH.search(ln)) is not None:
        srv.n_ubatch = _int(g.group(1))
    elif (g := _CKPT_CONFIG.search(ln)) is not None:
        srv.ck_max, srv.ck_step = _int(g.group(1)), _int(g.group(2))
    elif _CKPT_OFF.search(ln):
        srv.ck_off = True
    elif (g := _VERBOSITY.search(ln)) is not None:
        srv.verbosity = _int(g.group(1))


def _apply_options(srv: _Server) -> None:
    """-b/--batch-size and -ub/--ubatch-size from a spawned server's options (`-ub 2048`, or
    `--ubatch-size=2048`); the server's own `llama_context:` lines, when later in the log, win."""
    opts = srv.options
    for i, opt in enumerate(opts):
        name, eq, value = opt.partition("=")
        field_ = _OPTION_OF.get(name)
        if field_ is None:
            continue
        value = value if eq else (opts[i + 1] if i + 1 < len(opts) else "")
        if value.isascii() and value.isdigit() and 0 < _int(value) <= _MAX_TOKENS:  # (llama-server refuses others)
            setattr(srv, field_, _int(value))


def _refuse_implausible(tasks: dict, source: str) -> None:
    """A token count no llama-server prints (past int32): one line, not a report built on it."""
    for t in tasks.values():
        counts = [t.lcp, t.n_prompt_trace, t.n_prompt_sampled, t.n_gen, t.stop, *t.cached, *t.do_ckpt, *t.created, *t.erased,
                  *(k for k, _ in t.progress), *(n for pair in t.restored for n in pair),
                  t.prompt_eval[1] if t.prompt_eval else None]
        big = max((c for c in counts if c is not None), default=0)
        if big > _MAX_TOKENS:
            raise InputError(f"{source}: task {t.task} has a token count of {big}, more than llama.cpp can hold "
                             f"({_MAX_TOKENS}): the log was edited or damaged; give the log as llama-server wrote it")


def _refuse_short_prompts(out: tuple[TaskPrefill, ...], source: str) -> None:
    """A task whose prompt, as its 'stop processing' line gives it, is shorter than the tokens it
    processed: no server prints that (its reused tokens would be negative); a number cut or edited
    (a log cut inside its last line's `n_tokens = 24417` read 2441)."""
    for t in out:
        if t.n_reused is not None and t.n_reused < 0:
            raise InputError(f"{source}: task {t.task} processed {t.n_processed} tokens of a prompt of {t.n_prompt}, which "
                             "no server prints (a number cut or edited): give the log as llama-server wrote it")


def _refuse_implausible_settings(servers: dict, source: str) -> None:
    """A batch size or checkpoint setting no llama-server prints (0 or past int32 for a size)."""
    for srv in servers.values():
        for name, value, least in (("n_batch", srv.n_batch, 1), ("n_ubatch", srv.n_ubatch, 1),
                                   ("the checkpoints' max", srv.ck_max, 0), ("the checkpoints' spacing", srv.ck_step, 0)):
            if value is not None and not least <= value <= _MAX_TOKENS:
                raise InputError(f"{source}: {name} = {value}, which no llama-server runs with: the log was edited or "
                                 "damaged; give the log as llama-server wrote it")


def _has_facts(t: _Task) -> bool:
    return bool(t.cached or t.do_ckpt or t.progress or t.prompt_eval or t.stop is not None or t.n_prompt_trace is not None)


def _refuse_wrapped(lines: list[str], source: str) -> None:
    """A log whose long lines were broken at a width (a terminal's, `fold`, a mail client's): its
    lines would be read in pieces, the batches missed, and the report wrong. Told by many lines of
    exactly the longest length each followed by a piece of a line (no timestamp, no server prefix,
    no `name:` opening), which a log as the server wrote it does not have (its progress lines,
    all of one length, are followed by the server's next line)."""
    shown = [ln for ln in lines if ln.strip()]
    width = max(len(ln) for ln in shown)
    if not 40 <= width <= 250:
        return
    pieces = sum(1 for ln, nxt in zip(shown, shown[1:]) if len(ln) == width and not _LINE_START.search(nxt))
    if pieces >= max(5, len(shown) // 10):
        raise InputError(f"{source}: the log's lines look broken at {width} characters ({pieces} lines of exactly "
                         "that length, none longer, each followed by the rest of a line): a terminal or an editor "
                         "wrapped them; give the log as llama-server wrote it (its stderr redirected to a file, "
                         "or --log-file)")


# How a line the server wrote begins (after any prefix a log collector adds): its timestamp, or a
# task's or the server's prefix, or a `name:` opening (llama_context:, print_info:, main:, ...).
_LINE_START = re.compile(rf"{_TIMESTAMP}|slot +\S+: id +\d+ \||srv +\S+:|^\s*\[ *\d+\] |^[A-Za-z_][\w.]*:")


def _refuse_unread_batches(tasks: dict, servers: dict, order: list, source: str) -> None:
    """A task at -lv 4 (by the server's start lines or its own 'new prompt' line) that processed
    tokens (its 'prompt eval time' line says so) with no batch line read: at that verbosity the
    server writes a 'cached n_tokens' line before every batch, so its wording is one this reader
    does not know (a newer or older server), or those lines were cut out, and a report would say
    no batch ended early. (At the default verbosity a prompt may print no batch line at all: its
    'prompt processing' lines come only before a batch that starts 3 s into it.)"""
    for k in order:
        t, srv = tasks[k], servers[k[0]]
        # (its info-level progress lines do not stand in: at -lv 4 a log without the batch lines
        # they come with had them cut out, and would read as complete batches, none ended early)
        # (at -lv 4 by the server's start lines, or by the task's own 'new prompt' line, which only -lv 4
        # prints: a paste from the first request on has no start lines)
        at_trace = (srv.verbosity or 0) >= 4 or t.n_prompt_trace is not None
        if at_trace and t.prompt_eval and t.prompt_eval[1] > 0 and not (t.cached or t.do_ckpt) \
                and not (t.progress and t.unread):  # (a batch line in other words: `_refuse_unread_lines` names it)
            raise InputError(f"{source}: task {t.task} processed {t.prompt_eval[1]} tokens, but no line of the log "
                             "says its prompt batches in the wording tmplkit reads (at -lv 4, 'cached n_tokens = "
                             "...' before each batch: llama.cpp as llama-cpp-python 0.3.33 to 0.3.36 pin it): those "
                             "lines cut out of the log, or a server of another version; give the log as one of "
                             "those wrote it")


def _refuse_unread_lines(tasks: dict, order: list, source: str) -> None:
    """A task line that opens as one this reader counts on (a batch, a checkpoint, the timings) and
    says it otherwise: its batches or checkpoints would be counted short, the report read as sound
    (a fragmented prompt read as one without a break)."""
    for k in order:
        if tasks[k].unread:
            line = tasks[k].unread[0]
            raise InputError(f"{source}: task {tasks[k].task} has a line tmplkit cannot read ({line[:120]!r}): written "
                             "otherwise than by llama.cpp as llama-cpp-python 0.3.33 to 0.3.36 pin it (another version), "
                             "or damaged; give the log as one of those servers wrote it")


def _refuse_older_format(lines: list[str], source: str) -> None:
    """A log of a llama-server older than those this reader reads: one line saying so (it would
    otherwise read as tasks with nothing in them)."""
    for ln in lines:
        if (g := _OLD_FORMAT.search(ln)) is not None:
            raise InputError(f"{source}: a log format tmplkit does not read (a line with '{g.group(0)}', printed by an older "
                             "llama-server; tmplkit reads the format of llama.cpp as llama-cpp-python 0.3.33 to 0.3.36 pin "
                             "it, whose lines say 'prompt processing, n_tokens = ...'): give a log of a newer llama-server")


def _notes(srv: _Server) -> list[str]:
    """What a reader of the log should know about what it cannot show."""
    notes = []
    if srv.options and (srv.n_batch is not None or srv.n_ubatch is not None):
        notes.append("batch sizes read from the options the router spawned the server with")
    missing = [f"{name} as {default}" for name, value, default in
               (("n_batch", srv.n_batch, DEFAULT_N_BATCH), ("n_ubatch", srv.n_ubatch, DEFAULT_N_UBATCH)) if value is None]
    if missing:
        notes.append(f"the log does not show {' or '.join(m.split()[0] for m in missing)} (llama-server prints them at -lv 4 "
                     f"or more, at its start; a router, in the options it spawns a server with): taken "
                     f"{' and '.join(missing)}, llama-server's defaults")
    if srv.ck_off:
        notes.append("context checkpoints are off (-ctxcp 0, or a model that needs none)")
    if srv.verbosity is not None and srv.verbosity < 4:
        notes.append(f"verbosity {srv.verbosity}: batches are shown only after a prompt's first 3 s, and checkpoints not "
                     "at all; run llama-server with -lv 4 for every batch and checkpoint")
    return notes


def _finish(t: _Task, srv: _Server, instance: int | None, others: Sequence[tuple[int, int, int]] = ()) -> TaskPrefill:
    n_batch, logged = t.n_batch or srv.n_batch or DEFAULT_N_BATCH, bool(t.n_batch or srv.n_batch)
    n_ubatch = t.n_ubatch if t.n_ubatch is not None else srv.n_ubatch
    trace = bool(t.cached or t.do_ckpt or t.n_prompt_trace is not None)
    processed = t.prompt_eval[1] if t.prompt_eval else None
    n_prompt = t.n_prompt_trace if t.n_prompt_trace is not None else t.n_prompt_sampled
    if n_prompt is None and t.stop is not None and t.n_gen is not None:
        n_prompt = t.stop - max(t.n_gen, 1) + 1  # the memory holds the prompt and all but the last token generated
    ended = t.prompt_eval is not None or t.stop is not None or t.n_prompt_sampled is not None
    starts = tuple(t.cached or t.do_ckpt)
    at = t.lines["cached"] if t.cached else t.lines["do_ckpt"]
    reused = starts[0] if trace and starts else None
    if reused is None and n_prompt is not None and processed is not None:
        reused = n_prompt - processed
    relative = False
    if not trace and t.progress:
        # (the reused tokens unknown, a log cut before the task's end or its 'stop processing' line:
        # positions count from the first token processed, the prompt ending at the tokens processed)
        relative = reused is None
        starts, at = tuple((reused or 0) + k for k, _ in t.progress), t.lines["progress"]
    shared = tuple(starts[i + 1] for i in range(len(starts) - 1) if _shared(t.slot, at[i], at[i + 1], others))
    implied = _implied_end(starts, t.progress, n_batch, n_ubatch) if relative and processed is None else None
    common: int | None
    if t.lcp is not None:
        common = t.lcp
    elif t.lcp_info is not None and n_prompt is not None:
        common = round(t.lcp_info[0] * n_prompt)
    else:  # (no selection line: the slot was empty, unless the log begins after that line)
        common = 0 if t.lcp_info is None and trace and not t.headless else None
    restored = tuple(n for n, _ in t.restored)
    return TaskPrefill(
        task=t.task, slot=t.slot, level="trace" if trace else "info", n_prompt=n_prompt, n_reused=reused,
        n_processed=processed, n_generated=t.n_gen, n_common=common, batch_starts=starts, batches_complete=trace,
        n_batch=n_batch, n_ubatch=n_ubatch, checkpoints_created=tuple(t.created) if trace else None,
        checkpoints_restored=restored if trace else None, full_reprocess=t.full if trace else None,
        checkpoints_erased=tuple(t.erased), prompt_ms=t.prompt_eval[0] if t.prompt_eval else None,
        prompt_tps=t.prompt_eval[2] if t.prompt_eval else None, instance=instance, ended=ended, relative=relative,
        shared_ends=shared, n_batch_logged=logged, implied_end=implied, batches_cut=_batch_lines_cut(t, trace, n_batch))


def _batch_lines_cut(t: _Task, trace: bool, n_batch: int) -> bool:
    """Whether an info-level task's batch lines were cut out of the log: none there, though its
    prompt ran long enough to begin a batch past `PROGRESS_AFTER_S` (one of n_batch tokens takes
    about n_batch / tokens-per-second; twice that past the mark leaves no doubt)."""
    if trace or t.progress or t.prompt_eval is None:
        return False
    ms, n, tps = t.prompt_eval
    return bool(n and tps) and ms / 1000 - 2 * n_batch / tps > PROGRESS_AFTER_S


def _implied_end(starts: Sequence[int], progress: Sequence[tuple[int, float]], n_batch: int, n_ubatch: int | None) -> int | None:
    """Where a prompt ended whose length the log does not say, where its progress lines do: the
    server ends a batch at n - 4 - n_ubatch and at n - 4 (`TaskPrefill.near_end`), so a last line
    at progress 1.00 (the share of the prompt in memory) and a line n_ubatch before it put the end 4
    tokens after the last; else None (a log cut in the middle of a prompt, or other batch sizes)."""
    if len(starts) < 2 or not progress or progress[-1][1] < 0.995:
        return None
    ub = n_ubatch if n_ubatch is not None else DEFAULT_N_UBATCH
    end = starts[-1] + min(n_batch, 4)
    return end if end - min(n_batch, 4 + ub) in starts else None


# ---------------------------------------------------------------------------------------------


def format_server_log(log: ServerLog, quiet: bool = False) -> str:
    """The log's report as text: one block per task, then the summary. `quiet` (`-q`): only the
    tasks that show a pattern, nothing where none does."""
    by_task = {loc.task: loc for loc in log.locations}
    if quiet and all(t.pattern == "none" for t in log.tasks):
        return ""
    n = len(log.tasks)
    lines = [f"{log.source}: {n} task{'' if n == 1 else 's'}; n_batch {log.n_batch or DEFAULT_N_BATCH}"
             + (f", n_ubatch {log.n_ubatch}" if log.n_ubatch else "")
             + (f", checkpoints: at most {log.checkpoints_max}, min spacing {log.checkpoint_min_step}"
                if log.checkpoints_max is not None else "")
             + (f"; verbosity {log.verbosity}" if log.verbosity is not None else "")]
    lines += [f"  note: {n}" for n in log.notes]
    for t in log.tasks:
        if quiet and t.pattern == "none":
            continue
        calls = t.decode_calls
        port = f" (server on port {t.instance})" if t.instance is not None else ""
        head = (f"task {t.task}{port}: {t.n_prompt if t.n_prompt is not None else '?'} prompt tokens, "
                f"{t.n_reused if t.n_reused is not None else '?'} reused, "
                f"{t.n_processed if t.n_processed is not None else '?'} processed"
                + (f" ({t.prompt_tps:.0f} tokens/s)" if t.prompt_tps else "")
                + (f"; {calls} decode calls" if calls is not None else "")
                + f"; {len(t.mid_breaks)} mid-prompt breaks" + ("" if t.batches_complete else " seen"))
        lines.append(head)
        if t.gaps:
            lines.append(f"  lines cut out of the log: {', '.join(f'{a}..{b}' for a, b in t.gaps)} (not batches)")
        if t.checkpoints_created is not None:
            lines.append(f"  checkpoints created at {_short(t.checkpoints_created) or 'none'}; restored "
                         f"{_short(t.checkpoints_restored or ()) or 'none'}" + ("; full re-processing forced" if t.full_reprocess else ""))
        if t.went_back is not None and t.n_common:
            lines.append(f"  shared {t.n_common} tokens with the slot, reused {t.n_reused} (went back {t.went_back})")
        loc = by_task.get(t.task)
        if loc is not None:
            req = f"request {loc.request} ({loc.n_messages} messages)" + ("" if loc.tokens_match else ", token count not matched: approximate")
            counts = ", ".join(f"{v} {k}" for k, v in sorted(loc.counts().items()))
            lines.append(f"  {req}; early batch ends at message starts: {counts or 'none'}")
            for p in loc.places[:8]:
                lines.append(f"    {p.describe()}")
            if len(loc.places) > 8:
                lines.append(f"    ... {len(loc.places) - 8} more (--format json)")
        if t.pattern != "none":
            lines.append(f"  pattern: {t.pattern}")
        for f in t.findings():
            lines.append(f"  - {f}")
    s = log.summary()
    lines.append("summary: " + ", ".join(f"{k}: {v}" for k, v in sorted(s["patterns"].items()))
                 + f"; {_known(s['tokens_processed'])} tokens processed, {_known(s['tokens_reused'])} reused, "
                 f"{s['mid_breaks']} mid-prompt breaks")
    return "\n".join(lines) + "\n"


def _known(count: int | None) -> str:
    return "?" if count is None else str(count)


def _short(xs: Sequence[int], n: int = 12) -> str:
    xs = list(xs)
    return ", ".join(map(str, xs[:n])) + (f", ... ({len(xs)} in all)" if len(xs) > n else "")
