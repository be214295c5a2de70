#!/usr/bin/env python
"""How long `tmplkit turns` takes on a long session: this tree against a git revision, alternately.

    python scripts/bench_turns_speed.py --against 9b0fe4f --rounds 3 --json scripts/results/turns-speed.json
    python scripts/bench_turns_speed.py --against 9b0fe4f --cases chat-2000-qwen35 --rounds 1
    python scripts/bench_turns_speed.py --alone --rounds 5 --json scripts/results/turns-speed-alone.json

Cases (each a fresh process per run, so neither tree warms the other's caches):
- agent-90k: a generated coding-agent session (seed 0, 341 messages, about 89k tokens in its last request,
  the size in llama.cpp issue 25213) on the corpus's Qwen3.5-4B template, with the qwen35
  vocabulary and the thinking switches (`tmplkit turns --tokenizer vocab:qwen35`);
- agent-90k-text: the same session, text only (`--no-switches`, no tokenizer);
- chat-2000: a 2,000-message plain chat (user, assistant, ...) on fixtures/turns/stable.jinja, a
  ChatML template of ours;
- chat-2000-qwen35: the same chat on the Qwen3.5-4B template (its history loop is heavier);
- agent-90k-two-settings: agent-90k with the cost of llama-server's and tmplkit's settings only
  (`--settings llama-server,tmplkit`: no divergence-aware setting, so no next renders to predict from);
- agent-90k-ahead: agent-90k with the next renders made in a forked child on the second core
  (`study_turns(..., ahead=True)`, what `tmplkit turns -j 2` does with one template); its renders
  per request count this process's only.

Both trees study the same sessions, written once by this tree into the temporary folder. Per case:
the seconds of `study_turns` alone (templates and tokenizers loaded before the clock starts), per
round and as medians, and the paired ratios this/REV with their spread. The machine's CPU model
is recorded: absolute times differ 2-3x between machines, the ratios much less.

`--alone`: this tree only, each round a fresh process that times both the study and the session's
requests rendered alone (each request's text once, at its time, as a client's template would; the
conversation prepared for the server inside the clock in both), in alternating order; per case the
paired ratio study/alone with its spread (the issue's "within 2x of rendering the requests alone"),
and the floor under it: the renders each makes per request (a request, the conversation ending with
the generated turn, and with a tokenizer the next renders the divergence-aware setting predicts
from), the seconds spent in them, and the study's time outside its renders over "alone". With a
tokenizer, a third reference in the same rounds: the requests rendered and tokenized whole, each
alone, as llama-server does with every request it is sent ("tokenized"; the study tokenizes only
each request's new part), and the paired ratio study/tokenized. Where transformers is installed, a
fourth: the same requests rendered by transformers' own `render_jinja_template` ("transformers", what
a client's library renders them with; the last request's text checked equal to tmplkit's outside the
clock), and the paired ratio study/transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model, emit_results, loadavg, revision_tree  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent

QWEN35 = ("corpus:llama.cpp", "Qwen3.5-4B")
CHATML = (str(ROOT / "fixtures" / "turns" / "stable.jinja"), None)
# case -> ((template source, name), tokenizer or None, switches, session file stem[, study_turns options])
CASES = {
    "agent-90k": (QWEN35, "vocab:qwen35", True, "agent"),
    "agent-90k-text": (QWEN35, None, False, "agent"),
    "chat-2000": (CHATML, None, True, "chat"),
    "chat-2000-qwen35": (QWEN35, None, True, "chat"),
    # `tmplkit turns --settings llama-server,tmplkit`: no divergence-aware setting, so no next renders
    "agent-90k-two-settings": (QWEN35, "vocab:qwen35", True, "agent", {"settings": ("llama-server", "tmplkit")}),
    # `tmplkit turns -j 2` on one template: the next renders made in a forked child on the second core
    "agent-90k-ahead": (QWEN35, "vocab:qwen35", True, "agent", {"ahead": True}),
}
DEFAULT_CASES = ("agent-90k", "agent-90k-text", "chat-2000")
# (a revision before --settings, or before the next renders were made ahead, has no such case)
ALONE_CASES = DEFAULT_CASES + ("agent-90k-two-settings", "agent-90k-ahead")


def plain_chat(n_messages: int) -> list[dict]:
    """`n_messages` of a plain chat, user first and last (every user message is a request)."""
    out = []
    for i in range(n_messages):
        if i % 2 == 0:
            out.append({"role": "user", "content": f"Question {i // 2}: how would you rename the module `pkg/m{i}.py`?"})
        else:
            out.append({"role": "assistant", "content": f"Rename it to `pkg/mod_{i}.py` and update its {i % 7 + 1} importers."})
    if out[-1]["role"] != "user":
        out.append({"role": "user", "content": "Thanks."})
    return out


def write_sessions(folder: Path) -> dict:
    """The sessions both trees study, as JSON files of messages; their sizes (messages, and the
    agent session's last request in qwen35 tokens on the Qwen3.5-4B template)."""
    sys.path.insert(0, str(ROOT))
    from tmplkit.session import generate_session
    from tmplkit.sources import load_one
    from tmplkit.tokens.tokenizers import load_tokenizer
    from tmplkit.turns import session_requests

    # 341 messages, about 89k qwen35 tokens in the last request: the session of the figures
    agent = generate_session(120000, seed=0, style="agent")
    sessions = {"agent": list(agent.messages), "chat": plain_chat(2000)}
    for stem, msgs in sessions.items():
        (folder / f"{stem}.json").write_text(json.dumps({"messages": msgs}), encoding="utf-8")
    last = session_requests(agent, load_one(*QWEN35))[-1]
    tokens = len(load_tokenizer("vocab:qwen35").tokenize(last.text, add_bos=False))
    return {"agent_messages": len(sessions["agent"]), "agent_last_request_tokens": tokens, "chat_messages": len(sessions["chat"])}


def worker(case: str, session_file: str) -> dict:
    """One timed study of `case` with the tmplkit on sys.path (this tree's or the revision's)."""
    from tmplkit.session import load_session

    try:  # this tree
        from tmplkit.tokens.tokenizers import load_tokenizer
    except ImportError:
        try:  # before the layers were folders (9b0fe4f)
            from tmplkit.tokenizers import load_tokenizer  # type: ignore[no-redef]
        except ImportError:  # before the session layer (e95b580)
            from tmplkit.tokenize import load_tokenizer  # type: ignore[no-redef]
    from tmplkit.sources import load_one
    from tmplkit.turns import study_turns

    source, tok_spec, switches, _, *extra = CASES[case]
    template = load_one(*source)
    session = load_session(session_file)
    tok = load_tokenizer(tok_spec) if tok_spec else None
    options = dict(extra[0]) if extra else {}  # (a revision before --settings runs no such case)
    start = time.perf_counter()
    report = study_turns(template, session, tokenizer=tok, switches=switches, **options)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "n_requests": report.n_requests, "stable": report.stable, "error": report.error}


