"""Write a llama-server log as a router forwards it, for a build whose router could not be run here.

A router (`llama-server --models-dir DIR`, no `-m`) spawns a server per model and prints, from
`server_models::load` (tools/server/server-models.cpp; 0.3.33: lines 887, 901-904; 0.3.36: 1154, 1168-1171):

    srv          load: spawning server instance with name=NAME on port PORT
    srv          load: spawning server instance with args:
    srv          load:   ARG                      (one line per argument, long names)

and then every line the spawned server writes, as `LOG("[%5d] %s", port, line)` (0.3.33: line
939; 0.3.36: 189). This script does exactly that to a log the server wrote on its own: the router's
lines first (their timestamps set to 0: the router's own, which this log does not have), then each
line of the log prefixed with the port. The server's lines themselves are unchanged. With
`--cut-progress N`, only the first and last N/2 prompt-progress lines of each task are kept (as
`scripts/server_logs.py --cut-progress`), as someone pasting the log into a bug report cuts it.

    python scripts/router_shape_log.py fixtures/server-logs/0.3.33-cold-lv3.log --port 39007 \
        --name tiny-qwen35 --cut-progress 24 -o fixtures/server-logs/0.3.33-router-lv3-cut.log -- \
        llama-server --host 127.0.0.1 --jinja --port 39007 --no-warmup --alias tiny-qwen35 \
        --ctx-size 65536 --cache-ram 0 --log-verbosity 3 --model tiny-qwen35.gguf --parallel 1 \
        --threads 2 --threads-batch 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def router_shaped(text: str, port: int, name: str, args: list[str]) -> str:
    at = "0.00.000.000 I "
    head = [f"{at}srv          load: spawning server instance with name={name} on port {port}",
            f"{at}srv          load: spawning server instance with args:"]
    head += [f"{at}srv          load:   {a}" for a in args]
    return "\n".join(head + [f"[{port:5d}] {ln}" for ln in text.splitlines()]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="a log llama-server wrote on its own")
    ap.add_argument("--port", type=int, required=True, help="the port the router gave the spawned server")
    ap.add_argument("--name", default="model", help="the model's name in the router (its file name without .gguf)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--cut-progress", type=int, metavar="N", help="keep only the first and last N/2 progress lines")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    a.args = argv[cut + 1:]  # the spawned server's arguments, after --
    text = Path(a.log).read_text(encoding="utf-8")
    if a.cut_progress is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from server_logs import _cut_progress

        text = "\n".join(_cut_progress(text.splitlines(), a.cut_progress)) + "\n"
    Path(a.output).write_text(router_shaped(text, a.port, a.name, a.args), encoding="utf-8")
    print(a.output, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
