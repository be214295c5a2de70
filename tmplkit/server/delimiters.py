"""The message delimiters llama-server's chat endpoint uses for a template, read off the real
server, and how they compare with tmplkit's.

Where the pinned llama.cpp (llama-cpp-python 0.3.36) decides them: `/v1/chat/completions` renders
the messages with `common_chat_templates_apply` and copies its `message_delimiters` into the task
(tools/server/server-common.cpp:1410); the task's tokens are split with them
(tools/server/server-context.cpp:4286-4302, `common_chat_msg_delimiters::split`, common/chat.cpp:
153-185: each delimiter tokenized on its own, the first in list order that matches at a token
wins). Only user starts act: a batch ends and a checkpoint may be taken there (server-context.cpp:
3501-3538, 3569-3616). The delimiters come from one of two places:

- a specialized handler, chosen by markers in the template's source (common/chat.cpp:1090-1170,
  `common_chat_try_specialized_template`; the log says `Using specialized template: NAME` at
  `-lv 5`), with hard-coded delimiters: Qwen3-Coder/Qwen3.5/Nemotron 3 Nano
  (common/parsers/qwen3-coder.cpp:32-38, a tool delimiter `<|im_start|>user\\n<tool_response>`),
  gpt-oss (gpt-oss.cpp:34-40), Cohere2 MoE (cohere2moe.cpp:57-62), Kimi K3, Ling 3, MiniCPM5,
  MiniMax M3, Muse Glimmer, DeepSeek, Gemma 4; the other handlers (LFM2, Ministral 3, Functionary
  v3.2, Kimi K2, GigaChat 3) set none. No log line prints these lists.
- otherwise the differential autoparser (common/chat.cpp:1335-1349): its `assistant_start` and
  `user_start` (common/chat-diff-analyzer.cpp:347-458, after the per-family workarounds, 60-175),
  which it logs at `-lv 5` as `user_msg_start: ...` and `assistant_msg_start: ...`
  (chat-diff-analyzer.cpp:271-272).

So the text is read from the log where the server prints it, and the positions from what the
server does: on a model that needs checkpoints (the tiny sliding-window model) and with
`--checkpoint-min-step 0`, the server ends a prompt batch at every user start it finds
(server-context.cpp:3530-3538) and logs where each batch starts (`cached n_tokens = C`,
server-context.cpp:3423). The probe is tmplkit's round-trip conversation of the template (unique
contents per message), sent to `/v1/chat/completions`; its render comes from `/apply-template`
(the same `oaicompat_chat_params_parse`). Two batch ends are not user starts: n - 4 - n_ubatch
and n - 4 (3540-3559, PR 20288); they move with the prompt's length, so the probe is sent again
without the generation prompt and without its last message, and a position in those two counts
only where a shorter prompt with the same text there starts a user message there too. Position 0 is always a batch start, so a user start there
cannot be seen.

    >>> d = server_delimiters(load_one("Qwen3.5-4B.jinja"), binary)          # doctest: +SKIP
    >>> d.handler, [(s.message, s.role) for s in d.user_starts][:3]          # doctest: +SKIP
    ('Qwen3-Coder', [(1, 'user'), (3, 'user'), (5, 'tool')])
    >>> compare_delimiters(d, analyze(template)).verdict                      # doctest: +SKIP
    'tool results taken for user messages'

The comparison with tmplkit's delimiters is `tmplkit.server.delimiter_comparison`; the byte model
the probe runs on by default is `tmplkit.prefill.bytemodel`.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis import analyze
from ..errors import ModelError
from ..prefill import tiny_model_path
from ..prefill.bytemodel import byte_model_path
from ..prefill.models import resolve_model
from ..tokens.roundtrip import vocab_for_template
from ..tokens.tokenizers import LlamaCppTokenizer
from .chat_session import _task_lines
from .log import ANSI, read_server_log
from .process import MessageDelimiter, ServerRefused, TemplateRefused, check_server_model, start_with_template
from .process import log_path as log_file

__all__ = ["ServerDelimiters", "ServerStart", "message_opener", "probe_model", "server_delimiters"]


_N_UBATCH = 512
_SERVER_ARGS = ("--jinja", "--no-prefill-assistant", "-c", "16384", "-b", "16384", "-ub", str(_N_UBATCH), "-np", "1",
                "-t", "1", "-tb", "1", "--no-warmup", "--cache-ram", "0", "-ctxcp", "256", "-cms", "0", "-lv", "5")
_MARKER = re.compile(r"Kq[A-Z0-9]+Zx")  # the round trip's content markers (tmplkit.analysis.probes)
_PREFIX = r"(?:[\d.]+ [A-Z] )?"  # llama.cpp's log prefix (time and level), when it is on
_SPECIALIZED = re.compile(r"Using specialized template: ([^\n]+)")
_AUTOPARSER = re.compile(r"using differential autoparser")
_AUTO_STARTS = re.compile(r"user_msg_start: (.*?)\n" + _PREFIX + r"assistant_msg_start: (.*?)\n" + _PREFIX + "reasoning_mode:",
                          re.DOTALL)


@dataclass(frozen=True)
class ServerStart:
    """A user start llama-server found in the probe: its token position and the message it opens
    (the message whose content comes first after it), with that message's role."""

    pos: int
    message: int | None
    role: str | None

    def to_dict(self) -> dict:
        return {"pos": self.pos, "message": self.message, "role": self.role}