def alone_worker(case: str, session_file: str, order: str) -> dict:
    """One round of `--alone`: the study and the requests rendered alone (with a tokenizer, also
    rendered and tokenized alone), timed in `order` (comma-separated: "study", "alone", "tokenized"),
    in this process."""
    from tmplkit.sandbox import PINNED_NOW
    from tmplkit.session import for_server, load_session
    from tmplkit.session.requests import DEFAULT_INTERVAL, clock_at, request_points
    from tmplkit.sources import load_one
    from tmplkit.tokens.tokenizers import load_tokenizer
    from tmplkit.turns import study_turns

    source, tok_spec, switches, _, *extra = CASES[case]
    template = load_one(*source)
    session = load_session(session_file)
    tok = load_tokenizer(tok_spec) if tok_spec else None
    options = dict(extra[0]) if extra else {}

    def alone() -> int:
        conversation = for_server(template, session)
        msgs = list(conversation.messages)
        points = request_points(msgs)
        for k, (n, _) in enumerate(points):
            conversation.render(msgs[:n], add_generation_prompt=True, clock=clock_at(PINNED_NOW + k * DEFAULT_INTERVAL))
        return len(points)

    def tokenized() -> int:
        # each request rendered and tokenized whole, as llama-server does with every request it is sent
        conversation = for_server(template, session)
        msgs = list(conversation.messages)
        points = request_points(msgs)
        for k, (n, _) in enumerate(points):
            tok.tokenize(conversation.render(msgs[:n], add_generation_prompt=True,
                                             clock=clock_at(PINNED_NOW + k * DEFAULT_INTERVAL)), add_bos=False)
        return len(points)

    def by_transformers() -> int:
        # the requests as a client's library renders them (the conversation prepared as in `alone`)
        conversation = for_server(template, session)
        msgs = [dict(m) for m in conversation.messages]
        points = request_points(msgs)
        for n, _ in points:
            _transformers_render(template, conversation, msgs[:n])
        return len(points)

    if "transformers" in order:  # (its template compiled before any clock, as tmplkit's is by load_one)
        conversation = for_server(template, session)
        first = request_points(list(conversation.messages))[0][0]
        _transformers_render(template, conversation, [dict(m) for m in conversation.messages[:first]])
    renders = _count_renders()
    seconds, n_requests, n_renders, render_s = {}, {}, {}, {}
    for what in order.split(","):
        if what == "tokenized" and tok is None:
            continue
        renders.update(n=0, s=0.0)
        start = time.perf_counter()
        n_requests[what] = (study_turns(template, session, tokenizer=tok, switches=switches, **options).n_requests
                            if what == "study" else alone() if what == "alone" else by_transformers()
                            if what == "transformers" else tokenized())
        seconds[what] = time.perf_counter() - start
        n_renders[what], render_s[what] = renders["n"], renders["s"]
    out = {"seconds": seconds, "n_requests": n_requests, "renders": n_renders, "render_seconds": render_s}
    if "transformers" in seconds:  # (the same text as tmplkit's, checked outside the clock on the last request)
        conversation = for_server(template, session)
        msgs = list(conversation.messages)
        n = request_points(msgs)[-1][0]
        ours = conversation.render(msgs[:n], add_generation_prompt=True, clock=clock_at(PINNED_NOW))  # (transformers' clock)
        out["transformers_same_text"] = ours == _transformers_render(template, conversation, [dict(m) for m in msgs[:n]])
    return out


