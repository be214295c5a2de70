"""The session layer: one conversation type, the session generator beside it, and one render of a
conversation for a server.

- `Conversation` (also named `Session`): messages and tools, read and checked by
  `load_conversation` / `load_session` / `session_from_json` (one-line InputErrors naming the JSON
  path), written by `save_session` (_conversation);
- `generate_session()` / `next_user_turn()`: seeded coding-agent sessions (_generator);
- `messages_for(template, messages)`: tool-call arguments as llama-server gives that template
  (_arguments);
- `render_conversation(template, conversation)` and `for_server(...)`: the render every place that
  renders a conversation for a server shares (_render).

Below it lie the sources, the sandbox and the analysis; above it the server's rules, prefill and
turns.
"""

from ._arguments import messages_for, object_arguments, reads_thinking, reasoning_for, template_messages
from ._conversation import Conversation, Session, load_conversation, load_session, save_session, session_from_json
from ._generator import STYLES, TOOLS, generate_session, next_user_turn
from ._render import SESSION_LIMITS, ServerConversation, for_server, render_conversation, render_variables

__all__ = [
    "SESSION_LIMITS", "STYLES", "TOOLS", "Conversation", "ServerConversation", "Session", "for_server", "generate_session",
    "load_conversation", "load_session", "messages_for", "next_user_turn", "object_arguments", "reads_thinking", "reasoning_for",
    "render_conversation",
    "render_variables", "save_session", "session_from_json", "template_messages",
]
