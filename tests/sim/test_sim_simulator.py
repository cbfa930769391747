"""The simulator: real scheduler, conservation, determinism, KV accounting, the fast lane."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastmode.engine import scheduler as engine_scheduler
from fastmode.engine.scheduler import SchedulerConfig
from fastmode.engine.tiers import Tier
from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel
from fastmode.sim import simulator
from fastmode.sim.distributions import ArrivalProcess, LengthDist
from fastmode.sim.report import sim_report, summarize
from fastmode.sim.simulator import SimConfig, kv_cache_blocks, simulate
from fastmode.sim.workload import RequestSpec, WorkloadConfig, generate_workload


@pytest.fixture(scope="module")
def h100_8b() -> CostModel:
    return CostModel(load_hardware("h100"), load_model("llama-3.1-8b"), tp=1)


def workload(
    n=300, rate=20.0, seed=0, mix="fast=0.1,standard=0.8,flex=0.1", prompt="uniform:64:512", output="uniform:16:128"
):
    return generate_workload(
        WorkloadConfig(
            n, ArrivalProcess("poisson", rate), LengthDist.parse(prompt), LengthDist.parse(output), mix, seed
        )
    )


def sched_config(num_blocks=4000, lane=4, **kw) -> SchedulerConfig:
    return SchedulerConfig(num_blocks=num_blocks, fast_lane_max_batch=lane, max_model_len=131072, **kw)


def test_simulator_drives_the_engines_scheduler_class(h100_8b, monkeypatch):
    assert simulator.Scheduler is engine_scheduler.Scheduler  # imported, not copied
    calls = []
    real_schedule = engine_scheduler.Scheduler.schedule

    def spy(self, now_s):
        calls.append(type(self))
        return real_schedule(self, now_s)

    monkeypatch.setattr(engine_scheduler.Scheduler, "schedule", spy)
    result = simulate(workload(20), h100_8b, SimConfig(sched_config()))
    assert calls and set(calls) == {engine_scheduler.Scheduler}
    assert len(calls) == result.num_steps


def test_every_request_finishes_with_its_length_and_kv_returns(h100_8b):
    reqs = workload(400, rate=40.0)
    result = simulate(reqs, h100_8b, SimConfig(sched_config()))
    assert sorted(result.request_ids) == sorted(r.request_id for r in reqs)
    by_id = {r.request_id: r for r in reqs}
    for rid, m in zip(result.request_ids, result.requests):
        assert m.completion_tokens == by_id[rid].output_tokens
        assert m.prompt_tokens == by_id[rid].prompt_tokens
        assert m.ttft_s is not None and m.ttft_s > 0
    assert result.num_free_blocks_end == result.num_blocks


def test_kv_returns_after_preemptions_under_memory_pressure(h100_8b):
    # ~100 blocks of 16 tokens cannot hold 64 sequences of up to 640 tokens: the scheduler must preempt.
    reqs = workload(200, rate=50.0)
    result = simulate(reqs, h100_8b, SimConfig(sched_config(num_blocks=100)))
    assert result.num_preemptions > 0
    assert len(result.requests) == len(reqs)
    assert result.num_free_blocks_end == result.num_blocks


def test_deterministic_per_seed(h100_8b):
    cfg = SimConfig(sched_config(), record_steps=True)
    a = simulate(workload(150, seed=3), h100_8b, cfg)
    assert len(a.steps) == a.num_steps and sum(s[1] for s in a.steps) == pytest.approx(a.busy_s)
    b = simulate(workload(150, seed=3), h100_8b, cfg)
    c = simulate(workload(150, seed=4), h100_8b, cfg)
    assert a.requests == b.requests and a.request_ids == b.request_ids and a.makespan_s == b.makespan_s
    assert a.requests != c.requests


def test_idle_time_is_skipped_not_stepped(h100_8b):
    reqs = [RequestSpec("a", 0.0, 100, 10), RequestSpec("b", 3600.0, 100, 10)]
    result = simulate(reqs, h100_8b, SimConfig(sched_config()))
    assert result.num_steps == 2 * 10  # one prefill step (samples the first token) + 9 decodes, twice
    assert result.makespan_s > 3600.0 and result.busy_s < 1.0
    ttft = {rid: m.ttft_s for rid, m in zip(result.request_ids, result.requests)}
    assert ttft["a"] == pytest.approx(ttft["b"], rel=1e-6)  # the gap costs the second request nothing


def test_fast_lane_gives_fast_users_more_tok_s_under_load(h100_8b):
    """Llama-3.1-8B on an H100, ~3,000 tok/s offered: the lane's batch cap makes fast decode faster."""
    reqs = workload(200, rate=24.0, mix="fast=0.05,standard=0.95", prompt="512", output="128")
    lane = summarize(simulate(reqs, h100_8b, SimConfig(sched_config(num_blocks=20000, lane=4))).requests)
    assert lane["fast"].tok_s_p50 > 1.5 * lane["standard"].tok_s_p50
    assert lane["fast"].usd_per_mtok > lane["standard"].usd_per_mtok  # and the meter charges for it
    # Control: without the lane, priority alone does not make a fast request decode faster.
    plain = summarize(simulate(reqs, h100_8b, SimConfig(sched_config(num_blocks=20000, lane=None))).requests)
    assert plain["fast"].tok_s_p50 == pytest.approx(plain["standard"].tok_s_p50, rel=0.15)


