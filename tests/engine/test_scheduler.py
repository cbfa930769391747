"""Scheduler policies, driven without a model (the scheduler never imports torch).

The driver feeds back a fixed token per sampled sequence: what is under test
is which sequences run, how many tokens, and the KV accounting.
"""

from __future__ import annotations

import sys

import pytest

from fastmode.engine.errors import RequestError
from fastmode.engine.scheduler import Scheduler, SchedulerConfig
from fastmode.engine.sequence import FinishReason, LengthLimit, Sequence, Status
from fastmode.engine.tiers import Tier
from fastmode.sampling_params import SamplingParams

TOKEN = 7


def make(rid, n_prompt=8, tier=Tier.STANDARD, t=0.0, max_tokens=50, prompt=None):
    ids = prompt if prompt is not None else [100 + (hash(rid) + i) % 50 for i in range(n_prompt)]
    return Sequence(rid, ids, SamplingParams(temperature=0, max_tokens=max_tokens), tier, t)


def step(s: Scheduler, now=0.0):
    out = s.schedule(now)
    sampled = {x.seq.request_id: [TOKEN] for x in out.scheduled if x.emits_token}
    s.update_from_output(out, sampled, now)
    return out


def ids(out):
    return [x.seq.request_id for x in out.scheduled]


def free_ok(s: Scheduler) -> bool:
    return s.block_manager.num_free_blocks == s.config.num_blocks


