"""The contract table: every command that renders a template, under every way a user or an attacker
can hand it trouble, run as a user runs it (a subprocess), each under a wall-clock bound.

Scenarios: a hostile template that runs long in one C-level call (`wordwrap` over 4M words) and one
that holds four hundred 9 MB strings at once (each within the size limit: only memory stops it); one that passes every probe and runs a
`wordwrap` over 20M words only on a message of the session it is given; a huge template (20 MB); a bad conversation (a lone
surrogate); a bad tokenizer (a missing .gguf); an output path in a missing folder (refused before
the work?) and a symlink (written through, kept a link?); standard output closed (`>&-`); Ctrl-C
early (while tmplkit's imports run) and late (in the middle of the work).

Each run is recorded: the exit code, the seconds, whether a traceback showed, stderr's first line,
and the outcome: "ok" when the contract held (exit 0-2 with one line, or 130 on Ctrl-C, within the
bound, never a traceback), "HANG" (killed at the bound), "TRACEBACK", or "BROKEN" (anything else:
the wrong exit code, a symlink replaced).

    python scripts/contract_matrix.py [--out scripts/results/contract_matrix] [--bound 150]
        [--commands audit,mask] [--scenarios hostile-time,closed-stdout] [--merge] [--update-docs]

Writes <out>.json and <out>.md and prints the table; --update-docs also puts it into docs/hardening.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "fixtures" / "hostile"
CHATML = ROOT / "fixtures" / "templates" / "chatml.jinja"
sys.path.insert(0, str(ROOT))

# How each command is run: {T} the template, {C} a conversation, {K} a tokenizer, {M} a model (the
# cached tiny one), {MODEL} a --model option (empty: the command's own tiny model), {L} a
# llama-server log, {B} a second template, {O} the output.
COMMANDS = {
    "audit": "audit {T} -o {O}",
    "table": "table {T} --jobs 1 -o {O}",
    "show": "show {T} -o {O}",
    "turns": "turns {T} --tokenizer {K} -o {O}",
    "mask": "mask {T} --session {C} --tokenizer {K} --format json -o {O}",
    "annotate": "annotate {T} -o {O}",
    "spans": "spans {T} --session {C} --tokenizer {K} -o {O}",
    "request": "request {T} --session {C} --tokenizer {K} -o {O}",
    # the smallest run that loads the model: one policy (one setting), a 512-token context
    "prefill": "prefill {M} --session {C} --template {T} --settings none -c 512 -o {O}",
    "replay": "replay {M} --session {C} --template {T} --settings llama-server -c 512 -o {O}",
    "engine-parity": "engine-parity {T} {MODEL} -o {O}",
    "server delimiters": "server delimiters {T} {MODEL} -o {O}",
    "server log": "server log {L} --template {T} --session {C} --tokenizer {K} -o {O}",
    "session generate": "session generate --tokens 400000 -o {O}",
    "lock": "lock {T} --fresh --lock {O}",
    "diff": "diff {T} {B} -o {O}",
}
SCENARIOS = ("hostile-time", "hostile-memory", "hostile-session", "huge-template", "bad-conversation", "bad-tokenizer",
             "missing-folder", "symlink-output", "closed-stdout", "ctrl-c-early", "ctrl-c-late")
TINY = "tiny:qwen35"
SERVER_LOG = ROOT / "fixtures" / "server-logs" / "0.3.36-cold-lv3.log"
# The commands that run llama-server: their cells say "not run" where it is not built.
NEEDS_SERVER = {"engine-parity", "server delimiters"}
# A model stands for the tokenizer where the command takes a model (the model carries its vocabulary).
TAKES_MODEL = {"prefill", "replay", "engine-parity", "server delimiters"}
# Why a (command, scenario) pair does not apply.
_NO_CONVERSATION = ("audit", "table", "show", "annotate", "engine-parity", "server delimiters", "lock", "diff")
_NO_TOKENIZER = ("table", "show", "annotate", "lock", "diff")
NOT_APPLICABLE = {
    **{(c, s): "renders its own probe conversations, takes none" for c in _NO_CONVERSATION
       for s in ("bad-conversation", "hostile-session")},
    **{(c, "bad-tokenizer"): "takes no tokenizer or model" for c in _NO_TOKENIZER},
    **{("session generate", s): "takes no template, conversation or tokenizer (it writes a session)"
       for s in ("hostile-time", "hostile-memory", "hostile-session", "huge-template", "bad-conversation",
                 "bad-tokenizer")},
}
# The commands that report on a template rather than gate it (exit 0 whatever they find): on a
# hostile template, their report must say that it was not rendered (what the output then holds).
REPORTS_NOT_RENDERED = {"engine-parity": r"\| unrendered \|", "server delimiters": r"\| not compared \|",
                        "lock": '"verdict": "(timeout|memory)"'}
# The commands whose output is a file they always write (never standard output).
WRITES_A_FILE = {"annotate", "lock"}


def _slug(command: str) -> str:
    return command.replace(" ", "-")


def _fixtures(work: Path) -> dict:
    """The files the runs use, made in `work`: a good conversation, a bad one, a huge template, a
    tokenizer (a small tokenizer.json trained here), a symlink to a file."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world user assistant system tool"] * 20, trainer)
    (work / "tok").mkdir()
    tok.save(str(work / "tok" / "tokenizer.json"))
    good = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]
    (work / "chat.json").write_text(json.dumps(good))
    (work / "bad.json").write_text('[{"role": "user", "content": "a\\ud800"}, {"role": "assistant", "content": "b"}]')
    # A template that passes every probe and turns hostile on one message of the session (ours): one
    # `wordwrap` over 20M words, under a session render's output limit (50M characters), minutes in one call.
    (work / "on-session.jinja").write_text("{% for m in messages %}{% if m.content == 'wrap it' %}"
                                           "{{ ('x ' * 20000000)|wordwrap(1) }}{% endif %}{% endfor %}" + CHATML.read_text())
    (work / "wrap-it.json").write_text(json.dumps([{"role": "user", "content": "wrap it"},
                                                   {"role": "assistant", "content": "done"}]))
    (work / "huge.jinja").write_text(CHATML.read_text() + "{# " + "x" * 20_000_000 + " #}")
    return {"T": str(CHATML), "C": str(work / "chat.json"), "K": str(work / "tok"), "M": TINY, "MODEL": "",
            "L": str(SERVER_LOG), "B": str(CHATML), "work": work}


