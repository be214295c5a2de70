"""Batch policies, the checkpoint store, and reports: pure logic, no model."""

from __future__ import annotations

import json

import pytest

from tmplkit.errors import InputError
from tmplkit.prefill.report import CheckpointRecord, Comparison, DecodeCall, PolicyResult, PrefillReport, markdown_summary, write_atomic
from tmplkit.server_rules import POLICIES, BreakContext, Checkpoint, CheckpointStore, FixedBreaks, ServerGated, get_policy
from tmplkit.tokens.spans import SpanDetector

# user starts at 2, 6, 12; an assistant start at 4
SPANS = SpanDetector([("user", [9]), ("assistant", [8])]).split([0, 0, 9, 1, 8, 1, 9, 1, 1, 1, 1, 1, 9, 1])


def ctx(last_checkpoint=None, min_step=8192, pending=None):
    return BreakContext(spans=SPANS, last_user=SPANS.last_user_start(), last_checkpoint=last_checkpoint,
                        min_step=min_step, pending_checkpoint=pending)


def test_policy_registry_and_unknown_name():
    assert set(POLICIES) >= {"none", "every-user-start", "gated"}
    assert get_policy("gated") is POLICIES["gated"]
    with pytest.raises(InputError, match="unknown batch policy 'fast'"):
        get_policy("fast")


def test_none_never_breaks_and_ignores_spans():
    p = get_policy("none")
    assert not p.uses_spans
    assert all(p.break_before(pos, ctx()) is None for pos in range(14))


def test_every_user_start_breaks_at_each_user_start_only():
    p = get_policy("every-user-start")
    hits = [pos for pos in range(14) if p.break_before(pos, ctx(last_checkpoint=2)) is not None]
    assert hits == [2, 6, 12]


def test_gated_rules_in_order():
    p = get_policy("gated")
    assert p.break_before(12, ctx(last_checkpoint=2)) == "last user message"
    assert p.break_before(6, ctx(last_checkpoint=None)) == "no checkpoint yet"
    assert p.break_before(6, ctx(last_checkpoint=2, min_step=3)) == "min step"
    assert p.break_before(6, ctx(last_checkpoint=2, min_step=4)) is None  # 6 is not > 2 + 4
    assert p.break_before(4, ctx()) is None  # an assistant start


def test_gated_counts_the_checkpoint_the_batch_starts_with():
    # the batch being filled starts at user start 2, where a checkpoint is taken before it is
    # decoded: the next user start needs no break for "no checkpoint yet" or the minimum step
    gated, server = get_policy("gated"), ServerGated()
    assert gated.break_before(6, ctx(last_checkpoint=None, pending=2)) is None
    assert server.break_before(6, ctx(last_checkpoint=None, pending=2)) == "no checkpoint yet"
    assert gated.break_before(6, ctx(last_checkpoint=0, min_step=4, pending=2)) is None
    assert server.break_before(6, ctx(last_checkpoint=0, min_step=4, pending=2)) == "min step"
    assert gated.break_before(12, ctx(pending=2)) == server.break_before(12, ctx(pending=2)) == "last user message"


def test_gated_ends_no_batch_for_a_checkpoint_too_small_to_pay_for_it():
    # below min_tokens (the runner passes n_ubatch) a resume from the checkpoint would save less
    # than the extra batch costs; llama-server's gate breaks anyway (its BOS-only batch)
    small = BreakContext(spans=SPANS, last_user=SPANS.last_user_start(), last_checkpoint=None, min_step=8192, min_tokens=4)
    gated, server = get_policy("gated"), ServerGated()
    assert gated.break_before(2, small) is None
    assert server.break_before(2, small) == "no checkpoint yet"
    assert gated.break_before(6, small) == "no checkpoint yet"
    last = BreakContext(spans=SPANS, last_user=12, last_checkpoint=6, min_step=8192, min_tokens=13)
    assert gated.break_before(12, last) is None  # the last user message too


