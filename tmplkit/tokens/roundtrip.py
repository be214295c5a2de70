"""The token-level round trip, and which corpus vocabulary goes with which corpus template.

`token_round_trip(analysis, tokenizer)` tokenizes the analysis's round-trip render, splits the
token ids with the delimiters derived in context (`token_delimiters`), and requires the spans'
roles to equal `RoundTrip.expected_roles`: the proof that the delimiters work on what a prefill
engine sees, not only on text.

`VOCAB_FOR_TEMPLATE` is the one table pairing corpus templates with the corpus's vocab-only GGUFs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..sources import corpus
from .delimiter_ids import TokenDelimiters, token_delimiters
from .spans import SpanDetector, Spans
from .tokenizers import Tokenizer

# Template name pattern (re.search on the template's name, e.g. the .jinja file stem) -> vocab name
# (corpus.vocab_path), first match wins. "exact" means the vocab is the model family's own; "base"
# means the model added special tokens (its turn markers) that the vocab lacks, so those markers
# tokenize as text there: still a real tokenizer, and a harder test of in-context delimiters.
VOCAB_FOR_TEMPLATE: tuple[tuple[str, str, str], ...] = (
    (r"^Qwen3\.5", "qwen35", "exact"),
    (r"^(Qwen-Qwen2\.5|Qwen-QwQ|Qwen-Qwen3-|Qwen3-Coder)", "qwen2", "exact"),
    (r"^MiMo-VL", "qwen2", "exact"),
    (r"DeepSeek-R1-Distill-Qwen", "qwen2", "base"),
    (r"^meta-llama-Llama-3\.", "llama-bpe", "exact"),
    (r"firefunction-v2|functionary-medium-v3\.[12]", "llama-bpe", "exact"),
    (r"Hermes-2-Pro-Llama-3|Hermes-3-Llama-3\.1", "llama-bpe", "base"),
    (r"DeepSeek-R1-Distill-Llama", "llama-bpe", "base"),
    (r"Phi-3", "phi-3", "exact"),
    (r"gemma-4", "gemma-4", "exact"),
    (r"command-r|Cohere2", "command-r", "exact"),
    (r"DeepSeek-V3|DeepSeek-V4|llama-cpp-deepseek-r1", "deepseek-llm", "base"),
)


def vocab_for_template(name: str) -> str | None:
    """The corpus vocab for a template name, or None when the corpus has none that matches.

    >>> vocab_for_template("Qwen3.5-4B"), vocab_for_template("meta-llama-Llama-3.1-8B-Instruct")
    ('qwen35', 'llama-bpe')
    """
    for pattern, vocab, _ in VOCAB_FOR_TEMPLATE:
        if re.search(pattern, name):
            return vocab
    return None


@dataclass(frozen=True)
class TokenRoundTrip:
    """The verdict of splitting the tokenized round-trip render with token delimiters.

    `passed` when the token spans' roles equal `expected_roles` and the token split finds the
    same message starts as the text split.
    """

    template: str
    tokenizer: str
    passed: bool
    expected_roles: tuple[str, ...]
    actual_roles: tuple[str, ...]
    n_tokens: int
    delimiters: TokenDelimiters
    problems: tuple[str, ...] = ()
    spans: Spans | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {
            "template": self.template,
            "tokenizer": self.tokenizer,
            "passed": self.passed,
            "expected_roles": list(self.expected_roles),
            "actual_roles": list(self.actual_roles),
            "n_tokens": self.n_tokens,
            "problems": list(self.problems),
            "delimiters": self.delimiters.to_dict(),
        }


def token_round_trip(analysis, tokenizer: Tokenizer) -> TokenRoundTrip:
    """Split the tokenized round-trip render of `analysis` and compare roles with the expected ones.

    >>> rt = token_round_trip(analyze(load_one("Qwen3.5-4B.jinja")), load_tokenizer("vocab:qwen35"))  # doctest: +SKIP
    >>> rt.passed                                                                                     # doctest: +SKIP
    True
    """
    name = getattr(analysis, "name", "")
    tok_name = getattr(tokenizer, "name", type(tokenizer).__name__)
    rt = getattr(analysis, "round_trip", None)
    expected = tuple(getattr(rt, "expected_roles", ()) or ())
    td = token_delimiters(analysis, tokenizer)
    if rt is None or not getattr(rt, "rendered", ""):
        return TokenRoundTrip(name, tok_name, False, expected, (), 0, td, ("the analysis has no round-trip render to tokenize",))
    ids = tokenizer.tokenize(rt.rendered)
    spans = SpanDetector(td).split(ids)
    actual = spans.roles
    if td.prompt_start is not None and actual == expected + ("assistant",):
        actual = expected  # (the generation prompt's assistant start, proven where the ids were: `prompt_start`)
    problems = list(td.problems)
    if actual != expected:
        problems.insert(0, f"token spans have roles {list(actual)}, expected {list(expected)}")
    passed = actual == expected and td.passed
    return TokenRoundTrip(name, tok_name, passed, expected, actual, len(ids), td, tuple(problems), spans)


def corpus_pairs() -> list[tuple[str, str]]:
    """(template name, vocab name) for every corpus template that has a vocab in the corpus.

    Raises SourceError when the corpus is not fetched.
    """
    out = []
    for path in sorted(corpus.templates_dir().glob("*.jinja")):
        vocab = vocab_for_template(path.stem)
        if vocab is not None and vocab in corpus.list_vocabs():
            out.append((path.stem, vocab))
    return out