def _args(command: str, scenario: str, fx: dict) -> tuple[list[str], str]:
    """The argument list of one run and its output path."""
    work: Path = fx["work"]
    values = dict(fx)
    values["O"] = str(work / f"out-{_slug(command)}-{scenario}.txt")
    if scenario == "hostile-time" or scenario == "ctrl-c-late":
        values["T"] = str(HOSTILE / "filter_wordwrap_slow.jinja")
    elif scenario == "hostile-memory":
        values["T"] = str(HOSTILE / "bomb_held_values.jinja")
    elif scenario == "hostile-session":
        values["T"], values["C"] = str(work / "on-session.jinja"), str(work / "wrap-it.json")
        if command == "turns":
            values["T"] = f"{values['T']} --session {values['C']}"
    elif scenario == "huge-template":
        values["T"] = str(work / "huge.jinja")
    elif scenario == "bad-conversation":
        values["C"] = str(work / "bad.json")
        if command == "turns":
            values["T"] = f"{CHATML} --session {work / 'bad.json'}"
    elif scenario == "bad-tokenizer":
        values["K"] = values["M"] = str(work / "missing.gguf")
        values["MODEL"] = f"--model {values['M']}"
        if command == "audit":  # (its token round trip's tokenizer)
            values["T"] = f"{values['T']} --tokenizer {values['K']}"
    elif scenario == "missing-folder":
        values["O"] = str(work / "no" / "such" / "folder" / "out.txt")
        values["T"] = str(HOSTILE / "filter_wordwrap_slow.jinja")  # refused before the work, or it runs long
    elif scenario == "symlink-output":
        link, target = work / f"link-{_slug(command)}.txt", work / f"target-{_slug(command)}.txt"
        target.write_text("old\n")
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        values["O"] = str(link)
    elif scenario == "closed-stdout" and command not in WRITES_A_FILE:
        return COMMANDS[command].format(**values).replace(f" -o {values['O']}", "").split(), ""
    return COMMANDS[command].format(**values).split(), values["O"]


