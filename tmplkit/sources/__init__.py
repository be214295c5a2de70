"""The sources layer: chat templates from GGUF files, the Hub, files and folders, and the pinned corpora.

- `templates`: `load(source)` and `ChatTemplate` (re-exported here);
- `gguf_meta`: the one bounded GGUF metadata reader (`Keys` names every metadata key once);
- `corpus`: the pinned llama.cpp and Hub template corpora in the cache.
"""

from .templates import (
    COMMON_SPECIAL_TOKENS,
    ChatTemplate,
    choose_one,
    default_of,
    family_special_tokens,
    load,
    load_dir,
    load_gguf,
    load_hf,
    load_jinja,
    load_json,
    load_many,
    load_one,
    names_of,
    select_named,
)

__all__ = ["COMMON_SPECIAL_TOKENS", "ChatTemplate", "choose_one", "default_of", "family_special_tokens", "load", "load_dir", "load_gguf", "load_hf",
           "load_jinja", "load_json", "load_many", "load_one", "names_of", "select_named"]
