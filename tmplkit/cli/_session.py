"""The `session` subcommand: generate an agent session file."""

from __future__ import annotations

from ._common import add_output, at_least, emit, positive

# The library's layers are imported inside the functions that use them: a command loads only what it runs.


def add_session(sub) -> None:
    p = sub.add_parser("session")
    ss = p.add_subparsers(dest="session_command", required=True)
    g = ss.add_parser("generate", help="write a seeded coding-agent session (OpenAI-style messages JSON)")
    g.add_argument("--tokens", type=int, default=16000, metavar="N", help="about how long (default 16000; estimated "
                                                                          "from characters)")
    g.add_argument("--style", default="agent", help="agent (reasoning, parallel calls, long outputs; the default), "
                                                    "tool-role (tool messages), user-turns (for templates without tools)")
    g.add_argument("--requests", type=int, metavar="N", help="this many user requests instead of a length")
    g.add_argument("--seed", type=int, default=0)
    add_output(g, "the session")
    g.set_defaults(func=_cmd_generate)


def _cmd_generate(args) -> int:
    import json

    from ..session import generate_session

    positive(args.requests, "--requests")
    at_least(args.tokens, 200, "--tokens")
    session = generate_session(args.tokens, seed=args.seed, style=args.style, requests=args.requests)
    emit(json.dumps(session.to_dict(), indent=1, ensure_ascii=False) + "\n", args.output)
    return 0