@dataclass(frozen=True)
class ServerDelimiters:
    """What llama-server's chat endpoint does with a template's messages.

    `status`: "ok", "refused" (the server would not start with the template, though it starts
    without it, or answered the probe with an error: `error`), "unplaced" (its prompt tokenizes
    here to another length than the server counted) or "unrendered" (tmplkit has no round-trip
    conversation for it); a server or model that cannot serve raises instead. `route`:
    "specialized" (`handler` names it; its delimiters are not logged: `delimiters` is None) or
    "autoparser" (`delimiters` as the log prints them, in the server's order). `user_starts`: where
    the server started a user message on the probe; `undecided`: positions that could not be told
    from its end-of-prompt batches. `messages` are the probe's (roles only in `to_dict`).
    """

    template: str
    status: str
    vocab: str
    route: str | None = None
    handler: str | None = None
    delimiters: tuple[MessageDelimiter, ...] | None = None
    user_starts: tuple[ServerStart, ...] = ()
    undecided: tuple[int, ...] = ()
    n_tokens: int | None = None
    first_token_chars: int = 0  # characters of the prompt's first token: a start there is never a batch break
    prompt: str = field(default="", repr=False)
    messages: tuple = field(default=(), repr=False)
    error: str | None = None

    def to_dict(self) -> dict:
        return {"template": self.template, "status": self.status, "vocab": self.vocab, "route": self.route,
                "handler": self.handler,
                "delimiters": None if self.delimiters is None else [d.to_dict() for d in self.delimiters],
                "user_starts": [s.to_dict() for s in self.user_starts], "undecided": list(self.undecided),
                "n_tokens": self.n_tokens, "roles": [m.get("role") for m in self.messages], "error": self.error}


def probe_model(template, spec: str | os.PathLike = "bytes") -> tuple[str, Path]:
    """(vocab, model) the probe runs on, for `spec`:

    - "bytes" (the default): the tiny model with a vocabulary of single bytes (`byte_model_path`),
      where every delimiter, tokenized on its own, matches wherever its text occurs: what the
      server's delimiters do to the template's text, whatever the model;
    - "family": the tiny model of the template's family vocabulary from the corpus
      (`vocab_for_template`), else Qwen3.5's: what tokenizing changes on that vocabulary;
    - a model (`gemma`, `tiny:VOCAB` or a GGUF path): yours; it must need checkpoints
      (sliding-window, hybrid or recurrent), or the server ends no batch at a user message.
    """
    if str(spec) == "bytes":
        return "bytes", byte_model_path()
    if str(spec) == "family":
        vocab = vocab_for_template(getattr(template, "name", "")) or "qwen35"
        return vocab, tiny_model_path(vocab, "default" if vocab == "qwen35" else None)

    path = resolve_model(spec)
    return path.name, path


