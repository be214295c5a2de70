"""The ready CI steps: the pre-commit hook (.pre-commit-hooks.yaml) and the GitHub Action
(action.yml) run the exact commands their files declare, here on temporary repositories."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "templates"
FAILING = "{% for m in messages %}{{ m.content }}{% endfor %}"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _env() -> dict[str, str]:
    # The `tmplkit` script of the environment running the tests first on PATH, as pre-commit's
    # own environment would have it; no configuration file, no colour. PYTHONPATH: the script
    # imports this checkout's package, whichever checkout the environment installed.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    env.pop("NO_COLOR", None)
    return env


@pytest.fixture(scope="module")
def hook() -> dict:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (found,) = [h for h in hooks if h["id"] == "tmplkit-audit"]
    assert found["language"] == "python" and found["entry"].split()[0] == "tmplkit"
    return found


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    return repo


def _run_hook(hook: dict, repo: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """What pre-commit does: the staged files its `files` pattern matches (re.search, as pre-commit),
    passed after the entry and its args, in one process (require_serial)."""
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout.split()
    files = [f for f in staged if re.search(hook["files"], f) and not re.search(hook.get("exclude", "^$"), f)]
    assert hook.get("require_serial") is True
    cmd = [*shlex.split(hook["entry"]), *hook.get("args", []), *files]
    return subprocess.run(cmd, cwd=repo, env=_env(), capture_output=True, text=True), files


CHATML = (FIXTURES / "chatml.jinja").read_text()
OTHERS = {
    # what a model repository holds besides its templates: none of it may reach the audit
    "README.md": "# a model\n",
    "config.json": '{"architectures": ["X"]}',
    "tokenizer.json": '{"version": "1.0"}',
    "templates/notes.txt": "not a template",
}


def test_hook_passes_on_good_templates_and_skips_other_files(hook, tmp_path):
    repo = _repo(tmp_path, {
        "chat.jinja": CHATML,
        "models/llama3/chat_template.json": '{"chat_template": ' + json.dumps((FIXTURES / "llama3.jinja").read_text()) + "}",
        "models/qwen/tokenizer_config.json": '{"chat_template": ' + json.dumps(CHATML) + ', "eos_token": "<|im_end|>"}',
        "legacy/phi.j2": (FIXTURES / "phi.jinja").read_text(),
        **OTHERS,
    })
    proc, files = _run_hook(hook, repo)
    assert sorted(files) == ["chat.jinja", "legacy/phi.j2", "models/llama3/chat_template.json",
                             "models/qwen/tokenizer_config.json"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""  # --quiet: nothing when all is well


def test_hook_fails_on_a_broken_template_naming_it(hook, tmp_path):
    repo = _repo(tmp_path, {"chat.jinja": CHATML, "broken.jinja": FAILING, **OTHERS})
    proc, files = _run_hook(hook, repo)
    assert sorted(files) == ["broken.jinja", "chat.jinja"]
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("IMPOSSIBLE") and "broken" in lines[0] and "chat " not in proc.stdout
    assert lines[-1] == "2 templates: 1 impossible, 1 pass -> FAILED"


def test_hook_honours_the_project_configuration(hook, tmp_path):
    repo = _repo(tmp_path, {
        "broken.jinja": FAILING,
        "pyproject.toml": '[tool.tmplkit.expected-failures]\nbroken = "kept for a test"\n',
    })
    proc, _ = _run_hook(hook, repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- the GitHub Action ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def action() -> dict:
    return yaml.safe_load((ROOT / "action.yml").read_text())


def _audit_step(action: dict) -> dict:
    (step,) = [s for s in action["runs"]["steps"] if s.get("name") == "Audit"]
    return step


def _run_action(action: dict, cwd: Path, env_extra: dict | None = None, **inputs: str) -> subprocess.CompletedProcess:
    """The Audit step's script under bash, its env filled from the inputs (defaults from the file)."""
    values = {k: str(v.get("default", "")) for k, v in action["inputs"].items()} | inputs
    step = _audit_step(action)
    env = _env() | (env_extra or {})
    for key, expr in step["env"].items():
        (name,) = re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", expr).groups()
        env[key] = values[name]
    return subprocess.run(["bash", "-e", "-c", step["run"]], cwd=cwd, env=env, capture_output=True, text=True)


