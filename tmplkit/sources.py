"""Loading chat templates from GGUF files, Hugging Face repos, .jinja/JSON files and folders."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatTemplate:
    """One chat template and where it came from.

    `name` identifies the template in reports (e.g. "Qwen3-Coder" or "model.gguf:tool_use");
    `source` is the origin as the user gave it; bos/eos are the token strings templates see.
    """

    text: str
    name: str
    source: str
    bos_token: str | None = None
    eos_token: str | None = None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "text": self.text,
        }
