"""Run several batch policies on one session, interleaved, and compare them (the CLI's library twin).

    >>> comp = compare_policies("model.gguf", "session.json", template="Qwen3.5-4B.jinja",
    ...                         policies=["none", "every-user-start", "gated"], repeat=3)   # doctest: +SKIP
    >>> print(comp.to_markdown())                                                       # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..errors import InputError
from ..server_rules import POLICIES, PrefillSettings, get_policy
from ..session import Session, load_session
from ..sources.templates import ChatTemplate, load_one
from .prompt import Prompt, build_prompt
from .report import Comparison, PolicyResult
from .runner import PrefillRunner


def resolve_template(template: str | os.PathLike | ChatTemplate | None, runner: PrefillRunner) -> ChatTemplate:
    """The chat template: given explicitly (any tmplkit source), else the model GGUF's own."""
    if isinstance(template, ChatTemplate):
        return template
    if template is None:
        if not runner.info.chat_template:
            raise InputError(f"{Path(runner.model_path).name} carries no chat template; pass one with --template "
                             f"(a .jinja file, a GGUF, hf:ORG/NAME, ...)")
        return load_one(runner.model_path)
    return load_one(template)


def prepare(runner: PrefillRunner, session: Session | str | os.PathLike,
            template: str | os.PathLike | ChatTemplate | None = None) -> tuple[Prompt, ChatTemplate]:
    """Render and tokenize `session` for `runner`'s model (its own vocabulary), with tmplkit's spans."""
    if not isinstance(session, Session):
        session = load_session(session)
    tmpl = resolve_template(template, runner)
    return build_prompt(session, tmpl, runner.tokenizer, add_bos=runner.info.add_bos, fits=runner.check_text), tmpl


def expand_policies(policy: str | list[str]) -> list[str]:
    names = list(POLICIES) if policy == "all" else ([policy] if isinstance(policy, str) else list(policy))
    for name in names:
        get_policy(name)
    return names


def compare_policies(model: str | os.PathLike, session: Session | str | os.PathLike,
                     template: str | os.PathLike | ChatTemplate | None = None,
                     policies: str | list[str] = "all", repeat: int = 1,
                     settings: PrefillSettings | None = None, warmup: bool = True,
                     progress: Callable[[str, int, int, int], None] | None = None) -> Comparison:
    """Prefill the session once per policy per repeat, policies interleaved within each repeat.

    `progress(policy, repeat_index, done_tokens, total_tokens)` is called after each decode call.
    `warmup`: one untimed prefill first (the first decodes after loading are slower, as pages of
    the model are touched for the first time; llama-server also warms up before serving).
    """
    if repeat < 1:
        raise InputError("repeat must be at least 1")
    names = expand_policies(policies)
    session_name = str(session) if not isinstance(session, Session) else (session.source or "<session>")
    with PrefillRunner(model, settings) as runner:
        prompt, tmpl = prepare(runner, session, template)
        reports: dict[str, list] = {n: [] for n in names}
        runner.check_prompt(prompt.tokens)
        if warmup:
            runner.run(prompt.tokens[:min(len(prompt.tokens), 2 * runner.settings.n_batch)], None, "none")
        for k in range(repeat):
            for name in names:
                cb = (lambda done, total, name=name, k=k: progress(name, k, done, total)) if progress else None
                reports[name].append(runner.run(prompt.tokens, prompt.spans, name, progress=cb))
        return Comparison(
            model=str(model),
            session=session_name,
            template=tmpl.name,
            n_prompt=len(prompt.tokens),
            settings={**runner.settings.to_dict(), "n_threads": runner.n_threads, "n_swa": runner.info.n_swa,
                      "checkpointing": runner.checkpointing},
            results=tuple(PolicyResult(n, tuple(reports[n])) for n in names),
            delimiters=tuple(d.to_dict() for d in prompt.delimiters),
        )
