"""The round trip fails only where a consumer of the roles is misled: a message written on in the
turn before it whose content still lies in a span of its own role passes, and says so."""

from __future__ import annotations

from tmplkit.analysis._probing import Prober
from tmplkit.analysis._verdict import round_trip_verdict
from tmplkit.analysis.probes import ProbeBuilder
from tmplkit.delimiters import Delimiter, sort_delimiters
from tmplkit.sources import ChatTemplate

# Ours: tool results written one after the other, each opened by <tool>.
GROUPED = ("{% for m in messages %}{% if m.role == 'tool' %}<tool>{{ m.content }}</tool>\n{% else %}<|{{ m.role }}|>"
           "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}</call>{% endfor %}\n{% endif %}"
           "{% endfor %}")
# The second result is expected to continue the first one's span (as where no separator between
# results was found): the round trip decides whether reading it otherwise misleads anything.
MODES = ["own", "own", "own", "continues", "own"]


def _render():
    prober = Prober(ChatTemplate(GROUPED, "grouped", "-"), None)
    text, probe, _, err = prober.attempt(ProbeBuilder(prober.needles), "U1 C1(G1,G2) T1 T2 A3")
    assert err is None
    return text, probe


def test_a_continuation_in_a_span_of_its_own_role_passes_and_says_so():
    text, probe = _render()
    delims = sort_delimiters([Delimiter("user", "<|user|>"), Delimiter("assistant", "<|assistant|>"), Delimiter("tool", "<tool>")])
    r = round_trip_verdict(text, probe, delims, MODES)
    assert r.passed and not r.problems
    assert r.notes == ("message 3 (tool): the template writes it on in the turn before it, and a tool start opens a span of its "
                       "own there: it is read as a tool message, which misleads no consumer",)


def test_a_continuation_read_as_another_role_fails():
    text, probe = _render()
    # the second result's opener read as a user start: a tool result given to the user
    delims = sort_delimiters([Delimiter("user", "<|user|>"), Delimiter("assistant", "<|assistant|>"),
                              Delimiter("tool", "<call>kq_lookup</call><tool>"), Delimiter("user", "</tool>\n<tool>")])
    r = round_trip_verdict(text, probe, delims, MODES)
    assert not r.passed
    assert "message 3 (tool): continues the turn before it, but its content lies in a user span" in r.problems
