"""The contract table: every command that renders a template, under every way a user or an attacker
can hand it trouble, run as a user runs it (a subprocess), each under a wall-clock bound.

Scenarios: a hostile template that runs long in one C-level call (`wordwrap` over 4M words) and one
that builds a huge value (`~` tenfold per step); a huge template (20 MB); a bad conversation (a lone
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

# How each command is run: {T} the template, {C} a conversation, {K} a tokenizer, {O} the output.
COMMANDS = {
    "audit": "audit {T} -o {O}",
    "table": "table {T} --jobs 1 -o {O}",
    "show": "show {T} -o {O}",
    "turns": "turns {T} --tokenizer {K} -o {O}",
    "mask": "mask {C} --template {T} --tokenizer {K} --format json -o {O}",
    "annotate": "annotate {T} -o {O}",
    "spans": "spans {C} --template {T} --tokenizer {K} -o {O}",
    "request": "request {C} --template {T} --tokenizer {K} -o {O}",
}
# (command, scenario) pairs that do not apply: the command takes no conversation or tokenizer.
NOT_APPLICABLE = {("audit", "bad-conversation"), ("table", "bad-conversation"), ("show", "bad-conversation"),
                  ("annotate", "bad-conversation"), ("table", "bad-tokenizer"), ("show", "bad-tokenizer"),
                  ("annotate", "bad-tokenizer")}
SCENARIOS = ("hostile-time", "hostile-memory", "huge-template", "bad-conversation", "bad-tokenizer",
             "missing-folder", "symlink-output", "closed-stdout", "ctrl-c-early", "ctrl-c-late")


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
    (work / "huge.jinja").write_text(CHATML.read_text() + "{# " + "x" * 20_000_000 + " #}")
    (work / "target.txt").write_text("old\n")
    return {"T": str(CHATML), "C": str(work / "chat.json"), "K": str(work / "tok"), "work": work}


def _args(command: str, scenario: str, fx: dict) -> tuple[list[str], str]:
    """The argument list of one run and its output path."""
    work: Path = fx["work"]
    values = dict(fx)
    values["O"] = str(work / f"out-{command}-{scenario}.txt")
    if scenario == "hostile-time" or scenario == "ctrl-c-late":
        values["T"] = str(HOSTILE / "filter_wordwrap_slow.jinja")
    elif scenario == "hostile-memory":
        values["T"] = str(HOSTILE / "bomb_concat_levels.jinja")
    elif scenario == "huge-template":
        values["T"] = str(work / "huge.jinja")
    elif scenario == "bad-conversation":
        values["C"] = str(work / "bad.json")
        if command == "turns":
            values["T"] = f"{CHATML} --session {work / 'bad.json'}"
    elif scenario == "bad-tokenizer":
        values["K"] = str(work / "missing.gguf")
        if command == "audit":  # (its token round trip's tokenizer)
            values["T"] = f"{values['T']} --tokenizer {values['K']}"
    elif scenario == "missing-folder":
        values["O"] = str(work / "no" / "such" / "folder" / "out.txt")
        values["T"] = str(HOSTILE / "filter_wordwrap_slow.jinja")  # refused before the work, or it runs long
    elif scenario == "symlink-output":
        link = work / f"link-{command}.txt"
        link.unlink(missing_ok=True)
        link.symlink_to(work / "target.txt")
        values["O"] = str(link)
    elif scenario == "closed-stdout" and command != "annotate":  # annotate always writes a file
        return COMMANDS[command].format(**values).replace(f" -o {values['O']}", "").split(), ""
    return COMMANDS[command].format(**values).split(), values["O"]


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
        return {"command": command, "scenario": scenario, "outcome": "n/a"}
    args, output = _args(command, scenario, fx)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "dumb"}
    stdout = subprocess.DEVNULL if scenario != "closed-stdout" else None
    pass_fds = ()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tmplkit", *args], stdout=stdout, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT, text=True, start_new_session=True, pass_fds=pass_fds,
                            preexec_fn=(lambda: os.close(1)) if scenario == "closed-stdout" else None)
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


def _outcome(row: dict, scenario: str, output: str, hung: bool) -> str:
    if hung:
        return "HANG"
    if row["traceback"]:
        return "TRACEBACK"
    code = row["exit"]
    if scenario.startswith("ctrl-c"):
        return "ok" if code == 130 or (scenario == "ctrl-c-late" and row["interrupted_at"] is None and code in (0, 1, 2)) \
            else "BROKEN"
    if scenario == "symlink-output":
        return "ok" if Path(output).is_symlink() and code in (0, 1, 2) else "BROKEN"
    if scenario == "closed-stdout" and output:  # (annotate writes its file, never standard output)
        return "ok" if code in (0, 1, 2) else "BROKEN"
    if scenario in ("hostile-time", "hostile-memory", "bad-conversation", "bad-tokenizer", "missing-folder",
                    "closed-stdout"):
        return "ok" if code in (1, 2) else "BROKEN"  # never a success on what could not be done
    return "ok" if code in (0, 1, 2) else "BROKEN"


def _cell(row: dict) -> str:
    if row["outcome"] == "n/a":
        return "-"
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
    ran = sum(1 for r in rows if r["outcome"] != "n/a")
    lines += ["", f"{held} of {ran} runs kept the contract; bound {result['bound']:g} s per run; "
              f"{result['machine']}."]
    return "\n".join(lines) + "\n"


DOCS = ROOT / "docs" / "hardening.md"
MARK, END = "<!-- CONTRACT-MATRIX -->", "<!-- /CONTRACT-MATRIX -->"


def _update_docs(table: str) -> None:
    """The table between docs/hardening.md's two markers (the text around them is the page's)."""
    from tmplkit.atomic import write_output

    text = DOCS.read_text(encoding="utf-8")
    head, _, rest = text.partition(MARK)
    _, _, tail = rest.partition(END)
    write_output(str(DOCS), f"{head}{MARK}\n\n{table}\n{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "scripts" / "results" / "contract_matrix"))
    parser.add_argument("--bound", type=float, default=150.0, help="seconds a run may take before it counts as a hang")
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--merge", action="store_true", help="keep the other rows of the last run's JSON")
    parser.add_argument("--update-docs", action="store_true", help="put the table into docs/hardening.md")
    args = parser.parse_args(argv)
    commands = [c for c in args.commands.split(",") if c]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [c for c in commands if c not in COMMANDS] + [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    rows = []
    if args.merge:  # the rows of an earlier run, those run now replacing theirs
        earlier = json.loads(Path(args.out + ".json").read_text())["rows"]
        rows = [r for r in earlier if r["command"] not in commands or r["scenario"] not in scenarios]
    with tempfile.TemporaryDirectory(prefix="tmplkit-contract-") as tmp:
        fx = _fixtures(Path(tmp))
        for command in commands:
            for scenario in scenarios:
                row = run_one(command, scenario, fx, args.bound)
                rows.append(row)
                print(f"{command:<9} {scenario:<17} {row['outcome']:<9} {row.get('exit')!s:>4} {row.get('seconds', 0):>7}"
                      f"  {row.get('stderr', '')[:110]}", file=sys.stderr, flush=True)
    order = {(c, s): i for i, (c, s) in enumerate((c, s) for c in COMMANDS for s in SCENARIOS)}
    rows.sort(key=lambda r: order[(r["command"], r["scenario"])])
    from tmplkit._version import __version__

    result = {"tmplkit_version": __version__, "bound": args.bound, "command": "python scripts/contract_matrix.py",
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "rows": rows}
    from tmplkit.atomic import write_output

    write_output(args.out + ".json", json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    table = markdown(result)
    write_output(args.out + ".md", table)
    if args.update_docs:
        _update_docs(table)
    print(table)
    return 0 if all(r["outcome"] in ("ok", "n/a") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
