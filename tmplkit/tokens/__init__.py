"""The tokens layer: tokenizers, delimiters as token ids, span detection, the token round trip.

- `tokenizers`: the tokenizer adapters and `TokenizerSpec`, the one reader of tokenizer specs;
- `gguf_vocab`: GGUF BPE vocabularies rebuilt for the `tokenizers` package (no llama.cpp needed);
- `vocab_check`: a GGUF vocabulary llama.cpp would abort the process on, told before it opens it;
- `delimiter_ids`: each role's delimiter as token ids (`token_delimiters`);
- `spans`: the span detector over token ids (`SpanDetector`, `Spans`, `TokenSpan`);
- `roundtrip`: the token round trip (`token_round_trip`, `vocab_for_template`).

Nothing is imported here: numpy and the tokenizer libraries load only with the module that needs them.
"""
