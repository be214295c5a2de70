"""The audit's driver: every template analyzed (in this process, or in sandboxed workers), the
prefix-stability check beside it when asked, the token round trip with each template's tokenizer;
the outcome an `AuditReport`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from ..analysis import Analysis, analyze
from ..errors import InputError
from ..sources.templates import ChatTemplate
from ._choices import EXPECTED_KINDS, is_expected_failures
from ._gate import AuditReport, check_modes
from ._prefix import PrefixStability, analyze_with_prefix_stability, check_session, default_turns_session, split_prefix_checks
from .isolate import add_scan_warnings, analyze_isolated

__all__ = ["audit", "token_checks", "token_skips", "tokenizer_for"]


def audit(
    templates: Sequence[ChatTemplate],
    *,
    jobs: int | None = 1,
    timeout: float | None = None,
    memory_mb: int | None = None,
    expected_failures: dict | None = None,
    tokenizer: str | None = None,
    tokenizers: Mapping[str, str | None] | None = None,
    fail_on: str = "fail",
    prefix_stability: str = "off",
    session=None,
    progress: Callable[[int, int, Analysis], None] | None = None,
) -> AuditReport:
    """Analyze every template and collect the results in input order.

    `jobs=1` with no limits analyzes in this process; otherwise each template runs in a worker
    process with a wall-clock and memory limit (see tmplkit.auditing.isolate), `jobs` at a time.
    `tokenizer` (a path/spec for `load_tokenizer`, or "auto") adds the token-level round trip;
    `tokenizers` pairs template names with tokenizers, ahead of `tokenizer`. `fail_on`: see
    AuditReport. `prefix_stability` "report" or "fail" adds the prefix-stability check of each
    passing template over `session` (a `Session`; default `default_turns_session()`), run in the
    same worker as its analysis and under the same limits; "fail" makes an unstable one fail.

    >>> from tmplkit.sources import load
    >>> audit(load("fixtures/templates/chatml.jinja")).ok
    True
    """
    if expected_failures is not None and not is_expected_failures(expected_failures):
        raise InputError(f"expected_failures must map template names to a reason, or to {{kind: reason}} with kinds "
                         f"{', '.join(EXPECTED_KINDS)}; got {type(expected_failures).__name__}")
    check_modes(fail_on, prefix_stability)  # before any work
    target = None
    if prefix_stability != "off":
        session = session if session is not None else default_turns_session()
        check_session(session)
        target = functools.partial(analyze_with_prefix_stability, session=session, timeout=timeout)
    if jobs == 1 and timeout is None and memory_mb is None:
        results = _in_process(templates, target, progress)
    else:
        kwargs: dict = {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if memory_mb is not None:
            kwargs["memory_mb"] = memory_mb
        results = analyze_isolated(list(templates), jobs=jobs, progress=progress, target=target, **kwargs)
    prefix: tuple[PrefixStability, ...] = ()
    if target is not None:
        results, prefix = split_prefix_checks(results)
    checks = token_checks(results, tokenizer, tokenizers) if tokenizer or tokenizers else ()
    skipped = token_skips(results, tokenizer, tokenizers) if checks else ()
    return AuditReport(tuple(results), dict(expected_failures or {}), checks, fail_on, prefix, prefix_stability,
                       skipped)


def token_skips(results: Sequence[Analysis], tokenizer: str | None,
                tokenizers: Mapping[str, str | None] | None = None) -> tuple[str, ...]:
    """Per result, why the token round trip asked for (`tokenizer` given: one for all, or "auto")
    did not run on a passing analysis; "" where it ran or was not asked for (AuditReport.token_skipped)."""
    out = []
    for a in results:
        why = ""
        if tokenizer and a.status == "pass" and tokenizer_for(a.name, a.source, tokenizer, tokenizers) is None:
            why = ("no tokenizer for it: its vocabulary needs an extra that is not installed, or the configuration "
                   "pairs it with none" if tokenizers and a.name in tokenizers else
                   "no tokenizer for it: --tokenizer auto knows none (not a GGUF, no corpus vocabulary paired with "
                   "its name); give --tokenizer or pair it under [tool.tmplkit.tokenizers]")
        out.append(why)
    return tuple(out)


def _in_process(templates: Sequence[ChatTemplate], target, progress) -> list:
    """Each template analyzed in this process (render limits only), with the scan's warnings."""
    results: list = []
    for i, t in enumerate(templates):
        out = (target or analyze)(t)
        a = add_scan_warnings(out[0] if isinstance(out, tuple) else out, t.text)
        results.append((a, *out[1:]) if isinstance(out, tuple) else a)
        if progress:
            progress(i + 1, len(templates), a)
    return results


def tokenizer_for(name: str, source: str, tokenizer: str | None, tokenizers: Mapping[str, str | None] | None = None) -> str | None:
    """The tokenizer spec the token round trip uses for the template `name` read from `source`.

    The pairing `tokenizers` (template name -> spec) first; then `tokenizer`: "auto" is the GGUF
    the template came from, else the corpus vocab paired with its name
    (tokens.roundtrip.VOCAB_FOR_TEMPLATE), else None; any other value is one tokenizer for all.

    >>> tokenizer_for("x", "x.jinja", "auto", {"x": "vocab:qwen35"}), tokenizer_for("y", "m.gguf", "auto")
    ('vocab:qwen35', 'm.gguf')
    """
    if tokenizers and name in tokenizers:
        return tokenizers[name] or None  # ("": no tokenizer, as None: a round trip not run is said so, never passed)
    if tokenizer != "auto":
        return tokenizer
    if source.lower().endswith(".gguf"):
        return source
    from ..tokens.roundtrip import vocab_for_template  # numpy: only with --tokenizer (keeps import tmplkit.auditing numpy-free)

    vocab = vocab_for_template(name)
    return f"vocab:{vocab}" if vocab else None


def token_checks(results: Sequence[Analysis], tokenizer: str | None, tokenizers: Mapping[str, str | None] | None = None) -> tuple:
    """The token-level round trip of every passing analysis with a tokenizer (see `tokenizer_for`);
    None for the others."""
    from ..tokens.roundtrip import token_round_trip  # numpy, a tokenizer library: only with --tokenizer
    from ..tokens.tokenizers import load_tokenizer

    opened: dict[str, object] = {}

    def get(spec: str):
        if spec not in opened:
            opened[spec] = load_tokenizer(spec)
        return opened[spec]

    out = []
    for a in results:
        spec = tokenizer_for(a.name, a.source, tokenizer, tokenizers)
        out.append(token_round_trip(a, get(spec)) if spec and a.status == "pass" else None)
    return tuple(out)