def test_policy_modules_do_not_import_torch():
    import subprocess

    code = (
        "import sys; import fastmode.engine.scheduler, fastmode.engine.block_manager, fastmode.engine.window_blocks, "
        "fastmode.engine.metering, fastmode.engine.waiting_queue; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fast_admitted_before_standard_before_flex():
    s = Scheduler(SchedulerConfig(num_blocks=64, max_num_seqs=1, fast_lane_max_batch=None))
    s.add(make("flex", tier=Tier.FLEX, t=0.0))
    s.add(make("std", tier=Tier.STANDARD, t=1.0))
    s.add(make("fast", tier=Tier.FAST, t=2.0))
    assert ids(s.schedule(3.0)) == ["fast"]


def test_fcfs_within_a_tier():
    s = Scheduler(SchedulerConfig(num_blocks=64, max_num_seqs=2, fast_lane_max_batch=None))
    for i, t in enumerate([3.0, 1.0, 2.0]):
        s.add(make(f"r{i}", t=t))
    assert ids(s.schedule(4.0)) == ["r1", "r2"]


def test_aging_promotes_a_starving_flex_request():
    s = Scheduler(SchedulerConfig(num_blocks=64, max_num_seqs=1, fast_lane_max_batch=None, aging_s=10.0))
    s.add(make("flex", tier=Tier.FLEX, t=0.0))
    s.add(make("std", tier=Tier.STANDARD, t=14.0))
    # At t=15 flex has waited 15 s: one promotion -> effective rank 1, equal to standard's;
    # equal effective ranks fall back to the real tier, so standard still goes first.
    assert ids(s.schedule(15.0)) == ["std"]
    s2 = Scheduler(SchedulerConfig(num_blocks=64, max_num_seqs=1, fast_lane_max_batch=None, aging_s=10.0))
    s2.add(make("flex", tier=Tier.FLEX, t=0.0))
    s2.add(make("std", tier=Tier.STANDARD, t=19.0))
    # At t=25 flex has waited 25 s: two promotions -> effective rank 0, ahead of standard (rank 1).
    assert ids(s2.schedule(25.0)) == ["flex"]
    s3 = Scheduler(SchedulerConfig(num_blocks=64, max_num_seqs=1, fast_lane_max_batch=None, aging_s=None))
    s3.add(make("flex", tier=Tier.FLEX, t=0.0))
    s3.add(make("std", tier=Tier.STANDARD, t=19.0))
    assert ids(s3.schedule(1e6)) == ["std"]


def test_fast_lane_caps_the_batch_and_pauses_lower_tiers():
    s = Scheduler(SchedulerConfig(num_blocks=256, max_num_seqs=32, fast_lane_max_batch=3))
    for i in range(8):
        s.add(make(f"s{i}", t=float(i)))
    out = step(s)
    assert len(out.scheduled) == 8 and not out.lane_active
    s.add(make("f0", tier=Tier.FAST, t=10.0))
    out = step(s, 10.0)
    assert out.lane_active and len(out.scheduled) == 3 and "f0" in ids(out)
    assert len(out.paused) == 6  # 8 standard resident, 2 served
    paused = [p.request_id for p in out.paused]
    assert all(s.get(p).status is Status.RUNNING and s.get(p).block_table for p in paused)  # KV kept
    # Over the next steps the two free slots rotate through every paused standard sequence.
    served = set()
    for k in range(4):
        out = step(s, 11.0 + k)
        assert len(out.scheduled) == 3 and "f0" in ids(out)
        served |= set(ids(out)) - {"f0"}
    assert served == {f"s{i}" for i in range(8)}
    # When the fast request finishes the lane closes and the batch is full again.
    s.abort("f0", 20.0)
    out = step(s, 21.0)
    assert not out.lane_active and len(out.scheduled) == 8


def test_fast_request_preempts_when_resident_slots_are_full():
    """max_num_seqs binding: a fast arrival takes a standard's place (no priority inversion)."""
    s = Scheduler(SchedulerConfig(num_blocks=256, max_num_seqs=2, fast_lane_max_batch=2))
    s.add(make("s0", t=0.0))
    s.add(make("s1", t=1.0))
    step(s)
    s.add(make("f", tier=Tier.FAST, t=2.0))
    out = step(s, 2.0)
    assert "f" in ids(out)
    assert [p.request_id for p in out.preempted] == ["s1"]  # the latest standard arrival
    s1 = s.get("s1")
    assert s1.status is Status.WAITING and s1.block_table == [] and s1.num_computed_tokens == 0
    assert s1.num_preemptions == 1 and s1.output_token_ids == [TOKEN]  # output kept, KV recomputed later
    s.abort("f", 3.0)
    out = step(s, 3.0)
    assert "s1" in ids(out)
    x = next(x for x in out.scheduled if x.seq.request_id == "s1")
    assert x.num_tokens == 9  # 8 prompt tokens + the kept output token, recomputed as one prefill


def test_memory_pressure_preempts_lowest_tier_and_readmits_in_place():
    # 4 blocks of 4 tokens = 16 slots.
    s = Scheduler(
        SchedulerConfig(
            num_blocks=4, block_size=4, max_num_seqs=8, fast_lane_max_batch=None, enable_prefix_caching=False
        )
    )
    s.add(make("std", n_prompt=6, t=0.0))
    s.add(make("flex", n_prompt=6, tier=Tier.FLEX, t=1.0))
    step(s)  # both prefilled: 2 + 2 blocks
    assert s.block_manager.num_free_blocks == 0
    for _ in range(3):  # std needs a third block at token 9
        out = step(s)
        if out.preempted:
            break
    assert [p.request_id for p in out.preempted] == ["flex"]
    # A later flex arrival must queue behind the preempted one (its place is kept).
    s.add(make("flex2", n_prompt=2, tier=Tier.FLEX, t=5.0))
    order = [q.request_id for q in s.waiting.iter_admission_order(6.0)]
    assert order == ["flex", "flex2"]
    s.abort("std", 7.0)
    out = step(s, 7.0)
    assert ids(out)[0] == "flex"


def test_chunked_prefill_respects_the_token_budget_and_keeps_decodes_running():
    s = Scheduler(SchedulerConfig(num_blocks=256, max_num_batched_tokens=32, fast_lane_max_batch=None))
    s.add(make("short", n_prompt=4, t=0.0))
    step(s)
    s.add(make("long", n_prompt=100, t=1.0))
    chunks = []
    while s.get("long").num_computed_tokens < 100:
        out = step(s, 2.0)
        assert out.total_tokens <= 32
        assert "short" in ids(out)  # the running decode is never stalled
        chunks.append(out.num_scheduled_tokens["long"])
    assert chunks == [31, 31, 31, 7]
    assert s.get("long").num_output_tokens == 1  # sampled once, at the end of the prompt


def test_prefix_cache_is_shared_across_tiers():
    s = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, fast_lane_max_batch=None))
    prompt = list(range(10, 30))  # 20 tokens = 5 blocks
    a = make("a", prompt=prompt, tier=Tier.STANDARD, max_tokens=1)
    s.add(a)
    step(s)
    assert a.is_finished and free_ok(s)  # finished, but its blocks stay cached
    b = make("b", prompt=prompt + [1, 2], tier=Tier.FAST, max_tokens=1)
    s.add(b)
    out = step(s, 1.0)
    assert b.num_cached_tokens == 20  # every full block of the shared prefix
    assert out.num_scheduled_tokens["b"] == 2
    assert s.block_manager.num_prefix_hits == 5


def test_cache_eviction_makes_room():
    s = Scheduler(SchedulerConfig(num_blocks=6, block_size=4, fast_lane_max_batch=None))
    s.add(make("a", prompt=list(range(16)), max_tokens=1))
    step(s)
    assert len(s.block_manager.evictable) == 4 and free_ok(s)
    s.add(make("b", prompt=list(range(50, 70)), max_tokens=1))  # needs 5 blocks: evicts cached ones
    step(s)
    assert s.get("b") is None and free_ok(s)


