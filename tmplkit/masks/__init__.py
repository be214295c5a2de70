"""Training masks from proven boundaries: which tokens of a rendered conversation the model learns
(`assistant_mask`, `assistant_masks`, `text_mask`: _mask), and a copy of a template with
`{% generation %}` tags that makes transformers' `return_assistant_tokens_mask` return the same
mask (`annotate_template`: _annotate).

Below it lie the analysis (the proven delimiters), the session layer (one render of a conversation)
and the turns study (what the model generates for a turn); the CLI (`tmplkit mask`, `tmplkit
annotate`) sits above it.
"""

from ._annotate import Annotated, AnnotationError, annotate_template, check_conversations, transformers_mask
from ._mask import (
    MASK_SCHEMA_VERSION,
    AssistantMask,
    MaskedTurn,
    MaskError,
    TextMask,
    assistant_mask,
    assistant_masks,
    text_mask,
    text_masks,
    tokenize_mask,
)

__all__ = ["MASK_SCHEMA_VERSION", "AnnotationError", "Annotated", "annotate_template", "check_conversations",
           "transformers_mask", "AssistantMask", "MaskError", "MaskedTurn", "TextMask", "assistant_mask",
           "assistant_masks", "text_mask", "text_masks", "tokenize_mask"]
