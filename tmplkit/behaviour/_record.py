"""A template's behaviour record: what tmplkit derived for it, in the fields a publisher reviews.

`derive_behaviour` is the worker target (tmplkit.auditing.isolate): the analysis, the prefix-stability check
on the agent session and the probe renders, in one sandboxed process. `record_of` turns what it
found into a `BehaviourRecord`: the verdict, every role's delimiter, the generation prompt and
what it does with reasoning under each thinking switch, where tool responses and the system
prompt go, whether earlier reasoning is kept, the prefix-stability verdict, and a digest of each
probe render. Two records are equal exactly when the behaviour is: the template's text is kept
apart (`text_sha256`), so an edit that renders the same on every probe changes nothing else.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from ..analysis import LIMIT_STATUSES, STATUSES, TOOL_PLACEMENTS, Analysis
from ..auditing import NOT_APPLICABLE, NOT_CHECKED, PrefixStability, analyze_with_prefix_stability
from ..delimiters import SPAN_ROLES
from ..errors import InputError
from ._probes import SETTINGS_DEFAULT, probe_renders, rendered_roles, switch_settings

__all__ = ["START_ROLES", "UNCHECKED_VERDICTS", "BehaviourRecord", "derive_behaviour", "record_of", "sha256_of"]

# The role starts a record holds (Analysis fields), in the order a report names them.
START_ROLES = (("system", "system_start"), ("user", "user_start"), ("assistant", "assistant_start"),
               ("tool", "tool_response_start"), ("tool_next", "tool_response_next"),
               ("reasoning", "reasoning_start"), ("reasoning_end", "reasoning_end"))


# Verdicts with no behaviour behind them, so nothing can be compared with them: a run's limit (a
# longer --timeout, a larger --memory, another machine may derive it), or a sandbox escape the
# template tried (the sandbox stopped it: no probe rendered, and two such records would compare
# alike on their empty renders).
UNCHECKED_VERDICTS = LIMIT_STATUSES
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_STR_OR_NONE = (str, type(None))


def sha256_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class BehaviourRecord:
    """What one template does. `renders` maps each probe to the digest of its render; `texts` (not
    compared, not written to a lock) keeps the renders themselves, to show the first that differs."""

    name: str
    source: str
    text_sha256: str
    verdict: str
    starts: dict = field(default_factory=dict)
    delimiters: tuple[tuple[str, str], ...] = ()
    generation: dict = field(default_factory=dict)
    rendered: dict = field(default_factory=dict)
    system: str | None = None
    # Whether a chat without a system message still renders a system turn (the template's default
    # system prompt); None where the template has no system start or the probe did not render.
    default_system: bool | None = None
    tool_placement: str = "unknown"
    earlier_reasoning: str | None = None
    prefix_stability: dict = field(default_factory=dict)
    renders: dict = field(default_factory=dict)
    reason: str = ""
    texts: dict = field(default_factory=dict, repr=False, compare=False)
    template_text: str = field(default="", repr=False, compare=False)
    # False where the worker gave no behaviour (a crash; see `derived`): never written to a lock.
    completed: bool = field(default=True, repr=False, compare=False)

    @property
    def derived(self) -> bool:
        """Whether this is the template's behaviour: False where a run's limit or the sandbox stopped
        its derivation, its agent-session check included ("not checked": the time limit came before
        the session's end), or the worker died (`UNCHECKED_VERDICTS`, `completed`)."""
        return (self.completed and self.verdict not in UNCHECKED_VERDICTS
                and self.prefix_stability.get("verdict") != NOT_CHECKED)

    def behaviour(self) -> dict:
        """The record less its name, source, text digest and reason: what two templates compare on."""
        d = self.to_dict()
        for key in ("name", "source", "text_sha256", "reason"):
            d.pop(key)
        return d

    def to_dict(self) -> dict:
        return {
            "name": self.name, "source": self.source, "text_sha256": self.text_sha256, "verdict": self.verdict,
            "reason": self.reason, "starts": dict(self.starts),
            "delimiters": [{"role": r, "text": t} for r, t in self.delimiters],
            "generation": {k: dict(v) for k, v in self.generation.items()}, "rendered": dict(self.rendered),
            "system": self.system, "default_system": self.default_system, "tool_placement": self.tool_placement,
            "earlier_reasoning": self.earlier_reasoning,
            "prefix_stability": dict(self.prefix_stability), "renders": dict(self.renders),
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = "the lock", fix: str = "write the lock again with `tmplkit lock --fresh`") -> BehaviourRecord:
        """A record read back from a lock; InputError naming `where` and saying `fix` when a field is
        missing or wrong."""
        problem = _record_problem(d)
        if problem:
            raise InputError(f"{where}: a template's record is not a behaviour record ({problem}); {fix}")
        try:
            return cls(name=str(d["name"]), source=str(d["source"]), text_sha256=str(d["text_sha256"]),
                       verdict=str(d["verdict"]), reason=str(d.get("reason", "")), starts=dict(d["starts"]),
                       delimiters=tuple((str(x["role"]), str(x["text"])) for x in d["delimiters"]),
                       generation={str(k): dict(v) for k, v in d["generation"].items()}, rendered=dict(d["rendered"]),
                       system=d["system"], default_system=d["default_system"], tool_placement=str(d["tool_placement"]),
                       earlier_reasoning=d["earlier_reasoning"], prefix_stability=dict(d["prefix_stability"]),
                       renders=dict(d["renders"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"{where}: a template's record is not a behaviour record ({type(exc).__name__}: {exc}); "
                             f"{fix}") from None


# The keys a record read back must have (lock.schema.json requires `reason` too; a record without
# one is read as without a reason, as locks written before it was a field are).
_RECORD_KEYS = ("name", "source", "text_sha256", "verdict", "starts", "delimiters", "generation", "rendered", "system",
                "default_system", "tool_placement", "earlier_reasoning", "prefix_stability", "renders")


def _record_problem(d: dict) -> str:
    """What is wrong with the types of a lock's record (as lock.schema.json gives them), or "": a
    hand-edited or corrupt field is a malformed lock, not a change in behaviour."""
    def bad(key: str, want: str) -> str:
        return f"'{key}' is {d.get(key)!r}, not {want}"

    if missing := [k for k in _RECORD_KEYS if k not in d]:
        return f"'{missing[0]}' is missing"
    # (a key no record has is a hand edit the next `tmplkit lock` would drop unsaid, or a misspelt one)
    if extra := [k for k in d if k not in _RECORD_KEYS and k != "reason"]:
        return f"{extra[0]!r} is no field of a record"

    scalars = (("name", str, "a string"), ("source", str, "a string"), ("reason", str, "a string"),
               ("system", _STR_OR_NONE, "a string or null"), ("earlier_reasoning", _STR_OR_NONE, "a string or null"))
    for key, kinds, want in scalars:
        if key in d and not isinstance(d[key], kinds):
            return bad(key, want)
    if "text_sha256" in d and not (isinstance(d["text_sha256"], str) and _DIGEST.fullmatch(d["text_sha256"])):
        return bad("text_sha256", "a sha256: digest")
    for key, allowed in (("verdict", STATUSES), ("tool_placement", TOOL_PLACEMENTS)):
        if key in d and (not isinstance(d[key], str) or d[key] not in allowed):
            return bad(key, "one of " + ", ".join(allowed))
    if "default_system" in d and d["default_system"] not in (True, False, None):
        return bad("default_system", "true, false or null")
    for key in ("starts", "generation", "rendered", "prefix_stability", "renders"):
        if key in d and not isinstance(d[key], dict):
            return bad(key, "an object")
    if "delimiters" in d and not isinstance(d["delimiters"], list):
        return bad("delimiters", "a list")
    if any(not (isinstance(x, dict) and set(x) == {"role", "text"} and x["role"] in SPAN_ROLES and isinstance(x["text"], str))
           for x in d.get("delimiters") or ()):
        return "a delimiter in 'delimiters' is not an object of a role and a text (strings)"
    if any(not isinstance(v, _STR_OR_NONE) for v in (d.get("starts") or {}).values()):
        return "a role's start in 'starts' is not a string or null"
    if any(not isinstance(v, str) for v in (d.get("renders") or {}).values()):
        return "a render digest in 'renders' is not a string"
    return _inner_problem(d)


# (a limit may stop the agent session's check of a template whose analysis passed: "not checked")
_PREFIX_VERDICTS = ("stable", "unstable", NOT_APPLICABLE, NOT_CHECKED)
_REASONING = ("open", "closed", "model", None)


def _inner_problem(d: dict) -> str:
    """What is wrong inside a record's objects (lock.schema.json's rules), or ""."""
    if unknown := sorted(set(d.get("starts") or {}) - {role for role, _ in START_ROLES}):
        return f"'starts' has a role tmplkit does not record ({unknown[0]!r})"
    for setting, gen in (d.get("generation") or {}).items():
        if not isinstance(gen, dict) or set(gen) != {"prompt", "reasoning"}:
            return f"'generation' of {setting!r} is not an object of 'prompt' and 'reasoning'"
        if not isinstance(gen["prompt"], _STR_OR_NONE) or not isinstance(gen["reasoning"], _STR_OR_NONE) \
                or gen["reasoning"] not in _REASONING:
            return f"'generation' of {setting!r} has a prompt or reasoning that is not one of its values"
    if d.get("verdict") == "pass" and not d.get("generation"):
        return "a passing template's 'generation' is empty"
    if any(v not in (True, False, None) for v in (d.get("rendered") or {}).values()):
        return "a role in 'rendered' is not true, false or null"
    prefix = d.get("prefix_stability")
    if isinstance(prefix, dict) and (set(prefix) != {"verdict", "cause", "request"}
                                     or not isinstance(prefix["verdict"], str) or prefix["verdict"] not in _PREFIX_VERDICTS
                                     or not isinstance(prefix["cause"], str)
                                     or not (prefix["request"] is None or type(prefix["request"]) is int)):
        return "'prefix_stability' is not an object of a verdict, a cause and a request number or null"
    return ""


def derive_behaviour(template, session=None, timeout: float | None = None):
    """A worker target: (Analysis, PrefixStability or None, {probe: render}) of `template`, all
    rendered in this process under its limits."""
    analysis, prefix = analyze_with_prefix_stability(template, session, timeout)
    if analysis.status in LIMIT_STATUSES:
        return analysis, prefix, {}
    return analysis, prefix, probe_renders(template, analysis.capabilities.get("thinking_flags", ()))


def _generation(analysis: Analysis, renders: dict[str, str]) -> dict:
    """{setting: {"prompt": text or None, "reasoning": open/closed/model or None}}: the generation
    prompt as the one-message chat with and without it differ (None: not a plain suffix)."""
    out = {}
    for setting, _ in switch_settings(analysis.capabilities.get("thinking_flags", ())):
        tag = "" if setting == SETTINGS_DEFAULT else f" [{setting}]"
        with_gp = renders.get("user" + tag, renders.get("user"))
        without = renders.get("user without generation prompt" + tag, renders.get("user without generation prompt"))
        prompt = None
        if with_gp is not None and without is not None and not with_gp.startswith(("error: ", "limit: ")):
            prompt = with_gp[len(without):] if with_gp.startswith(without) else None
        out[setting] = {"prompt": prompt, "reasoning": analysis.generation_reasoning.get(setting)}
    return out


def _default_system(analysis: Analysis, renders: dict[str, str]) -> bool | None:
    text = renders.get("user")
    if not analysis.system_start or text is None or text.startswith(("error: ", "limit: ")):
        return None
    return analysis.system_start in text


def _prefix(check: PrefixStability | None) -> dict:
    if check is None:
        return {"verdict": NOT_APPLICABLE, "cause": "", "request": None}
    return {"verdict": check.verdict, "cause": check.cause, "request": check.request}


def record_of(template, analysis: Analysis, prefix: PrefixStability | None, renders: dict[str, str]) -> BehaviourRecord:
    """The behaviour record of `template` from what `derive_behaviour` found."""
    reason = ""
    if analysis.status != "pass":
        reason = analysis.why_not or analysis.status
    elif prefix is not None and prefix.verdict == NOT_CHECKED:  # (`derived`: not the template's behaviour)
        reason = f"its agent-session check did not run to the end ({prefix.detail}); raise --timeout or --memory"
    return BehaviourRecord(
        name=template.name, source=template.source, text_sha256=sha256_of(template.text), verdict=analysis.status,
        reason=reason, starts={role: getattr(analysis, attr) for role, attr in START_ROLES},
        delimiters=tuple((d.role, d.text) for d in analysis.delimiters),
        generation=_generation(analysis, renders) if renders else {},
        rendered=rendered_roles(renders) if renders else {},
        system=analysis.capabilities.get("system"), default_system=_default_system(analysis, renders),
        tool_placement=analysis.tool_placement,
        earlier_reasoning=analysis.earlier_reasoning, prefix_stability=_prefix(prefix),
        renders={name: sha256_of(text) for name, text in sorted(renders.items())},
        texts=dict(renders), template_text=template.text)