def _transformers_render(template, conversation, msgs: list) -> str:
    """`msgs` rendered by transformers' own `render_jinja_template` (tmplkit's pinned clock)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from tmplkit.masks._proof import _pin_clock

    _pin_clock(template.text)  # (cached by transformers with the compiled template)
    variables = {k: v for k, v in conversation.variables.items() if k not in ("messages", "tools")}
    tools = list(conversation.tools) if conversation.tools else None
    return render_jinja_template(conversations=[msgs], tools=tools, chat_template=template.text,
                                 add_generation_prompt=True, **variables)[0][0]


def _has_transformers() -> bool:
    try:
        import transformers.utils.chat_template_utils  # noqa: F401
    except ImportError:
        return False
    return True


def _count_renders() -> dict:
    """Count the sandbox's renders (one pass each, `render_with_prompt`'s included) and the seconds
    spent in them: how many renders a request costs is the floor of the study's ratio to "alone"."""
    from tmplkit.sandbox import _rendering

    seen = {"n": 0, "s": 0.0}
    inner = _rendering._render

    def counted(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seen["n"] += 1
            seen["s"] += time.perf_counter() - start

    _rendering._render = counted
    return seen


def alone_rounds(rounds: int, cases) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-turns-alone-") as tmp:
        folder = Path(tmp)
        sizes = write_sessions(folder)
        out: dict = {}
        for case in cases:
            seen: dict = {"study": [], "alone": []}
            renders: dict = {"study": [], "alone": []}
            if CASES[case][1]:
                seen["tokenized"], renders["tokenized"] = [], []
            if _has_transformers():
                seen["transformers"], renders["transformers"] = [], []
            for r in range(max(1, rounds)):
                order = list(seen)[r % len(seen):] + list(seen)[:r % len(seen)]  # each first in turn
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_turns_speed.py"), "--alone-worker", case,
                                       str(folder / f"{CASES[case][3]}.json"), ",".join(order)],
                                      capture_output=True, text=True, cwd=ROOT, env=env)
                if proc.returncode != 0:
                    raise RuntimeError(f"{case}: " + (proc.stderr.strip().splitlines() or ["the worker failed"])[-1])
                res = json.loads(proc.stdout)
                for k in seen:
                    seen[k].append(res["seconds"][k])
                    renders[k].append(res["render_seconds"][k])
                print(f"round {r} {case}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in seen.items()), file=sys.stderr)
            paired = [a / b for a, b in zip(seen["study"], seen["alone"])]
            out[case] = {"seconds": seen, "median_s": {k: statistics.median(v) for k, v in seen.items()},
                         "paired_study_over_alone": {"median": statistics.median(paired), "min": min(paired), "max": max(paired)},
                         "n_requests": res["n_requests"]["study"],
                         # the floor: renders per request, and the study's time outside its renders
                         "renders": res["renders"], "renders_per_request": {k: v / res["n_requests"]["study"] for k, v in res["renders"].items()},
                         "render_seconds_median": {k: statistics.median(v) for k, v in renders.items()},
                         "study_outside_renders_over_alone": statistics.median(
                             [(s - r) / a for s, r, a in zip(seen["study"], renders["study"], seen["alone"])])}
            for ref in ("tokenized", "transformers"):
                if ref in seen:
                    paired = [a / b for a, b in zip(seen["study"], seen[ref])]
                    out[case][f"paired_study_over_{ref}"] = {"median": statistics.median(paired), "min": min(paired),
                                                             "max": max(paired)}
            if "transformers" in seen:
                out[case]["transformers_same_text"] = res["transformers_same_text"]
    return {"mode": "alone", "rounds": rounds, "sessions": sizes, "cases": out,
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "loadavg_at_end": loadavg()}}


