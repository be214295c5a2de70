"""Where each request stops matching what the server holds, and why.

Request k+1 is compared with what the server holds after request k (request k and the turn it
generated). The first differing character is the divergence; a server reuses its memory up to
there at most. The cause is read off the renders, never off the template's name, by checks in
this order:

- "date or time": rendering request k+1 at request k's time moves the divergence later;
  "random draw" where the template reads no date and draws at random (the `random` filter,
  `lipsum`: tmplkit seeds a render's draws by its time; transformers draws anew every render);
- "reasoning dropped": the held text has the reasoning of an earlier assistant turn at the
  divergence and the request no longer has it;
- "generation prompt": it lies in request k's generation prompt, i.e. the template renders an
  assistant turn otherwise than the prompt it generated after;
- "tool list": a tool definition lies at the divergence, in either text;
- "tool calls rewritten": it lies in the tool calls of the turn request k generated, which the
  history writes otherwise (Apriel 1.5 adds each call's id);
- "system prompt": the divergence lies in the system message;
- "last user message" / "last tool result": it lies at request k's last message (the template
  renders the newest message otherwise once the model has answered it), or in its newest user
  message as written, tool results after it (the newest query's mark, lost once a newer one comes);
- "answer dropped": the held text has the answer (content) of an earlier assistant turn at the
  divergence and the request no longer has it (a template that keeps an earlier turn's reasoning
  and drops its answer), or the empty answer the generated turn ends with;
- "message dropped": the same for an earlier message of another role (a classifier's template that
  renders only the newest exchange);
- "generation prompt" also where it lies in the markup request k ends with after its last message
  (the turn's close before a prompt, an opening the template always writes), inside no message;
- "template text": it lies in the template's own words before the first message or after request
  k's last, inside no message (a classifier's task line that names the newest message's role, a
  reward model's instructions after the conversation);
- "other": none of these; `held_text` and `request_text` show both texts around it.

With a tokenizer the token ids are compared too, as a server compares them: request k tokenized
whole, the generated turn tokenized on its own (as the model emits it), the next request whole.
Ids can differ before the text does (a merge across the request/turn boundary, or a special
token the model emits where the template writes text): `token_note` says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..markup import UNIT
from ..sandbox import REASONING_KEYS
from ..session import content_text
from ..session.requests import Request, common_prefix
from ..tokens.tokenizers import common_byte_prefix, utf8

__all__ = ["CAUSES", "Divergence", "divergences", "TokenizedRequests", "tokenize_requests"]

CAUSES = ("date or time", "random draw", "reasoning dropped", "generation prompt", "tool list", "system prompt",
          "last user message", "last tool result", "tool calls rewritten", "answer dropped", "message dropped", "template text", "other",
          "token ids")  # (the last: the text matches and the ids do not, set where the token divergence is read)
# Words that name reasoning markup (as the analysis reads them: tmplkit.analysis._reasoning).
_REASONING_WORDS = ("think", "reason", "thought", "analysis")
_BARE_WORD = re.compile(r"[A-Za-z_]+")  # a role or channel name between markup units (`<|channel|>final`)
_NEAR = 256  # characters around a message's text still counted as its rendering (headers, markup)
_SHOW = 60   # characters shown each side of an unexplained divergence


@dataclass(frozen=True)
class Divergence:
    """Request `request` against what the server held after request `request - 1`.

    `position`: the first differing character of the request (== `n_held` when the request
    extends what is held: stable); `token_position`/`n_held_tokens`: the same in token ids, when
    a tokenizer was given.
    """

    request: int
    position: int
    n_held: int
    cause: str = ""
    detail: str = ""
    held_text: str = ""
    request_text: str = ""
    token_position: int | None = None
    n_held_tokens: int | None = None
    token_note: str = ""

    @property
    def stable(self) -> bool:
        text_ok = self.position >= self.n_held
        if not text_ok or self.token_position is None:
            return text_ok
        assert self.n_held_tokens is not None, "token_position and n_held_tokens are set together"
        return self.token_position >= self.n_held_tokens

    def to_dict(self) -> dict:
        return {"request": self.request, "stable": self.stable, "position": self.position, "n_held": self.n_held,
                "cause": self.cause, "detail": self.detail, "held_text": self.held_text,
                "request_text": self.request_text, "token_position": self.token_position,
                "n_held_tokens": self.n_held_tokens, "token_note": self.token_note}


@dataclass(frozen=True)
class TokenizedRequests:
    """Token ids of each request (whole) and of each generated turn (on its own)."""

    requests: tuple[tuple[int, ...], ...] = field(repr=False)
    generated: tuple[tuple[int, ...], ...] = field(repr=False)

    # (not an argument: `replace` with other ids makes it anew instead of sharing stale prefixes)
    _common: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def held(self, k: int) -> tuple[int, ...]:
        return self.requests[k] + self.generated[k]

    def common(self, k: int) -> int:
        """The common prefix of request k and what is held after request k - 1 (k >= 1): the
        divergence in ids, which every simulated setting and the divergences read (computed once)."""
        got = self._common.get(k)
        if got is None:
            # (request k - 1, then its turn, compared in place: `held` copies both, twice a request)
            before, ids = self.requests[k - 1], self.requests[k]
            got = common_prefix(before, ids)
            if got == len(before):
                got += common_prefix(self.generated[k - 1], ids[got:])
            self._common[k] = got
        return got


def tokenize_requests(requests, tokenizer, *, add_bos: bool = False) -> TokenizedRequests:
    """Tokenize every request whole and every generated turn on its own.

    `add_bos` prepends the tokenizer's BOS to a request that does not already start with it (as
    `prefill.build_prompt` does).
    """
    reqs, gens = tokenize_texts([r.text for r in requests], tokenizer, add_bos=add_bos), []
    for r in requests:
        gens.append(_emitted(tokenizer, tokenizer.tokenize(r.generated, add_bos=False)) if r.generated else ())
    return TokenizedRequests(reqs, tuple(gens))


def tokenize_texts(texts, tokenizer, *, add_bos: bool = False, base: tuple[str, Sequence[int]] | None = None,
                   chain: bool = True, pool: list | None = None) -> tuple[tuple[int, ...], ...]:
    """Each text tokenized as a whole would be, with the BOS prepended when `add_bos` and the text
    lacks it.

    A session's texts share their beginnings (request k+1 starts as request k did), so where the
    tokenizer can (`tokenize_after`: llama.cpp's, which splits at special tokens first) each text
    reuses the ids of `base` (text, its ids) or, with `chain`, of the text before it, up to a control
    token they share: tokenizing a session is then linear in its length, not quadratic. `pool`: a
    list the caller keeps between calls, of texts tokenized before (their bytes and ids); each text
    then starts from whichever of those and `base` shares the longest beginning with it (the next
    renders of a request resemble those of the request before more than the request itself, where a
    new user message makes the template drop earlier reasoning), and is added to it."""
    bos = tuple(tokenizer.tokenize("", add_bos=True)) if add_bos else ()
    after = getattr(tokenizer, "tokenize_after", None)
    ref = _base(base, bos)
    out = []
    for text in texts:
        data = utf8(text)
        start = _nearest(data, [ref, *pool]) if pool is not None and after is not None else ref
        ids = tuple(after(text, start)) if after is not None else tuple(tokenizer.tokenize(text, add_bos=False))
        if pool is not None:
            pool.append((data, ids))
            del pool[:-_POOL]
        if chain:
            ref = (data, ids)
        if bos and ids[:len(bos)] != bos:
            ids = bos + ids
        out.append(ids)
    return tuple(out)


_POOL = 8  # texts kept in a `tokenize_texts` pool: a request's next renders and the request before's


def _nearest(data: bytes, bases: Sequence) -> tuple[bytes, Sequence[int]] | None:
    """Of `bases` ((bytes, ids) or None), the one whose bytes share the longest beginning with `data`."""
    best, score = None, -1
    for b in bases:
        if b is not None and (k := common_byte_prefix(data, b[0])) > score:
            best, score = b, k
    return best


def _base(base, bos) -> tuple[bytes, Sequence[int]] | None:
    """`base` (text, ids) as `tokenize_after` takes it: the text's bytes, its ids without a BOS."""
    if base is None:
        return None
    text, ids = base
    return utf8(text), tuple(ids[len(bos):] if bos and tuple(ids[:len(bos)]) == bos else ids)


def _emitted(tokenizer, ids) -> tuple[int, ...]:
    """The generated turn's tokens the server decodes: up to its first end-of-generation token,
    which ends the generation and is never decoded (llama-server releases the slot first; see
    `PrefillRunner.decode_generated`); what the template writes after it, the model never emits."""
    is_eog = getattr(tokenizer, "is_eog", None)  # (a tokenizer.json says nothing of it)
    if is_eog is None:
        return tuple(ids)
    for i, t in enumerate(ids):
        if is_eog(t):
            return tuple(ids[:i])
    return tuple(ids)


def divergences(requests, messages, tools=(), *, redraw=None, tokens: TokenizedRequests | None = None,
                tokenizer=None, draws: bool = False) -> tuple[Divergence, ...]:
    """The divergence of every request after the first.

    `messages`/`tools`: the session's (for the causes); `redraw(k, at)`: request k rendered at the
    time `at` (for the date check; None skips it); `draws`: the time changes only the template's
    random draws (the check's cause is "random draw"); `tokens`/`tokenizer`: compare token ids too.
    """
    out = []
    for k in range(1, len(requests)):
        prev, cur = requests[k - 1], requests[k]
        held = prev.held
        pos = common_prefix(held, cur.text)
        div = Divergence(k, pos, len(held))
        if pos < len(held):
            cause, detail = _cause(prev, cur, pos, messages, tools, redraw, draws)
            div = Divergence(k, pos, len(held), cause, detail, held[max(0, pos - _SHOW):pos + _SHOW],
                             cur.text[max(0, pos - _SHOW):pos + _SHOW])
        if tokens is not None:
            div = _with_tokens(div, tokens, k, tokenizer, cur.text)
        out.append(div)
    return tuple(out)


def _cause(prev: Request, cur: Request, pos: int, messages, tools, redraw, draws: bool = False) -> tuple[str, str]:
    """(cause, detail) of request `cur` diverging at `pos` from what request `prev` left held: the
    first check that names one, the surest first (a render at the other time that matches further
    is proof; a text found at the divergence is a sign)."""
    return (_clock_cause(prev, cur, pos, redraw, draws)
            or _reasoning_cause(prev, cur.text, pos, messages)
            or _prompt_cause(prev, cur.text, pos)
            or _preamble_cause(prev, cur, pos, messages, tools)
            or _newest_user(prev, cur.text, pos, messages)
            or _last_message_cause(prev, cur.text, pos, messages)
            or _turn_cause(prev, cur.text, pos, messages) or _outside_messages(prev, cur.text, pos, messages)
            or ("other", "see held_text and request_text"))


def _prompt_start(prev: Request) -> int:
    """Where request `prev`'s generation prompt begins in its text."""
    return len(prev.text) - len(prev.generation_prompt)


def _clock_cause(prev: Request, cur: Request, pos: int, redraw, draws: bool) -> tuple[str, str] | None:
    """"date or time" (or "random draw") where the request rendered at `prev`'s time matches further."""
    if redraw is None or common_prefix(prev.held, redraw(cur.index, prev.time)) <= pos:
        return None
    if draws:
        return "random draw", (f"with request {prev.index}'s draws the request matches further: the template "
                               "draws at random (`random`, `lipsum`), anew in every render transformers makes "
                               "(llama-server's Jinja has no `random` filter)")
    return "date or time", (f"rendered at request {prev.index}'s time the request matches further "
                            f"({cur.time:%H:%M:%S} vs {prev.time:%H:%M:%S})")


def _reasoning_cause(prev: Request, text: str, pos: int, messages) -> tuple[str, str] | None:
    """"reasoning dropped": an earlier message's reasoning, or the reasoning markup of the held turn,
    at the divergence in the held text and not in the request."""
    held = prev.held
    for i, m in enumerate(messages[:prev.turn[1]]):
        # (reasoning under any key a template reads it from: gpt-oss's `thinking`, Laguna's `reasoning`)
        r = next(filter(None, (content_text(m.get(k)).strip() for k in REASONING_KEYS)), "") \
            if m.get("role") == "assistant" else ""
        if r and _covers(held, r, pos, slack=_NEAR) and text.count(r) < held.count(r):
            return "reasoning dropped", f"the reasoning of message {i} is in the held text at the divergence and not in the request"
    g0 = _prompt_start(prev)
    # In the generated turn, or in request k's history (an empty block Intern-S1 writes into the
    # turns after the last user message only), not in its generation prompt (a forced-open block).
    block = _reasoning_block(held, text, pos) if pos >= len(prev.text) or pos < g0 else ""
    if block and block in text[pos:pos + 4096]:
        return "reasoning dropped", (f"the held turn closes its reasoning at once ({block!r} at the divergence), where the "
                                     "request writes the turn's reasoning before it: the newest turn's reasoning is left out")
    if block:
        return "reasoning dropped", (f"the reasoning markup {block!r} the held turn has at the divergence is not in the "
                                     "request: the template writes it into the newest turn only (an empty reasoning block "
                                     "the history drops)")
    return None


def _prompt_cause(prev: Request, text: str, pos: int) -> tuple[str, str] | None:
    """"generation prompt": the divergence lies in request `prev`'s generation prompt, which the
    re-rendered turn writes otherwise."""
    g0 = _prompt_start(prev)
    # Text inserted before an intact generation prompt belongs to the message before it; the
    # generation prompt the next request ends with is its own, no sign of that.
    at = text.find(prev.generation_prompt, g0)
    moved = 0 < at - g0 <= _NEAR and at + len(prev.generation_prompt) != len(text)
    # (a turn was generated, though the template may render none of it: it dropped the turn)
    if prev.turn[1] > prev.turn[0] and g0 <= pos <= len(prev.text) and not moved:
        return "generation prompt", (f"the generation prompt {prev.generation_prompt!r} differs from the re-rendered turn "
                                     f"{text[g0:g0 + len(prev.generation_prompt) + 20]!r}")
    return None


def _preamble_cause(prev: Request, cur: Request, pos: int, messages, tools) -> tuple[str, str] | None:
    """"tool list" or "system prompt": a tool's description, the system message, or a system message
    the request adds (hoisted to the front by the template) at the divergence."""
    held, text = prev.held, cur.text
    for t in tools or ():
        fn = t.get("function", t)
        s = fn.get("description")  # a tool's name also appears in every call of it; its description does not
        if isinstance(s, str) and s and (_covers(held, s, pos, _NEAR) or _covers(text, s, pos, _NEAR)):
            return "tool list", f"tool '{fn.get('name')}' is defined at the divergence: the tool list moved or changed"
    system = next((content_text(m.get("content")) for m in messages[:1] if m.get("role") == "system"), "")
    if system.strip() and _covers(held, system.strip(), pos, _NEAR):
        return "system prompt", "the divergence lies in the system message"
    # A system message the request adds, which the template writes ahead of the history (it hoists
    # every system message to the front): the request has it at the divergence, the held text not.
    for i in range(prev.n_messages, cur.n_messages):
        m = messages[i]
        body = content_text(m.get("content")).strip() if m.get("role") == "system" else ""
        if body and _covers(text, body, pos, _NEAR) and not _covers(held, body, pos, _NEAR) and text.find(body) < len(held):
            return "system prompt", (f"the request's new system message {i} is written at the divergence, ahead of the "
                                     "history: the template moves system messages to the front")
    return None


def _last_message_cause(prev: Request, text: str, pos: int, messages) -> tuple[str, str] | None:
    """"last user message" or "last tool result": request `prev`'s last message, rendered otherwise
    once the model has answered it."""
    last = next((m for m in reversed(messages[:prev.n_messages]) if m.get("role") in ("user", "tool")), None)
    if last is None:
        return None
    body = content_text(last.get("content")).strip()
    g0 = _prompt_start(prev)
    # (an empty one, Bielik's empty tool result, is placed by where the generation prompt begins)
    near_end = not body and prev.n_messages > 0 and messages[prev.n_messages - 1] is last and g0 - _NEAR // 4 <= pos < g0
    if body and _covers(prev.held[:len(prev.text)], body, pos, _NEAR) or near_end:
        role = last["role"]
        return ("last user message" if role == "user" else "last tool result",
                f"request {prev.index}'s last message ({role}) is rendered differently once the model has answered it")
    return None


# A line's end or the opening of a markup unit (whole or cut at the divergence: `<｜hy_`).
_LINE_OR_MARKUP = re.compile(r"[\n<\[〈]")


def _newest_user(prev: Request, text: str, pos: int, messages) -> tuple[str, str] | None:
    """"last user message" where the divergence lies in request k's newest user message as written:
    in its text or after it on its line, before any markup (Nemotron Cascade marks the newest query
    ` /think`, which it writes ` /no_think` once a newer query comes, after tool results too)."""
    i = next((i for i in range(prev.n_messages - 1, -1, -1) if messages[i].get("role") == "user"), None)
    body = content_text(messages[i].get("content")).strip() if i is not None else ""
    if not body or body not in text:  # (a message the request no longer holds is dropped, not rewritten)
        return None
    start = prev.text.rfind(body, 0, pos + len(body))
    end = start + len(body)
    gap = prev.text[end:pos] if start >= 0 and end <= pos <= end + _SHOW else "\n"  # (on its line, before its markup)
    if start >= 0 and (start < pos < end or not _LINE_OR_MARKUP.search(gap)):
        when = "once the model has answered it" if i == prev.n_messages - 1 else "once a newer one comes"
        return "last user message", f"request {prev.index}'s newest user message (message {i}) is rendered differently {when}"
    return None


def _turn_cause(prev: Request, text: str, pos: int, messages) -> tuple[str, str] | None:
    """The cause where an earlier assistant turn is written otherwise once the model has answered:
    its tool calls, in the turn request k generated ("tool calls rewritten"), or its answer, which
    the held text has at the divergence and the request no longer has ("answer dropped"); None
    where neither is seen."""
    held = prev.held
    turn = messages[prev.turn[1] - 1] if prev.turn[1] > prev.turn[0] else {}
    if pos >= len(prev.text) and turn.get("role") == "assistant":
        names = [c.get("function", c).get("name") for c in turn.get("tool_calls") or () if isinstance(c, dict)]
        before = held[max(len(prev.text), pos - _NEAR):pos]
        if any(isinstance(n, str) and n and n in before for n in names):
            return "tool calls rewritten", (f"the history writes the tool calls of message {prev.turn[1] - 1} otherwise than "
                                            "the turn the model generated (the template renders the newest turn's calls "
                                            "in another form)")
    for i, m in enumerate(messages[:prev.turn[1]]):
        body = content_text(m.get("content")).strip()
        if body and _covers(held, body, pos, slack=_NEAR) and text.count(body) < held.count(body):
            if m.get("role") == "assistant":
                return "answer dropped", (f"the answer of message {i} is in the held text at the divergence and not in the "
                                          "request: the template drops an earlier turn's answer (and keeps its reasoning)")
            return "message dropped", (f"message {i} ({m.get('role')}) is in the held text at the divergence and not in the "
                                       "request: the template renders only the newest messages (a classifier's prompt)")
    rest = held[pos:]
    if pos >= len(prev.text) and turn.get("role") == "assistant" and not content_text(turn.get("content")).strip() \
            and rest.strip() and not _BARE_WORD.sub("", UNIT.sub(" ", rest)).strip():
        return "answer dropped", (f"the empty answer the generated turn ends with ({rest.strip()!r}) is not in the request: "
                                  f"the template drops message {prev.turn[1] - 1}'s empty answer from the history")
    return None


def _outside_messages(prev: Request, text: str, pos: int, messages) -> tuple[str, str] | None:
    """The cause where the divergence lies in request k's own text and inside no message's: in the
    markup it ends with after its last message (the turn's close and the prompt the model generated
    after, "generation prompt": a template that closes the turn before a prompt without its header,
    one that writes the assistant's opening always and drops the turn from the history), or in the
    template's own words before the first message or after the last ("template text": a classifier's
    task line that names the newest message's role, a reward model's instructions that follow the
    conversation). None where a message's text spans it, or it lies between two messages."""
    written = prev.text
    texts = _message_texts(messages[:prev.n_messages])
    texts += [e for e in (json.dumps(t, ensure_ascii=False)[1:-1] for t in texts) if e not in texts]  # (as `tojson` writes them)
    # (each search bounded: a long session's "other" divergences are read without scanning it whole each time)
    if pos >= len(written) or any(0 <= written.find(t, max(0, pos - len(t) + 1), pos + len(t)) < pos for t in texts):
        return None
    tail = _CLOSING.search(written, max(0, len(written) - 2048))  # (the markup a request ends with is short)
    if prev.turn[1] > prev.turn[0] and tail is not None and tail.start() <= pos and UNIT.search(tail.group(0)):
        return "generation prompt", (f"request {prev.index} ends with {tail.group(0)!r} after its last message (the turn's "
                                     "close and the prompt the model generated after), which the history writes otherwise: "
                                     f"{text[tail.start():tail.end() + 20]!r}")
    if not texts:
        return None
    if all(written.find(t, 0, pos) < 0 for t in texts):
        where = "before the first message"
    elif all(written.find(t, pos) < 0 for t in reversed(texts)):
        where = f"after request {prev.index}'s last message"
    else:
        return None
    return "template text", (f"the divergence lies in the template's own text {where}, no message's: the template "
                             "writes it otherwise as the conversation grows (a classifier's or a reward model's "
                             "instructions about the newest message)")


# The markup a text ends with: units, whitespace, and bare words next to a unit (`<|channel>thought\n`).
_CLOSING = re.compile(r"(?:" + UNIT.pattern + r"|(?<=[>\]])[A-Za-z_]+|[A-Za-z_]+(?=<|\[|〈)|\s)+$")


def _message_texts(messages) -> list[str]:
    """The texts of `messages` a render holds as they are: contents, reasoning, tool-call names."""
    out = []
    for m in messages:
        out.append(content_text(m.get("content")).strip())
        out += [content_text(m.get(k)).strip() for k in REASONING_KEYS if m.get("role") == "assistant"]
        out += [c.get("function", c).get("name") for c in m.get("tool_calls") or () if isinstance(c, dict)]
    return [t for t in out if isinstance(t, str) and t]


def _reasoning_block(held: str, text: str, pos: int) -> str:
    """The reasoning markup (`<think>`, `<|channel|>analysis`, ...) that the held text has at the
    divergence and the request does not, else "". The divergence may fall inside the markup where
    the request's next unit shares its opening (`<t` of `<think>` and `<tool_call>`): it is read from
    the unit's start."""
    opening = held.rfind("<", max(0, pos - 32), pos + 1)
    if opening >= 0 and any(c.isspace() for c in held[opening:pos]):
        opening = -1  # whitespace between: no unit spans the divergence
    m = UNIT.match(held, opening) if opening >= 0 else None
    if m is not None and m.end() > pos and text.startswith(held[opening:pos], opening):
        pos = opening
    rest = held[pos:pos + 200]
    lead = len(rest) - len(rest.lstrip())
    m = UNIT.match(rest, lead)
    if m is None or not any(w in m.group(0).lower() for w in _REASONING_WORDS):
        return ""
    return "" if text[pos:].lstrip().startswith(m.group(0)) else rest[:m.end()].strip()


def _covers(text: str, needle: str, pos: int, slack: int, after: int = 32) -> bool:
    """Whether an occurrence of `needle` in `text` spans `pos`, from `slack` characters before it
    (its header) to `after` characters past its end."""
    start = text.find(needle, max(0, pos - len(needle) - after))
    return 0 <= start <= pos + slack


def _with_tokens(div: Divergence, tokens: TokenizedRequests, k: int, tokenizer, text: str) -> Divergence:
    held = tokens.held(k - 1)
    nxt = tokens.requests[k]
    tpos = tokens.common(k)
    note = ""
    if tpos < len(held):
        ids = f"held {list(held[tpos:tpos + 3])} vs request {list(nxt[tpos:tpos + 3])}"
        own = _without_bos(tokenizer, text, nxt)
        end = _token_end(tokenizer, text, own, tpos - (len(nxt) - len(own)))
        if end is not None and end <= div.position:
            n_req = len(tokens.requests[k - 1])
            where = "at the request/turn boundary" if abs(tpos - n_req) <= 2 else "inside the held text"
            note = f"ids differ at token {tpos} {where} although the text matches up to character {div.position}: {ids}"
        elif div.position >= div.n_held:
            note = f"token {tpos} of the request runs past the end of the held text (it merges with what follows): {ids}"
    cause = div.cause or ("token ids" if tpos < len(held) else "")
    return Divergence(div.request, div.position, div.n_held, cause, div.detail, div.held_text, div.request_text,
                      tpos, len(held), note)


def _without_bos(tokenizer, text: str, ids) -> Sequence[int]:
    """`ids` (`text`'s, as `tokenize_texts` gives them) without the BOS it prepended, if it did."""
    bos = list(tokenizer.tokenize("", add_bos=True))
    if bos and list(ids[:len(bos)]) == bos and not text.startswith("".join(tokenizer.piece(i) for i in bos)):
        return ids[len(bos):]
    return ids


def _token_end(tokenizer, text: str, ids: Sequence[int], j: int) -> int | None:
    """Where token j of `text` (whose ids are `ids`) ends, in characters, when the tokenizer can say:
    from the ids' pieces where they spell the text exactly (llama.cpp's; no need to tokenize a
    long request again), else from its offsets."""
    if tokenizer is None or j < 0:
        return None
    pieces = getattr(tokenizer, "piece_bytes", None)
    if pieces is not None and j < len(ids):
        data = utf8(text)
        counted = getattr(tokenizer, "piece_lengths", None)  # (llama.cpp's: from its table, not a call a token)
        lengths = list(counted(ids)) if counted is not None else [len(pieces(i)) for i in ids]
        if sum(lengths) == len(data):
            # a token ending inside a character counts that character, as the offsets do
            return len(data[:sum(lengths[:j + 1])].decode("utf-8", "replace"))
    if not hasattr(tokenizer, "tokenize_with_offsets"):
        return None
    _, offsets = tokenizer.tokenize_with_offsets(text)
    return offsets[j][1] if j < len(offsets) else None
