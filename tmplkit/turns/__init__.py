"""An agent session turn by turn: its requests, where each diverges from what the server holds,
and what each costs.

- `session_requests(session, template)` / `iter_requests`: what the client sends each time and
  what the server then holds; `next_renders`: the requests that can follow each one (requests.py);
- `divergences(...)`, `tokenize_requests(...)`: where and why request k+1 stops matching the held
  text and tokens (divergence.py);
- `ServerSimulation`, `MemoryModel`: llama-server's prompt cache over token positions
  (simulation.py); `session_cost(...)`: tokens recomputed per request under four settings (cost.py);
- `study_turns(template, session, tokenizer=...)`: all of it for one template (summary.py), and
  its reports as text, markdown, CSV or JSON (formats.py, `tmplkit turns`).
"""

from .cost import SETTINGS, CostSetting, SessionCost, default_settings, session_cost
from .divergence import CAUSES, Divergence, TokenizedRequests, divergences, tokenize_requests
from .requests import Request, common_prefix, iter_requests, next_renders, request_points, session_requests
from .simulation import MemoryModel, ServerSimulation, SimulatedRequest, plan_batches
from .summary import HISTORY_FLAGS, TurnsReport, study_turns

__all__ = [
    "CAUSES", "HISTORY_FLAGS", "SETTINGS", "CostSetting", "Divergence", "MemoryModel", "Request", "ServerSimulation",
    "SessionCost", "SimulatedRequest", "TokenizedRequests", "TurnsReport", "common_prefix", "default_settings",
    "divergences", "iter_requests", "next_renders", "plan_batches", "request_points", "session_cost", "session_requests", "study_turns",
    "tokenize_requests",
]
