"""The turns study's llama-server setting held against the real server, request by request.

A session is sent through a running llama-server's `/v1/chat/completions` (`drive_session`), and
each request is predicted beforehand from the same inputs the server has: the prompt as the server
renders it (`/apply-template`: llama.cpp's own engine and message handling, which differ from
transformers' on some templates, see `engine_parity`), its token ids (the model's vocabulary, BOS
as the model adds it), the server's delimiter list for the template
(`server_rules.server_delimiter_list`, split the server's way) and its rules
(`turns.ServerSimulation` with `ServerGated`, the settings the server was started with). Per
request the prediction must equal the log: tokens reused and processed, where each batch starts,
which checkpoints are created and which one is restored, whether the whole prompt is processed
again.

The server generates `max_tokens` tokens after each prompt; with 1 (the default) the sampled token
is never decoded, so the slot holds exactly the prompt (the next request's common prefix is the
two prompts'), whatever the tiny random model samples.

    >>> check = check_resume(server, template, session, tokenizer=tok, delimiters=delims,       # doctest: +SKIP
    ...                      settings=PrefillSettings(max_checkpoints=8, checkpoint_min_step=512))
    >>> check.equal, check.mismatches()[:1]                                                    # doctest: +SKIP
    (True, [])
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError
from ..server_rules import ServerGated, server_split
from ..session.requests import request_points
from ..turns import MemoryModel, ServerSimulation
from .chat_session import ServedRequest, _task_lines, drive_session
from .log import read_server_log

__all__ = ["RequestCheck", "ResumeCheck", "check_resume", "predict_requests", "request_bodies",
           "server_renders", "send_completions", "server_settings_args"]

# What is compared per request: (name, predicted, measured) are read by `RequestCheck.fields`.
_FIELDS = ("n_prompt", "n_reused", "n_processed", "batch_starts", "checkpoints_created", "checkpoint_restored",
           "full_reprocess")


@dataclass(frozen=True)
class RequestCheck:
    """One request: the prediction and the server's log, field by field (`_FIELDS`)."""

    index: int
    predicted: dict
    measured: dict

    @property
    def equal(self) -> bool:
        return all(self.predicted[k] == self.measured[k] for k in _FIELDS)

    def differences(self) -> list[str]:
        return [f"{k}: predicted {self.predicted[k]}, measured {self.measured[k]}" for k in _FIELDS
                if self.predicted[k] != self.measured[k]]

    def to_dict(self) -> dict:
        return {"index": self.index, "equal": self.equal, "predicted": self.predicted, "measured": self.measured}


@dataclass(frozen=True)
class ResumeCheck:
    """A session's requests on one template: each predicted and measured."""

    template: str
    requests: tuple[RequestCheck, ...] = field(repr=False)
    delimiters: tuple[tuple[str, str], ...] = ()

    @property
    def equal(self) -> bool:
        return all(r.equal for r in self.requests)

    def mismatches(self) -> list[str]:
        return [f"request {r.index}: " + "; ".join(r.differences()) for r in self.requests if not r.equal]

    def total(self, key: str, which: str = "measured", first: bool = False) -> int:
        per = [getattr(r, which)[key] for r in self.requests]
        return sum(per if first else per[1:])

    def to_dict(self) -> dict:
        return {"template": self.template, "equal": self.equal, "requests_checked": len(self.requests),
                "delimiters": [list(d) for d in self.delimiters],
                "processed_after_first": self.total("n_processed"),
                "full_reprocess": [r.index for r in self.requests if r.measured["full_reprocess"]],
                "mismatches": self.mismatches(), "requests": [r.to_dict() for r in self.requests]}


def server_settings_args(settings) -> list[str]:
    """llama-server's flags for the batch and checkpoint rules of `settings` (a `PrefillSettings`)."""
    return ["-b", str(settings.n_batch), "-ub", str(settings.n_ubatch), "-ctxcp", str(settings.max_checkpoints),
            "-cms", str(settings.checkpoint_min_step)]