def server_delimiters(template, binary, model: str | os.PathLike = "bytes", *, analysis=None,
                      log_dir=None, startup_s: float = 120, request_s: float = 300) -> ServerDelimiters:
    """Start llama-server `binary` with `template` (`--jinja --chat-template-file`) on `model`
    (see `probe_model`: by default the tiny byte-vocabulary model), send it the template's
    round-trip conversation, and read which delimiters it took and where it started user messages.

    Its log goes to `log_dir` (default: a temporary folder, removed). A server that cannot run,
    cannot load the model (`check_server_model` first), is not ready within `startup_s` seconds or
    does not answer a request within `request_s` raises ModelError (nothing was read); only the
    template's own refusal is a "refused" result.
    """
    if analysis is None:
        analysis = analyze(template)
    name = getattr(template, "name", "")
    vocab, model = probe_model(template, model)
    check_server_model(model)
    rt = analysis.round_trip
    if rt is None or not rt.messages:
        why = "; ".join((rt.problems if rt is not None else analysis.errors)[:1]) or "no round trip"
        return ServerDelimiters(name, "unrendered", vocab, error=f"tmplkit has no round-trip conversation for it ({why})")
    messages = tuple(rt.messages)
    asked = _ask(template, binary, model, _probe_body(rt), log_dir, startup_s, request_s)
    if isinstance(asked, str):
        return ServerDelimiters(name, "refused", vocab, messages=messages, error=asked)
    return _placed(name, vocab, model, messages, *asked)


def _probe_body(rt) -> dict:
    """The chat request of the round-trip conversation `rt`, as a client sends it (its tools and
    template kwargs in their fields; one token generated, nothing cached)."""
    kwargs = dict(rt.render_kwargs)
    tools = kwargs.pop("tools", None)
    kwargs.pop("add_generation_prompt", None)
    body: dict = {"messages": list(rt.messages), "max_tokens": 1, "cache_prompt": False, "seed": 0}
    if tools is not None:
        body["tools"] = tools
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return body


def _ask(template, binary, model, body: dict, log_dir, startup_s: float, request_s: float):
    """Start the server with `template` and send it `body`, then the same shorter (without the
    generation prompt, then without the last message): (log, task, prompt, [(task, prompt) of
    each shorter one it answered]), or the server's refusal as a string."""
    with tempfile.TemporaryDirectory(prefix="tmplkit-server-delims-") as tmp:
        path = Path(tmp) / "template.jinja"
        path.write_text(template.text, encoding="utf-8")
        log_path = log_file(log_dir or tmp, getattr(template, "name", ""))
        try:
            server = start_with_template(binary, model, _SERVER_ARGS, path, log=log_path, startup_s=startup_s,
                                         keep_log=log_dir is not None)
        except TemplateRefused as exc:
            return exc.reason
        with server:
            head = server.log_text()
            try:
                seg, task, prompt = _probe(server, head, dict(body, add_generation_prompt=True), log_path, request_s)
            except ServerRefused as exc:  # its error answer to the probe (no answer at all: raised)
                return str(exc)
            others = []
            for other in (dict(body, add_generation_prompt=False), dict(body, messages=body["messages"][:-1])):
                try:
                    others.append(_probe(server, head, other, log_path, request_s)[1:])
                except ServerRefused:
                    pass
    return seg, task, prompt, others


def _placed(name: str, vocab, model, messages: tuple, seg_a, task_a, prompt_a: str, others) -> ServerDelimiters:
    """Where the server started user messages in its prompt `prompt_a` (`task_a`'s batches),
    placed on the messages by tokenizing the prompt here as the server did."""
    route, handler, delims = _route(seg_a)
    n_a = task_a.n_prompt or 0
    tok = LlamaCppTokenizer(model)
    try:
        ids_bos = tok.tokenize(prompt_a, add_bos=True)
        _, offsets = tok.tokenize_with_offsets(prompt_a)
    finally:
        tok.close()
    if len(ids_bos) != n_a:
        return ServerDelimiters(name, "unplaced", vocab, route, handler, delims, messages=messages, n_tokens=n_a,
                                prompt=prompt_a, error=f"the render tokenizes to {len(ids_bos)} tokens here, the server "
                                                       f"counted {n_a}: cannot place its starts")
    bos = len(ids_bos) - len(offsets)
    opener = message_opener(prompt_a, messages)
    starts, undecided = _user_starts(task_a, prompt_a, others, lambda p: _char_at(offsets, p - bos, len(prompt_a)), opener)
    found = []
    for p in sorted(starts):
        msg = opener(_char_at(offsets, p - bos, len(prompt_a)))
        found.append(ServerStart(p, msg, messages[msg].get("role") if msg is not None else None))
    # position 0 starts the first batch whatever it is; with a BOS token there, the prompt's text is all visible
    first = offsets[0][1] if offsets and bos == 0 else 0
    return ServerDelimiters(name, "ok", vocab, route, handler, delims, tuple(found), tuple(sorted(undecided)), n_a,
                            first, prompt_a, messages)


