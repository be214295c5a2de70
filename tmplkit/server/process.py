"""What llama-server takes: tmplkit's delimiters in a `/completion` request, and the server itself.

llama-server (the pinned llama.cpp, tools/server/server-context.cpp) reads from a `/completion`
request body `prompt` (a string it tokenizes with BOS and special tokens parsed, or token ids),
`cache_prompt` (keep the prompt's memory for the next request; default true) and
`message_delimiters`: a list of `{"role": ..., "delimiter": ...}` objects (common/chat.cpp,
`common_chat_msg_delimiters_parse`; a role other than system, user, assistant or tool counts as
none). It tokenizes each delimiter on its own (`common_tokenize(vocab, delimiter, false, true)`),
splits the prompt's tokens with them, the first delimiter in list order winning at a position,
and ends a prompt batch, and takes a context checkpoint, only at user-message starts.

tmplkit gives it the text of each delimiter's token-checked ids (`TokenDelimiters.message_delimiters`),
longest first, after checking that the server, tokenizing each on its own, gets those very ids:

    >>> req = completion_request(load_one("Qwen3.5-4B.jinja"), load_tokenizer("vocab:qwen35"), "chat.json")  # doctest: +SKIP
    >>> requests.post(url + "/completion", json=req.to_dict())                                            # doctest: +SKIP

`LlamaServer` starts a llama-server binary (built by scripts/build_llama_server.sh) on loopback,
and `read_prefill_log` reads where it started each prompt batch and took each checkpoint from its
log at `-lv 5`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..delimiters import ROLES, text_matches
from ..environment import llama_server_override
from ..errors import AnalysisError, InputError, ModelError
from ..sources.corpus import LLAMA_CPP_PYTHON_VERSION, cache_root

__all__ = ["BUILD_HINT", "CompletionRequest", "LlamaServer", "MessageDelimiter", "PrefillLog", "completion_request",
           "llama_server_binary", "message_delimiters", "read_prefill_log", "server_message_starts"]


@dataclass(frozen=True)
class MessageDelimiter:
    """One entry of llama-server's `message_delimiters`."""

    role: str
    delimiter: str

    def to_dict(self) -> dict:
        return {"role": self.role, "delimiter": self.delimiter}


@dataclass(frozen=True)
class CompletionRequest:
    """A llama-server `/completion` request body; `to_dict()` is the JSON to POST, nothing else."""

    prompt: str
    message_delimiters: tuple[MessageDelimiter, ...]
    cache_prompt: bool = True
    n_predict: int | None = None  # None: the server's default

    def to_dict(self) -> dict:
        body: dict = {"prompt": self.prompt, "message_delimiters": [d.to_dict() for d in self.message_delimiters],
                      "cache_prompt": self.cache_prompt}
        if self.n_predict is not None:
            body["n_predict"] = self.n_predict
        return body


def message_delimiters(template, tokenizer, *, analysis=None) -> tuple[MessageDelimiter, ...]:
    """The template's delimiters as llama-server's `message_delimiters`, for clients that render
    the prompt themselves.

    They are the text of the ids tmplkit derived and checked on the template's probe render
    (`token_delimiters`), longest first in tokens (llama-server takes the first that matches),
    for the roles llama-server knows (system, user, assistant, tool).
    Raises AnalysisError when those ids do not split the probe render as its text, or when a
    delimiter's text tokenizes on its own (as llama-server tokenizes it) to other ids.

    >>> [d.to_dict() for d in message_delimiters(load_one("Qwen3.5-4B.jinja"), load_tokenizer("vocab:qwen35"))][:1]  # doctest: +SKIP
    [{'role': 'tool', 'delimiter': '<|im_start|>user\\n<tool_response'}]
    """
    # Here, not at the top: `import tmplkit.server.process` (LlamaServer, the binary's path, the
    # prefill log) needs neither Jinja nor numpy, which these two functions bring.
    from ..analysis import analyze
    from ..tokens.delimiter_ids import token_delimiters

    if analysis is None:
        analysis = analyze(template)
    name = getattr(template, "name", "")
    td = token_delimiters(analysis, tokenizer)
    if not td.passed:
        raise AnalysisError(f"template '{name}': its delimiters do not split the tokens as the text "
                            f"({'; '.join(td.problems[:2])}); llama-server cannot be given them as text")
    out: list[tuple[int, MessageDelimiter]] = []
    # llama-server knows the four message roles only (common_chat_role_from_string); a reasoning
    # delimiter would start a span of no role there, which decides nothing: left out.
    for d in (d for d in td.delimiters if d.role in ROLES):
        for ids, text in zip((d.ids,) + d.alternatives, (d.token_text,) + d.alternative_texts):
            alone = tuple(tokenizer.tokenize(text, add_bos=False))
            if d.occurrences and alone != ids:
                raise AnalysisError(
                    f"template '{name}': the {d.role} delimiter {text!r} tokenizes on its own to {list(alone)}, "
                    f"not to the ids checked in context {list(ids)}; llama-server takes text only, so give "
                    "the token ids to a runner that takes ids (tmplkit prefill)")
            out.append((len(alone), MessageDelimiter(d.role, text)))
    out.sort(key=lambda x: -x[0])  # stable: ties keep tmplkit's order
    return tuple(m for _, m in out)


