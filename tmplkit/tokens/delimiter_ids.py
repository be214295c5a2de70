"""Role delimiters as token ids of one tokenizer, read off a tokenized render and checked there.

`tokenize_delimiters(delimiters, rendered, tokenizer)` is the core: it takes text delimiters, a
render in which they start messages, and a tokenizer; `token_delimiters(analysis, tokenizer)`
applies it to an Analysis's probe render; `text_delimiters(template)` gives a template's text
delimiters as the analysis derives them (for a prompt that is not the probe render).

Tokenizing a delimiter on its own (what llama-server does) is wrong whenever the tokenizer merges
its first or last characters with what surrounds it: in the qwen35 vocab `>\\n` is one token, so
`<|im_start|>user\\n<tool_response>` ends inside a token once the template's newline follows. The
sequences are therefore read off the tokenized render, at every place each delimiter occurs, in
named steps:

1. tokenize the render (`_Render.of`) and locate every delimiter occurrence in its tokens
   (`_occurrences`);
2. for each delimiter, list candidate id sequences, preferred first (`_options`): cut at its edge
   tokens (`_edge_candidates`), a core shared by all occurrences (`_common_cores`), each first
   without the last tokens that message content can merge with (`_robust_first`);
3. choose one candidate per delimiter so that splitting the tokens finds exactly the message starts
   that splitting the text finds (`_choose`), and say where it still does not (`_split_problems`).
"""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np

from ..delimiters import ROLES, Delimiter, sort_delimiters, text_matches
from ..errors import InputError
from .spans import SpanDetector

if TYPE_CHECKING:
    from ..analysis import Analysis
    from ..sources.templates import ChatTemplate
    from .tokenizers import Offsets, Tokenizer

__all__ = ["ANALYSIS_FAILED", "TokenDelimiter", "TokenDelimiters", "text_delimiters", "token_delimiters", "tokenize_delimiters"]

Ids = tuple[int, ...]


@dataclass(frozen=True)
class TokenDelimiter:
    """One role delimiter as token ids of one tokenizer.

    `ids` is what the span detector matches. `occurrences` counts where the delimiter starts a
    message in the probe render; `aligned` says its text began and ended on token boundaries at
    all of them; `stable` that the tokens covering it were the same ids at all of them.
    `standalone_ids` is the delimiter tokenized on its own (what llama-server uses); `adjusted`
    explains, when ids differ from the exact tokens of the text, what was changed and why.
    """

    role: str
    text: str
    ids: Ids
    occurrences: int
    aligned: bool
    stable: bool
    standalone_ids: Ids
    adjusted: str | None = None
    # The text the ids stand for (the delimiter as llama-server should be given it).
    token_text: str = ""
    # Further id sequences matched for this delimiter, where its edge tokens vary with context.
    alternatives: tuple[Ids, ...] = ()
    alternative_texts: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "role": self.role,
            "text": self.text,
            "ids": list(self.ids),
            "token_text": self.token_text,
            "occurrences": self.occurrences,
            "aligned": self.aligned,
            "stable": self.stable,
            "standalone_ids": list(self.standalone_ids),
            "adjusted": self.adjusted,
            "alternatives": [list(a) for a in self.alternatives],
        }


@dataclass(frozen=True)
class TokenDelimiters:
    """Every delimiter of an Analysis as token ids, longest first, with the check's verdict.

    `passed` is true when the tokenizer spells every delimiter (its ids, and their alternatives,
    decode to text the template writes) and splitting the tokenized probe render with these ids
    finds exactly the message starts that splitting its text finds, at the same places; `problems`
    says otherwise. `mismatch`, also the first problem, says that the tokenizer does not match the
    template and which delimiter it does not spell (a vocabulary that cannot write `<|im_start|>`,
    or normalises it). `warnings` note what does not fail the check (a delimiter absent from the
    render, one whose text tokenizes differently on its own).
    """

    tokenizer: str
    template: str
    delimiters: tuple[TokenDelimiter, ...]
    passed: bool
    problems: tuple[str, ...] = ()
    n_tokens: int = 0
    warnings: tuple[str, ...] = ()
    mismatch: str | None = None
    # The token at which the assistant's ids also match the render's end, where it opens the turn to
    # generate without the whitespace its messages' content follows (`_prompt_opening`): a start
    # the text split cannot see, counted as one (None: no such match).
    prompt_start: int | None = None

    def to_dict(self) -> dict:
        return {
            "tokenizer": self.tokenizer,
            "template": self.template,
            "passed": self.passed,
            "n_tokens": self.n_tokens,
            "delimiters": [d.to_dict() for d in self.delimiters],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }

    def message_delimiters(self) -> list[dict]:
        """llama-server's `message_delimiters` form: `[{"role": ..., "delimiter": ...}]`, of the four
        message roles it knows (a reasoning delimiter would start a span of no role there).

        The delimiter strings are the text of the token-aligned sequences, so that llama-server,
        which tokenizes each on its own, gets the ids checked here.
        """
        return [{"role": d.role, "delimiter": text} for d in self.delimiters if d.role in ROLES
                for text in dict.fromkeys((d.token_text,) + d.alternative_texts)]  # (ids that read alike: one text)

    def id_lists(self) -> list[dict]:
        """`[{"role": ..., "ids": [...]}]`, longest first."""
        return [{"role": d.role, "ids": list(q)} for d in self.delimiters for q in (d.ids,) + d.alternatives]

    def why_unproven(self) -> str:
        """"" where the check passed; else why not, as one phrase: "not proven by the analysis (...)"
        or "not proven on this tokenizer (...)" (the first problem), as `tmplkit spans` and the
        training masks refuse them."""
        if self.passed:
            return ""
        why = "; ".join(self.problems[:1]) or "their round trip failed"
        where = "by the analysis" if why.startswith(ANALYSIS_FAILED) else "on this tokenizer"
        return f"not proven {where} ({why})"

    def __iter__(self):
        return iter(self.delimiters)

    def __len__(self) -> int:
        return len(self.delimiters)


