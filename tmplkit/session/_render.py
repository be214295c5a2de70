"""One render of a conversation for a server: what every place that renders a conversation as a
server would (a prefill's prompt, each request of a session, the spans and the request commands,
engine parity) renders through.

A server gives a template the conversation with tool-call arguments as it gives them
(`messages_for`: JSON strings, or objects where the template reads objects), the tools only when
there are any, the family's common BOS/EOS where the template reads them and its source gives none
(`sources.family_special_tokens`, as the analysis proves its delimiters), llama-server's default
reasoning switches (`SERVER_VARIABLES`), its `enable_thinking` (`_thinking.server_thinking`) and
its date variables at the render's time (the server setting only), and the caller's extra
variables; a session render may be long, so it runs under `SESSION_LIMITS` (or a `session_limits` block's).

    >>> from tmplkit.sources import ChatTemplate
    >>> t = ChatTemplate("{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}{% endfor %}", "bare", "-")
    >>> render_conversation(t, Conversation(({"role": "user", "content": "hi"},)), add_generation_prompt=False)
    '<s>[INST]hi'

`for_server(template, conversation)` prepares the conversation once (a `ServerConversation`) for
callers that render it many times: every request of a session, each at its own time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property

from ..errors import InputError, RenderError
from ..jsonio import shape_problem
from ..sandbox import PINNED_NOW, Prepared, draws_at_random, prepare_message, prepare_tools, reads_clock, reads_date, render, render_with_prompt
from ..sources.templates import ChatTemplate, family_special_tokens, require_template
from ._arguments import messages_for
from ._conversation import Conversation, load_conversation
from ._inputs import DEFAULT_INPUTS, SESSION_LIMITS, check_inputs, given_tools, session_render
from ._thinking import server_thinking
from ._workarounds import as_server_finishes, as_server_renders

__all__ = ["SERVER_VARIABLES", "SESSION_LIMITS", "ServerConversation", "for_server", "render_conversation",
           "render_variables", "server_variables"]

# What llama-server sets in every render unless told otherwise: `preserve_reasoning` is on by default
# (common/arg.cpp, `--no-reasoning-preserve` turns it off) and reaches the template as itself and as
# the four switches templates read to keep earlier turns' reasoning (common/chat.cpp applies
# caps.cpp `caps_apply_preserve_reasoning`); a request's own variables set after them win.
SERVER_VARIABLES = {"preserve_reasoning": True, "preserve_thinking": True, "clear_thinking": False,
                    "truncate_history_thinking": False, "drop_thinking": False}

# The date variables llama-server sets in every render, and their formats (common/chat.cpp).
_DATE_FORMATS = {"datetime": "%b %d %Y", "date_string": "%d %b %Y"}


def _pinned() -> datetime:
    return PINNED_NOW


def render_variables(template: ChatTemplate, kwargs: Mapping | None = None, inputs: str = DEFAULT_INPUTS) -> dict:
    """The variables of every render of a conversation for a server: the family's common BOS/EOS
    strings where the template reads them and its source gives none (as the analysis renders, so a
    bare .jinja of a Mistral-style template that writes `eos_token` after each reply renders), for
    the server setting llama-server's own (`server_variables`), then `kwargs`."""
    kwargs = dict(kwargs or {})
    server = server_variables(template, kwargs) if inputs == "server" else {}
    return {**family_special_tokens(template), **server, **kwargs}


def server_variables(template: ChatTemplate, kwargs: Mapping | None = None) -> dict:
    """What llama-server sets in every render of `template` before a request's own variables:
    its reasoning switches (`SERVER_VARIABLES`; a `preserve_reasoning` of `kwargs` sets all four,
    as the server's does) and, where the template names it, `enable_thinking` (`server_thinking`:
    true where the server finds the template reasons)."""
    out: dict = {}
    preserve = (kwargs or {}).get("preserve_reasoning", True)
    if isinstance(preserve, bool):  # (the server applies only a boolean; the request's is passed as given)
        out = {name: value == preserve for name, value in SERVER_VARIABLES.items()}
    if "enable_thinking" in template.text:  # (passed to every template; only one that names it reads it)
        out["enable_thinking"] = server_thinking(template)
    return out