def completion_request(template, tokenizer, conversation, *, analysis=None, add_generation_prompt: bool = True,
                       cache_prompt: bool = True, n_predict: int | None = None) -> CompletionRequest:
    """The `/completion` body for `conversation`: its render (`session.render_conversation`),
    tmplkit's delimiters and `cache_prompt`.

    `conversation` is a `Conversation` or anything `load_conversation` takes. Raises
    AnalysisError when llama-server, splitting this prompt with these delimiters, would not find
    the message starts that splitting its text finds.
    """
    from ..analysis import analyze  # not at the top: see message_delimiters
    from ..session import Conversation, load_conversation, render_conversation

    if n_predict is not None and n_predict < -1:  # llama-server: -1 generates until the model stops
        raise InputError(f"n_predict must be -1 (until the model stops), 0 or more, got {n_predict}")
    if not isinstance(conversation, Conversation):
        conversation = load_conversation(conversation)
    if analysis is None:
        analysis = analyze(template)
    delims = message_delimiters(template, tokenizer, analysis=analysis)
    prompt = render_conversation(template, conversation, add_generation_prompt=add_generation_prompt)
    problem = _split_problem(prompt, analysis.delimiters, delims, tokenizer)
    if problem:
        raise AnalysisError(f"template '{getattr(template, 'name', '')}': on this conversation {problem}")
    return CompletionRequest(prompt, delims, cache_prompt, n_predict)


def _split_problem(prompt: str, text_delimiters, delims: Sequence[MessageDelimiter], tokenizer) -> str | None:
    """None when llama-server, splitting the prompt's tokens with `delims`, starts a user message
    exactly where the text split does: at the token where the user delimiter starts, or inside it
    (ids cut back to the tokens wholly inside it). Only user starts decide its batches and
    checkpoints, so other roles are not checked (its split may find more of them than tmplkit's,
    since it moves on one token after a match)."""
    expected = [(at, at + len(d.text)) for at, d in text_matches(prompt, text_delimiters) if d.role == "user"]
    ids, offsets = tokenizer.tokenize_with_offsets(prompt)
    got = [offsets[pos][0] for role, pos in server_message_starts(ids, delims, tokenizer) if role == "user"]
    if len(got) != len(expected):
        return f"llama-server would find {len(got)} user-message starts, the text has {len(expected)}"
    for (lo, hi), at in zip(expected, got):
        if not lo <= at < hi:
            return f"llama-server would start the user message at character {lo} at character {at}"
    return None


def server_message_starts(ids: Sequence[int], delims: Sequence[MessageDelimiter], tokenizer) -> list[tuple[str, int]]:
    """(role, token position) of each message start llama-server finds in `ids`.

    Its algorithm (common/chat.cpp, `common_chat_msg_delimiters::split`): each delimiter tokenized
    on its own; at each position the first delimiter in list order that matches wins; the scan
    then moves on by one token (not past the match).
    """
    by_first: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for d in delims:  # grouped by first id, in list order
        seq = tuple(tokenizer.tokenize(d.delimiter, add_bos=False))
        if seq:
            by_first.setdefault(seq[0], []).append((d.role, seq))
    out = []
    n = len(ids)
    for i, t in enumerate(ids):
        for role, seq in by_first.get(t, ()):
            if i + len(seq) <= n and tuple(ids[i:i + len(seq)]) == seq:
                out.append((role, i))
                break
    return out


# ---------------------------------------------------------------------------------------------
# The server process


# What to do when there is no llama-server: the build script lives in the repository, not in the
# installed package, so the hint says where to get it as well as how to give another binary.
BUILD_HINT = ("give --server PATH (or set TMPLKIT_LLAMA_SERVER) to a llama-server binary, or build the pinned one "
              "from a checkout of the tmplkit repository: make llama-server")


