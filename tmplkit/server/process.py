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
log at `-lv 5`. `start_with_template` starts one with a chat template and tells a server or model
that cannot run (an error: nothing was checked) from a template the server refuses (`TemplateRefused`:
a finding); an error answer to a request is `ServerRefused`, a server gone or silent a `ModelError`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._interrupt import hold_sigterm
from ..delimiters import ROLES, text_matches
from ..environment import llama_server_override
from ..errors import AnalysisError, InputError, ModelError, TokenizerError
from ..sources.corpus import LLAMA_CPP_PYTHON_VERSION, cache_root
from .log import ANSI

__all__ = ["BUILD_HINT", "LOG_PREFIX", "CompletionRequest", "LlamaServer", "MessageDelimiter", "PrefillLog", "ServerExited",
           "ServerRefused", "ServerStartError", "TemplateRefused", "check_server_model", "completion_request",
           "llama_server_binary", "log_path", "message_delimiters", "read_prefill_log", "server_log_error", "server_message_starts",
           "start_with_template"]


# llama-server's log of the server started for one template is `llama-server-NAME.log` (`log_path`).
LOG_PREFIX = "llama-server-"


def log_path(folder, name: str) -> Path:
    """The log file in `folder` (`--log-dir`, or a temporary one) of the server started for template
    `name`, the name made fit for a file name; a name this process gave already (two templates of
    one name, from two folders, or two names made alike) gets `-2`, `-3`...: one log never replaces
    another of the same run."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "template"
    path, n = Path(folder) / f"{LOG_PREFIX}{safe}.log", 1
    while path.resolve() in _GIVEN_LOGS:
        n += 1
        path = Path(folder) / f"{LOG_PREFIX}{safe}-{n}.log"
    _GIVEN_LOGS.add(path.resolve())
    return path


_GIVEN_LOGS: set[Path] = set()  # (the log paths `log_path` gave in this process)


def _fresh_log(path: Path):
    """`path` opened for the server's log. A link there, symbolic or hard (another name of some
    file: `llama-server-q.log` -> the template `q.jinja` itself), is replaced by a file of its own,
    not written through: the log replaced the template it was a link to."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
            os.unlink(path)
    return path.open("w")


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
    delimiter's text tokenizes on its own (as llama-server tokenizes it) to other ids; TokenizerError
    when a delimiter's ids decode to text the template does not write (the tokenizer does not
    match the template: its vocabulary cannot spell the delimiter, or normalises it).

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
    if not analysis.delimiters or analysis.status != "pass":
        # (the analysis's own reason, not "no delimiters were given" of the token check; a failed
        # verdict's delimiters misplace some message, an impossible one's prove that none can exist)
        why = analysis.why_not or "it derived none"
        raise AnalysisError(f"template '{name}': no delimiters to give llama-server: its analysis is {analysis.status} "
                            f"({why})")
    td = token_delimiters(analysis, tokenizer)
    if td.mismatch:
        raise TokenizerError(
            f"template '{name}': {td.mismatch}; give the tokenizer of the model that uses this template "
            "(--tokenizer MODEL.gguf, or vocab:NAME of its family)")
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

    if n_predict is not None and not -1 <= n_predict <= 2**31 - 1:  # llama-server: -1 generates until the model stops
        raise InputError(f"n_predict must be -1 (until the model stops) or 0 to {2**31 - 1} (llama-server's int32), "
                         f"got {n_predict}")
    if not isinstance(conversation, Conversation):
        conversation = load_conversation(conversation)
    if analysis is None:
        analysis = analyze(template)
    delims = message_delimiters(template, tokenizer, analysis=analysis)
    prompt = render_conversation(template, conversation, add_generation_prompt=add_generation_prompt)
    from ..session.token_spans import misplaced_messages

    misplaced = misplaced_messages(prompt, conversation.messages, analysis.delimiters)
    problem = (f"{misplaced[0]}, which llama-server would read so too (the template writes it otherwise than its probes)"
               if misplaced else _split_problem(prompt, analysis.delimiters, delims, tokenizer))
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


class ServerRefused(ModelError):
    """llama-server answered a request with an error (HTTP 4xx/5xx): it refused what it was sent.
    `status`: the HTTP status."""

    def __init__(self, message: str, *, status: int):
        super().__init__(message)
        self.status = status


class ServerStartError(ModelError):
    """llama-server did not become ready: not within its time (this class), or it exited (`ServerExited`).
    `problem`: the message without its note on the log."""

    def __init__(self, problem: str, log_note: str):
        super().__init__(f"{problem}; {log_note}")
        self.problem = problem