@dataclass(frozen=True)
class ServerConversation:
    """`conversation` as a server gives it to `template`: its messages with tool-call arguments as
    the template takes them, its tools (None when it has none) and the render variables (the family's
    BOS/EOS, then `kwargs`). `render()` renders it, or any list of messages made from its messages."""

    template: ChatTemplate
    conversation: Conversation = field(repr=False)
    messages: tuple[dict, ...] = field(repr=False)
    tools: tuple[dict, ...] | None = field(repr=False)
    kwargs: dict = field(default_factory=dict)
    variables: dict = field(default_factory=dict, repr=False)
    inputs: str = DEFAULT_INPUTS  # whose message preparation: "server" or "transformers" (session._inputs)

    @property
    def engine(self) -> str:
        """Whose template engine renders: llama-server's where the server prepares the messages (what
        transformers' sandbox refuses and llama-server renders, a list a template changes in place,
        is rendered so), else transformers'."""
        return "llama-server" if self.inputs == "server" else "transformers"

    def render(self, messages: Sequence[dict] | None = None, *, add_generation_prompt: bool = True,
               clock: Callable[[], datetime] | None = None) -> str:
        """The render of `messages` (default: the whole conversation); `clock` is the time the
        template's `strftime_now` reads (default: the sandbox's pinned time). The conversation's own
        messages are prepared for the sandbox once (every request renders them again)."""
        given = self.messages if messages is None else messages
        ready = self._prepared
        prepared = Prepared(ready.get(id(m)) or prepare_message(m) for m in self._as_rendered(given))
        try:
            text = session_render(render, self.template, prepared, tools=self._prepared_tools, engine=self.engine,
                                  add_generation_prompt=add_generation_prompt, clock=clock, **self.variables_at(clock))
        except RenderError as exc:
            raise self._refusal(exc, given) from exc
        return self._finished(text, add_generation_prompt)

    def render_with_prompt(self, messages: Sequence[dict], *, clock: Callable[[], datetime] | None = None) -> tuple[str, str]:
        """`render(messages)` with the generation prompt and without it, in one pass where the
        template allows (`sandbox.render_with_prompt`): each request of a session needs both."""
        ready = self._prepared
        prepared = Prepared(ready.get(id(m)) or prepare_message(m) for m in self._as_rendered(messages))
        try:
            with_prompt, without = session_render(render_with_prompt, self.template, prepared, tools=self._prepared_tools,
                                                  engine=self.engine, clock=clock, **self.variables_at(clock))
        except RenderError as exc:
            raise self._refusal(exc, messages) from exc
        return self._finished(with_prompt, True), without

    def _refusal(self, exc: RenderError, messages) -> RenderError:
        """`exc` (the template refused `messages`), saying which of them are the client's developer
        messages given as system (a template that takes one system message first refuses the
        session for a developer message that comes after it, as it does on the server)."""
        mapped = [i for i, m in enumerate(self.messages) if id(m) in self._developers]
        if type(exc) is not RenderError or not mapped or not any(id(m) in self._developers for m in messages):
            return exc
        which, many = ", ".join(map(str, mapped)), len(mapped) > 1
        return RenderError(f"{exc} (message{'s' if many else ''} {which} {'are developer messages' if many else 'is a developer message'}"
                           ", which llama-server gives as system)", template_message=exc.template_message,
                           template_raised=exc.template_raised)

    @cached_property
    def _developers(self) -> frozenset[int]:
        """The identities of the messages the client sent as developer and the server setting gives as system."""
        sent = self.conversation.messages
        return frozenset(id(m) for m, c in zip(self.messages, sent)
                         if m.get("role") == "system" and c.get("role") == "developer")

    @property
    def reads_clock(self) -> bool:
        """Whether two renders of the same messages at other times can differ: the template reads
        the clock (`sandbox.reads_clock`), or, as llama-server gives it, the date variables."""
        return reads_clock(self.template.text) or bool(self._date_names)

    @property
    def draws_only(self) -> bool:
        """Whether what changes between renders at other times is only the template's random draws
        (`sandbox.draws_at_random`; it names no date: no `strftime_now`, no date variable)."""
        return draws_at_random(self.template.text) and not reads_date(self.template.text) and not self._date_names

    def variables_at(self, clock: Callable[[], datetime] | None = None) -> dict:
        """The variables of a render at `clock`'s time (default: the sandbox's pinned time):
        `variables`, and llama-server's date variables as common/chat.cpp's
        `common_chat_extra_context` writes them in every render (`datetime` "Jan 01 2025",
        `date_string` "01 Jan 2025") where the template names them and the request's variables do
        not set them; none of those under transformers' preparation."""
        if not self._date_names:
            return self.variables
        now = (clock or _pinned)()
        return {**self.variables, **{name: now.strftime(_DATE_FORMATS[name]) for name in self._date_names}}

    @cached_property
    def _date_names(self) -> tuple[str, ...]:
        if self.inputs != "server":
            return ()
        return tuple(n for n in _DATE_FORMATS if n in self.template.text and n not in self.kwargs)

    def _as_rendered(self, messages):
        """The list a server renders for `messages` (a system message folded where the template
        never reads one, Gemma 4's model turns: `as_server_renders`); as it is under transformers'
        preparation."""
        return as_server_renders(self.template, messages) if self.inputs == "server" else messages

    def _finished(self, text: str, add_generation_prompt: bool) -> str:
        """The render as the server's prompt (`as_server_finishes`); as it is under transformers'."""
        return as_server_finishes(self.template, text, add_generation_prompt) if self.inputs == "server" else text

    @cached_property
    def _prepared_tools(self) -> Prepared | None:
        return prepare_tools(self.tools)

    @cached_property
    def _prepared(self) -> dict[int, dict]:
        # Keyed by identity: the messages are this object's own, kept alive by it.
        return {id(m): prepare_message(m) for m in self.messages}


