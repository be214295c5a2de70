"""scripts/quickstart_check.py reads the audit's summary off `make audit`'s log: held here against
the summary the audit prints now (its wording changed once and the script recorded no summary)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("quickstart_check", ROOT / "scripts" / "quickstart_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_audits_summary_is_read_off_its_log():
    done = subprocess.run([sys.executable, "-m", "tmplkit", "--no-config", "audit", "fixtures/templates/chatml.jinja",
                           "--format", "summary"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    log = ["make: what ran before", *done.stdout.splitlines(), *done.stderr.splitlines(), "make: what ran after"]
    assert _script()._audit_summary(log) == "1 template: 1 pass -> ok", done.stdout
    assert _script()._audit_summary(["make: *** [audit] Error 2"]) is None  # (the audit did not finish)