def test_report_has_every_tier_and_the_aggregate(h100_8b):
    result = simulate(workload(200), h100_8b, SimConfig(sched_config(), usd_per_machine_hour=2.95))
    rep = sim_report(result, 2.95)
    assert set(rep["tiers"]) == {"fast", "standard", "flex"}
    assert sum(t["num_requests"] for t in rep["tiers"].values()) == 200
    for t in rep["tiers"].values():
        assert t["ttft_p99_s"] >= t["ttft_p50_s"] > 0 and t["tpot_mean_s"] > 0 and t["usd_per_mtok"] > 0
    agg = rep["aggregate"]
    assert agg["throughput_tok_s"] > 0 and 0 < agg["utilization"] <= 1.0 + 1e-9
    machine = sum(t["machine_s"] for t in rep["tiers"].values())
    assert machine == pytest.approx(result.busy_s, rel=1e-9)  # every simulated second is charged to someone


def test_kv_cache_blocks_from_memory(h100_8b):
    m = h100_8b.model
    blocks = kv_cache_blocks(h100_8b, 16)
    free = h100_8b.hardware.usable_mem_bytes - h100_8b.weight_bytes
    assert blocks == int(free // (m.kv_bytes_per_token() * 16))
    assert kv_cache_blocks(h100_8b, 16, kv_cache_gib=1.0) == int(2**30 // (m.kv_bytes_per_token() * 16))
    with pytest.raises(ValueError, match="no room"):
        kv_cache_blocks(CostModel(load_hardware("h100"), load_model("llama-3.1-70b"), tp=1), 16)


def test_prompt_plus_output_beyond_context_is_rejected(h100_8b):
    cfg = SimConfig(SchedulerConfig(num_blocks=4000, max_model_len=1024))
    with pytest.raises(ValueError, match="max_model_len"):
        simulate([RequestSpec("x", 0.0, 1000, 100)], h100_8b, cfg)


def test_shared_prefixes_hit_the_prefix_cache(h100_8b):
    reqs = [RequestSpec(f"r{i}", i * 1.0, 600, 8, Tier.STANDARD, prefix_group=1, prefix_tokens=512) for i in range(5)]
    result = simulate(reqs, h100_8b, SimConfig(sched_config()))
    cached = [m.cached_tokens for m in result.requests]
    assert cached[0] == 0 and all(c == 512 for c in cached[1:])


def test_sim_modules_do_not_import_torch():
    code = (
        "import sys; import fastmode.sim, fastmode.sim.command, fastmode.calibrate.fit, "
        "fastmode.calibrate.pricing, fastmode.calibrate.calibration_file; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_preempted_requests_recompute_from_their_own_cached_blocks(h100_8b):
    """Prefix caching matters even without shared prompts: a preempted sequence's freed blocks stay
    cached, so its recompute hits them (which is why the simulator keeps the cache on)."""
    reqs = workload(150, rate=40.0)
    on = simulate(reqs, h100_8b, SimConfig(sched_config(num_blocks=300)))
    off = simulate(reqs, h100_8b, SimConfig(sched_config(num_blocks=300, enable_prefix_caching=False)))
    assert on.num_preemptions > 0
    assert on.busy_s < off.busy_s


def test_prefix_cache_is_skipped_only_while_it_cannot_matter(h100_8b, monkeypatch):
    """simulate() runs a workload without shared prefixes without the prefix cache, and starts over
    with it at the first preemption; either way the result is exactly the configured scheduler's."""
    runs = []
    real_run = simulator._run

    def spy(*args, **kwargs):
        runs.append(kwargs.get("skip_prefix_cache", False))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(simulator, "_run", spy)
    shared = [
        RequestSpec(f"r{i}", i * 0.05, 300, 8, Tier.STANDARD, prefix_group=i % 3, prefix_tokens=200) for i in range(60)
    ]
    cases = [
        (workload(300, rate=20.0), 4000, [True]),  # never preempts: one run, without the cache
        (workload(200, rate=50.0), 100, [True, False]),  # preempts: starts over with the cache
        (shared, 4000, [False]),
    ]  # shared prefixes: the cache is used from the start
    for reqs, num_blocks, expected_runs in cases:
        cfg = SimConfig(sched_config(num_blocks=num_blocks), record_steps=True)
        runs.clear()
        got = simulate(reqs, h100_8b, cfg)
        assert runs == expected_runs
        want = real_run(reqs, h100_8b, cfg)  # the configured scheduler, cache on throughout
        assert got.requests == want.requests and got.request_ids == want.request_ids
        assert got.steps == want.steps and got.num_preemptions == want.num_preemptions
        assert got.num_free_blocks_end == want.num_free_blocks_end == num_blocks


def test_step_jitter_is_mean_one_with_the_given_cv_and_seeded(h100_8b):
    draw = simulator._jitter(0.3, seed=1)
    xs = [draw() for _ in range(40000)]
    mean = sum(xs) / len(xs)
    cv = (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5 / mean
    assert mean == pytest.approx(1.0, abs=0.01) and cv == pytest.approx(0.3, abs=0.01)
    assert simulator._jitter(0.0, seed=1) is None

    reqs = workload(300, rate=30.0)
    cfg = sched_config()
    plain = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True))
    assert simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True, jitter_seed=5)).steps == plain.steps
    a = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True, step_jitter_cv=0.3, jitter_seed=1))
    b = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True, step_jitter_cv=0.3, jitter_seed=1))
    c = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True, step_jitter_cv=0.3, jitter_seed=2))
    assert a.steps == b.steps and a.steps != c.steps and a.steps != plain.steps
    assert sorted(a.request_ids) == sorted(plain.request_ids)  # every request still finishes
    with pytest.raises(ValueError, match="step_jitter_cv"):
        SimConfig(cfg, step_jitter_cv=-0.1)


def test_step_seconds_prices_each_step_from_its_shape_and_start_time(h100_8b):
    """A `step_seconds` in place of the cost model sees every step's chunks, decode contexts and
    start time, and its answer is the step's time."""
    from fastmode.sim.step_timer import StepTimer

    reqs = [RequestSpec("only", 0.0, 64, 40)]
    cfg = sched_config()
    plain = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True))
    timer, starts = StepTimer(h100_8b), []

    def doubled(chunks, contexts, start_s):
        starts.append(start_s)
        return 2 * timer.step_s(chunks, contexts)

    run = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True), doubled)
    assert [s[1] for s in run.steps] == pytest.approx([2 * s[1] for s in plain.steps])
    assert starts == pytest.approx([end - dt for end, dt, *_ in run.steps])