def for_server(template: ChatTemplate, conversation, kwargs: Mapping | None = None, *,
               inputs: str | None = None) -> ServerConversation:
    """`conversation` (a `Conversation`, or one already prepared: then kept, or prepared again for
    another template, other `kwargs` or other `inputs`) as a server gives it to `template`; `inputs`:
    whose message preparation ("server", the default, or "transformers": `session._inputs`; None
    keeps a prepared conversation's own)."""
    require_template(template)
    _check_kwargs(kwargs)
    if not isinstance(conversation, (Conversation, ServerConversation)):  # (a list, parsed JSON or a path, as its siblings take)
        conversation = load_conversation(conversation)
    elif isinstance(conversation, Conversation) and (problem := shape_problem((conversation.messages, conversation.tools))):
        # (one built by hand, not read: its values may hold themselves, which every walk below would follow)
        raise InputError(f"{conversation.source or '<conversation>'}: {problem}; give the conversation as JSON-like data")
    if isinstance(conversation, ServerConversation):
        inputs = conversation.inputs if inputs is None else inputs
        if conversation.template == template and conversation.inputs == inputs:  # its messages stay as they are
            if kwargs is None:
                return conversation
            return replace(conversation, kwargs=dict(kwargs), variables=render_variables(template, kwargs, inputs))
        kwargs = conversation.kwargs if kwargs is None else kwargs
        conversation = conversation.conversation
    inputs = check_inputs(inputs or DEFAULT_INPUTS)
    try:
        messages = tuple(messages_for(template, conversation.messages, inputs))
        tools = given_tools(conversation.tools, inputs)
    except InputError as exc:  # (the session's fault: named by its file)
        raise InputError(f"{conversation.source}: {exc}" if conversation.source else str(exc)) from None
    return ServerConversation(template, conversation, messages, tools, dict(kwargs or {}),
                              render_variables(template, kwargs, inputs), inputs)


# What every render sets from the conversation and the request: template variables may not replace it.
_RENDER_SETS = ("messages", "tools", "documents", "add_generation_prompt", "limits", "clock", "template")


def _check_kwargs(kwargs: Mapping | None) -> None:
    if kwargs is not None and not (isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)):
        raise InputError(f"template variables must be a mapping of name -> value, got {type(kwargs).__name__}")
    taken = sorted(set(kwargs or ()) & set(_RENDER_SETS))
    if taken:
        raise InputError(f"template variables {', '.join(taken)}: set by each render from the conversation and the "
                         "request; leave them out of the variables")


def render_conversation(template: ChatTemplate, conversation, *, add_generation_prompt: bool = True,
                        kwargs: Mapping | None = None, clock: Callable[[], datetime] | None = None) -> str:
    """`conversation` rendered with `template` as a server renders it (see the module doc)."""
    return for_server(template, conversation, kwargs).render(add_generation_prompt=add_generation_prompt, clock=clock)