def test_gated_picks_the_user_start_that_leaves_the_last_ubatch_fullest():
    # user starts at 3, 7, 14, 17 and 30 (the last user message); ubatches of 8 tokens
    toks = [0] * 32
    for u in (3, 7, 14, 17, 30):
        toks[u] = 9
    spans = SpanDetector([("user", [9])]).split(toks)
    gated, server = get_policy("gated"), ServerGated()

    def c(begin, end, last_checkpoint=None):
        return BreakContext(spans=spans, last_user=30, last_checkpoint=last_checkpoint, min_step=4, min_tokens=2,
                            batch_begin=begin, batch_end=end, n_ubatch=8)

    def first_break(policy, ctx):  # asked in order, as the runner fills the batch
        return next(((p, r) for p in spans.starts("user") if ctx.batch_begin < p < ctx.batch_end
                     for r in [policy.break_before(p, ctx)] if r), None)

    # batch [0, 20): 3, 7, 14 and 17 all qualify ("no checkpoint yet"); a break before 3 leaves
    # the last ubatch 5 tokens short of full, 7: 1, 14: 2, 17: 7; so the batch ends before 7
    assert first_break(gated, c(0, 20)) == (7, "no checkpoint yet")
    assert first_break(server, c(0, 20)) == (3, "no checkpoint yet")  # llama-server: the first one
    # counted from where the batch starts
    assert first_break(gated, c(1, 20)) == (17, "no checkpoint yet")  # 16 tokens: two full ubatches
    # "min step" (past 0 + 4): the same choice among 7, 14, 17
    assert first_break(gated, c(0, 20, last_checkpoint=0)) == (7, "min step")
    # nothing better in the batch: the first that qualifies
    assert first_break(gated, c(0, 6)) == (3, "no checkpoint yet")
    # the last user message comes in this batch: its checkpoint will do, no break before it
    assert first_break(gated, c(16, 32, last_checkpoint=9)) == (30, "last user message")
    assert first_break(server, c(16, 32, last_checkpoint=9)) == (17, "min step")


def test_fixed_breaks_is_a_policy_too():
    p = FixedBreaks([3, 7])
    assert sorted(p.candidates(None, 10)) == [3, 7]
    assert p.break_before(3, ctx()) == "fixed" and p.break_before(4, ctx()) is None


def _ck(n, pmin=None, pmax=None, run=1):
    return Checkpoint(n, n - 10 if pmin is None else pmin, n - 1 if pmax is None else pmax, b"x" * 4, run)


def test_store_keeps_at_most_max_and_drops_oldest():
    store = CheckpointStore(max_count=3, min_step=0)
    evicted = []
    for n in (100, 200, 300, 400):
        evicted += store.add(_ck(n))
    assert [c.n_tokens for c in store] == [200, 300, 400]
    assert [c.n_tokens for c in evicted] == [100]


def test_store_evicts_close_checkpoints_of_earlier_runs_first():
    store = CheckpointStore(max_count=4, min_step=1000)
    for n in (100, 600, 5000):
        store.add(_ck(n, run=1))
    store.add(_ck(7000, run=2))  # full: 600 is within 1000 of 100 and from an earlier run
    assert [c.n_tokens for c in store] == [100, 5000, 7000]


def test_store_stops_evicting_close_checkpoints_once_below_the_cap():
    """server-context.cpp:2296-2310 checks the store's size before every step of its loop: one
    close checkpoint goes, the next close one stays (seen on the real server: the 30k-token
    session of scripts/bench_server_resume.py --ratios restores the one that stays)."""
    store = CheckpointStore(max_count=5, min_step=1000)
    for n in (100, 600, 5000, 5400):
        store.add(_ck(n, run=1))
    evicted = store.add(_ck(9000, run=2))
    assert [c.n_tokens for c in evicted] == [600]
    assert [c.n_tokens for c in store] == [100, 5000, 5400, 9000]


def test_store_replaces_same_position():
    store = CheckpointStore()
    store.add(_ck(100))
    new = _ck(100, run=2)
    assert len(store.add(new)) == 1 and list(store) == [new]


