"""Differential analysis: derive each role's start delimiter from probe renders, and prove it.

`analyze(template)` renders small probe conversations (tmplkit.analysis.probes) that differ by one message,
finds each message's content by its needle, and reads the role delimiters off the text between
contents, in every context a role was seen in. A long mixed conversation is then rendered and
split with the derived delimiters; the Analysis carries that round-trip verdict.

The stages, each in its own module and each returning a frozen findings value:

- `_text`      pure text helpers: common prefix/suffix, cuts at markup units, agreement
- `_probing`   rendering probes and collecting the evidence (the only mutable state)
- `_chat`      user and assistant starts, the generation prompt, BOS and turn opener
- `_system`    where system messages go, and the system start
- `_tools`     tool calls and responses, and the tool-response delimiters
- `_reasoning` reasoning markers, thinking switches and what the generation prompt does with them
- `_verdict`   the round-trip conversation, split and checked (also cut where a server is given
               it, with each thinking switch, and with the family's BOS/EOS where none is known);
               a start that matches in the generation prompt is extended back (`extend_back`), and
               the other roles' starts over the same markup
- `_analyzer`  `analyze()`, composing them
- `_result`    Analysis, RoundTrip, and the one way a failed Analysis is built

None of this rests on the BOS/EOS tokens: a bare .jinja renders them empty (or gets "" where the
template needs them), and the delimiters are the same as with the real tokens.
"""

from ._analyzer import analyze
from ._result import LIMIT_STATUSES, STATUSES, TOOL_PLACEMENTS, Analysis, RoundTrip, failed_analysis, failure_reason, one_line, status_of

__all__ = ["LIMIT_STATUSES", "STATUSES", "TOOL_PLACEMENTS", "Analysis", "RoundTrip", "analyze", "failed_analysis", "failure_reason", "one_line",
           "status_of"]
