"""tmplkit's session verdicts held against chatlint's own prefix check, on its conversation shapes.

For every (template, shape) of the Hub corpus's development half (`corpus:hub`) and chatlint
0.1.2's conversation shapes: chatlint's `check_prefix_stability` (each snapshot's prompt a prefix
of the next one's, else a `tail_marker` or a `history_rewrite`) and tmplkit's `study_turns` (what
the server holds after each request, the request and the generated turn, a prefix of the next
request, else the first divergence and its cause), both rendering with bos `<s>` and eos `</s>`.

Where the two differ, the difference is put down to what the renders show:

- `generated reasoning`, `the generated turn`: tmplkit's own prompts extend each other, as
  chatlint's do, and the divergence lies in the turn the model generated (its reasoning, an empty
  reasoning block, a closing marker the history writes otherwise): chatlint compares prompts only;
- `the clock`: tmplkit renders each request at its own time (the cause is "date or time");
- `prefill snapshot`: a shape's snapshot ends with an assistant message (a prefill), which is no
  request a client makes for the model to speak; tmplkit's requests are where the model speaks;
- `null content as ""`: tmplkit renders a message as llama-server gives it (`content: null` of a
  tool-call turn given as `""`, the other null-valued keys left out), while chatlint passes the
  null; chatlint's own renderer, given the messages so, renders what tmplkit renders;
- `tools given as none`: transformers and tmplkit give a template without tools `tools = none`,
  chatlint leaves the variable undefined (`tools is none` differs);
- `inputs as a server gives them`: tmplkit renders what llama-server gives the template (tool-call
  arguments as the client's JSON strings where the template does not read them as objects; the
  reasoning also under `thinking` for gpt-oss and LFM2; the switches that keep earlier reasoning,
  which the server sets by default), and chatlint's renderer, given those messages and switches,
  renders otherwise than from the shape's;
- `enable_thinking as the server passes it`: the same, where the server's `enable_thinking`
  (`session.server_thinking`) alone makes the difference;
- `llama-server's engine`: chatlint cannot render the shape where transformers' sandbox refuses
  what llama-server's engine renders (a list changed in place, Kimi K2's call-id queue; a
  filter's sequence to `tojson`, llama.cpp's DeepSeek R1), and tmplkit renders the server's
  requests as that engine does;
- anything else is `unexplained`, printed in full: the goal is none.

tmplkit's cause of each unstable pair is counted (`causes`); an `other` (no named cause applies) is
printed in full too: the goal is none.

    python scripts/bench_anchor.py -o scripts/results/anchor.json

Needs chatlint 0.1.2 (the `test` extra pins it) and the Hub corpus (`tmplkit corpus fetch hub`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _machine import cpu_model  # noqa: E402

import tmplkit  # noqa: E402
from tmplkit.atomic import write_text_atomic  # noqa: E402
from tmplkit.sources import ChatTemplate  # noqa: E402

BOS, EOS = "<s>", "</s>"


def _session(shape):
    from tmplkit.session import Session

    return Session(tuple(shape.snapshots[-1]), tuple(shape.tools or ()))


def chatlint_verdict(template, shape) -> dict:
    from chatlint.properties import FAIL, PASS, check_prefix_stability
    from chatlint.render import Template

    r = check_prefix_stability(Template(template.name, template.text), shape)
    if r.verdict == PASS:
        return {"verdict": "stable"}
    if r.verdict != FAIL:
        return {"verdict": "cannot render"}
    return {"verdict": "unstable", "kind": r.metrics.get("kind"), "request": _snapshot_index(r.detail) + 1}


def _snapshot_index(detail: str) -> int:
    # "snapshot K is not a prefix of snapshot K+1 ..."
    return int(detail.split()[1])


def tmplkit_verdict(template: ChatTemplate, shape) -> dict:
    from tmplkit.turns import session_requests, study_turns

    session = _session(shape)
    report = study_turns(template, session, switches=False)
    if report.error:
        return {"verdict": "cannot render", "detail": report.error[:300]}
    if report.n_requests < 2:
        return {"verdict": "not applicable", "n_requests": report.n_requests}
    requests = session_requests(session, template)
    prompts_extend = all(b.text.startswith(a.text) for a, b in zip(requests, requests[1:]))
    first = report.first
    out = {"n_requests": report.n_requests, "prompts_extend": prompts_extend}
    if first is None:
        return {"verdict": "stable", **out}
    # Whether the prompts alone still extend each other where tmplkit first diverges: then the
    # divergence lies in the turn the model generated.
    in_turn = requests[first.request].text.startswith(requests[first.request - 1].text)
    return {"verdict": "unstable", "cause": first.cause, "request": first.request, "detail": first.detail[:300],
            "in_generated_turn": in_turn, **out}


def _renders(template, shape, prepare, tools_none: bool = False, variables=None) -> list:
    """chatlint's render of each snapshot with the generation prompt, its messages prepared by
    `prepare` and, with `tools_none`, `tools` given as none where the shape has none (chatlint
    leaves the variable undefined; transformers and tmplkit pass None), and `variables`; a failure
    is its error's type."""
    from chatlint.render import _compile

    compiled, out = _compile(template.text), []
    for snap in shape.snapshots:
        ctx = {**(variables or {}), "messages": prepare(snap), "add_generation_prompt": True, "bos_token": BOS,
               "eos_token": EOS}
        if shape.tools is not None or tools_none:
            ctx["tools"] = shape.tools
        try:
            out.append(compiled.render(**ctx))
        except Exception as exc:  # noqa: BLE001 - a template's own failure, whatever it is
            out.append(("error", type(exc).__name__))
    return out