class ServerExited(ServerStartError):
    """llama-server exited at start, before it was ready. `returncode`; `reason`: its log's error
    line (`server_log_error`), None where it wrote none."""

    def __init__(self, problem: str, log_note: str, *, returncode: int, reason: str | None):
        super().__init__(problem, log_note)
        self.returncode = returncode
        self.reason = reason


class TemplateRefused(ModelError):
    """llama-server exited at start with a chat template and starts without it on the same binary
    and model: it refuses the template. `reason`: its words, from its log."""

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason


class LlamaServer:
    """A llama-server process on 127.0.0.1, started by us, its output in `log`; a context manager.

    `keep_log`: the log stays where it is after the work (False: it goes with a temporary folder,
    so messages quote it instead of pointing at it). Raises ServerExited when the process exits
    before it is ready, ServerStartError when it is not ready within `startup_s` seconds (both
    ModelErrors).

    >>> with LlamaServer(binary, model, ["-c", "8192"], log=Path("server.log")) as srv:   # doctest: +SKIP
    ...     srv.post("/completion", req.to_dict())
    """

    def __init__(self, binary: str | os.PathLike, model: str | os.PathLike | None, args: Sequence[str] = (), *,
                 log: str | os.PathLike, startup_s: float = 300, keep_log: bool = True):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.binary = os.fspath(binary)
        self.log = Path(log)
        self.keep_log = keep_log
        self._log_file = _fresh_log(self.log)
        # model None: no -m, llama-server is a router (--models-dir in `args`; server.cpp's is_router_server)
        model_args = ["-m", os.fspath(model)] if model is not None else []
        cmd = [self.binary, *model_args, "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc: subprocess.Popen | None = None
        try:
            with hold_sigterm():  # (a SIGTERM unwinding from inside Popen would leave the process unknown)
                # a process group of its own: stopping it stops what it started (a wrapper script's children)
                self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            self._wait_ready(startup_s)
        except BaseException as exc:
            self.stop()
            if self.proc is None and isinstance(exc, OSError):
                raise ModelError(f"{self.binary}: cannot run llama-server ({exc.strerror or exc}); {BUILD_HINT}") from None
            raise

    def _wait_ready(self, startup_s: float) -> None:
        deadline = time.monotonic() + startup_s
        said = None  # what /health last answered (None: nothing answered on the port)
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self._exited():
                self.stop()  # (what its process group still holds too)
                reason = self.log_error()
                why = f": {reason}" if reason else ", writing no error"
                problem = f"llama-server {self.binary} exited with code {self.proc.returncode} at start{why}"
                raise ServerExited(problem, self.log_note(), returncode=self.proc.returncode, reason=reason)
            try:
                answer = self.get("/health")
                said = str(answer)[:100]
                if isinstance(answer, dict) and answer.get("status") == "ok":
                    return
            except urllib.error.HTTPError as exc:  # 503 while the model loads
                said = f"HTTP {exc.code}"
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        state = f"its /health still answered {said}" if said is not None else "nothing answered on its port"
        last = self.log_error() or self.log_tail()
        problem = (f"llama-server {self.binary} was not ready within {startup_s:g} s ({state}"
                   f"{f'; its log ends: {last}' if last else ''}); check --server and --model, or raise "
                   "--start-timeout if it is only slow to load")
        raise ServerStartError(problem, self.log_note())

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict, timeout: float = 3600, *, longer: str | None = None) -> dict:
        """POST `body` as JSON; the JSON answer. A refusal (HTTP 4xx/5xx) raises ServerRefused (a
        ModelError) with its message; no answer (the process gone, the connection dropped, the
        time out) raises ModelError; `longer`: the option that allows a slow server more time, named
        where the time ran out."""
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise ServerRefused(f"llama-server refused {path} (HTTP {exc.code}): {str(detail)[:500]}",
                                status=exc.code) from None
        except OSError as exc:  # (URLError, a reset connection, a timeout)
            raise ModelError(self._no_answer(path, exc, timeout, longer)) from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise ModelError(f"llama-server's answer to {path} is not JSON ({raw[:80]!r}): is {self.binary} "
                             "llama-server?") from None
        if not isinstance(answer, dict):  # (every answer tmplkit reads is an object)
            raise ModelError(f"llama-server's answer to {path} is not a JSON object ({raw[:80]!r}): is {self.binary} "
                             "llama-server?")
        return answer

    def post_for(self, path: str, body: dict, key: str, timeout: float = 3600, *, longer: str | None = None) -> str:
        """`post`, and the answer's text under `key` (/apply-template's "prompt"); ModelError, one
        line, where the answer has none (a server that is not llama-server, or another version)."""
        answer = self.post(path, body, timeout=timeout, longer=longer)  # (an object: `post` refuses others)
        value = answer.get(key)
        if not isinstance(value, str):
            raise ModelError(f"llama-server's answer to {path} has no text {key!r} ({json.dumps(answer)[:80]}): is "
                             f"{self.binary} llama-server, of a version that serves {path}?")
        return value

    def _no_answer(self, path: str, exc: OSError, timeout: float, longer: str | None) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + 1  # a server that crashed: its exit code, not only a dropped connection
        while not self._exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._exited():
            self.stop()
        reason = self.log_error()
        why = f" ({reason})" if reason else ""
        if self.proc.returncode is not None:
            return (f"llama-server {self.binary} exited with code {self.proc.returncode} before it answered {path}"
                    f"{why}; nothing was checked; {self.log_note()}")
        cause = getattr(exc, "reason", None) or exc
        if isinstance(cause, TimeoutError):  # (alive, but silent for the whole time allowed)
            more = f"give it longer ({longer}) if it is only slow; " if longer else ""
            return (f"llama-server {self.binary} did not answer {path} within {timeout:g} s{why}; nothing was checked; "
                    f"{more}{self.log_note()}")
        return f"llama-server {self.binary} did not answer {path} ({cause}){why}; nothing was checked; {self.log_note()}"

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
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text(encoding="utf-8", errors="replace")

    def log_error(self) -> str | None:
        """Its log's error line that says why (`server_log_error`), None where it wrote none."""
        if not self._log_file.closed:
            self._log_file.flush()
        return server_log_error(self.log)

    def log_tail(self) -> str | None:
        """Its log's last non-empty line (up to 200 characters), None where it wrote nothing."""
        if not self._log_file.closed:
            self._log_file.flush()
        try:
            lines = [ANSI.sub("", ln).strip() for ln in _read_ends(self.log, 0, _LOG_TAIL).splitlines()]
        except OSError:
            return None
        last = next((ln for ln in reversed(lines) if ln), None)
        return last[:200] if last else None

    def log_note(self) -> str:
        """Where its log is, or, where it goes with a temporary folder, how to keep it."""
        return _log_note(self.log, self.keep_log)

    def stop(self) -> None:
        """SIGINT (llama-server's clean stop), SIGKILL after 30 s; then SIGKILL to what its process group
        still holds (a wrapper script's children), before the process is reaped: until then the
        group's id cannot name another's."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if not self._exited():
                self._signal(signal.SIGINT)
                deadline = time.monotonic() + 30
                while not self._exited() and time.monotonic() < deadline:
                    time.sleep(0.05)
            self._signal(signal.SIGKILL)
            proc.wait()
        self._log_file.close()

    def _exited(self) -> bool:
        """The process has ended; it is not reaped here (`stop` does that)."""
        assert self.proc is not None
        if self.proc.returncode is not None:
            return True
        if not hasattr(os, "waitid"):
            return self.proc.poll() is not None
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped by someone else
            return True

    def _signal(self, sig: int) -> None:
        """`sig` to its process group (it leads one, and is not reaped yet, so the group is its own)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_note(log: Path, keep_log: bool) -> str:
    return f"its log: {log}" if keep_log else "give --log-dir DIR to keep llama-server's log"