def _probe(server, head: str, body: dict, log_path: Path, request_s: float):
    """Send `body` to the chat endpoint; (its log, its task, its prompt from /apply-template)."""
    mark = len(server.log_text())
    try:
        server.post("/v1/chat/completions", body, timeout=request_s, longer="--request-timeout")
        segment = _wait_task(server, mark, 30)
    except ServerRefused as exc:
        # the answer failed, but the prompt may have been prefilled (the tiny model's random token
        # need not parse in the template's format): its log says
        try:
            segment = _wait_task(server, mark, 5)
        except ModelError:
            raise exc from None
    prompt = server.post_for("/apply-template", {k: v for k, v in body.items() if k not in ("max_tokens", "seed", "cache_prompt")},
                         "prompt", timeout=request_s, longer="--request-timeout")
    return segment, read_server_log(head + segment, str(log_path)).tasks[-1], prompt


def _user_starts(task, prompt: str, others, char_at, opener) -> tuple[set[int], list[int]]:
    """The user starts of the probe's task: its batch starts but the first, less the two near the
    prompt's end (n - 4 - n_ubatch, n - 4), unless a shorter prompt that has the same text there
    (`others`: (task, prompt)) shows the position as a user start of its own, or as none. One of
    those two after the last message's content opens no message: it is left out."""
    near = set(task.near_end)
    batch = set(task.batch_starts[1:])
    starts = batch - near
    undecided = []
    for p in sorted(batch & near):
        c = char_at(p)
        verdict = None
        for other, text in others:
            shared = len(os.path.commonprefix([prompt, text]))
            if other.n_prompt is None or p >= other.n_prompt or c + 32 > shared or p in set(other.near_end):
                continue
            verdict = p in set(other.batch_starts[1:])
            break
        if verdict is None and opener(c) is not None:
            undecided.append(p)
        elif verdict:
            starts.add(p)
    return starts, undecided


def _char_at(offsets, i: int, end: int) -> int:
    return offsets[i][0] if 0 <= i < len(offsets) else end


def _wait_task(server, mark: int, wait_s: float) -> str:
    return _task_lines(server, mark, wait_s)


def _route(segment: str) -> tuple[str | None, str | None, tuple[MessageDelimiter, ...] | None]:
    """Which way the chat endpoint took for the request, and the delimiters where it logs them."""
    text = ANSI.sub("", segment)
    m = _SPECIALIZED.search(text)
    if m is not None:
        return "specialized", m.group(1).strip(), None
    if _AUTOPARSER.search(text):
        a = _AUTO_STARTS.search(text)
        if a is None:
            return "autoparser", None, None
        user, assistant = a.group(1), a.group(2)
        # chat.cpp:1341-1347: the assistant start first, then the user start, each only when found
        out = [MessageDelimiter(role, d) for role, d in (("assistant", assistant), ("user", user)) if d]
        return "autoparser", None, tuple(out)
    # one specialized handler logs no line: Gemma 4's (common/chat.cpp:1193-1201)
    return "specialized", None, None


def message_opener(text: str, messages: Sequence[dict]):
    """A function: a character offset -> the index of the message whose content marker comes
    first at or after it (None: none does)."""
    owner: dict[str, int] = {}
    for i, message in enumerate(messages):
        for mark in _MARKER.findall(json.dumps(message)):
            owner.setdefault(mark, i)
    seen: dict[str, int] = {}
    for found in _MARKER.finditer(text):
        seen.setdefault(found.group(0), found.start())
    firsts = sorted((at, owner[mk]) for mk, at in seen.items() if mk in owner)
    ats = [a for a, _ in firsts]

    def opener(c: int) -> int | None:
        k = bisect.bisect_left(ats, c)
        return firsts[k][1] if k < len(firsts) else None

    return opener