@pytest.mark.parametrize("stage", ["waiting", "mid_prefill", "decoding", "paused", "preempted"])
def test_abort_at_every_stage_frees_everything(stage):
    s = Scheduler(
        SchedulerConfig(num_blocks=32, block_size=4, max_num_batched_tokens=8, max_num_seqs=4, fast_lane_max_batch=1)
    )
    victim = make("v", prompt=list(range(100, 120)), t=0.0)  # explicit prompts: hash()-derived ones could
    s.add(victim)  # share a prefix with "f" and avoid the preemption
    if stage == "mid_prefill":
        step(s)
        assert 0 < victim.num_computed_tokens < 20
    elif stage in ("decoding", "paused", "preempted"):
        while victim.num_output_tokens < 2:
            step(s)
        if stage == "paused":
            s.add(make("f", tier=Tier.FAST, t=1.0))
            out = step(s, 1.0)
            assert victim in out.paused
        if stage == "preempted":
            s2 = s  # fill memory with a fast request that needs victim's blocks
            s2.add(make("f", prompt=list(range(200, 300)), tier=Tier.FAST, t=1.0))
            for _ in range(20):
                out = step(s2, 1.0)
                if victim.status is Status.WAITING:
                    break
            assert victim.status is Status.WAITING and victim.num_preemptions >= 1
    assert s.abort("v", 5.0)
    assert victim.finish_reason is FinishReason.ABORT and victim.block_table == []
    s.abort("f", 5.0)
    assert not s.has_work and free_ok(s)
    assert not s.abort("v", 6.0)  # second abort is a no-op


def test_request_that_can_never_fit_is_rejected_up_front():
    s = Scheduler(SchedulerConfig(num_blocks=2, block_size=4, max_model_len=100))
    with pytest.raises(RequestError, match="never fit"):
        s.add(make("big", n_prompt=20))
    with pytest.raises(RequestError, match="context limit") as e:
        s.add(make("long", n_prompt=100))
    assert (e.value.param, e.value.code) == ("prompt", "context_length_exceeded")
    s.add(make("ok", n_prompt=4))
    with pytest.raises(ValueError, match="duplicate"):
        s.add(make("ok", n_prompt=4))


def test_finishing_by_length_and_eos_frees_blocks():
    s = Scheduler(SchedulerConfig(num_blocks=32, block_size=4), eos_token_ids=frozenset({TOKEN}))
    s.add(make("eos", max_tokens=10))
    s.add(Sequence("len", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), Tier.STANDARD, 0.0))
    for _ in range(5):
        step(s)
    assert s.get("eos") is None and s.get("len") is None and free_ok(s)


def test_the_stop_or_limit_that_ended_a_sequence_is_recorded():
    s = Scheduler(SchedulerConfig(num_blocks=32, block_size=4, max_model_len=12), eos_token_ids=frozenset({TOKEN}))
    eos = make("eos", max_tokens=10)
    stop_id = Sequence("stop-id", [1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(TOKEN,)))
    budget = Sequence("budget", [1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    context = Sequence("context", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=50, ignore_eos=True))
    both = Sequence("both", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=2, ignore_eos=True))
    seqs = [eos, stop_id, budget, context, both]
    for seq in seqs:
        s.add(seq)
    for _ in range(6):
        step(s)
    assert all(seq.is_finished for seq in seqs) and free_ok(s)
    assert [seq.finish_reason for seq in seqs] == [FinishReason.STOP] * 2 + [FinishReason.LENGTH] * 3
    assert (eos.stop_reason, eos.length_limit) == (TOKEN, None)
    assert (stop_id.stop_reason, stop_id.length_limit) == (TOKEN, None)
    assert (budget.stop_reason, budget.length_limit) == (None, LengthLimit.MAX_TOKENS)
    assert len(context.output_token_ids) == 2 and context.length_limit is LengthLimit.CONTEXT
    assert both.length_limit is LengthLimit.CONTEXT  # both limits on the same token: the context is full


