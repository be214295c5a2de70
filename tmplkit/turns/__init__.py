"""An agent session turn by turn: its requests, where each diverges from what the server holds,
and what each costs.

- `session_requests(session, template)` / `iter_requests`: what the client sends each time and
  what the server then holds; `next_renders`: the requests that can follow each one (requests.py);
- `divergences(...)`, `tokenize_requests(...)`: where and why request k+1 stops matching the held
  text and tokens (divergence.py);
- `ServerSimulation`, `MemoryModel`: llama-server's prompt cache over token positions
  (simulation.py); `session_cost(...)`: tokens recomputed per request under four settings (cost.py);
- `prepare_session(session, template, tokenizer)`: the session pipeline written once (requests,
  tokens, spans per delimiter set, predicted divergences) for the study, the replay and the
  benchmarks (pipeline.py), the next renders made on a second core where asked (ahead.py);
- `study_turns(template, session, tokenizer=...)`: all of it for one template (summary.py), and
  its reports as text, markdown, CSV or JSON (formats.py, `tmplkit turns`).

Below it lie the session layer (`tmplkit.session`: the requests render the conversation as a server
does) and llama-server's rules (`tmplkit.server_rules`: the simulation follows them); the replay on
a model (`tmplkit.replay`) sits above it and prefill.
"""

from ..session.requests import Request, common_prefix, iter_requests, next_renders, request_points, session_requests
from .cost import SETTINGS, CostSetting, SessionCost, default_settings, session_cost
from .divergence import CAUSES, Divergence, TokenizedRequests, divergences, tokenize_requests
from .pipeline import PreparedSession, prepare_session, request_spans
from .simulation import MemoryModel, ServerSimulation, SimulatedRequest, plan_batches
from .summary import HISTORY_FLAGS, TurnsReport, study_turns

__all__ = [
    "CAUSES", "HISTORY_FLAGS", "SETTINGS", "CostSetting", "Divergence", "MemoryModel", "PreparedSession", "Request",
    "ServerSimulation", "SessionCost", "SimulatedRequest", "TokenizedRequests", "TurnsReport", "common_prefix",
    "default_settings", "divergences", "iter_requests", "next_renders", "plan_batches", "prepare_session", "request_points",
    "request_spans", "session_cost", "session_requests", "study_turns", "tokenize_requests",
]