def check_resume(server, template, session, *, tokenizer, delimiters, settings, memory=None, max_tokens: int = 1,
                 seed: int = 0) -> ResumeCheck:
    """Predict each request of `session` on `server` (started with `server_settings_args(settings)`,
    `-lv 4` or more, one slot, the template as its chat template), then send them and compare.

    `tokenizer`: the server model's vocabulary (BOS added as the model adds it); `delimiters`: the
    server's (role, text) list for the template; `memory`: the model's (default: a sliding window of
    512, the tiny model's).
    """
    if max_tokens != 1:
        raise InputError("check_resume predicts what the slot holds only with max_tokens 1 (no generated token decoded)")
    memory = memory or MemoryModel.swa(512, settings.n_ubatch)
    prompts = server_renders(server, session)
    predicted = predict_requests(prompts, tokenizer, delimiters, settings, memory)
    served = drive_session(server, session, max_tokens=max_tokens, seed=seed)
    checks = tuple(RequestCheck(k, p, _measured(s)) for k, (p, s) in enumerate(zip(predicted, served)))
    return ResumeCheck(template.name, checks, tuple(delimiters))


def server_renders(server, session) -> list[str]:
    """Each request of `session` as `server` renders it (`/apply-template`, with the generation
    prompt, as the chat endpoint renders it: the same `oaicompat_chat_params_parse`)."""
    return [server.post_for("/apply-template", b, "prompt", timeout=120) for b in request_bodies(session)]


def request_bodies(session) -> list[dict]:
    """Each request's messages and tools, as `drive_session` sends them (for `/apply-template`)."""
    messages = [dict(m) for m in session.messages]
    out = []
    for n, _ in request_points(messages):
        body: dict = {"messages": messages[:n]}
        if session.tools:
            body["tools"] = [dict(t) for t in session.tools]
        out.append(body)
    return out


def predict_requests(prompts, tokenizer, delimiters, settings, memory) -> list[dict]:
    """The turns study's llama-server setting over `prompts` (the server's renders), with the
    (role, text) `delimiters` the server is given, per request as `_measured` reads the log."""
    ids = [(role, tokenizer.tokenize(text, add_bos=False)) for role, text in delimiters]
    sim = ServerSimulation(memory, settings)
    out = []
    for prompt in prompts:
        tokens = tokenizer.tokenize(prompt, add_bos=True)
        r = sim.resume(tokens, server_split(tokens, ids), ServerGated())
        out.append({"n_prompt": r.n_prompt, "n_reused": r.n_reused, "n_processed": r.n_recomputed,
                    "batch_starts": list(r.batch_starts), "checkpoints_created": list(r.checkpoints),
                    "checkpoint_restored": r.restored, "full_reprocess": r.full_reprocess})
    return out


def _measured(served) -> dict:
    p = served.prefill
    restored = list(p.checkpoints_restored or ())
    return {"n_prompt": served.n_prompt, "n_reused": served.n_reused, "n_processed": served.n_processed,
            "batch_starts": list(p.batch_starts), "checkpoints_created": list(p.checkpoints_created or ()),
            "checkpoint_restored": restored[-1] if restored else None, "full_reprocess": bool(p.full_reprocess)}



def send_completions(server, prompts, delimiters, *, log_wait_s: float = 30) -> list[dict]:
    """Send each of `prompts` (texts) to `server`'s `/completion` with `message_delimiters`
    (a client that renders the prompt itself and gives tmplkit's delimiters), one token generated
    (so the slot holds the prompt alone, as in `check_resume`); per request as `_measured` reads
    the log."""
    head = server.log_text()
    out = []
    for k, prompt in enumerate(prompts):
        body = {"prompt": prompt, "message_delimiters": [{"role": r, "delimiter": d} for r, d in delimiters],
                "cache_prompt": True, "n_predict": 1, "seed": 0}
        mark = len(server.log_text())
        answer = server.post("/completion", body)
        task = read_server_log(head + _task_lines(server, mark, log_wait_s), f"{server.log} (request {k})").tasks[-1]
        timings = answer.get("timings") or {}
        served = ServedRequest(k, 0, int(answer.get("tokens_evaluated", task.n_prompt or 0)),
                               int(timings.get("cache_n", task.n_reused or 0)), int(timings.get("prompt_n", task.n_processed or 0)),
                               task)
        out.append(_measured(served))
    return out