def llama_server_binary(version: str | None = None) -> Path | None:
    """The llama-server scripts/build_llama_server.sh built ($TMPLKIT_LLAMA_SERVER wins), or None.

    `version`: another pinned llama-cpp-python release (`tmplkit.server.pins`), built by
    `scripts/build_llama_server.sh VERSION`; $TMPLKIT_LLAMA_SERVER stands for the default one only.
    """
    env = llama_server_override() if version in (None, LLAMA_CPP_PYTHON_VERSION) else None
    built = cache_root() / f"llama-server-{version or LLAMA_CPP_PYTHON_VERSION}" / "build" / "bin" / "llama-server"
    path = env or built
    return path if path.is_file() and os.access(path, os.X_OK) else None


class LlamaServer:
    """A llama-server process on 127.0.0.1, started by us, its output in `log`; a context manager.

    >>> with LlamaServer(binary, model, ["-c", "8192"], log=Path("server.log")) as srv:   # doctest: +SKIP
    ...     srv.post("/completion", req.to_dict())
    """

    def __init__(self, binary: str | os.PathLike, model: str | os.PathLike | None, args: Sequence[str] = (), *,
                 log: str | os.PathLike, startup_s: float = 300):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log)
        self._log_file = self.log.open("w")
        # model None: no -m, llama-server is a router (--models-dir in `args`; server.cpp's is_router_server)
        model_args = ["-m", os.fspath(model)] if model is not None else []
        cmd = [os.fspath(binary), *model_args, "--host", "127.0.0.1", "--port", str(self.port), *args]
        try:
            self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT)
        except OSError as exc:
            self._log_file.close()
            raise ModelError(f"{os.fspath(binary)}: cannot run llama-server ({exc.strerror or exc}); {BUILD_HINT}") from None
        try:
            self._wait_ready(startup_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, startup_s: float) -> None:
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ModelError(f"llama-server exited with code {self.proc.returncode} at start; see {self.log}")
            try:
                if self.get("/health").get("status") == "ok":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        raise ModelError(f"llama-server did not answer /health within {startup_s:.0f} s; see {self.log}")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict, timeout: float = 3600) -> dict:
        """POST `body` as JSON; the JSON answer. A refusal (HTTP 4xx/5xx) raises ModelError with its message."""
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise ModelError(f"llama-server refused {path} (HTTP {exc.code}): {str(detail)[:500]}") from None

    def metrics(self) -> dict[str, float]:
        """The Prometheus counters of /metrics (the server must run with --metrics)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.split()[:2]
                out[key] = float(value)
        return out

    def log_text(self) -> str:
        self._log_file.flush()
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Reading what the server did from its log


@dataclass(frozen=True)
class PrefillLog:
    """Where llama-server started each prompt batch, took each context checkpoint and restored one
    (token positions)."""

    batch_starts: tuple[int, ...]
    checkpoints: tuple[int, ...]
    restored: tuple[int, ...] = ()

    def breaks(self, n_batch: int, n_tokens: int) -> tuple[int, ...]:
        """The positions where a batch ended early: before n_batch tokens, and not at the prompt's end."""
        ends = self.batch_starts[1:] + (n_tokens,)
        return tuple(e for s, e in zip(self.batch_starts, ends) if e - s < n_batch and e < n_tokens)

    def to_dict(self) -> dict:
        return {"batch_starts": list(self.batch_starts), "checkpoints": list(self.checkpoints), "restored": list(self.restored)}


# At -lv 5 the server logs, once per prompt batch, the memory's last position before it
# ("main/do_checkpoint = yes|no, pos_min = A, pos_max = B": the batch starts at B + 1), and at
# -lv 4 each checkpoint it takes or restores ("created context checkpoint ... n_tokens = N",
# "restored context checkpoint (... n_tokens = N", N its position).
_BATCH = re.compile(r"main/do_checkpoint = (?:yes|no), pos_min = -?\d+, pos_max = (-?\d+)")
_CHECKPOINT = re.compile(r"created context checkpoint \d+ of \d+ \(.*?n_tokens = (\d+)")
_RESTORED = re.compile(r"restored context checkpoint \(.*?n_tokens = (\d+)")


def read_prefill_log(text: str) -> PrefillLog:
    """The batch starts, checkpoints and restored checkpoints in a llama-server log (run with
    `-lv 5`), in log order.

    Give the log of one request (the part written after it began).
    """
    return PrefillLog(tuple(int(m.group(1)) + 1 for m in _BATCH.finditer(text)),
                      tuple(int(m.group(1)) for m in _CHECKPOINT.finditer(text)),
                      tuple(int(m.group(1)) for m in _RESTORED.finditer(text)))
