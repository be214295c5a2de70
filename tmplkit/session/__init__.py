"""The session layer: one conversation type, the session generator beside it, and one render of a
conversation for a server.

- `Conversation` (also named `Session`): messages and tools, read and checked by
  `load_conversation` / `load_session` / `session_from_json` (one-line InputErrors naming the JSON
  path), written by `save_session` (_conversation); a Responses API or Anthropic Messages request
  body read as llama-server converts it (`chat_body`, `body_format`) (_client_formats);
- `generate_session()` / `next_user_turn()`: seeded coding-agent sessions (_generator);
- `messages_for(template, messages)`: tool-call arguments as llama-server gives that template
  (objects where its capability check finds them read: `server_object_arguments`) (_arguments);
- `given_messages(messages, inputs)`: each message as llama-server reads and writes it again
  ("server": a null content as `""`, only the keys its message struct holds) or as transformers
  gives it ("transformers": null-valued keys dropped, reasoning under both names), and the tools
  likewise (`given_tools`) (_inputs), a tool's parameters checked as llama-server's JSON Schema
  builder reads them (`schema_problem`) (_tool_schema);
- `as_server_prepares(template, messages)`, `as_server_renders(...)` and `as_server_finishes(...)`:
  llama-server's workarounds for what a template reads (content parts joined or made, StepFun's
  trim, Ministral 3's content blocks; on each list rendered, a system message it never reads
  folded, Gemma 4's older templates given whole model turns and DeepSeek V4's tool results in the
  order of the calls; the Gemma 4 handler's start of the model's turn) (_workarounds);
- `server_handler(template)`: which of llama-server's specialized handlers takes the template, in
  its order (_handlers); every decision above that follows the handler asks it;
- `server_thinking(template)`: the `enable_thinking` llama-server passes the template, by its
  handler or its autoparser's probes (_thinking);
- `trusted_by_probes(cache, conversation, agree, probes)`: whether a fast path may serve a
  template, held against its proof on probe conversations once per template (_turn_alone, whose
  fast path is a session's generated turns asked for alone; the masks' one-render path asks too);
- `render_conversation(template, conversation)` and `for_server(...)`: the render every place that
  renders a conversation for a server shares, with the variables the server sets
  (`server_variables`) (_render).

Below it lie the sources, the sandbox and the analysis; above it the server's rules, prefill and
turns.
"""

from ._arguments import messages_for, object_arguments, reads_thinking, reasoning_for, server_object_arguments, template_messages
from ._client_formats import body_format, chat_body, converted
from ._conversation import Conversation, Session, load_conversation, load_session, save_session, session_from_json
from ._generator import STYLES, TOOLS, generate_session, next_user_turn
from ._handlers import server_handler
from ._inputs import (
                      DEFAULT_INPUTS,
                      INPUTS,
                      active_session_limits,
                      check_inputs,
                      content_text,
                      given_messages,
                      given_tools,
                      inputs_note,
                      server_json,
                      server_refuses,
                      session_limits,
                      session_render,
)
from ._render import SERVER_VARIABLES, SESSION_LIMITS, ServerConversation, for_server, render_conversation, render_variables, server_variables
from ._thinking import server_thinking
from ._tool_schema import schema_problem
from ._turn_alone import read_once_per_template, trusted_by_probes
from ._workarounds import ContentReads, as_server_finishes, as_server_prepares, as_server_renders, content_reads

__all__ = [
    "body_format", "chat_body", "converted", "given_tools", "server_json",
    "ContentReads", "Conversation", "DEFAULT_INPUTS", "INPUTS", "SERVER_VARIABLES", "SESSION_LIMITS", "STYLES", "ServerConversation",
    "Session", "TOOLS", "as_server_finishes", "as_server_prepares", "as_server_renders", "check_inputs",
    "content_reads", "content_text", "for_server",
    "generate_session", "given_messages", "inputs_note", "load_conversation", "load_session", "messages_for",
    "next_user_turn", "object_arguments", "reads_thinking", "reasoning_for", "render_conversation",
    "render_variables", "save_session", "server_object_arguments", "server_handler", "server_refuses", "server_thinking", "server_variables",
    "session_from_json", "active_session_limits", "session_limits", "session_render",
    "read_once_per_template", "schema_problem", "template_messages", "trusted_by_probes",
]