def _as_in_a_terminal() -> None:
    """In the child: Ctrl-C's default action, as a command started at a terminal has it (this script
    run in the background, `cmd &` in a shell without job control, would hand its children SIGINT
    ignored, and Python then installs no handler at all)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _close_stdout() -> None:
    _as_in_a_terminal()
    os.close(1)


def _wait_for_imports(proc: subprocess.Popen, bound: float) -> None:
    """Until the process has loaded a compiled module only tmplkit's imports bring (numpy's or
    markupsafe's): tmplkit's first line has run, its imports are under way."""
    end = time.monotonic() + bound
    while time.monotonic() < end and proc.poll() is None:
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
        except OSError:
            return
        if "numpy" in maps or "markupsafe" in maps:
            return


def run_one(command: str, scenario: str, fx: dict, bound: float) -> dict:
    if (command, scenario) in NOT_APPLICABLE:
        return {"command": command, "scenario": scenario, "outcome": "n/a", "why": NOT_APPLICABLE[command, scenario]}
    if command in NEEDS_SERVER and fx.get("llama_server") is None:
        return {"command": command, "scenario": scenario, "outcome": "not run", "why": "no llama-server"}
    args, output = _args(command, scenario, fx)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "dumb"}
    stdout = subprocess.DEVNULL if scenario != "closed-stdout" else None
    pass_fds = ()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tmplkit", *args], stdout=stdout, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT, text=True, start_new_session=True, pass_fds=pass_fds,
                            preexec_fn=_close_stdout if scenario == "closed-stdout" else _as_in_a_terminal)
    interrupted_at = None
    if scenario == "ctrl-c-early":
        _wait_for_imports(proc, bound)
        interrupted_at = time.monotonic() - start
        os.killpg(proc.pid, signal.SIGINT)
    elif scenario == "ctrl-c-late":
        try:
            proc.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            interrupted_at = time.monotonic() - start
            os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=max(0.1, bound - (time.monotonic() - start)))
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        hung = True
    seconds = time.monotonic() - start
    row = {"command": command, "scenario": scenario, "args": args, "exit": proc.returncode, "seconds": round(seconds, 2),
           "interrupted_at": None if interrupted_at is None else round(interrupted_at, 2),
           "traceback": "Traceback (most recent call last)" in err,
           "stderr": next((line for line in err.splitlines() if line.startswith("tmplkit:")), err.strip()[:300])[:300]}
    row["outcome"] = _outcome(row, scenario, output, hung)
    return row


# --- Ctrl-C at set delays from the start: where the interpreter's own start-up ends and tmplkit's begins ---

EARLY_DELAYS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2)
_SCRIPT = "import sys\nfrom tmplkit.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n"


def _early_kind(code: int, err: str) -> str:
    if code == 130 and err.strip() == "tmplkit: interrupted":
        return "one line"
    if "Traceback" in err or "KeyboardInterrupt" in err:
        return "traceback"
    if code == -signal.SIGINT and err.strip() == "tmplkit: interrupted":
        # the line, then the signal's default action ended the process (a shell reports 130 alike)
        return "one line, then the signal"
    if code == -signal.SIGINT:
        return "no output"  # the signal's default action: before Python installed its own handler
    return f"exit {code}"


def ctrl_c_window(fx: dict, delays, repeat: int) -> dict:
    """`tmplkit show` interrupted (SIGINT to its process group, as a terminal's Ctrl-C) `delay`
    seconds after it is started, `repeat` times per delay, run as `python -m tmplkit` and as the
    console script pip writes; and, for scale, the median wall time of `python -c pass` (the
    interpreter's start-up, its `site` included: the window no code of tmplkit can cover)."""
    work: Path = fx["work"]
    script = work / "tmplkit"
    script.write_text(f"#!{sys.executable}\n" + _SCRIPT)
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "dumb"}
    show = ["show", str(CHATML), "-o", str(work / "out-sweep.txt")]
    entries = {"python -m tmplkit": [sys.executable, "-m", "tmplkit", *show], "tmplkit (console script)": [str(script), *show]}
    counts: dict = {}
    for _ in range(repeat):  # delays and entry points interleaved, so the machine's load falls on all alike
        for delay in delays:
            for name, argv in entries.items():
                start = time.monotonic()
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                                        text=True, start_new_session=True, preexec_fn=_as_in_a_terminal)
                time.sleep(max(0.0, start + delay - time.monotonic()))
                os.killpg(proc.pid, signal.SIGINT)
                _, err = proc.communicate(timeout=60)
                kind = _early_kind(proc.returncode, err)
                by = counts.setdefault(name, {}).setdefault(f"{delay:g}", {})
                by[kind] = by.get(kind, 0) + 1
    startup = []
    for _ in range(max(repeat, 5)):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        startup.append(time.monotonic() - start)
    return {"delays": [f"{d:g}" for d in delays], "repeat": repeat, "counts": counts,
            "python_startup_s": round(sorted(startup)[len(startup) // 2], 3)}


def window_markdown(window: dict) -> str:
    lines = ["| Ctrl-C after | " + " | ".join(f"{d} s" for d in window["delays"]) + " |",
             "|---|" + "---|" * len(window["delays"])]
    for name, by in window["counts"].items():
        cells = [", ".join(f"{kind} {n}" for kind, n in sorted(by.get(d, {}).items())) for d in window["delays"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"{window['repeat']} runs per cell (`tmplkit show`); `python -c pass` takes "
              f"{window['python_startup_s']:.3f} s here (median)."]
    return "\n".join(lines) + "\n"


def _outcome(row: dict, scenario: str, output: str, hung: bool) -> str:
    if hung:
        return "HANG"
    if row["traceback"]:
        return "TRACEBACK"
    code = row["exit"]
    if scenario.startswith("ctrl-c"):
        return "ok" if code == 130 or (scenario == "ctrl-c-late" and row["interrupted_at"] is None and code in (0, 1, 2)) \
            else "BROKEN"
    if scenario == "symlink-output":  # still a link, and what a success wrote went through it
        written = Path(output).resolve().read_text(errors="replace") != "old\n"
        return "ok" if Path(output).is_symlink() and code in (0, 1, 2) and (code != 0 or written) else "BROKEN"
    if scenario == "closed-stdout" and output:  # (annotate writes its file, never standard output)
        return "ok" if code in (0, 1, 2) else "BROKEN"
    if code == 0 and scenario.startswith("hostile") and row["command"] in REPORTS_NOT_RENDERED:
        # a report, not a gate: exit 0, and its output says the template was not rendered
        text = Path(output).read_text(errors="replace") if Path(output).is_file() else ""
        return "ok" if re.search(REPORTS_NOT_RENDERED[row["command"]], text) else "BROKEN"
    if scenario in ("hostile-time", "hostile-memory", "hostile-session", "bad-conversation", "bad-tokenizer", "missing-folder",
                    "closed-stdout"):
        return "ok" if code in (1, 2) else "BROKEN"  # never a success on what could not be done
    return "ok" if code in (0, 1, 2) else "BROKEN"


def _cell(row: dict) -> str:
    if row["outcome"] == "n/a":
        return "n/a"
    if row["outcome"] == "not run":
        return f"not run ({row['why']})"
    if row["outcome"] == "ok":
        return f"exit {row['exit']}, {row['seconds']:.0f} s"
    return f"**{row['outcome']}** (exit {row['exit']}, {row['seconds']:.0f} s)"


def markdown(result: dict) -> str:
    rows = result["rows"]
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in rows)]
    lines = ["| command | " + " | ".join(scenarios) + " |", "|---|" + "---|" * len(scenarios)]
    for command in dict.fromkeys(r["command"] for r in rows):
        by = {r["scenario"]: r for r in rows if r["command"] == command}
        lines.append(f"| {command} | " + " | ".join(_cell(by[s]) if s in by else "" for s in scenarios) + " |")
    held = sum(1 for r in rows if r["outcome"] == "ok")
    ran = sum(1 for r in rows if r["outcome"] not in ("n/a", "not run"))
    skipped = sum(1 for r in rows if r["outcome"] == "not run")
    lines += ["", f"{held} of {ran} runs kept the contract"
              + (f" ({skipped} not run: no llama-server)" if skipped else "")
              + f"; bound {result['bound']:g} s per run; {result['machine']}; {result.get('minutes', 0):.0f} minutes."]
    why: dict[str, dict[str, list[str]]] = {}  # reason -> command -> its scenarios
    for r in rows:
        if r["outcome"] == "n/a":
            why.setdefault(r["why"], {}).setdefault(r["command"], []).append(r["scenario"])
    for reason, by_command in why.items():
        groups: dict[tuple, list[str]] = {}  # the commands with the same scenarios, together
        for command, scens in by_command.items():
            groups.setdefault(tuple(scens), []).append(command)
        said = "; ".join(f"{', '.join(commands)} ({', '.join(scens)})" for scens, commands in groups.items())
        lines += ["", f"n/a, {reason}: {said}."]
    return "\n".join(lines) + "\n"


def _llama_server() -> str | None:
    """The llama-server binary the server commands would use (as tests/conftest.py finds it), or None."""
    from tmplkit.server.process import llama_server_binary

    path = llama_server_binary()
    return None if path is None else str(path)


DOCS = ROOT / "docs" / "hardening.md"
MARK, END = "<!-- CONTRACT-MATRIX -->", "<!-- /CONTRACT-MATRIX -->"
EARLY_MARK, EARLY_END = "<!-- CTRL-C-WINDOW -->", "<!-- /CTRL-C-WINDOW -->"


def _update_docs(table: str, mark: str, end: str) -> None:
    """The table between two of docs/hardening.md's markers (the text around them is the page's)."""
    from tmplkit.atomic import write_output

    text = DOCS.read_text(encoding="utf-8")
    if mark not in text:
        raise SystemExit(f"{DOCS}: no {mark} marker to put the table after")
    head, _, rest = text.partition(mark)
    _, _, tail = rest.partition(end)
    write_output(str(DOCS), f"{head}{mark}\n\n{table}\n{end}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results" / "contract_matrix"))
    parser.add_argument("--bound", type=float, default=150.0, help="seconds a run may take before it counts as a hang")
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--merge", action="store_true", help="keep the other rows of the last run's JSON")
    parser.add_argument("--update-docs", action="store_true", help="put the table into docs/hardening.md")
    parser.add_argument("--early-delays", default=",".join(f"{d:g}" for d in EARLY_DELAYS),
                        help="seconds after the start at which the Ctrl-C sweep interrupts (empty: no sweep)")
    parser.add_argument("--early-repeat", type=int, default=5, help="runs per delay and entry point in the sweep")
    args = parser.parse_args(argv)
    commands = [c for c in args.commands.split(",") if c]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [c for c in commands if c not in COMMANDS] + [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    rows, window = [], None
    if args.merge:  # the rows of an earlier run, those run now replacing theirs
        earlier_run = json.loads(Path(args.out + ".json").read_text())
        rows = [r for r in earlier_run["rows"] if r["command"] not in commands or r["scenario"] not in scenarios]
        window = earlier_run.get("ctrl_c_window")
    delays = [float(d) for d in args.early_delays.split(",") if d]
    with tempfile.TemporaryDirectory(prefix="tmplkit-contract-") as tmp:
        fx = _fixtures(Path(tmp))
        fx["llama_server"] = _llama_server()
        started = time.monotonic()
        for command in commands:
            for scenario in scenarios:
                row = run_one(command, scenario, fx, args.bound)
                rows.append(row)
                print(f"{command:<17} {scenario:<17} {row['outcome']:<9} {row.get('exit')!s:>4} {row.get('seconds', 0):>7}"
                      f"  {row.get('stderr', '')[:110]}", file=sys.stderr, flush=True)
        # the table's minutes: the runs that made its rows (a row run again replaces its seconds)
        minutes = round(sum(r.get("seconds", 0) for r in rows) / 60, 1) if args.merge else \
            round((time.monotonic() - started) / 60, 1)
        if delays:
            window = ctrl_c_window(fx, delays, args.early_repeat)
    order = {(c, s): i for i, (c, s) in enumerate((c, s) for c in COMMANDS for s in SCENARIOS)}
    rows.sort(key=lambda r: order[(r["command"], r["scenario"])])
    from tmplkit._version import __version__

    result = {"tmplkit_version": __version__, "bound": args.bound, "command": "python scripts/contract_matrix.py",
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "minutes": minutes, "rows": rows, "ctrl_c_window": window}
    from tmplkit.atomic import write_output

    write_output(args.out + ".json", json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    table = markdown(result)
    early = window_markdown(window) if window else ""
    write_output(args.out + ".md", table + ("\n" + early if early else ""))
    if args.update_docs:
        _update_docs(table, MARK, END)
        if early:
            _update_docs(early, EARLY_MARK, EARLY_END)
    print(table + ("\n" + early if early else ""))
    return 0 if all(r["outcome"] in ("ok", "n/a", "not run") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
