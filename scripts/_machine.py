"""What the benchmark scripts record about the machine they ran on (timings differ 2-3x between machines)."""

from __future__ import annotations

import platform


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None
