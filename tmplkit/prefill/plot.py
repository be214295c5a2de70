"""Plot batch sizes along the prompt, one panel per policy, with checkpoint positions marked."""

from __future__ import annotations

import io
import os

from ..errors import InputError
from .report import Comparison, PrefillReport, write_atomic

_COLORS = {"full": "#4c72b0", "user start": "#dd8452", "near end": "#55a868", "end": "#8172b3"}


def require_matplotlib():
    """matplotlib, or an InputError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("plotting needs matplotlib; run `pip install 'tmplkit[plot]'` or drop --plot") from None
    return matplotlib


def plot_reports(reports: list[PrefillReport], path: str | os.PathLike, title: str = "") -> None:
    """Write a PNG: for each report, a bar per decode call (x: its tokens, height: its size)."""
    write_atomic(path, reports_png(reports, title))


def reports_png(reports: list[PrefillReport], title: str = "") -> bytes:
    """`plot_reports`'s PNG, as bytes (written with the command's other outputs, all or none)."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.patches import Patch

    n = len(reports)
    fig, axes = plt.subplots(n, 1, figsize=(11, 2.3 * n + 0.6), sharex=True, squeeze=False)
    for ax, rep in zip(axes[:, 0], reports):
        for c in rep.decode_calls:
            ax.bar(c.start, c.size, width=c.size, align="edge", color=_COLORS.get(c.reason, "grey"),
                   edgecolor="white", linewidth=0.3)
        # a marker per call, so that batches of a few tokens show too
        ax.scatter([c.start + c.size / 2 for c in rep.decode_calls], [c.size for c in rep.decode_calls], s=9,
                   c=[_COLORS.get(c.reason, "grey") for c in rep.decode_calls], edgecolors="black", linewidths=0.3,
                   zorder=3)
        for k, ck in enumerate(rep.checkpoints):
            ax.axvline(ck.n_tokens, color="crimson", linewidth=0.9, linestyle="--",
                       label="checkpoint" if k == 0 else None)
        if rep.restored is not None:
            ax.axvline(rep.restored.n_tokens, color="black", linewidth=1.2, label="restored")
        ax.set_ylabel("batch size")
        ax.set_title(f"{rep.policy}: {rep.n_decode_calls} decode calls, {len(rep.checkpoints)} checkpoints, "
                     f"{rep.tokens_per_second:.0f} tokens/s", fontsize=9, loc="left")
        ax.set_yscale("log")
    axes[-1, 0].set_xlabel("prompt position (tokens)")
    handles: list[Artist] = [Patch(color=c, label=f"ended: {r}") for r, c in _COLORS.items()]
    handles.append(plt.Line2D([], [], color="crimson", linestyle="--", label="checkpoint"))
    fig.legend(handles=handles, loc="lower center", fontsize=8, ncol=len(handles), frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def plot_comparison(comp: Comparison, path: str | os.PathLike) -> None:
    write_atomic(path, comparison_png(comp))


def comparison_png(comp: Comparison) -> bytes:
    """`plot_comparison`'s PNG, as bytes."""
    return reports_png([r.first for r in comp.results],
                       title=f"{os.path.basename(comp.session)}: {comp.n_prompt} tokens, template {comp.template}")
