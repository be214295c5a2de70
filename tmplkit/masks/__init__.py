"""Training masks from proven boundaries: which tokens of a rendered conversation the model learns
(`assistant_mask`, `assistant_masks`, `text_mask`: _mask; the messages a render leaves out,
`left_out`: _dropped), and a copy of a template with
`{% generation %}` tags that makes transformers' `return_assistant_tokens_mask` return the same
mask (`annotate_template`: _annotate).

Below it lie the analysis (the proven delimiters) and the session layer (one render of a
conversation, its requests and what the model generates for a turn, `locate_turn`); the CLI
(`tmplkit mask`, `tmplkit annotate`) sits above it. The annotation is split by concern: `_lexer`
(the source's tags and places), `_tracing`, `_placement` (the three ways tags are placed),
`_proof` (transformers' mask against tmplkit's), `_annotate` (`annotate_template` composes them).
"""

from ._annotate import Annotated, annotate_template
from ._dropped import left_out
from ._mask import (
    MASK_SCHEMA_VERSION,
    AssistantMask,
    MaskedTurn,
    MaskError,
    TextMask,
    assistant_mask,
    assistant_masks,
    markup_only_turns,
    text_mask,
    text_masks,
    tokenize_mask,
)
from ._proof import AnnotationError, check_conversations, transformers_mask

__all__ = ["MASK_SCHEMA_VERSION", "AnnotationError", "Annotated", "annotate_template", "check_conversations",
           "transformers_mask", "AssistantMask", "MaskError", "MaskedTurn", "TextMask", "assistant_mask",
           "assistant_masks", "left_out", "markup_only_turns", "text_mask", "text_masks", "tokenize_mask"]