def engine_refused(template, shape) -> bool:
    """Whether transformers' sandbox refuses a snapshot of the shape for what llama-server's engine
    renders (a list changed in place, a filter's sequence to `tojson`: `RenderError.engine_refusal`),
    which tmplkit's server setting renders as that engine does and chatlint's renderer, transformers'
    sandbox, cannot."""
    from tmplkit.errors import RenderError
    from tmplkit.sandbox import render

    for snap in shape.snapshots:
        try:
            render(template, snap, tools=shape.tools, add_generation_prompt=True)  # (transformers' engine)
        except RenderError as exc:
            return exc.engine_refusal
    return False


def inputs_reason(template, shape) -> str | None:
    """Which of tmplkit's inputs makes chatlint's own renderer render the shape otherwise: a null
    content given as "" (the other null keys left out), then the messages as llama-server gives them
    (`session.messages_for`, and a system message folded where the template never reads one:
    `session.as_server_renders`) with the variables it sets (`session.server_variables`: its reasoning
    switches and `enable_thinking`; the switch named apart where it alone makes the difference);
    None where neither does."""
    from tmplkit.session import as_server_renders, messages_for, server_variables

    def no_nulls(messages):
        return [{k: v for k, v in m.items() if v is not None} for m in messages]

    def dropped(messages):
        return no_nulls({**m, "content": ""} if m.get("content") is None else m for m in messages)

    raw = _renders(template, shape, lambda m: m)
    without_nulls = _renders(template, shape, dropped)
    if raw != without_nulls:
        return 'null content as ""'
    no_tools = _renders(template, shape, dropped, tools_none=True)
    if without_nulls != no_tools:
        return "tools given as none"
    def as_server_gives(m):
        return no_nulls(as_server_renders(template, messages_for(template, m)))

    variables = server_variables(template)
    as_server = _renders(template, shape, as_server_gives, tools_none=True, variables=variables)
    if no_tools == as_server:
        return None
    if "enable_thinking" in variables:  # (the switch alone, where the rest renders as the shape's)
        unswitched = {k: v for k, v in variables.items() if k != "enable_thinking"}
        if _renders(template, shape, as_server_gives, tools_none=True, variables=unswitched) == no_tools:
            return "enable_thinking as the server passes it"
    return "inputs as a server gives them"


def reason(ours: dict, theirs: dict, template, shape) -> str | None:
    """Why the two verdicts differ (None: they agree)."""
    a, b = ours["verdict"], theirs["verdict"]
    if a == b == "unstable" and ours["request"] == theirs["request"]:
        return None
    if a == b and a != "unstable" or {a, b} == {"cannot render"}:
        return None
    if a == "not applicable" and b == "stable" and len(shape.snapshots) < 2:
        return None  # one request, one snapshot: nothing is resumed, nothing compared
    if any(m.get("role") == "assistant" for m in (s[-1] for s in shape.snapshots)):
        return "prefill snapshot"
    if b == "cannot render" and a != "cannot render" and engine_refused(template, shape):
        return "llama-server's engine"
    inputs = inputs_reason(template, shape)
    if inputs:
        return inputs
    if a == "unstable" and ours.get("cause") == "date or time":
        return "the clock"
    if a == "unstable" and ours.get("in_generated_turn") and b in ("stable", "unstable"):
        if b == "stable" or ours["request"] < theirs["request"]:
            return "generated reasoning" if ours.get("cause") == "reasoning dropped" else "the generated turn"
    return "unexplained"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="write the JSON result here")
    ap.add_argument("--only", nargs="*", help="just these template names")
    args = ap.parse_args(argv)
    from chatlint.shapes import all_shapes

    shapes = all_shapes()
    templates = [t for t in tmplkit.load("corpus:hub") if not args.only or t.name in args.only]
    rows, t0 = [], time.perf_counter()
    for t in templates:
        template = ChatTemplate(t.text, t.name, t.source, BOS, EOS)
        for shape in shapes:
            ours, theirs = tmplkit_verdict(template, shape), chatlint_verdict(template, shape)
            rows.append({"template": t.name, "shape": shape.name, "tmplkit": ours, "chatlint": theirs,
                         "reason": reason(ours, theirs, template, shape)})
    seconds = time.perf_counter() - t0
    table = Counter((r["chatlint"]["verdict"] + (f" ({r['chatlint']['kind']})" if r["chatlint"].get("kind") else ""),
                     r["tmplkit"]["verdict"] + (f" ({r['tmplkit']['cause']})" if r["tmplkit"].get("cause") else ""))
                    for r in rows)
    reasons = Counter(r["reason"] or "agree" for r in rows)
    causes = Counter(r["tmplkit"]["cause"] for r in rows if r["tmplkit"].get("cause"))
    for r in rows:
        if r["reason"] == "unexplained":
            print(f"UNEXPLAINED {r['template']} / {r['shape']}: tmplkit {r['tmplkit']} | chatlint {r['chatlint']}")
        if r["tmplkit"].get("cause") == "other":
            print(f"OTHER CAUSE {r['template']} / {r['shape']}: tmplkit {r['tmplkit']}")
    print(json.dumps({"pairs": len(rows), "reasons": dict(reasons), "causes": dict(causes)}, indent=1))
    if args.output:
        result = {"command": " ".join(["python", "scripts/bench_anchor.py", *(argv or sys.argv[1:])]), "cpu_model": cpu_model(),
                  "seconds": round(seconds, 1), "pairs": len(rows), "reasons": dict(reasons), "causes": dict(causes),
                  "table": [{"chatlint": k[0], "tmplkit": k[1], "pairs": n} for k, n in table.most_common()],
                  "differences": [r for r in rows if r["reason"]]}  # the agreeing pairs are counted above
        write_text_atomic(args.output, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
