#!/usr/bin/env python
"""What templates do with a `developer` message (the instructions OpenAI-style clients send), as each
engine gives it: transformers as it is (`apply_chat_template`), llama-server as `system` (but to
gpt-oss's templates). Per template, on a developer message and a user message:

- transformers: "left out" (the render holds neither its content nor a needle put in its place:
  `tmplkit.masks` names such a message in a mask's `left_out`), "raises", "as system" (the render
  is the one of the same message as `system`) or "own form" (printed otherwise);
- llama-server: "printed", "left out" or "raises" (the server setting's render; a template without a
  system role gets the instructions folded into the user message).

    python scripts/developer_roles.py --corpus hub --json scripts/results/developer-roles-hub.json
    python scripts/developer_roles.py --corpus llama.cpp --json scripts/results/developer-roles-llama.cpp.json

And the analysis's own finding (`capabilities['developer']`, on its probe conversation) against
the transformers column: `analysis_agrees` counts the templates where the two say the same, and
`analysis_differs` names the others.

The llama.cpp corpus templates whose names the Hub corpus has outside its development half are left
out (scripts/_held_out.py); `corpus:hub` is that half. Counts only: no timing.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _held_out import corpus_arguments, corpus_templates  # noqa: E402  (scripts/, beside this file)
from _machine import emit_results  # noqa: E402

from tmplkit.analysis import analyze  # noqa: E402
from tmplkit.errors import TmplkitError  # noqa: E402
from tmplkit.masks import left_out  # noqa: E402
from tmplkit.session import for_server, session_from_json  # noqa: E402

_DEVELOPER = "Answer in French, in one sentence."
_USER = "Which file holds the settings?"


def _render(template, role: str, inputs: str):
    server = for_server(template, session_from_json({"messages": [{"role": role, "content": _DEVELOPER},
                                                                  {"role": "user", "content": _USER}]}), inputs=inputs)
    return server, server.render(add_generation_prompt=True)


def transformers_outcome(template) -> str:
    try:
        server, text = _render(template, "developer", "transformers")
    except TmplkitError:
        return "raises"
    if left_out(server, text):
        return "left out"
    try:
        as_system = _render(template, "system", "transformers")[1]
    except TmplkitError:
        as_system = None
    return "as system" if as_system == text else "own form"


def server_outcome(template) -> str:
    try:
        server, text = _render(template, "developer", "server")
    except TmplkitError:
        return "raises"
    return "left out" if left_out(server, text) else "printed"


# The analysis's words for the transformers column's.
_AS_ANALYSIS = {"left out": "dropped", "raises": "rejected", "as system": "as_system", "own form": "own"}


def main(argv: list[str] | None = None) -> int:
    args = corpus_arguments(__doc__.splitlines()[0], argv)
    templates = corpus_templates(args.corpus)
    rows = {t.name: {"transformers": transformers_outcome(t), "llama-server": server_outcome(t),
                     "analysis": analyze(t).capabilities.get("developer")} for t in templates}
    differs = sorted(name for name, r in rows.items() if r["analysis"] != _AS_ANALYSIS[r["transformers"]])
    results = {"command": " ".join(["python scripts/developer_roles.py", *(argv if argv is not None else sys.argv[1:])]),
               "corpus": args.corpus, "templates": len(rows),
               "transformers": dict(Counter(r["transformers"] for r in rows.values()).most_common()),
               "llama-server": dict(Counter(r["llama-server"] for r in rows.values()).most_common()),
               "analysis_agrees": len(rows) - len(differs), "analysis_differs": differs,
               "rows": rows}
    emit_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