# ---------------------------------------------------------------------------------------------
# A server started with a chat template, and the model it is given


# A template every llama-server starts with (a name it knows): the control for one that will not start.
_CONTROL_TEMPLATE = ("--chat-template", "chatml")
_control_problems: dict[tuple, str | None] = {}


def start_with_template(binary, model, args: Sequence[str], template_file: str | os.PathLike, *,
                        log: str | os.PathLike, startup_s: float = 120, keep_log: bool = True) -> LlamaServer:
    """A `LlamaServer` of `binary` on `model` with `args` and `--chat-template-file template_file`.

    Where it exits at start, it is started again without the template (with a plain ChatML one,
    once per binary, model and arguments): where that starts, the server refuses the template
    (`TemplateRefused`, its reason from the log: a finding about the template); where that fails
    too, the server or the model is at fault and nothing about the template was learned: ModelError,
    as for a server that is not ready within `startup_s` seconds.
    """
    try:
        return LlamaServer(binary, model, [*args, "--chat-template-file", os.fspath(template_file)], log=log,
                           startup_s=startup_s, keep_log=keep_log)
    except ServerExited as exc:
        problem = _control_problem(binary, model, tuple(args), startup_s)
        if problem is not None:
            raise ModelError(f"{problem} (with the template and with a plain one: no template was checked); give "
                             f"--server a working llama-server and --model a model it can load ({os.fspath(model)}); "
                             f"{_log_note(Path(log), keep_log)}") from None
        reason = exc.reason or f"it exited with code {exc.returncode} at start and wrote no error"
        raise TemplateRefused(f"llama-server refuses the template at start: {reason}", reason=reason) from None


