#!/usr/bin/env python
"""How tmplkit's server setting reads a template (`tmplkit.session.content_reads`: string content,
typed content, the system role; `server_object_arguments`: tool-call arguments as objects;
`server_thinking`: `enable_thinking` true) against llama-server's own capability check (`/props`,
`chat_template_caps`) and the switch it passes in every render, template by template: the
decisions behind what the server setting gives a template (content parts joined or made, a system
message folded, arguments parsed, the switch). The server's switch is read off its renders
(`/apply-template` without the switch, with it true and false, of a user message and of a reply
with reasoning between two user messages): where the two values render alike on both, nothing
shows it and that column is not compared (`null`).

    python scripts/server_caps.py --corpus llama.cpp --json scripts/results/server-caps-llama.cpp.json
    python scripts/server_caps.py --corpus hub --json scripts/results/server-caps-hub.json

Needs the llama-server scripts/build_llama_server.sh builds; one server per template, on the tiny
Qwen3.5-vocab model. A template the server refuses at start is counted apart. The llama.cpp corpus
templates whose names the Hub corpus has outside its development half are left out
(scripts/_held_out.py); `corpus:hub` is that half.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _held_out import held_out  # noqa: E402  (scripts/, beside this file)

from tmplkit.errors import TmplkitError  # noqa: E402
from tmplkit.prefill import tiny_model_path  # noqa: E402
from tmplkit.server.process import LlamaServer, llama_server_binary  # noqa: E402
from tmplkit.session import content_reads, server_object_arguments, server_thinking  # noqa: E402
from tmplkit.sources import load_many  # noqa: E402

_CAPS = ("supports_string_content", "supports_typed_content", "supports_system_role", "supports_object_arguments",
         "enable_thinking")
_ARGS = ["--jinja", "-c", "512", "-np", "1", "-t", "1", "--no-warmup"]
_PROBES = ([{"role": "user", "content": "Hello."}],
           [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
            {"role": "user", "content": "Bye."}])


def compare(template, binary, model, log: Path) -> dict:
    """One row: our reading, the server's (None where it refuses the template), whether they agree."""
    reads = content_reads(template)
    ours = [reads.string, reads.typed, reads.system, server_object_arguments(template), server_thinking(template)]
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False, encoding="utf-8") as f:
        f.write(template.text)
    try:
        server = LlamaServer(binary, model, [*_ARGS, "--chat-template-file", f.name], log=log, startup_s=60, keep_log=False)
    except TmplkitError as exc:
        return {"template": template.name, "ours": ours, "theirs": None, "agree": None, "error": str(exc)[:200]}
    finally:
        Path(f.name).unlink()
    try:
        caps = server.get("/props")["chat_template_caps"]
        thinking = _servers_thinking(server)
    finally:
        server.stop()
    theirs = [bool(caps[k]) for k in _CAPS[:-1]] + [thinking]
    return {"template": template.name, "ours": ours, "theirs": theirs,
            "agree": all(a == b for a, b in zip(ours, theirs) if b is not None)}


def _servers_thinking(server) -> bool | None:
    """The `enable_thinking` the server passes by default, read off its renders of each probe:
    the one value whose render its own equals; None where both values render alike on every
    probe (or it refuses them)."""
    for messages in _PROBES:
        body = {"messages": messages, "add_generation_prompt": True}
        try:
            default, on, off = (server.post_for("/apply-template", {**body, **extra}, "prompt", timeout=60)
                                for extra in ({}, {"chat_template_kwargs": {"enable_thinking": True}},
                                              {"chat_template_kwargs": {"enable_thinking": False}}))
        except TmplkitError:
            return None
        if on != off:
            return default == on if default in (on, off) else None
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", choices=("llama.cpp", "hub"), default="llama.cpp")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = p.parse_args()
    binary = llama_server_binary()
    if binary is None:
        print("llama-server is not built: run `bash scripts/build_llama_server.sh`", file=sys.stderr)
        return 2
    model = tiny_model_path("qwen35")
    rows = []
    with tempfile.TemporaryDirectory(prefix="server-caps-") as tmp:
        for t in load_many([f"corpus:{args.corpus}"]):
            if args.corpus == "llama.cpp" and held_out(t.name):
                continue
            rows.append(compare(t, binary, model, Path(tmp) / "server.log"))
            if rows[-1]["agree"] is False:
                print(f"differs: {t.name}: ours {rows[-1]['ours']}, llama-server's {rows[-1]['theirs']}")
    checked = [r for r in rows if r["agree"] is not None]
    by_cap = {cap: sum(r["ours"][k] == r["theirs"][k] for r in checked) for k, cap in enumerate(_CAPS)}
    shown = sum(r["theirs"][-1] is not None for r in checked)  # (the switch, where the server's renders show it)
    res = {"corpus": args.corpus, "caps": list(_CAPS), "templates": len(rows), "checked": len(checked),
           "agree": sum(r["agree"] for r in checked), "agree_by_cap": by_cap,
           "enable_thinking_shown": shown, "refused_by_server": len(rows) - len(checked),
           "differs": [r for r in checked if not r["agree"]], "rows": rows}
    print(f"{args.corpus}: {res['agree']} of {res['checked']} templates read alike in every way "
          f"({res['refused_by_server']} refused by llama-server at start); "
          + ", ".join(f"{cap} {n}" for cap, n in by_cap.items()) + f" (of {shown} where the server's renders show it)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
