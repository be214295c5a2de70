"""Run a generated agent session through a pinned llama-server build, request by request, and keep
its log: the logs tmplkit's log reader is tested on (tests/data/server-logs/) and the figures
for `tmplkit server log` in docs/llama-server.md; fixtures/server-logs/README.md lists the commands.

    python scripts/server_logs.py --version 0.3.33 --verbosity 4 -o /tmp/server-0.3.33.log \
        --json scripts/results/server-log-0.3.33.json --fixture fixtures/server-logs/0.3.33-session-lv4.log

The server runs as a user runs it: its defaults for batches and checkpoints (-b 2048, -ub 512,
--ctx-checkpoints 32, --checkpoint-min-step 8192), one slot, on the tiny Qwen3.5-vocab model
(sliding-window attention: it needs checkpoints; `--model tiny:qwen35-hybrid`: the hybrid, whose
recurrent state needs them too) with its Qwen3.5 template (tool results inside user turns;
another with `--server-arg=--chat-template-file --server-arg=FILE`). Build 0.3.33 first with `bash scripts/build_llama_server.sh 0.3.33`.

`--router` runs llama-server as a router (`--models-dir`, no `-m`; the server options go to the
server it spawns, whose lines it prints prefixed with its port): the log a router's user has.
`--cut-progress N` keeps, in the fixture, only the first and last N/2 prompt-progress lines of each
task, as someone pasting a long log into a bug report does.

`--fixture` writes a trimmed copy: the start lines the reader reads and the lines of the tasks
chosen with `--tasks` (default: the first, the longest, and the first that restored a
checkpoint or re-processed its prompt), without the per-checkpoint search lines.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tmplkit.server.log import read_server_log  # noqa: E402
from tmplkit.server.pins import server_pin  # noqa: E402
from tmplkit.server.process import LlamaServer, llama_server_binary  # noqa: E402

_KEEP_START = re.compile(r"verbosity = \d+|llama_context: n_(u)?batch|context checkpoints (enabled|disabled)|"
                         r"initializing, n_slots|llama_server: model loaded|spawning server instance|srv +load:   ")
_NOISE = re.compile(r"checking checkpoint with|erased invalidated context checkpoint|n_past was set")
_TASK = re.compile(r"\| task (-?\d+) \|")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=None, help="pinned llama-cpp-python release (default: tmplkit's)")
    ap.add_argument("--verbosity", type=int, default=3, help="llama-server -lv (3: its default; 4: every batch)")
    ap.add_argument("--tokens", type=int, default=12000, help="session length (default 12000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from", dest="start", type=int, default=0,
                    help="begin at request N (-1: only the last, the whole session, as a client resuming it)")
    ap.add_argument("--requests", type=int, help="at most N requests")
    ap.add_argument("-o", "--output", required=True, help="the whole log")
    ap.add_argument("--json", help="write the log reader's report (its JSON) here")
    ap.add_argument("--fixture", help="write a trimmed copy of the log here")
    ap.add_argument("--tasks", help="task ids for the fixture, comma-separated")
    ap.add_argument("--server-arg", action="append", default=[], help="one more llama-server argument (repeatable)")
    ap.add_argument("--reuse", action="store_true", help="read the log already at -o instead of running the server")
    ap.add_argument("--router", action="store_true", help="run llama-server as a router (--models-dir) that spawns the server")
    ap.add_argument("--cut-progress", type=int, metavar="N",
                    help="in the fixture, keep only the first and last N/2 prompt-progress lines of each task")
    ap.add_argument("--model", default="tiny:qwen35", help="the model: a GGUF or a shortcut (default tiny:qwen35, "
                                                           "sliding window; tiny:qwen35-hybrid: recurrent + full attention)")
    args = ap.parse_args(argv)

    from tmplkit.prefill import generate_session
    from tmplkit.prefill.models import resolve_model
    from tmplkit.server.chat_session import drive_session

    version, _ = server_pin(args.version)
    binary = llama_server_binary(version)
    if binary is None:
        print(f"llama-server {version} is not built: bash scripts/build_llama_server.sh {version}", file=sys.stderr)
        return 2
    session = generate_session(args.tokens, seed=args.seed, style="agent")
    served: tuple = ()
    if not args.reuse:
        model = resolve_model(args.model)
        server_args = ["--jinja", "-c", "65536", "-np", "1", "-t", "2", "-tb", "2", "--no-warmup", "--cache-ram", "0",
                       "-lv", str(args.verbosity), *args.server_arg]
        extra = None
        if args.router:  # a models folder holding the model alone; the requests name it
            models = Path(args.output).with_suffix(".models")
            models.mkdir(exist_ok=True)
            link = models / Path(model).name
            if not link.exists():
                link.symlink_to(Path(model).resolve())
            server_args = ["--models-dir", str(models), *server_args]
            extra, model = {"model": link.stem}, None
        with LlamaServer(binary, model, server_args, log=Path(args.output)) as server:
            served = drive_session(server, session, start=args.start, requests=args.requests, extra=extra)
    for r in served:
        print(f"request {r.index}: {r.n_prompt} tokens, {r.n_reused} reused, {r.n_processed} processed, "
              f"pattern {r.prefill.pattern}")
    text = Path(args.output).read_text(encoding="utf-8", errors="replace")
    log = read_server_log(text, f"llama-server {version}{' (router)' if args.router else ''}, -lv {args.verbosity}")
    if args.json:
        given = [a for a in (argv or sys.argv[1:]) if a != "--reuse"]  # --reuse reads what the same command wrote
        out = {"command": "python scripts/" + Path(__file__).name + " " + " ".join(given),
               "llama_cpp_python": version, "session": session.source,
               "report": log.to_dict()}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    if args.fixture:
        wanted = ({int(t) for t in args.tasks.split(",")} if args.tasks else _default_tasks(log))
        Path(args.fixture).parent.mkdir(parents=True, exist_ok=True)
        Path(args.fixture).write_text(trim(text, wanted, args.cut_progress), encoding="utf-8")
        print(f"{args.fixture}: tasks {sorted(wanted)}")
    return 0


def _default_tasks(log) -> set[int]:
    tasks = list(log.tasks)
    chosen = {tasks[0].task, max(tasks, key=lambda t: t.n_processed or 0).task}
    resumed = [t for t in tasks[1:] if t.checkpoints_restored or t.full_reprocess or (t.went_back or 0) > 0]
    if resumed:
        chosen.add(resumed[0].task)
    return chosen


def trim(text: str, tasks: set[int], cut_progress: int | None = None) -> str:
    """The start lines the log reader reads, and every line of `tasks` but the noisy ones (the
    slot-selection lines just before a kept task stay too); with `cut_progress`, only the first and
    last cut_progress/2 progress lines of each task."""
    lines = text.splitlines()
    if cut_progress is not None:
        lines = _cut_progress(lines, cut_progress)
    out = []
    pending: list[str] = []
    for ln in lines:
        m = _TASK.search(ln)
        if m is None:
            if _KEEP_START.search(ln):
                out.append(ln)
            continue
        tid = int(m.group(1))
        if tid == -1:  # slot selection, before the task it chose
            if "selected slot" in ln or "checking sim" in ln:
                pending.append(ln)
            continue
        if tid in tasks and not _NOISE.search(ln):
            if "processing task" in ln:
                out.extend(pending)
            out.append(ln)
        if "processing task" in ln:
            pending = []
    return "\n".join(out) + "\n"


def _cut_progress(lines: list[str], n: int) -> list[str]:
    """`lines` without the middle prompt-progress lines of each task: n of them kept, the first
    n/2 and the last n - n/2."""
    by_task: dict[int, list[int]] = {}
    for i, ln in enumerate(lines):
        m = _TASK.search(ln)
        if m is not None and "prompt processing, n_tokens" in ln:
            by_task.setdefault(int(m.group(1)), []).append(i)
    drop = {i for idx in by_task.values() if len(idx) > n for i in idx[n // 2:len(idx) - (n - n // 2)]}
    return [ln for i, ln in enumerate(lines) if i not in drop]


if __name__ == "__main__":
    raise SystemExit(main())
