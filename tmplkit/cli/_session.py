"""The `session` subcommand: generate an agent session file."""

from __future__ import annotations

from ..errors import InputError
from ._common import add_output, at_least, emit, positive

# The library's layers are imported inside the functions that use them: a command loads only what it runs.

# --tokens' range and --requests' most: 2 million tokens (about 6 MB of JSON) is past any context a
# session is replayed in; 200 agent-style requests are about as long.
DEFAULT_TOKENS, MIN_TOKENS, MAX_TOKENS = 16000, 200, 2_000_000  # (the library's, session._generator: a test holds them equal)
MAX_REQUESTS = 200
STYLES = ("tool-role", "user-turns", "agent")  # (the library's too: the same test)


def add_session(sub) -> None:
    p = sub.add_parser("session")
    ss = p.add_subparsers(dest="session_command", required=True)
    g = ss.add_parser("generate", help="write a seeded coding-agent session (OpenAI-style messages JSON)")
    g.add_argument("--tokens", type=int, default=None, metavar="N",
                   help=f"about how long, {MIN_TOKENS} to {MAX_TOKENS} (default {DEFAULT_TOKENS}; estimated from characters)")
    g.add_argument("--style", default="agent", choices=STYLES, help="agent (reasoning, parallel calls, long outputs; the default), "
                                                    "tool-role (tool messages), user-turns (for templates without tools)")
    g.add_argument("--requests", type=int, metavar="N",
                   help=f"this many user requests (1 to {MAX_REQUESTS}) instead of a length: not with --tokens")
    g.add_argument("--seed", type=int, default=0, metavar="N",
                   help="the random seed: the same seed, length and style give the same session (default 0)")
    add_output(g, "the session")
    g.set_defaults(func=_cmd_generate)


def _cmd_generate(args) -> int:
    import json

    from ..session import generate_session

    if args.tokens is not None and args.requests is not None:
        raise InputError(f"give --tokens or --requests, not both: --requests {args.requests} makes {args.requests} user "
                         f"requests whatever their length, so --tokens {args.tokens} would be ignored")
    positive(args.requests, "--requests")
    _at_most(args.requests, MAX_REQUESTS, "--requests")
    tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    at_least(tokens, MIN_TOKENS, "--tokens")
    _at_most(tokens, MAX_TOKENS, "--tokens")
    session = generate_session(tokens, seed=args.seed, style=args.style, requests=args.requests)
    emit(json.dumps(session.to_dict(), indent=1, ensure_ascii=False) + "\n", args.output)
    return 0


def _at_most(value, most: int, flag: str) -> None:
    """Refuse `value` above `most`, naming the flag."""
    if value is not None and value > most:
        raise InputError(f"{flag} must be at most {most}, got {value}")