# ---------------------------------------------------------------------------------------------
# The typed values the steps pass on


@dataclass(frozen=True)
class _Occurrence:
    """Where one delimiter occurrence lies in the token list."""

    first: int  # first token overlapping the delimiter
    last: int  # last token overlapping it (inclusive)
    left_aligned: bool
    right_aligned: bool
    at: int = 0  # character offset where the delimiter starts

    @property
    def aligned(self) -> bool:
        return self.left_aligned and self.right_aligned

    def bounds(self, left_inner: bool, right_inner: bool) -> tuple[int, int]:
        lo = self.first + (1 if left_inner and not self.left_aligned else 0)
        hi = self.last + 1 - (1 if right_inner and not self.right_aligned else 0)
        return lo, hi


@dataclass(frozen=True)
class _Candidate:
    """An id sequence a delimiter may be matched by."""

    ids: Ids
    starts: tuple[int, ...]  # the token where the match starts, per occurrence (empty: unchecked)
    note: str | None = None  # how the ids differ from the delimiter's text, and why
    alternatives: tuple[Ids, ...] = ()  # further sequences matched as well

    def noted(self, extra: str) -> _Candidate:
        return _Candidate(self.ids, self.starts, _join(self.note, extra), self.alternatives)


@dataclass(frozen=True)
class _Options:
    """What the render says about one delimiter, and its candidates in order of preference."""

    delimiter: Delimiter
    occurrences: tuple[_Occurrence, ...]
    candidates: tuple[_Candidate, ...]
    standalone: Ids
    aligned: bool = False
    stable: bool = False
    problem: str | None = None
    warning: str | None = None


