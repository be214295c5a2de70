"""The `prefill` subcommand."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


def add_prefill(sub) -> None:
    # Choices and defaults come from the library: a policy added to POLICIES is offered here, and
    # a default changed in PrefillSettings is the command's default too.
    from ..server_rules import FLASH_ATTN, POLICIES, PrefillSettings

    d: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(PrefillSettings)}
    p = sub.add_parser("prefill", help="prefill an agent session on a model with each batch policy and compare them")
    p.add_argument("model", metavar="MODEL", help="a GGUF model llama.cpp can load, gemma or tiny:VOCAB (built on first use)")
    p.add_argument("session", metavar="SESSION.json", help="OpenAI-style messages JSON (a list, or {messages, tools})")
    p.add_argument("--template", metavar="SOURCE", help="chat template source (default: the model GGUF's own)")
    p.add_argument("--policy", default="all", choices=[*POLICIES, "all"],
                   help="; ".join(f"{name}: {pol.description}" for name, pol in POLICIES.items()) + "; all: each of them")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per policy, interleaved; figures are medians")
    p.add_argument("--json", metavar="FILE", help="write the full comparison as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="plot batch sizes along the prompt, checkpoints marked")
    g = p.add_argument_group("llama.cpp settings (llama-server's names)")
    g.add_argument("-c", "--ctx-size", type=int, default=d["n_ctx"], dest="n_ctx")
    g.add_argument("-b", "--batch-size", type=int, default=d["n_batch"], dest="n_batch")
    g.add_argument("-ub", "--ubatch-size", type=int, default=d["n_ubatch"], dest="n_ubatch")
    g.add_argument("-t", "--threads", type=int, default=d["n_threads"], dest="n_threads")
    g.add_argument("-ngl", "--n-gpu-layers", type=int, default=d["n_gpu_layers"], dest="n_gpu_layers")
    g.add_argument("-fa", "--flash-attn", choices=list(FLASH_ATTN), default=d["flash_attn"])
    g.add_argument("-ctk", "--cache-type-k", default=d["cache_type_k"])
    g.add_argument("-ctv", "--cache-type-v", default=d["cache_type_v"])
    g.add_argument("--swa-full", action="store_true", default=d["swa_full"],
                   help="full-size sliding-window cache (can roll back: no checkpoints)")
    g.add_argument("-nr", "--no-repack", action="store_true", help="do not repack weights (default: repack unless the CPU has AMX)")
    g.add_argument("--poll", type=int, default=d["poll"],
                   help=f"threadpool polling level 0-100, as llama-server's (default {d['poll']})")
    g.add_argument("--checkpoints", choices=list(_CHECKPOINTS), default=_CHECKPOINTS_NAME[d["checkpoints"]],
                   help="auto: exactly when the model cannot roll its memory back")
    g.add_argument("-ctxcp", "--ctx-checkpoints", type=int, default=d["max_checkpoints"], dest="max_checkpoints")
    g.add_argument("-cms", "--checkpoint-min-step", type=int, default=d["checkpoint_min_step"])
    p.set_defaults(func=_cmd_prefill)


_CHECKPOINTS = {"auto": None, "on": True, "off": False}
_CHECKPOINTS_NAME = {v: k for k, v in _CHECKPOINTS.items()}


def _cmd_prefill(args) -> int:
    from ._common import require_extra

    require_extra("llama", "tmplkit prefill")  # before any work
    from ._common import require_extra

    require_extra("llama", "tmplkit prefill")  # before any work
    from ..prefill import compare_policies
    from ..prefill.compare import TerminalProgress
    from ..prefill.models import resolve_model
    from ..prefill.plot import plot_comparison, require_matplotlib
    from ..prefill.report import check_writable, write_json
    from ..server_rules import PrefillSettings

    for out in (args.json, args.plot):  # refuse before the run, not after it
        if out:
            check_writable(out)
    if args.plot:
        require_matplotlib()
    settings = PrefillSettings(
        n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch, n_threads=args.n_threads,
        n_gpu_layers=args.n_gpu_layers, flash_attn=args.flash_attn, cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v, swa_full=args.swa_full, repack=False if args.no_repack else None, poll=args.poll,
        checkpoints=_CHECKPOINTS[args.checkpoints],
        max_checkpoints=args.max_checkpoints, checkpoint_min_step=args.checkpoint_min_step)
    bar = TerminalProgress(sys.stderr, args.repeat) if sys.stderr.isatty() else None
    try:
        comp = compare_policies(resolve_model(args.model), args.session, template=args.template, policies=args.policy,
                                repeat=args.repeat, settings=settings, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        write_json(args.json, comp.to_dict())
    if args.plot:
        plot_comparison(comp, args.plot)
    sys.stdout.write(comp.to_markdown())
    return 0