def test_find_restorable_follows_llama_server():
    store = CheckpointStore()
    for n, pmin in ((1, 0), (1000, 400), (3000, 2400)):
        store.add(_ck(n, pmin=pmin))
    # resume at 2500 (window 512): the newest checkpoint ending at or before 2500 and reaching back below 1988
    assert store.find_restorable(2500, 2500 - 512).n_tokens == 1000
    assert store.find_restorable(3100, 3100 - 512).n_tokens == 3000
    # nothing reaches back far enough but the one at pos_min 0
    assert store.find_restorable(900, 900 - 512).n_tokens == 1
    gone = store.drop_after(1500)
    assert [c.n_tokens for c in gone] == [3000] and [c.n_tokens for c in store] == [1, 1000]


def _report(policy, tps_seconds, calls):
    return PrefillReport(model="m.gguf", policy=policy, checkpointing=True, n_prompt=1000, n_reused=0, n_processed=1000,
                         seconds=tps_seconds, decode_seconds=tps_seconds * 0.9, checkpoint_seconds=0.01,
                         decode_calls=tuple(calls), checkpoints=(CheckpointRecord(996, 400, 995, 1024, 0.001, "near end"),),
                         user_starts=(10, 500))


def test_report_to_dict_is_json_and_counts_breaks():
    calls = [DecodeCall(0, 10, "user start", 0.1, "no checkpoint yet"), DecodeCall(10, 986, "near end", 1.0),
             DecodeCall(996, 4, "end", 0.01)]
    rep = _report("gated", 2.0, calls)
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["tokens_per_second"] == 500.0 and d["n_decode_calls"] == 3
    assert d["breaks"] == {"full": 0, "user start": 1, "near end": 1, "end": 1}
    assert d["rules"] == {"no checkpoint yet": 1}
    assert d["checkpoints"][0]["n_tokens"] == 996


def test_markdown_puts_policies_side_by_side():
    none = PolicyResult("none", (_report("none", 2.0, [DecodeCall(0, 1000, "end", 2.0)]),) * 3)
    gated = PolicyResult("gated", (_report("gated", 2.5, [DecodeCall(0, 10, "user start", .1, "last user message"),
                                                           DecodeCall(10, 990, "end", 2.4)]),))
    comp = Comparison("m.gguf", "s.json", "t", 1000, {"n_ctx": 4096}, (none, gated))
    md = markdown_summary(comp)
    assert "| | `none` | `gated` |" in md.replace("|  |", "| |")
    assert "| vs `none` | 1.000 | 0.800 |" in md
    assert "last user message 1" in md
    assert json.loads(json.dumps(comp.to_dict()))["results"][1]["policy"] == "gated"
    assert "checkpoints on (max None, min step None);" in md


def test_markdown_gives_no_checkpoint_shape_where_none_is_taken():
    # (`prefill -ctxcp 0` said "checkpoints off (max 32, min step 8192)")
    off = _report("none", 2.0, [DecodeCall(0, 1000, "end", 2.0)])
    off = PrefillReport(**{**off.__dict__, "checkpointing": False})
    comp = Comparison("m.gguf", "s.json", "t", 1000, {"max_checkpoints": 32, "checkpoint_min_step": 8192},
                      (PolicyResult("none", (off,)),))
    md = markdown_summary(comp)
    assert "checkpoints off; user starts" in md and "max 32" not in md


