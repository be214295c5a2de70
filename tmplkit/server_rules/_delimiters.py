"""llama-server's own delimiter lists and the spans they find, to compare with tmplkit's.

The chat endpoint gives each task a list of (role, text) delimiters
(tools/server/server-context.cpp:4285-4302): a specialized handler's hard-coded list
(`HANDLER_DELIMITERS`), none for the handlers that set none, or the differential autoparser's
assistant and user starts (common/chat.cpp:1335-1349), which `tmplkit server delimiters` reads
off the server's log. Each text is tokenized on its own (`common_tokenize(vocab, text, false,
true)`, common/chat.cpp:147-151) and the prompt is split by the server's own loop
(`common_chat_msg_delimiters::split`, common/chat.cpp:153-185): at every token the first delimiter
*in list order* that matches there wins, and matching goes on at the next token, not after the
match. Only user starts act (a batch break, maybe a checkpoint).

`load_server_delimiters(path)` reads the lists of a saved `tmplkit server delimiters --format json`;
without one, `server_delimiter_list(template)` knows two families by a marker (the regression's
ChatML and Gemma delimiters).

    >>> server_split([5, 7, 1, 9, 7, 1, 4], [("tool", [7, 1, 9]), ("user", [7, 1])]).starts("user")
    [4]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..sources.templates import ChatTemplate
from ..tokens.spans import Spans

__all__ = ["HANDLER_DELIMITERS", "SAVED_SCHEMA_VERSION", "SERVER_DELIMITERS", "delimiters_of_row", "load_server_delimiters",
           "server_delimiter_list", "server_spans", "server_split"]

Delims = tuple[tuple[str, str], ...]

# The layout of a saved `tmplkit server delimiters --format json` (its `schema_version`).
SAVED_SCHEMA_VERSION = 1

# llama-server's delimiters (its autoparser's user_start / assistant_start, as pinned by the
# vendored llama.cpp's tests/test-chat-auto-parser.cpp), by a marker of the template family:
# what is known without a saved `tmplkit server delimiters` result.
SERVER_DELIMITERS = (
    ("<|im_start|>", (("assistant", "<|im_start|>assistant"), ("user", "<|im_start|>user"))),
    ("<start_of_turn>", (("assistant", "<start_of_turn>model"), ("user", "<start_of_turn>user"))),
)

# The specialized handlers' hard-coded lists, in the server's order, by the name the handler logs
# (`Using specialized template: NAME`; Gemma 4's logs none: None). The handlers that set none
# (Ministral/Magistral Large 3, Functionary v3.2, Kimi K2 Thinking, LFM2, LFM2.5, GigaChatV3) map to ().
HANDLER_DELIMITERS: dict[str | None, Delims] = {
    # common/parsers/qwen3-coder.cpp:32-38
    "Qwen3-Coder": (("assistant", "<|im_start|>assistant"), ("tool", "<|im_start|>user\n<tool_response>"),
                    ("tool", "<|im_start|>tool_response"), ("user", "<|im_start|>user"), ("system", "<|im_start|>system")),
    # gpt-oss.cpp:34-40
    "GPT-OSS": (("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>developer"),
                ("system", "<|start|>system"), ("tool", "<|start|>functions")),
    # cohere2moe.cpp:23-62 (TURN_START + CHATBOT, + USER, + SYSTEM + RESULT_START, + SYSTEM)
    "Cohere2 MoE": (("assistant", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"), ("user", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"),
                    ("tool", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>"),
                    ("system", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>")),
    # kimi-k3.cpp:47-52
    "Kimi K3": (("assistant", '<|open|>message role="assistant"<|sep|>'), ("user", '<|open|>message role="user"<|sep|>'),
                ("tool", '<|open|>message role="tool"'), ("system", '<|open|>message role="system"')),
    # ling3.cpp:41-46
    "Ling 3.0 (Bailing V3)": (("assistant", "<role>ASSISTANT</role>"), ("user", "<role>HUMAN</role>"),
                              ("tool", "<role>OBSERVATION</role>"), ("system", "<role>SYSTEM</role>")),
    # minicpm5.cpp:26-31
    "MiniCPM5": (("assistant", "<|im_start|>assistant"), ("tool", "<|im_start|>user\n<tool_response>"),
                 ("user", "<|im_start|>user"), ("system", "<|im_start|>system")),
    # minimax-m3.cpp:31-37
    "MiniMax-M3": (("assistant", "]~b]ai"), ("user", "]~b]user"), ("tool", "]~b]tool"), ("system", "]~b]developer"),
                   ("system", "]~b]system")),
    # muse-glimmer.cpp:26-31
    "Muse Glimmer": (("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>system"),
                     ("tool", "<|start|>tool")),
    # deepseek.cpp:104-111 (GEN_PROMPT, then the user start)
    "DeepSeek V3.2/V4": (("assistant", "<｜Assistant｜>"), ("user", "<｜User｜>")),
    # gemma4.cpp:166-169
    None: (("user", "<|turn>user"), ("assistant", "<|turn>model")),
    # common/chat.cpp:1098-1170: these set no message_delimiters
    "Ministral/Magistral Large 3": (), "Functionary v3.2": (), "Kimi K2 Thinking": (), "LFM2": (), "LFM2.5": (),
    "GigaChatV3": (),
}


def delimiters_of_row(row: Mapping) -> Delims | None:
    """The server's list for one row of `tmplkit server delimiters --format json` (None: the
    server did not take the template). A row the server took on a route or handler not known here
    raises ValueError, saying which: its list cannot be told."""
    server = row.get("server", row)
    if server.get("status") != "ok":
        return None
    if server.get("route") == "autoparser":
        return tuple((d["role"], d["delimiter"]) for d in server.get("delimiters") or ())
    if server.get("route") == "specialized":
        if server.get("handler") not in HANDLER_DELIMITERS:
            raise ValueError(f"llama-server's handler {server.get('handler')!r} is not known here")
        return HANDLER_DELIMITERS[server.get("handler")]
    raise ValueError(f"the route {server.get('route')!r} is not known here (autoparser, specialized)")


def load_server_delimiters(path: str | Path) -> dict[str, Delims]:
    """Template name -> the server's delimiter list, from a saved `tmplkit server delimiters
    --format json` (templates the server did not take are left out)."""
    from ..jsonio import read_json

    write = "write one with `tmplkit server delimiters SOURCE... --format json -o FILE`"
    try:  # (a pipe, a huge or deeply nested file refused as every JSON input is)
        data = read_json(path, what="a saved `tmplkit server delimiters --format json`")
    except InputError as exc:
        raise InputError(f"{exc}; or {write}") from None
    rows = data.get("results") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("template"), str) for r in rows):
        raise InputError(f"{path}: not a saved `tmplkit server delimiters --format json` (no list of results, each "
                         f"with its template); {write}")
    layout = data.get("schema_version", SAVED_SCHEMA_VERSION)
    if isinstance(layout, bool) or layout != SAVED_SCHEMA_VERSION:  # (true == 1 in Python, not in a layout)
        raise InputError(f"{path}: a saved result of layout {data.get('schema_version')!r}, not this tmplkit's "
                         f"({SAVED_SCHEMA_VERSION}); {write}")
    out = {}
    for row in rows:
        try:
            delims = delimiters_of_row(row)
            _check_written(row.get("server", row).get("delimiters"))
        except ValueError as exc:
            raise InputError(f"{path}: the result of template '{row['template']}': {exc}; {write}") from None
        except (AttributeError, KeyError, TypeError):
            raise InputError(f"{path}: the result of template '{row['template']}' is not as the command writes it "
                             f"(each delimiter a role and a string); {write}") from None
        if delims is not None:
            out[row["template"]] = delims
    return out


def _check_written(delimiters) -> None:
    """A row's `delimiters` as the command writes them: none, or a list of {role, delimiter} strings
    (a TypeError otherwise, whatever the route: one edited by hand is not the server's)."""
    if delimiters is None:
        return
    if not isinstance(delimiters, list) or not all(
            isinstance(d, dict) and isinstance(d.get("role"), str) and isinstance(d.get("delimiter"), str) for d in delimiters):
        raise TypeError


def server_delimiter_list(template: ChatTemplate, known: Mapping[str, Delims] | None = None) -> Delims:
    """llama-server's delimiter list for `template`: from `known` (`load_server_delimiters`) when
    given, else its family's two delimiters (user and assistant start)."""
    if known is not None:
        if template.name in known:
            return tuple(known[template.name])
        raise InputError(f"llama-server's delimiters for template '{template.name}' are not in the saved result; "
                         "run `tmplkit server delimiters` on it")
    for marker, delims in SERVER_DELIMITERS:
        if marker in template.text:
            return delims
    raise InputError(f"llama-server's delimiters for template '{template.name}' are not known here")


def server_split(tokens, delimiters: Sequence[tuple[str, Sequence[int]]]) -> Spans:
    """The server's split of `tokens` by (role, ids) `delimiters` in its list order (module doc)."""
    tok = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens, dtype=np.int64)
    n = len(tok)
    roles = tuple(dict.fromkeys(r for r, _ in delimiters))
    best = np.full(n, len(delimiters), dtype=np.int64)  # per token, the first delimiter in list order matching there
    for prio in range(len(delimiters) - 1, -1, -1):
        seq = np.asarray(delimiters[prio][1], dtype=np.int64)
        if not len(seq) or len(seq) > n:
            continue  # the server adds only non-empty delimiters (chat.cpp:1341-1347; the handlers' are literals)
        c = np.flatnonzero(tok[:n - len(seq) + 1] == seq[0])
        for k in range(1, len(seq)):
            c = c[tok[c + k] == seq[k]]
        best[c] = prio
    pos = np.flatnonzero(best < len(delimiters))
    role_idx = np.array([roles.index(delimiters[p][0]) for p in best[pos]], dtype=np.int8)
    return Spans(n, pos.astype(np.int64), role_idx, roles)


def server_spans(tokens, template: ChatTemplate, tokenizer, known: Mapping[str, Delims] | None = None) -> Spans:
    """The spans llama-server finds: its delimiters, each tokenized on its own, split its way."""
    delims = server_delimiter_list(template, known)
    return server_split(tokens, [(role, tokenizer.tokenize(text, add_bos=False)) for role, text in delims])