def run(root: Path, case: str, folder: Path) -> dict:
    stem = CASES[case][3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_turns_speed.py"), "--worker", case,
                           str(folder / f"{stem}.json")], capture_output=True, text=True, cwd=root, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} in {root}: " + (proc.stderr.strip().splitlines() or ["the worker failed"])[-1])
    return json.loads(proc.stdout)


def against(rev: str, rounds: int, cases) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-turns-speed-") as tmp, revision_tree(ROOT, rev, Path(tmp) / "tree") as tree:
        folder = Path(tmp)
        sizes = write_sessions(folder)
        seen: dict = {c: {"this": [], rev: []} for c in cases}
        details: dict = {}
        for r in range(max(1, rounds)):
            for case in cases:
                order = [("this", ROOT), (rev, tree)] if r % 2 == 0 else [(rev, tree), ("this", ROOT)]
                for label, root in order:
                    res = run(root, case, folder)
                    seen[case][label].append(res["seconds"])
                    details.setdefault(case, {})[label] = res
                print(f"round {r} {case}: this {seen[case]['this'][-1]:.2f} s, {rev} {seen[case][rev][-1]:.2f} s",
                      file=sys.stderr)
    return {"against": rev, "rounds": rounds, "sessions": sizes, "cases": {c: _summary(seen[c], rev, details[c]) for c in cases},
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(),
                        "loadavg_at_end": loadavg()}}


def _summary(seen: dict, rev: str, details: dict) -> dict:
    paired = [a / b for a, b in zip(seen["this"], seen[rev])]
    return {"seconds": seen, "median_s": {k: statistics.median(v) for k, v in seen.items()},
            "paired_this_over_rev": {"median": statistics.median(paired), "min": min(paired), "max": max(paired)},
            "result": {k: {x: v[x] for x in ("n_requests", "stable", "error")} for k, v in details.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--against", metavar="REV", required=False, help="the git revision to compare with (e.g. e95b580)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), help=f"default: {' '.join(DEFAULT_CASES)}; with --alone also "
                   "agent-90k-two-settings and agent-90k-ahead")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    p.add_argument("--alone", action="store_true", help="time the study against its requests rendered alone (this tree only)")
    p.add_argument("--worker", nargs=2, metavar=("CASE", "SESSION"), help=argparse.SUPPRESS)
    p.add_argument("--alone-worker", nargs=3, metavar=("CASE", "SESSION", "ORDER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        json.dump(worker(*args.worker), sys.stdout)
        return 0
    if args.alone_worker:
        json.dump(alone_worker(*args.alone_worker), sys.stdout)
        return 0
    if not args.against and not args.alone:
        p.error("give --against REV (e.g. --against 9b0fe4f) or --alone")
    cases = args.cases or (ALONE_CASES if args.alone else DEFAULT_CASES)
    try:
        res = alone_rounds(args.rounds, cases) if args.alone else against(args.against, args.rounds, cases)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    emit_results(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