def test_incremental_counts_match_a_recount_under_churn():
    """The scheduler keeps per-tier running counts and the queue its size incrementally (they are read
    every step); after every step of a churning load (tiers, the lane, preemptions, aborts, drafts)
    they must equal a recount, and the KV accounting must balance."""
    import random

    rng = random.Random(7)
    s = Scheduler(
        SchedulerConfig(
            num_blocks=16, block_size=4, max_num_seqs=6, max_num_batched_tokens=24, fast_lane_max_batch=2, aging_s=5.0
        )
    )
    tiers = [Tier.FAST, Tier.STANDARD, Tier.STANDARD, Tier.FLEX]
    preempted = 0
    for k in range(400):
        now = k * 0.1
        if rng.random() < 0.3:
            s.add(
                make(f"r{k}", n_prompt=rng.randint(1, 30), tier=rng.choice(tiers), t=now, max_tokens=rng.randint(1, 12))
            )
        if rng.random() < 0.05 and s.running:
            s.abort(rng.choice(s.running).request_id, now)
        for seq in s.running:  # some decoding sequences speculate, so the draft path runs too
            if not seq.is_prefilling and rng.random() < 0.3:
                seq.draft_token_ids = [TOKEN] * rng.randint(1, 3)
        out = s.schedule(now)
        preempted += len(out.preempted)
        sampled = {}
        for x in out.scheduled:
            if x.emits_token:
                sampled[x.seq.request_id] = [TOKEN] * (1 + rng.randint(0, x.num_draft_tokens))
        s.update_from_output(out, sampled, now)
        for tier in Tier:
            assert s.num_running(tier) == sum(1 for q in s.running if q.tier is tier)
        assert len(s.waiting) == len(list(s.waiting)) and bool(s.waiting) == (len(s.waiting) > 0)
        held = {b for q in s.running for b in q.block_table}
        assert s.block_manager.num_free_blocks == s.config.num_blocks - len(held)
    assert preempted > 0
    for seq in list(s.running) + list(s.waiting):
        s.abort(seq.request_id, 99.0)
    assert not s.has_work and free_ok(s) and not s.waiting


def test_block_tuples_cut_tokens_like_slices():
    """commit cuts tokens into blocks with a fast path; it must match plain slicing, also for blocks
    past the last token (accepted drafts are counted as computed before they are appended)."""
    from fastmode.engine.block_manager import _block_tuples

    tokens = list(range(23))
    for bs in (1, 4, 16):
        for start in range(0, 8):
            for stop in range(start, 10):
                want = [tuple(tokens[i * bs : (i + 1) * bs]) for i in range(start, stop)]
                assert list(_block_tuples(tokens, start, stop, bs)) == want


def test_accepted_drafts_crossing_a_block_register_the_real_tokens_in_the_prefix_cache():
    """A verify step computes drafts before they are appended: the block they complete must be
    hashed from its real tokens (next step), so a later prompt with that prefix hits the cache."""
    bs = 4
    s = Scheduler(SchedulerConfig(num_blocks=64, block_size=bs, fast_lane_max_batch=None))
    prompt = [101, 102, 103, 104, 105, 106]  # 1.5 blocks
    s.add(make("a", prompt=prompt, max_tokens=12))
    step(s)  # prefill + first token: 7 tokens
    seq = s.running[0]
    seq.draft_token_ids = [8, 9, 10]  # verify 1 + 3 tokens; all accepted, plus a bonus token
    out = s.schedule(1.0)
    s.update_from_output(out, {"a": [8, 9, 10, 11]}, 1.0)
    step(s, 2.0)  # the next plain step registers the blocks the drafts completed
    tokens = list(seq.token_ids)
    full = len(tokens[: seq.num_computed_tokens]) // bs
    parent, want = 0, []
    for b in range(full):
        parent = hash((parent, tuple(tokens[b * bs : (b + 1) * bs])))
        want.append(parent)
    assert seq.block_hashes == want and full >= 2
    # A new request whose prompt is the first two blocks of that sequence reuses them.
    s.add(make("b", prompt=tokens[: 2 * bs] + [1], max_tokens=2))
    before = s.block_manager.num_prefix_hits
    step(s, 3.0)
    assert s.block_manager.num_prefix_hits - before == 2


def test_a_block_completed_by_drafts_in_the_final_step_stays_in_the_prefix_cache():
    """When accepted drafts complete a block and the same step finishes the request, the block is
    registered before finish frees it: the next turn of the conversation hits it."""
    bs = 4
    s = Scheduler(SchedulerConfig(num_blocks=64, block_size=bs, fast_lane_max_batch=None))
    prompt = [101, 102, 103, 104, 105, 106]  # 1.5 blocks
    s.add(make("a", prompt=prompt, max_tokens=5))
    step(s)  # prefill + first token: 7 tokens, one block registered
    seq = s.running[0]
    seq.draft_token_ids = [8, 9, 10]  # all accepted plus a bonus token: max_tokens reached this step
    out = s.schedule(1.0)
    s.update_from_output(out, {"a": [8, 9, 10, 11]}, 1.0)
    assert seq.is_finished and seq.length_limit is LengthLimit.MAX_TOKENS
    assert free_ok(s)
    s.add(make("b", prompt=seq.token_ids[: 2 * bs] + [1], max_tokens=2))
    before = s.block_manager.num_prefix_hits
    step(s, 2.0)
    assert s.block_manager.num_prefix_hits - before == 2
