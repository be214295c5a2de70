#!/usr/bin/env python
"""How often `spans` and `request` find a conversation read otherwise than the probes: for every
template whose analysis passes, on three generated sessions (agent, tool-role, user-turns), the
messages `tmplkit.session.token_spans.misplaced_messages` flags (a user message in another role's
span, a tool result in a user span), per template. The goal on real templates is none: the check
fails a template only where its own probes misled (fixtures/templates/tool-without-id-as-user.jinja).

    python scripts/misplaced_messages.py --corpus hub
    python scripts/misplaced_messages.py --corpus llama.cpp --json misplaced.json

The llama.cpp corpus templates whose names the Hub corpus has outside its development half are left
out (scripts/_held_out.py); `corpus:hub` is that half. Counts only: no timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _held_out import corpus_arguments, corpus_templates  # noqa: E402  (scripts/, beside this file)
from _machine import emit_results  # noqa: E402

from tmplkit.analysis import analyze  # noqa: E402
from tmplkit.errors import TmplkitError  # noqa: E402
from tmplkit.session import generate_session, render_conversation  # noqa: E402
from tmplkit.session.token_spans import misplaced_messages  # noqa: E402

# (style, about how many tokens, seed): sessions of each shape a client sends
SESSIONS = (("agent", 8000, 0), ("tool-role", 4000, 1), ("user-turns", 6000, 2))


def main(argv: list[str] | None = None) -> int:
    args = corpus_arguments(__doc__.splitlines()[0], argv)
    templates = corpus_templates(args.corpus)
    sessions = {f"{style}-{n}-seed{seed}": generate_session(n, seed=seed, style=style) for style, n, seed in SESSIONS}
    passing, flagged, rendered = 0, {}, 0
    for t in templates:
        try:
            a = analyze(t)
        except TmplkitError:
            continue
        if a.status != "pass":
            continue
        passing += 1
        for name, session in sessions.items():
            try:
                text = render_conversation(t, session, add_generation_prompt=True)
            except TmplkitError:  # (a template that refuses the session: spans and request say so themselves)
                continue
            rendered += 1
            found = misplaced_messages(text, session.messages, a.delimiters, drops_tools=a.tool_placement == "dropped")
            if found:
                flagged.setdefault(t.name, {})[name] = list(found)
    emit_results({"corpus": args.corpus, "templates": len(templates), "passing": passing, "sessions": list(sessions),
                  "renders_checked": rendered, "flagged": flagged}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
