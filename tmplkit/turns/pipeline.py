"""A session made ready, once, for everything that follows it: the requests a client sends (as a
server renders them), their token ids, their spans for each delimiter set, and where each
request's next renders will diverge from what the server holds.

    requests (requests.py) -> tokens (divergence.tokenize_requests) -> spans (request_spans)
        -> predicted divergences (cost.predicted_divergences)

`study_turns` adds the text divergences, the thinking switches and the cost; the replay
(`tmplkit.replay`) runs the requests on a model; the benchmarks time both.

    >>> prepared = prepare_session(session, template, tokenizer)                 # doctest: +SKIP
    >>> len(prepared.requests), sorted(prepared.spans)                          # doctest: +SKIP
    (16, ['server', 'tmplkit'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from ..analysis import Analysis, RoundTrip
from ..errors import InputError, TmplkitError
from ..server_rules import server_delimiter_list, server_split
from ..session import ServerConversation, for_server
from ..session.requests import DEFAULT_INTERVAL, Request, iter_next_renders, iter_requests, request_points
from ..sources.templates import ChatTemplate
from ..tokens.delimiter_ids import text_delimiters, token_delimiters
from ..tokens.spans import SpanDetector, split_resumed
from .ahead import NextRendersAhead
from .cost import predicted_divergences
from .divergence import TokenizedRequests, _without_bos, tokenize_requests

__all__ = ["PreparedSession", "prepare_session", "request_spans"]


@dataclass(frozen=True)
class PreparedSession:
    """`conversation`: the session as the server gives it to the template; `requests`: what the
    client sends each time; with a tokenizer, `tokens` (each request whole, each generated turn on
    its own), `spans` (delimiter set name, "tmplkit" or "server", -> one Spans per request; a set
    that does not work here is missing and `notes` says why) and `predicted` (per request, the
    token positions where its next renders diverge from what is held; None without spans)."""

    template: ChatTemplate
    conversation: ServerConversation = field(repr=False)
    requests: tuple[Request, ...] = field(repr=False)
    tokens: TokenizedRequests | None = field(default=None, repr=False)
    spans: dict = field(default_factory=dict, repr=False)
    predicted: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    server_tokens: TokenizedRequests | None = field(default=None, repr=False)  # of `server_texts`, when given


def prepare_session(session, template: ChatTemplate, tokenizer=None, *, add_bos: bool = False,
                    kwargs: Mapping | None = None, interval=DEFAULT_INTERVAL, budget=None,
                    server: Mapping | None = None, server_texts=None, inputs: str | None = None,
                    predict: bool = True, ahead: bool = False, fits=None) -> PreparedSession:
    """`session` on `template`, through the pipeline of the module doc; without a tokenizer, the
    requests only. A template that cannot render the session raises its RenderError here.
    `budget` (a `Budget`): progress while rendering, and the requests up to its time limit.
    `server`: template name -> llama-server's delimiter list (`server_rules.load_server_delimiters`);
    None: the two delimiters of the families `server_rules.server_delimiter_list` knows by a marker.
    `server_texts`: each request as llama-server renders it (its own engine, where that differs
    from transformers': `server.resume.server_renders`); the llama-server setting's tokens and
    spans are then those, the generated turns the same. `inputs`: whose message preparation
    ("server", the default, or "transformers": `session.given_messages`). `predict`: the predicted
    divergences too (the divergence-aware setting's input: the next renders, about three renders
    a tool-calling request more; `predicted` is None without). `ahead`: those next renders made in
    a forked child on a second core meanwhile (`ahead.NextRendersAhead`; here where it cannot be),
    the same result in less time where a core is free. `fits(text, what)`: called with each request
    and the turn generated after it before any is tokenized (a runner's `check_text`: a session no
    context holds is refused before minutes of tokenizing)."""
    conversation = for_server(template, session, kwargs, inputs=inputs)  # prepared once, rendered for every request
    early = (NextRendersAhead.start(conversation, interval=interval, template=template)
             if ahead and predict and tokenizer is not None else None)
    try:
        requests = iter_requests(conversation, template, interval=interval)
        if budget is None:
            reqs = tuple(requests)
        else:
            reqs = budget.take(requests, len(request_points(list(conversation.messages))))
        if tokenizer is None:
            return PreparedSession(template, conversation, reqs)
        if fits is not None and reqs:
            longest = _most_bytes(reqs)
            fits(longest.held, f"request {longest.index} with the turn generated after it")
        tokens = tokenize_requests(reqs, tokenizer, add_bos=add_bos)
        notes: list[str] = []
        server_tokens = _server_tokens(reqs, server_texts, tokenizer, add_bos, notes)
        spans = request_spans(template, tokenizer, reqs, tokens, notes, server, server_tokens)
        predicted = None
        if spans and predict:
            # (one request's at a time, each tokenized before the next are made: all of them first
            # peaked 190 MB higher on a 294k-token session, scripts/bench_turns_memory.py)
            texts = early.renders(reqs) if early is not None else iter_next_renders(conversation, template, reqs)
            predicted = predicted_divergences(tokens, texts, tokenizer, add_bos=add_bos, texts=[r.text for r in reqs])
    finally:
        if early is not None:
            early.close()
    return PreparedSession(template, conversation, reqs, tokens, spans, predicted, tuple(notes), server_tokens)


def _most_bytes(reqs: tuple[Request, ...]) -> Request:
    """The request that holds the most UTF-8 bytes with its generated turn (a fit is bounded by
    bytes: `tokens.tokenizers.fewest_tokens`): not always the most characters, where a template drops
    earlier text written three bytes a character (CJK reasoning) once a user message comes. Only a
    request with a quarter of the most characters or more can have the most bytes."""
    most = max(len(r.text) + len(r.generated) for r in reqs)

    def size(r: Request) -> int:
        return sum(len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in (r.text, r.generated))

    return max((r for r in reqs if 4 * (len(r.text) + len(r.generated)) >= most), key=size)


def _server_tokens(reqs, texts, tokenizer, add_bos: bool, notes: list) -> TokenizedRequests | None:
    """The requests as the server renders them (`texts`), tokenized; None without texts."""
    if texts is None:
        return None
    texts = list(texts)
    if len(texts) < len(reqs):
        raise InputError(f"{len(texts)} server renders for {len(reqs)} requests")
    changed = sum(t != r.text for r, t in zip(reqs, texts))
    if changed:
        notes.append(f"llama-server renders {changed} of {len(reqs)} requests otherwise than transformers; "
                     "its setting is simulated on its own renders")
    return tokenize_requests([replace(r, text=t) for r, t in zip(reqs, texts)], tokenizer, add_bos=add_bos)


def request_spans(template, tokenizer, reqs, tokens, notes: list, server: Mapping | None = None,
                  server_tokens: TokenizedRequests | None = None) -> dict:
    """One Spans per request for each delimiter set that works here ("tmplkit", "server"; for
    `server` see `prepare_session`; the server's spans are of `server_tokens` when given)."""
    det = None
    try:
        delims, _ = text_delimiters(template)
        probe = Analysis(name=template.name, source=template.source, status="pass", delimiters=delims,
                         round_trip=RoundTrip(True, (), (), rendered=reqs[-1].text))
        tdelims = token_delimiters(probe, tokenizer, ids=_without_bos(tokenizer, reqs[-1].text, tokens.requests[-1]))
        if tdelims.passed:
            det = SpanDetector(tdelims)
        else:
            notes.append("tmplkit's delimiters do not split the tokens as the text: " + "; ".join(tdelims.problems[:2]))
    except TmplkitError as exc:
        notes.append(f"no tmplkit delimiters: {exc}")
    ids = None
    try:
        # each text tokenized on its own, the prompt split the server's way (server_rules._delimiters)
        ids = [(role, tokenizer.tokenize(text, add_bos=False)) for role, text in server_delimiter_list(template, server)]
    except TmplkitError as exc:
        notes.append(f"no llama-server delimiters: {exc}")
    out: dict = {}
    if det is not None:
        out["tmplkit"] = []
    if ids is not None:
        out["server"] = []
    theirs = server_tokens if server_tokens is not None else tokens
    longest = max((len(i) for _, i in ids), default=0) if ids is not None else 0
    split_theirs = partial(server_split, delimiters=ids or [])
    # (each request split where it differs from the request before only: the whole of each
    # request, arrays included, cost 0.24 s of a 90k-token session's study)
    for k, request in enumerate(tokens.requests):
        if det is not None:
            out["tmplkit"].append(split_resumed(det.split, request, out["tmplkit"][-1] if k else None,
                                                _shared(tokens, k), det.longest))
        if ids is not None:
            out["server"].append(split_resumed(split_theirs, theirs.requests[k], out["server"][-1] if k else None,
                                               _shared(theirs, k), longest, greedy=False))
    return out


def _shared(tokens: TokenizedRequests, k: int) -> int:
    """How many first ids request k shares with request k - 1 (0 for the first): their common
    prefix is that of request k and what was held after k - 1, cut at request k - 1's end."""
    return min(tokens.common(k), len(tokens.requests[k - 1])) if k else 0