def _control_problem(binary, model, args: tuple[str, ...], startup_s: float) -> str | None:
    """None where `binary` starts on `model` with `args` and a plain template; else why not."""
    key = (os.fspath(binary), os.fspath(model), args)
    if key not in _control_problems:
        with tempfile.TemporaryDirectory(prefix="tmplkit-server-check-") as tmp:
            try:
                with LlamaServer(binary, model, [*args, *_CONTROL_TEMPLATE], log=Path(tmp) / "llama-server.log",
                                 startup_s=startup_s, keep_log=False):
                    problem = None
            except ServerStartError as exc:
                problem = exc.problem
            except ModelError as exc:  # (it cannot be run at all)
                problem = str(exc)
        _control_problems[key] = problem
    return _control_problems[key]


def check_server_model(model: str | os.PathLike) -> Path:
    """`model` as a llama-server model: a GGUF file (magic, version and header read: GGUFError
    otherwise) that holds weights (InputError for a vocabulary-only GGUF, which llama-server cannot
    load; the first file of a split model may hold none)."""
    from ..sources.gguf_meta import holds_no_weights

    path = Path(model)
    if not path.is_file():
        raise InputError(f"model file not found: {path}; give a GGUF model file")
    if holds_no_weights(path):
        raise InputError(f"{path}: a GGUF with no weights (a vocabulary only): llama-server cannot load it; give a "
                         "model with weights (a GGUF, or a tiny:VOCAB model)")
    return path


_ERROR_LINE = re.compile(r"^(?:[\d.]+ )?E (?:\S+ +\S+: )?(?:\w+: )?(.*)$")
_ABOUT_TEMPLATE = re.compile(r"\btemplate\b", re.IGNORECASE)
_QUOTED = re.compile(r"'[^']*'")  # (a path it quotes may hold the word)


# Bytes of a log read for why a server would not start: its beginning and its end. A server (or
# what --server names) that floods its log must not take the memory and the time of reading it all
# (a `yes` loop held 23 GB before the start timeout was looked at).
_LOG_HEAD = 4 << 20
_LOG_TAIL = 1 << 20


def _read_ends(path: Path, head: int, tail: int) -> str:
    """The first `head` and the last `tail` bytes of `path` (all of it where it is no longer), as
    text; the tail from its first whole line."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= head + tail:
            return f.read(head + tail).decode("utf-8", "replace")
        start = f.read(head)
        f.seek(size - tail)
        end = f.read(tail)
    return (start + b"\n" + end[end.find(b"\n") + 1:]).decode("utf-8", "replace")


def server_log_error(log: str | os.PathLike) -> str | None:
    """Why llama-server would not start, from its log: its first error line about the template (a
    logged one before a bare `error: ...` line, which quotes the template rather than the reason),
    else its first error line, the cause where later ones follow from it (one line, up to 300
    characters); None where there is none, or no log."""
    try:
        text = _read_ends(Path(log), _LOG_HEAD, _LOG_TAIL)
    except OSError:
        return None
    lines = [ANSI.sub("", ln).strip() for ln in text.splitlines()]
    errors: list[tuple[bool, str]] = []  # (a bare `error:` line, its text)
    for i, ln in enumerate(lines):
        m = _ERROR_LINE.match(ln)
        found = m.group(1) if m is not None else ln if ln.startswith("error:") else None  # error: before the log starts
        if found is None:
            continue
        if found.endswith(":"):  # the reason follows on lines of its own (a Jinja error's `Error: ...`)
            found += " " + next((x for x in lines[i + 1:i + 12] if x.startswith("Error:")), "").strip()
        errors.append((m is None, found.strip()))
    about = sorted((e for e in errors if _ABOUT_TEMPLATE.search(_QUOTED.sub("", e[1]))), key=lambda e: e[0])
    chosen = about[0][1] if about else errors[0][1] if errors else None
    return chosen[:300] if chosen else None


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