def test_action_audits_the_paths_and_writes_junit(action, tmp_path):
    assert action["runs"]["using"] == "composite"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "chat.jinja").write_text(CHATML)
    (tmp_path / "t" / "broken.jinja").write_text(FAILING)
    proc = _run_action(action, tmp_path, paths="t/chat.jinja")
    assert proc.returncode == 0, proc.stderr
    suite = ET.parse(tmp_path / "tmplkit-audit.xml").getroot()
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    assert proc.stdout == "1 template: 1 pass -> ok\n"  # the job log: the summary (no annotation: all pass)

    proc = _run_action(action, tmp_path, paths="t/chat.jinja\nt/broken.jinja", junit="out/report.xml",
                       args="--timeout 30")
    assert proc.returncode == 2 and "out/report.xml" in proc.stderr  # no such folder: one line, exit 2
    (tmp_path / "out").mkdir()
    proc = _run_action(action, tmp_path, paths="t/chat.jinja\nt/broken.jinja", junit="out/report.xml",
                       args="--timeout 30")
    assert proc.returncode == 1
    suite = ET.parse(tmp_path / "out" / "report.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"


def test_action_annotates_the_failing_files_and_writes_a_step_summary(action, tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "chat.jinja").write_text(CHATML)
    (tmp_path / "t" / "with space.jinja").write_text(FAILING)
    summary = tmp_path / "step-summary.md"
    summary.write_text("")
    proc = _run_action(action, tmp_path, {"GITHUB_STEP_SUMMARY": str(summary)},
                       paths='t/chat.jinja "t/with space.jinja"')
    assert proc.returncode == 1, proc.stderr
    # The job log: the failing template, its reason, as an annotation on its file.
    (error,) = [line for line in proc.stdout.splitlines() if line.startswith("::error ")]
    assert error.startswith("::error file=t/with space.jinja,title=tmplkit%3A with space ") and "::with space: " in error
    assert proc.stdout.splitlines()[-1] == "2 templates: 1 impossible, 1 pass -> FAILED"
    table = summary.read_text()
    assert table.startswith("| template | status |") and "| with space | impossible |" in table
    suite = ET.parse(tmp_path / "tmplkit-audit.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"


def test_action_writes_junit_on_bad_input_too(action, tmp_path):
    proc = _run_action(action, tmp_path, paths="missing.jinja")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "missing.jinja" in proc.stderr
    suite = ET.parse(tmp_path / "tmplkit-audit.xml").getroot()
    assert suite.get("errors") == "1"
    assert "missing.jinja: no such file" in suite.find("testcase/error").get("message")


def test_action_installs_pinned_and_fetches_the_corpus_when_needed(action, tmp_path):
    (install,) = [s for s in action["runs"]["steps"] if s.get("name") == "Install tmplkit"]
    assert '-c "${ACTION_PATH}/constraints.txt"' in install["run"]
    # A stand-in tmplkit records each call, one argument a line: what the step runs, and how it splits.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    (bin_dir / "tmplkit").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" "--" >> {shlex.quote(str(log))}\n')
    (bin_dir / "tmplkit").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{_env()['PATH']}"
    proc = _run_action(action, tmp_path, {"PATH": path}, paths="'a b.jinja'\nc.jinja", args="--tokenizer auto")
    assert proc.returncode == 0, proc.stderr
    calls = [c.strip("\n").split("\n") for c in log.read_text().split("--\n") if c]
    assert calls[0] == ["corpus", "fetch", "llama.cpp"]
    assert calls[1] == ["audit", "--format", "github", "--fail-on", "fail", "--report", "junit:tmplkit-audit.xml",
                        "--tokenizer", "auto", "a b.jinja", "c.jinja"]
    log.unlink()
    assert _run_action(action, tmp_path, {"PATH": path}, paths="c.jinja").returncode == 0
    assert [c.split("\n")[0] for c in log.read_text().split("--\n") if c] == ["audit"]  # no fetch when not needed

    def fetched(**inputs) -> list:
        log.unlink(missing_ok=True)
        assert _run_action(action, tmp_path, {"PATH": path}, **inputs).returncode == 0
        return [c.split("\n")[2] for c in log.read_text().split("--\n") if c.startswith("corpus")]

    assert fetched(paths="c.jinja", args="--tokenizer vocab:qwen35") == ["llama.cpp"]  # (a corpus vocabulary)
    assert fetched(paths="c.jinja", args="--color auto") == []  # (auto of another option)
    # the configuration the audit reads: its sources and its tokenizers (the step read only its inputs)
    (tmp_path / "tmplkit.toml").write_text('sources = ["corpus:hub"]\ntokenizer = "auto"\n')
    assert fetched() == ["llama.cpp", "hub"]
    assert fetched(paths="c.jinja") == ["llama.cpp"]  # (paths given: the configuration's sources are not read)


def test_action_fail_on_warning(action, tmp_path):
    (tmp_path / "llama3.jinja").write_text((FIXTURES / "llama3.jinja").read_text())
    assert _run_action(action, tmp_path, paths="llama3.jinja").returncode == 0
    assert _run_action(action, tmp_path, paths="llama3.jinja", **{"fail-on": "warning"}).returncode == 1


# ---- reproducible CI, shipped types ----------------------------------------------------------------

def _requirement_names() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += [s for s in extra if not s.startswith("tmplkit[")]
    return {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", s).group()).lower() for s in specs}


def test_constraints_pin_every_dependency_and_ci_installs_with_them():
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert _requirement_names() <= set(pins), "a dependency of pyproject.toml is not pinned: make constraints"
    assert "transformers" in pins and "jinja2" in pins
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS ?= constraints.txt" in makefile and "-c $(CONSTRAINTS) -e '.[all]'" in makefile
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test" and "make setup" in ci and "make lint" in ci


def test_the_package_ships_py_typed():
    import tomllib

    assert (ROOT / "tmplkit" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["tmplkit"]


# ---- the behaviour lock through the hook and the action ---------------------------------------------

LOCK_PAIR = ROOT / "fixtures" / "lock" / "system-not-rendered"


def _locked_repo(tmp_path: Path) -> Path:
    """A repository whose configuration names a lock written for chat.jinja (lock pair a)."""
    repo = _repo(tmp_path, {"chat.jinja": (LOCK_PAIR / "a.jinja").read_text(),
                            "pyproject.toml": '[tool.tmplkit]\nlock = "tmplkit.lock.json"\n'})
    proc = subprocess.run(["tmplkit", "lock", "chat.jinja"], cwd=repo, env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return repo


def test_hook_checks_the_configured_lock(hook, tmp_path):
    repo = _locked_repo(tmp_path)
    proc, files = _run_hook(hook, repo)
    assert files == ["chat.jinja"] and proc.returncode == 0, proc.stdout + proc.stderr
    (repo / "chat.jinja").write_text((LOCK_PAIR / "b.jinja").read_text())
    subprocess.run(["git", "add", "chat.jinja"], cwd=repo, check=True)
    proc, _ = _run_hook(hook, repo)
    assert proc.returncode == 1
    assert "LOCK  chat: the system message is no longer rendered" in proc.stdout


def test_action_checks_the_lock_input(action, tmp_path):
    repo = _locked_repo(tmp_path)
    (repo / "pyproject.toml").unlink()  # the input names the lock, not the configuration
    assert _run_action(action, repo, paths="chat.jinja", lock="tmplkit.lock.json").returncode == 0
    (repo / "chat.jinja").write_text((LOCK_PAIR / "b.jinja").read_text())
    proc = _run_action(action, repo, paths="chat.jinja", lock="tmplkit.lock.json")
    assert proc.returncode == 1
    assert ("::error file=chat.jinja,title=tmplkit lock%3A chat::chat: the system message is no longer rendered"
            in proc.stdout)
    assert _run_action(action, repo, paths="chat.jinja").returncode == 0  # no lock: the audit alone