@dataclass(frozen=True)
class _Render:
    """A rendered text as tokens, with each token's [start, end) character offsets."""

    text: str
    ids: list[int]
    offsets: Offsets
    starts: list[int]
    ends: list[int]  # non-decreasing (bisect relies on it)

    @classmethod
    def of(cls, text: str, tokenizer: Tokenizer, ids: Sequence[int] | None = None) -> _Render:
        tokens: list[int]
        offsets: Offsets
        known = getattr(tokenizer, "offsets_of", None)  # (llama.cpp's: the offsets of ids it has, from their pieces)
        if not text:
            tokens, offsets = [], []
        elif ids is not None and known is not None:
            tokens, offsets = known(text, ids)
        else:
            tokens, offsets = tokenizer.tokenize_with_offsets(text)
        starts = [s for s, _ in offsets]
        ends = [e for _, e in offsets]
        # offsets are non-decreasing for the tokenizers we support; bisect relies on it
        if any(map(operator.gt, ends, islice(ends, 1, None))):
            ends = list(np.maximum.accumulate(ends))
        return cls(text, tokens, offsets, starts, ends)

    def locate(self, a: int, b: int) -> _Occurrence | None:
        """Tokens overlapping characters [a, b), or None when no token does."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(ends, a)  # first token with end > a
        while i < len(starts) and ends[i] == starts[i] and starts[i] <= a:  # zero-width tokens at a
            i += 1
        j = bisect.bisect_left(starts, b) - 1  # last token with start < b
        if i >= len(starts) or j < i:
            return None
        return _Occurrence(i, j, starts[i] >= a, ends[j] <= b, a)

    def piece(self, token: int) -> str:
        """The text token `token` covers."""
        return self.text[self.offsets[token][0]:self.offsets[token][1]]


# ---------------------------------------------------------------------------------------------
# The core and its steps


def text_delimiters(template: ChatTemplate) -> tuple[tuple[Delimiter, ...], str]:
    """The template's role delimiters, as tmplkit's analysis derives them (never a hand-written table)."""
    from ..analysis import analyze  # keeps the token layer's modules free of Jinja for callers that pass an analysis

    analysis = analyze(template)
    if not analysis.delimiters or analysis.status not in ("pass", "impossible"):
        # (a failed analysis's delimiters misplace some message: no proven delimiter is no delimiter;
        # an impossible one's are the template's own markup, two roles alike, which the prefill
        # runner counts as such: `PrefillPrompt.as_user`)
        why = analysis.why_not or "it derived none"
        raise InputError(f"template '{template.name}' has no proven role delimiters: its analysis is {analysis.status} "
                         f"({why}); `tmplkit audit` says why")
    return sort_delimiters(analysis.delimiters), "analysis"


# How a TokenDelimiters' first problem says that the analysis it came from did not pass.
ANALYSIS_FAILED = "the analysis did not pass"


def token_delimiters(analysis: Analysis, tokenizer: Tokenizer, *, ids: Sequence[int] | None = None) -> TokenDelimiters:
    """Derive each delimiter of `analysis` as token ids, from its tokenized probe render.

    See `tokenize_delimiters`; the render is `analysis.round_trip.rendered` (`ids`: its tokens, where
    the caller has them).

    >>> td = token_delimiters(analyze(load("Qwen3.5-4B.jinja")), load_tokenizer("vocab:qwen35"))  # doctest: +SKIP
    >>> [d.token_text for d in td][:1]                                                          # doctest: +SKIP
    ['<|im_start|>user\\n<tool_response']
    """
    from ..analysis import Analysis  # (imported here: the analysis layer loads the sandbox and Jinja, which tokenizers never need)

    if not isinstance(analysis, Analysis):
        # (read by attribute, anything else came back as a failed result, "no delimiters were given")
        raise TypeError(f"expected an Analysis, got {type(analysis).__name__}: give tmplkit.analyze(TEMPLATE), or "
                        "for delimiters of your own tmplkit.tokens.delimiter_ids.tokenize_delimiters(DELIMITERS, "
                        "RENDERED_TEXT, TOKENIZER)")
    rendered = analysis.round_trip.rendered if analysis.round_trip is not None else ""
    td = tokenize_delimiters(analysis.delimiters, rendered, tokenizer, template=analysis.name, ids=ids)
    if analysis.status != "pass" and td.delimiters:
        # Ids that split the render as its text are no proof where the text itself was not proved:
        # a failed analysis's delimiters misplace some message.
        why = analysis.why_not or "no reason given"
        td = replace(td, passed=False, problems=(f"{ANALYSIS_FAILED} ({analysis.status}: {why})",) + td.problems)
    return td


def tokenize_delimiters(delimiters: Iterable[Delimiter], rendered: str, tokenizer: Tokenizer, *,
                        template: str = "", ids: Sequence[int] | None = None) -> TokenDelimiters:
    """Each delimiter's token ids, read off `rendered` tokenized by `tokenizer`, and checked there.

    For each delimiter, the tokens covering it are read at every place it starts a message in
    `rendered`. Where its text begins or ends inside a token, the ids are cut back to the tokens
    wholly inside it (or, where that leaves nothing or does not mark every place, extended to
    whole tokens); the choice is kept only if splitting the tokenized render finds exactly the
    starts the text split finds. What was changed is in each `adjusted`. `ids`: `rendered`'s token
    ids (no BOS added), where the caller has them (the turns study's last request): not tokenized again
    where the tokenizer reads offsets off ids (`offsets_of`: llama.cpp's).

    >>> td = tokenize_delimiters([Delimiter("user", "<|im_start|>user")], text, tok, template="chatml")  # doctest: +SKIP
    """
    delimiters = sort_delimiters(delimiters)
    tok_name = getattr(tokenizer, "name", type(tokenizer).__name__)
    if not delimiters:
        return TokenDelimiters(tok_name, template, (), False, ("no delimiters were given (the analysis has none)",))
    render = _Render.of(rendered, tokenizer, ids)
    per, order, problems = _occurrences(render, delimiters)
    options = {d: _options(d, per[d], render, tokenizer) for d in delimiters}
    warnings = [o.warning for o in options.values() if o.warning]
    problems += [o.problem for o in options.values() if o.problem]
    opening = _prompt_opening(delimiters, render)
    choice = _choose(options, order, render, opening)
    options, more = _in_other_contexts(options, choice, order, render, tokenizer, opening)
    warnings += more
    expected, found = _expected_and_found(options, choice, order, render, opening)
    problems += _split_problems(expected, found, render.offsets)
    prompt_start = next((pos for pos, role in found if role == "assistant" and pos in opening), None)
    if prompt_start is not None:
        warnings.append(f"the assistant's ids also match the render's end ({render.text[render.offsets[prompt_start][0]:]!r}, "
                        "the turn to generate, opened without the whitespace its content follows): a span starts there")
    out = sorted((_token_delimiter(o, o.candidates[choice[d]], tokenizer) for d, o in options.items()),
                 key=lambda t: -len(t.ids))  # longest (in tokens) first, as the detector matches them
    for t in out:
        if t.occurrences and tuple(tokenizer.tokenize(t.token_text)) != t.ids:
            warnings.append(f"{t.role} delimiter {t.token_text!r} tokenizes on its own to other ids than in context; give llama-server the ids")
    mismatch = _unspelled(out, rendered, tok_name)
    if mismatch:  # first: ids of a tokenizer that is not the template's are no proof, whatever they split
        problems.insert(0, mismatch)
    return TokenDelimiters(tok_name, template, tuple(out), not problems, tuple(problems), len(render.ids), tuple(warnings),
                           mismatch, prompt_start)


def _prompt_opening(delimiters: Sequence[Delimiter], render: _Render) -> frozenset[int]:
    """The tokens at which an assistant start may be found though no text match is there: where the
    render ends with an assistant delimiter less its trailing whitespace (`assistant:` for
    `assistant: `, `[/INST]` for `[/INST] `), perhaps then a reasoning opening: the generation
    prompt that opens the next assistant turn. The text split misses it for the missing whitespace;
    ids that stop short of the whitespace (which BPE joins to the content's first letter) match it
    too, and rightly."""
    # (the prompt may open the reasoning too: `<|BOT|>assistant\n<think>\n`, Step3)
    thinking = "|".join(re.escape(d.text.strip()) for d in delimiters if d.role == "reasoning" and d.text.strip())
    out: set[int] = set()
    for d in delimiters:
        bare = d.text.rstrip()
        if d.role != "assistant" or not bare or bare == d.text:
            continue
        m = re.search(re.escape(bare) + (rf"\s*(?:{thinking})?" if thinking else "") + r"\s*\Z", render.text)
        if m and render.text.startswith(d.text, m.start()):
            continue  # (the whole delimiter: the text split has it)
        o = render.locate(m.start(), m.start() + len(bare)) if m else None
        if o is not None:
            out.update(range(o.first, o.last + 1))
    return frozenset(out)


def _occurrences(render: _Render, delimiters: Sequence[Delimiter]):
    """Where each delimiter starts a message in the render, as tokens.

    Returns ({delimiter: occurrences}, [(delimiter, index into its occurrences)] in text order,
    problems for matches no token covers).
    """
    per: dict[Delimiter, list[_Occurrence]] = {d: [] for d in delimiters}
    order: list[tuple[Delimiter, int]] = []
    problems: list[str] = []
    for pos, d in text_matches(render.text, delimiters) if render.text else []:
        o = render.locate(pos, pos + len(d.text))
        if o is None:
            problems.append(f"{d.role} delimiter {d.text!r} at character {pos} is covered by no token")
            continue
        order.append((d, len(per[d])))
        per[d].append(o)
    return per, order, problems


def _options(d: Delimiter, occ: Sequence[_Occurrence], render: _Render, tokenizer: Tokenizer) -> _Options:
    """The candidate id sequences of delimiter `d`, in order of preference."""
    standalone = tuple(tokenizer.tokenize(d.text))
    if not occ:
        unchecked = _Candidate(standalone, (), "not found in the probe render; tokenized on its own, unchecked")
        return _Options(d, (), (unchecked,), standalone,
                        warning=f"{d.role} delimiter {d.text!r} does not start a message in the probe render; its ids are unchecked")
    seen: set[Ids] = set()  # sequences already offered, shared by the steps so none repeats
    exact, trimmed, variants = _edge_candidates(occ, render, seen)
    cands = [c for c in exact + _common_cores(d, occ, render, seen) + trimmed + variants if _distinctive(d, c, tokenizer)]
    # (and again after: a candidate cut back to what no content merges with may keep no letter or markup)
    cands = [c for c in _robust_first(tokenizer, d, occ, cands, render, seen) if _distinctive(d, c, tokenizer)]
    problem = None
    if not cands:
        cands = [_Candidate(standalone, (), "no token sequence is common to all its occurrences; tokenized on its own")]
        problem = f"{d.role} delimiter {d.text!r}: no token sequence is common to all {len(occ)} occurrences"
    covering = {tuple(render.ids[o.first:o.last + 1]) for o in occ}
    return _Options(d, tuple(occ), tuple(cands), standalone, aligned=all(o.aligned for o in occ),
                    stable=len(covering) == 1, problem=problem)


# (left_inner, right_inner) in order of preference: cut back to the tokens wholly inside the
# delimiter first (they depend on the template only), extend to whole tokens after that.
_MODES = ((True, True), (True, False), (False, True), (False, False))


def _edge_candidates(occ: Sequence[_Occurrence], render: _Render, seen: set[Ids]):
    """Candidates from cutting every occurrence at its edge tokens, in each of `_MODES`.

    Returns (exact: every occurrence has these ids; trimmed: the first ids common to all;
    variants: up to 4 distinct sequences, all matched, where the edge tokens differ with context).
    """
    exact: list[_Candidate] = []
    trimmed: list[_Candidate] = []
    variants: list[_Candidate] = []
    for left_inner, right_inner in _MODES:
        if not right_inner and _into_content(occ):
            continue
        bounds = [o.bounds(left_inner, right_inner) for o in occ]
        seqs = [tuple(render.ids[lo:hi]) for lo, hi in bounds]
        los = tuple(lo for lo, _ in bounds)
        distinct = sorted(set(seqs), key=lambda q: (-seqs.count(q), seqs.index(q)))
        if 1 < len(distinct) <= 4 and all(distinct) and distinct[0] not in seen:
            note = _describe(occ, bounds[0][0], bounds[0][1], left_inner, right_inner, render)
            extra = f"its tokens differ between its {len(occ)} occurrences; matching {len(distinct)} variants"
            variants.append(_Candidate(distinct[0], los, _join(note, extra), tuple(distinct[1:])))
        seq = _common_prefix(seqs)  # all of it when every occurrence has the same tokens
        if not seq or seq in seen:
            continue
        seen.add(seq)
        note = _describe(occ, los[0], los[0] + len(seq), left_inner, right_inner, render)
        if len(set(seqs)) > 1:
            extra = f"the tokens differ between its {len(occ)} occurrences; kept the common first {len(seq)}"
            trimmed.append(_Candidate(seq, los, _join(note, extra)))
        else:
            exact.append(_Candidate(seq, los, note))
    return exact, trimmed, variants


def _common_cores(d: Delimiter, occ: Sequence[_Occurrence], render: _Render, seen: set[Ids],
                  keep: int = 3) -> list[_Candidate]:
    """Token sequences that start at the same character of the delimiter at every occurrence.

    Where a neighbour merges into the delimiter at some occurrences only (`><` after a textual
    end marker, `<` alone after a word), the tokens differ at its edges but share a core: match
    from a character offset that begins a token everywhere, as far as the ids agree.
    """
    if len(occ) < 2 or all(o.aligned for o in occ):
        return []
    ids, starts, n = render.ids, render.starts, len(d.text)
    common = set.intersection(*({starts[t] - o.at for t in range(o.first, o.last + 1) if o.at <= starts[t] < o.at + n}
                                for o in occ))
    found = []
    for c in sorted(common):
        for right_inner in (True, False)[:1 if _into_content(occ) else 2]:
            seqs, los = [], []
            for o in occ:
                lo = bisect.bisect_left(starts, o.at + c, o.first, o.last + 1)
                hi = o.last + 1 - (1 if right_inner and not o.right_aligned else 0)
                seqs.append(tuple(ids[lo:hi]))
                los.append(lo)
            seq = _common_prefix(seqs)
            if seq:
                found.append((len(seq), c, not right_inner, seq, tuple(los)))
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    out: list[_Candidate] = []
    for _, c, _, seq, match_starts in found:
        if seq in seen:
            continue
        seen.add(seq)
        note = (f"the tokens at its edges differ between its {len(occ)} occurrences (a neighbour merges into it at some); "
                f"matching {len(seq)} tokens from character {c}, {d.text[c:]!r}")
        out.append(_Candidate(seq, match_starts, note))
        if len(out) == keep:
            break
    return out


def _distinctive(d: Delimiter, cand: _Candidate, tokenizer: Tokenizer) -> bool:
    """Whether each id sequence of `cand` keeps something of what makes `d` its role's: a letter or
    digit of its text where it has one (`User: ` after `</s>`, `>User` in BPE, cut back to `:`
    matches every colon a message writes; the probe's contents hold none, so the split check
    passes it), and some of its markup where it has any (`</think>` cut back to `think`, or
    `<|im_start|>assistant` to `assistant`, opens a span at every such word; `_keeps_markup`)."""
    if not any(ch.isalnum() for ch in d.text):
        return True
    return all(_keeps_markup(tokenizer.detokenize(list(q)), d.text) for q in (cand.ids,) + cand.alternatives)


def _into_content(occ: Sequence[_Occurrence]) -> bool:
    """Whether the delimiter ends inside a token at some occurrence: widened to whole tokens, its ids
    would take in the first characters of the message's content (a start delimiter ends where the
    content begins), and match only content that begins as the probe's does (`assistant: K`, where
    BPE joins the space to the probe's first letter)."""
    return any(not o.right_aligned for o in occ)


# What message content may begin with: a delimiter's last tokens must not merge with any of it.
_CONTINUATIONS = ("a", "A", " a", "1", ".", ",", "<", "{", "[", "\"", "'", "\n", "\n\n", " ", "  ", "\t", "é", "😀")


def _robust_first(tokenizer: Tokenizer, d: Delimiter, occ: Sequence[_Occurrence], cands: list[_Candidate],
                  render: _Render, seen: set[Ids]) -> list[_Candidate]:
    """Put before each candidate its version without the last tokens that content can merge with.

    In the qwen35 vocab `<|im_start|>user\\n<tool_response>\\n` ends in `>\\n`, which becomes `>\\n\\n`
    when the tool response itself starts with a newline: the delimiter would then miss.
    """
    if not occ:
        return cands
    end = occ[0].at + len(d.text)
    offsets = render.offsets
    out: list[_Candidate] = []
    for cand in cands:
        seq, los = cand.ids, cand.starts
        if los and not cand.alternatives and offsets[los[0] + len(seq) - 1][1] <= end:
            k, culprit = _robust_len(tokenizer, render, seq, los[0], end)
            if 0 < k < len(seq) and seq[:k] not in seen:
                seen.add(seq[:k])
                dropped = render.text[offsets[los[0] + k][0]:offsets[los[0] + len(seq) - 1][1]]
                extra = f"dropped {dropped!r} at the end: content starting with {culprit!r} merges with it"
                out.append(_Candidate(seq[:k], los, cand.note).noted(extra))
        out.append(cand)
    return out


def _robust_len(tokenizer: Tokenizer, render: _Render, seq: Ids, lo: int, end: int) -> tuple[int, str | None]:
    """How many of `seq`'s leading ids survive whatever content follows the delimiter.

    Re-tokenizes the text from a few tokens before the match to the delimiter's `end`, followed
    by each of `_CONTINUATIONS`; returns the shortest surviving length and the continuation that
    cut it (None when nothing did).
    """
    start = render.offsets[lo][0]
    left_start = render.offsets[max(0, lo - 8)][0]
    head = render.text[left_start:end]
    k, culprit = len(seq), None
    for cont in _CONTINUATIONS:
        got, offs = tokenizer.tokenize_with_offsets(head + cont)
        at = bisect.bisect_left([s for s, _ in offs], start - left_start)
        if at >= len(got) or offs[at][0] != start - left_start:
            continue  # the match start itself moved: not something a continuation explains
        m = 0
        while m < k and at + m < len(got) and got[at + m] == seq[m]:
            m += 1
        if m < k:
            k, culprit = m, cont
    return k, culprit


# What the text before a delimiter may end with (a message's content, besides the probe's `Zx`, or
# markup): its ids as they read after each of these are matched too.
_ENDINGS = (".", "?", "!", ",", ":", ")", "]", "}", ">", "\"", "'", "`", "*", "1", " ", "\n", "é", "😀")


def _in_other_contexts(options: dict[Delimiter, _Options], choice: dict[Delimiter, int], order, render: _Render,
                       tokenizer: Tokenizer, opening: frozenset[int]) -> tuple[dict[Delimiter, _Options], list[str]]:
    """`options` with each chosen candidate also matching its delimiter where the probe never writes it.

    At the start of a text: SentencePiece writes a word space before a text's first piece (and after
    every control token), so `### User:` starts `▁###` there and `##` `#` after a newline; the probe
    starts with a system message, and a conversation that opens with a user message got no span for
    it. After text that ends otherwise than the probe's: `?<` is one token in llama-bpe, so a
    textual `<|assistant|>` after a question lost its first ids and its turn went to the user's span.
    Each form is read off the text from an occurrence on, tokenized alone or after the ending; kept
    where it differs from the ids matched already, spells its characters, loses at most one of them,
    keeps a letter and some of the delimiter's markup, and changes nothing the probe render's split
    finds; one that is another role's ids is said in a warning (returned with the options)."""
    out, warnings = dict(options), []
    split = _expected_and_found(out, choice, order, render, opening)  # (what each form must leave as it is)
    for d, opts in options.items():
        cand = opts.candidates[choice[d]]
        if not opts.occurrences or not cand.starts:
            continue
        others = {q: o.delimiter.role for o in out.values() if o.delimiter.role != d.role
                  for q in (o.candidates[choice[o.delimiter]].ids,) + o.candidates[choice[o.delimiter]].alternatives}
        forms = []
        for context, f in _context_forms(d, opts.occurrences, cand, render, tokenizer):
            if f in others:
                warnings.append(f"{context} the {d.role} delimiter {d.text!r} has the {others[f]}'s ids "
                                f"({tokenizer.detokenize(list(f))!r}): no span detector tells them apart there")
            elif _keeps_markup(tokenizer.detokenize(list(f)), d.text):
                forms.append(f)
        if not forms:
            continue
        widened = replace(cand, alternatives=cand.alternatives + tuple(forms),
                          note=_join(cand.note, f"its tokens differ at a text's start or after other content: "
                                                f"matching {len(forms)} more sequence(s) there"))
        trial = dict(out)
        trial[d] = replace(opts, candidates=opts.candidates[:choice[d]] + (widened,) + opts.candidates[choice[d] + 1:])
        if _expected_and_found(trial, choice, order, render, opening) == split:
            out = trial
    return out, list(dict.fromkeys(warnings))


def _keeps_markup(text: str, delimiter: str) -> bool:
    """Whether a delimiter's ids read as `text` in another context keep a letter or digit and, where
    the delimiter has markup (a character neither a letter, a digit nor a space), some of it: `###
    Assistant` after `*` in llama-bpe is ` Assistant` (`*###` one token), a word any message writes."""
    def markup(t: str) -> bool:
        return any(not ch.isalnum() and not ch.isspace() for ch in t)

    return any(ch.isalnum() for ch in text) and (markup(text) or not markup(delimiter))


def _context_forms(d: Delimiter, occ: Sequence[_Occurrence], cand: _Candidate, render: _Render,
                   tokenizer: Tokenizer) -> list[tuple[str, Ids]]:
    """The id sequences of `cand`'s characters at a text's start (where no occurrence is there) and
    after each of `_ENDINGS`, that no sequence of `cand` matches already and that lose at most one
    of its characters to the text before: [(where, as a warning begins, ids)]."""
    prefixes = ([""] if all(o.at > 0 for o in occ) else []) + list(_ENDINGS)
    o, lo, hi = occ[0], cand.starts[0], cand.starts[0] + len(cand.ids)
    if hi > len(render.ids) or render.offsets[lo][0] < o.at:
        return []
    a, b = render.offsets[lo][0] - o.at, render.offsets[hi - 1][1] - o.at  # the ids' characters, in the delimiter's
    tail = render.text[o.at:o.at + len(d.text) + 16]
    known = (cand.ids,) + cand.alternatives
    out: list[tuple[str, Ids]] = []
    for prefix in prefixes:
        got, offs = tokenizer.tokenize_with_offsets(prefix + tail)
        n = len(prefix)
        inside = [i for i, (s, e) in enumerate(offs) if s >= n + a and e <= n + b]
        if not inside:
            continue
        first, last = inside[0], inside[-1]
        form = tuple(got[first:last + 1])
        if inside != list(range(first, last + 1)) or form in [f for _, f in out] or form in known:
            continue
        if offs[first][0] - n - a > 1:
            continue  # (more than one character lost to the ending: ` User:` of `### User:` is any text's)
        if tokenizer.detokenize(list(form)) != tail[offs[first][0] - n:offs[last][1] - n]:
            continue  # (a byte-level token inside a character: no text of its own)
        if any(tuple(got[i:i + len(q)]) == q for i in range(len(got)) for q in known):
            continue  # (a sequence of `cand` matches in that text, at the delimiter or a token on)
        out.append((f"after text ending in {prefix!r}," if prefix else "at the start of a text,", form))
    return out


def _choose(options: dict[Delimiter, _Options], order, render: _Render, opening: frozenset[int] = frozenset()) -> dict[Delimiter, int]:
    """One candidate index per delimiter.

    Start from each delimiter's preferred candidate; while the token split disagrees with the
    text split, change one delimiter's candidate at a time where that lowers the disagreement.
    """
    choice = {d: 0 for d in options}

    def cost() -> int:
        exp, got = _expected_and_found(options, choice, order, render, opening)
        return len(set(exp).symmetric_difference(got)) + (len(exp) != len(got))

    best = cost()
    for _ in range(4):
        if best == 0:
            break
        improved = False
        for d, opts in options.items():
            keep = choice[d]
            for k in range(len(opts.candidates)):
                if k == keep:
                    continue
                choice[d] = k
                c = cost()
                if c < best:
                    best, keep, improved = c, k, True
            choice[d] = keep
        if not improved:
            break
    return choice


def _expected_and_found(options: dict[Delimiter, _Options], choice: dict[Delimiter, int], order,
                        render: _Render, opening: frozenset[int] = frozenset()) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(token, role) of each message start: as the text split says (and an assistant start the ids
    find in `opening`, see `_prompt_opening`), and as the chosen ids find."""
    picked = {d: o.candidates[choice[d]] for d, o in options.items()}
    chosen = [(d.role, q) for d, c in picked.items() for q in (c.ids,) + c.alternatives]
    found = SpanDetector(chosen).split(render.ids) if render.ids else None
    expected = sorted((picked[d].starts[k], d.role) for d, k in order if k < len(picked[d].starts))
    got = [(s.pos, s.role) for s in found] if found is not None else []
    if opening:
        expected = sorted(set(expected) | {(pos, role) for pos, role in got if role == "assistant" and pos in opening})
    return expected, got


def _split_problems(expected, got, offsets: Offsets) -> list[str]:
    if expected == got:
        return []
    problems = []
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing:
        problems.append("token split misses message starts at " + _fmt_positions(missing, offsets))
    if extra:
        problems.append("token split finds extra message starts at " + _fmt_positions(extra, offsets))
    return problems


def _token_delimiter(opts: _Options, cand: _Candidate, tokenizer: Tokenizer) -> TokenDelimiter:
    d = opts.delimiter
    token_text = tokenizer.detokenize(list(cand.ids))
    note = cand.note
    if note is None and token_text != d.text:
        note = f"its tokens stand for {token_text!r}: the tokenizer drops or normalises characters here"
    return TokenDelimiter(
        role=d.role, text=d.text, ids=cand.ids, occurrences=len(opts.occurrences), aligned=opts.aligned,
        stable=opts.stable, standalone_ids=opts.standalone, adjusted=note, token_text=token_text,
        alternatives=cand.alternatives, alternative_texts=tuple(tokenizer.detokenize(list(a)) for a in cand.alternatives),
    )


def _unspelled(delimiters: Sequence[TokenDelimiter], rendered: str, tokenizer: str) -> str | None:
    """None when the tokenizer spells every delimiter: each of its id sequences decodes to text the
    template writes (`_spells`); else that it does not match the template, and what one delimiter's
    ids come back as."""
    for d in delimiters:
        for ids, text in zip((d.ids,) + d.alternatives, (d.token_text,) + d.alternative_texts):
            if not _spells(text, d, rendered):
                return (f"the tokenizer {tokenizer!r} does not match the template: the {d.role} delimiter {d.text!r} "
                        f"comes back from its token ids {list(ids)[:12]} as {text!r} (its vocabulary cannot spell "
                        "the delimiter, or changes it)")
    return None


def _spells(text: str, d: TokenDelimiter, rendered: str) -> bool:
    """`text`, the decoded ids of delimiter `d`, is text the template writes there: cut back to the
    tokens wholly inside the delimiter, or widened to whole tokens around it, it is still a piece of
    the probe render where the delimiter occurs (of the delimiter's own text where it does not),
    less whitespace that a special token takes in (phi-3's `<|end|>` its `\\n`).
    A tokenizer that adds, spaces out or changes characters (a WordPiece vocabulary on `<|im_start|>`)
    decodes to text found in neither."""
    if not text:
        return False
    if d.occurrences:
        return text in rendered or _less_whitespace(text).search(rendered) is not None
    return text in d.text or d.text in text or _less_whitespace(text).search(d.text) is not None


def _less_whitespace(text: str) -> re.Pattern[str]:
    """Matches `text` in a string that has whitespace between its characters where `text` has none."""
    return re.compile(r"\s*".join(map(re.escape, text)))


# ---------------------------------------------------------------------------------------------
# Small helpers


def _describe(occ: Sequence[_Occurrence], lo: int, hi: int, left_inner: bool, right_inner: bool,
              render: _Render) -> str | None:
    """A note on how the chosen ids differ from the delimiter's text, or None when they match."""
    notes = []
    left = [x for x in occ if not x.left_aligned]
    right = [x for x in occ if not x.right_aligned]

    def where(xs) -> str:
        return "" if len(xs) == len(occ) else f" at {len(xs)} of its {len(occ)} occurrences"

    if left:
        how = "the match starts after it" if left_inner else "kept the whole token"
        notes.append(f"starts inside token {render.piece(left[0].first)!r}{where(left)}; {how}")
    if right:
        if right_inner:
            kept = render.text[render.offsets[lo][0]:render.offsets[hi - 1][1]] if hi > lo else ""
            how = f"dropped it, matching {kept!r}"
        else:
            how = "kept the whole token"
        notes.append(f"ends inside token {render.piece(right[0].last)!r}{where(right)}; {how}")
    return "; ".join(notes) if notes else None


def _join(note: str | None, extra: str) -> str:
    return f"{note}; {extra}" if note else extra


def _common_prefix(seqs: Iterable[Ids]) -> Ids:
    seqs = list(seqs)
    if not seqs:
        return ()
    first = seqs[0]
    n = min(len(s) for s in seqs)
    k = 0
    while k < n and all(s[k] == first[k] for s in seqs):
        k += 1
    return first[:k]


def _fmt_positions(items, offsets: Offsets, limit: int = 5) -> str:
    shown = [f"token {p} ({role}, char {offsets[p][0] if p < len(offsets) else '?'})" for p, role in items[:limit]]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(shown) + more
