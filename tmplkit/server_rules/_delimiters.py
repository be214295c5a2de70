"""llama-server's own delimiter sets: the two delimiters its chat parser finds for a template's
family (user and assistant start), each tokenized on its own as the server tokenizes them, and the
spans they find, to compare with tmplkit's.
"""

from __future__ import annotations

from ..errors import InputError
from ..sources import ChatTemplate
from ..spans import SpanDetector, Spans

__all__ = ["SERVER_DELIMITERS", "server_delimiters", "server_spans"]

# llama-server's delimiters (its autoparser's user_start / assistant_start, as pinned by the
# vendored llama.cpp's tests/test-chat-auto-parser.cpp), by a marker of the template family.
SERVER_DELIMITERS = (
    ("<|im_start|>", (("assistant", "<|im_start|>assistant"), ("user", "<|im_start|>user"))),
    ("<start_of_turn>", (("assistant", "<start_of_turn>model"), ("user", "<start_of_turn>user"))),
)


def server_delimiters(template: ChatTemplate) -> tuple[tuple[str, str], ...]:
    """llama-server's two delimiters for this template's family (user and assistant start)."""
    for marker, delims in SERVER_DELIMITERS:
        if marker in template.text:
            return delims
    raise InputError(f"llama-server's delimiters for template '{template.name}' are not known here")


def server_spans(tokens, template: ChatTemplate, tokenizer) -> Spans:
    """The spans llama-server finds: its two delimiters, each tokenized on its own."""
    return SpanDetector(list(server_delimiters(template)), tokenizer).split(list(tokens))
