"""Behaviour: what a template does, recorded, locked, and compared with another's.

A behaviour record (`BehaviourRecord`) holds what tmplkit derived for a template: its verdict,
every role's delimiter, the generation prompt and what it does with reasoning under each thinking
switch, where tool responses and the system prompt go, whether earlier reasoning is kept, the
prefix-stability verdict on the agent session, and a digest of each probe render. `compare`
says how two records differ in a publisher's words; a text edit that renders the same on every
probe is no change in behaviour. A lock (`BehaviourLock`) is a file of records the audit checks
templates against (`check_lock`).

The package: `_probes` (the probe conversations), `_record` (a record, and the worker target that
derives one), `_derive` (records of many templates, in workers), `_compare` (two records
compared), `_lock` (the lock file) and `_formats` (`tmplkit diff`'s report).
"""

from ._compare import CHANGE_KINDS, BehaviourDiff, Change, compare, pair_by_name, render_line, shown, text_change
from ._derive import DEFAULT_TIMEOUT, derive_records, require_derived
from ._formats import DIFF_FORMATS, DIFF_SCHEMA_VERSION, diff_dict, diff_set_dict, format_diff, format_diff_set
from ._lock import (
    DEFAULT_LOCK,
    LOCK_SCHEMA_VERSION,
    BehaviourLock,
    LockCheck,
    check_lock,
    listed_names,
    read_lock,
    require_entries,
    require_replaceable,
    write_lock,
)
from ._probes import PROBE_NAMES, SETTINGS_DEFAULT, probe_renders, rendered_roles, switch_settings
from ._record import START_ROLES, UNCHECKED_VERDICTS, BehaviourRecord, derive_behaviour, record_of, sha256_of

__all__ = [
    "CHANGE_KINDS", "DEFAULT_LOCK", "DEFAULT_TIMEOUT", "DIFF_FORMATS", "DIFF_SCHEMA_VERSION", "LOCK_SCHEMA_VERSION",
    "PROBE_NAMES", "SETTINGS_DEFAULT", "START_ROLES", "UNCHECKED_VERDICTS",
    "BehaviourDiff", "BehaviourLock", "BehaviourRecord", "Change", "LockCheck", "check_lock", "compare", "derive_behaviour", "listed_names",
    "derive_records", "diff_dict", "diff_set_dict", "format_diff", "format_diff_set", "pair_by_name", "probe_renders",
    "read_lock", "record_of", "require_replaceable", "render_line", "rendered_roles",
    "require_derived", "require_entries", "sha256_of", "shown", "switch_settings", "text_change", "write_lock",
]