def test_write_atomic_leaves_no_temp_file(tmp_path):
    target = tmp_path / "out.json"
    write_atomic(target, "{}")
    write_atomic(target, b"[]")
    assert target.read_text() == "[]"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_write_atomic_failure_is_one_input_error(tmp_path):
    from tmplkit.prefill.report import check_writable

    missing = tmp_path / "no-such-folder" / "out.json"
    with pytest.raises(InputError, match="no-such-folder"):
        write_atomic(missing, "{}")
    for bad in (missing, tmp_path):
        with pytest.raises(InputError, match="writable file path"):
            check_writable(bad)
    check_writable(tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


def test_settings_refuse_a_poll_level_out_of_range():
    from tmplkit.server_rules import PrefillSettings

    for bad in (-1, 101):
        with pytest.raises(InputError, match="poll"):
            PrefillSettings(poll=bad)
    assert PrefillSettings(poll=None).poll is None and PrefillSettings(poll=0).poll == 0


def test_settings_and_memory_built_by_hand_refuse_values_of_another_type():
    # (before: a TypeError from inside a comparison, or the value kept: 4096.0, True, 1 for a switch)
    import numpy as np

    from tmplkit.server_rules import PrefillSettings
    from tmplkit.turns import MemoryModel

    for field, bad, want in (("n_ctx", "4096", "an integer"), ("n_ctx", 4096.0, "an integer"), ("n_batch", True, "an integer"),
                             ("n_threads", "4", "an integer or None"), ("swa_full", 1, "true or false"),
                             ("checkpoints", "yes", "true or false or None"), ("flash_attn", 1, "a string"), ("policy", None, "a string")):
        with pytest.raises(InputError, match=rf"^PrefillSettings\.{field} must be {want}, got "):
            PrefillSettings(**{field: bad})
    # numpy's scalars are taken as the values they hold (kept as numpy, a report's JSON could not write them)
    s = PrefillSettings(n_ctx=np.int64(4096), swa_full=np.True_, poll=None, checkpoints=None)
    assert type(s.n_ctx) is int and s.n_ctx == 4096 and s.swa_full is True and json.dumps(s.to_dict())
    assert type(MemoryModel("swa", np.int64(512), np.int64(1024)).n_swa) is int
    with pytest.raises(InputError, match=r"^MemoryModel\.n_swa must be an integer, got '512'"):
        MemoryModel("swa", "512", 1024)
    with pytest.raises(InputError, match=r"^MemoryModel\.kind must be a string, got None"):
        MemoryModel(None)
    assert MemoryModel.swa(512).swa_cells == 1024


# ---- the checkpoint rule and the schedule of one prompt ----------------------------------------------


def test_break_context_is_built_by_keyword():
    with pytest.raises(TypeError):
        BreakContext(SPANS, 12, None, 8192)  # noqa


def test_one_checkpoint_rule_for_the_schedule_and_gated():
    from tmplkit.server_rules import checkpoint_due

    assert checkpoint_due(12, last_user=12, newest=10, min_step=100) == "last user message"
    assert checkpoint_due(6, last_user=12, newest=None, min_step=100) == "no checkpoint yet"
    assert checkpoint_due(6, last_user=12, newest=2, min_step=3) == "min step"
    assert checkpoint_due(6, last_user=12, newest=2, min_step=4) is None
    gated = get_policy("gated")
    for pos in (2, 6, 12):
        for newest in (None, 0, 2, 5):
            for step in (0, 3, 100):
                c = BreakContext(spans=SPANS, last_user=12, last_checkpoint=newest, min_step=step)
                assert gated.due(pos, c) == checkpoint_due(pos, last_user=12, newest=newest, min_step=step)


def _spans_with_users(n, users):
    from tmplkit.tokens.spans import SpanDetector

    toks = [1] * n
    for u in users:
        toks[u] = 9
    return SpanDetector([("user", [9])]).split(toks)


def _schedule(policy, spans, n, checkpointing=True, min_step=8192):
    from tmplkit.server_rules import BatchSchedule

    return BatchSchedule(get_policy(policy), spans, n, n_batch=2048, n_ubatch=512, min_step=min_step,
                         checkpointing=checkpointing)


def test_schedule_of_none_is_full_batches_and_the_near_end_breaks():
    # the 16,155-token session of issue 15 (-b 2048 -ub 512): its `none` schedule as reported there
    plan = _schedule("none", None, 16155).plan()
    assert [(b.begin, b.size, b.reason) for b in plan] == [
        *[(k * 2048, 2048, "full") for k in range(7)], (14336, 1303, "near end"), (15639, 512, "near end"),
        (16151, 4, "end")]
    assert [(b.begin, b.checkpoint) for b in plan if b.checkpoint] == [(15639, "near end"), (16151, "near end")]
    # a model that can roll back: no near-end breaks, no checkpoints
    plain = _schedule("none", None, 16155, checkpointing=False).plan()
    assert [b.size for b in plain] == [2048] * 7 + [1819] and not any(b.checkpoint for b in plain)


def test_schedule_of_gated_breaks_only_where_it_then_saves_a_checkpoint():
    users = [1, 300, 700, 2500, 5000, 9100, 9300, 12000, 13500]
    spans = _spans_with_users(16155, users)
    plan = _schedule("gated", spans, 16155).plan()
    starts = [b.begin for b in plan]
    assert starts == sorted(set(starts)) and plan[-1].end == 16155
    assert all(b.size <= 2048 for b in plan)
    early = {b.end for b in plan if b.rule}
    saved = {b.begin: b.checkpoint for b in plan if b.checkpoint}
    assert early and early <= set(saved)
    # the first checkpoint: at a user start of at least n_ubatch tokens (not the BOS-only one at 1)
    assert plan[0].rule == "no checkpoint yet" and plan[0].end in (300, 700)
    assert saved[13500] == "last user message"
    # llama-server's gate cuts at 1 (a BOS-only batch) and again after each checkpoint
    server = _plan_for(ServerGated(), spans)
    assert server[0].size == 1 and len(server) > len(plan)
    # every-user-start: a break before every user start
    every = _schedule("every-user-start", spans, 16155).plan()
    assert set(users) <= {b.begin for b in every}


def test_a_policy_may_add_checkpoints_and_drop_the_shared_rules_ones():
    from tmplkit.server_rules import BatchPolicy

    class Mine(BatchPolicy):
        name = "mine"

        def candidates(self, spans, n_tokens):
            return [3000]

        def break_before(self, pos, ctx):
            return "mine" if pos == 3000 else None

        def checkpoint_before(self, pos, spans=None):
            return pos == 3000

        def keeps_checkpoint(self, pos, spans=None):
            return pos != 16151  # drops the last near-end one

    plan = _plan_for(Mine(), None)
    assert [(b.begin, b.checkpoint) for b in plan if b.checkpoint] == [(3000, "next divergence"), (15639, "near end")]
    assert (plan[1].begin, plan[1].end, plan[1].rule) == (2048, 3000, "mine")


def _plan_for(policy, spans):
    from tmplkit.server_rules import BatchSchedule

    return BatchSchedule(policy, spans, 16155, n_batch=2048, n_ubatch=512, min_step=8192, checkpointing=True).plan()


def test_a_registered_policy_is_offered_by_the_cli_with_the_settings_defaults(monkeypatch):
    from tmplkit.cli import build_parser
    from tmplkit.cli._common import settings_of
    from tmplkit.server_rules import PrefillSettings

    monkeypatch.setitem(POLICIES, "mine", FixedBreaks([100]))
    args = build_parser().parse_args(["prefill", "m.gguf", "s.json", "--settings", "mine"])
    assert settings_of(args, tuple(POLICIES)) == ("mine",)
    every = build_parser().parse_args(["prefill", "m.gguf", "s.json"])  # (the default: every policy, "mine" too)
    assert settings_of(every, tuple(POLICIES))[-1] == "mine"
    old = build_parser().parse_args(["prefill", "m.gguf", "s.json", "--policy", "mine"])  # (the old spelling)
    assert old.settings == "mine"
    d = PrefillSettings()
    assert (args.n_ctx, args.n_batch, args.n_ubatch, args.poll, args.max_checkpoints, args.checkpoint_min_step,
            args.flash_attn, args.cache_type_k) == (d.n_ctx, d.n_batch, d.n_ubatch, d.poll, d.max_checkpoints,
                                                    d.checkpoint_min_step, d.flash_attn, d.cache_type_k)
    monkeypatch.delitem(POLICIES, "mine")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prefill", "m.gguf", "s.json", "--policy", "mine"])


def test_the_prefill_package_exports_what_it_lists():
    import tmplkit.prefill as prefill

    assert all(hasattr(prefill, name) for name in prefill.__all__)
    assert {"BatchSchedule", "PlannedBatch", "GenerationReport", "checkpoint_due", "FixedBreaks"} <= set(prefill.__all__)
