"""The messages a trainer's render leaves out: a model trained on the render never sees them.

A template may drop a message of a role it does not know without a word: under transformers'
preparation a `developer` message reaches the template as it is, and many templates print only
the roles they name (llama-server gives it as `system` instead). The mask is right for such a
render, but the example teaches the model an answer to a conversation without that message, so
the mask says which messages were left out.

A message is left out when its content is not in the render and a render with that content
replaced by a needle holds no needle either: a template that writes the content otherwise
(escaped, trimmed, as JSON) writes the needle. One render holds every such message's needle (a
template that drops every tool result of a long session costs one render more, not one a result).
"""

from __future__ import annotations

from ..errors import TmplkitError
from ..session import ServerConversation, content_text
from ..session.requests import NEEDLE

__all__ = ["left_out"]


def left_out(server: ServerConversation, text: str) -> tuple[int, ...]:
    """The indices of the messages of `server` (a conversation prepared as a trainer renders it)
    other than the assistant's whose content `text`, its render without a generation prompt, does
    not hold (see the module doc)."""
    messages = list(server.messages)
    unseen, at = [], 0
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            continue
        given = m.get("content")
        # (found in order where the template writes the messages in order: one pass over the render)
        content = given if isinstance(given, str) else ""
        found = _find(text, content, at) if content else -1
        if found < 0:
            content = content_text(given).strip()
            if not content:
                continue
            found = text.find(content)
        if found < 0:
            unseen.append(i)
        else:
            at = found + len(content)
    if not unseen:
        return ()
    needled = _needled(server, messages, unseen)
    if needled is None:
        return ()
    needled = needled.lower()  # (a template that writes the content in capitals writes the needle so)
    return tuple(i for i in unseen if _needle(i).lower() not in needled)


def _find(text: str, content: str, at: int) -> int:
    """`text.find(content, at)`, its search by the content's beginning (a long needle's search
    costs its length on every call; a session's tool results run to kilobytes)."""
    head = content[:32]
    pos = text.find(head, at)
    while pos >= 0 and not text.startswith(content, pos):
        pos = text.find(head, pos + 1)
    return pos


def _needle(i: int) -> str:
    # (a needle of its own for each message, none inside another: NEEDLE, the index, NEEDLE)
    return f"{NEEDLE}{i}{NEEDLE}"


def _needled(server: ServerConversation, messages: list[dict], indices: list[int]) -> str | None:
    """The render with the content of each of `indices` a needle (as a text part where it was
    parts); None where the template refuses it (nothing is proved then)."""
    out = list(messages)
    for i in indices:
        m = out[i]
        needle = _needle(i)
        out[i] = {**m, "content": [{"type": "text", "text": needle}] if isinstance(m.get("content"), list) else needle}
    try:
        return server.render(out, add_generation_prompt=False)
    except TmplkitError:
        return None
