"""The replay driver (benchmarks/validation/replay.py) on the tiny test model (seconds)."""

from __future__ import annotations


def test_replay_finishes_every_request_and_frees_kv(tiny_llama_dir):
    from benchmarks.validation.replay import replay
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.sim.distributions import ArrivalProcess, LengthDist
    from fastmode.sim.workload import RequestSpec, WorkloadConfig, generate_workload

    engine = LLMEngine(
        EngineConfig(
            model=str(tiny_llama_dir),
            dtype="float32",
            kv_cache_gib=0.01,
            max_num_seqs=8,
            num_threads=1,
            speculative="off",
        )
    )
    reqs = generate_workload(
        WorkloadConfig(
            16,
            ArrivalProcess("poisson", 40.0),
            LengthDist.parse("uniform:8:40"),
            LengthDist.parse("uniform:2:12"),
            "fast=0.3,standard=0.5,flex=0.2",
            1,
        )
    )
    reqs.append(RequestSpec("late", reqs[-1].arrival_s + 0.2, 20, 3))  # forces an idle wait
    result = replay(engine, reqs)
    assert sorted(result.request_ids) == sorted(r.request_id for r in reqs)
    by_id = {r.request_id: r for r in reqs}
    for rid, m in zip(result.request_ids, result.requests):
        assert m.completion_tokens == by_id[rid].output_tokens and m.ttft_s > 0
    assert result.makespan_s >= reqs[-1].arrival_s
    sched = engine.scheduler
    assert sched.block_manager.num_free_blocks == sched.config.num_blocks


def test_cpu_clock_skips_idle_time(tiny_llama_dir):
    from benchmarks.validation.replay import replay
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.sim.workload import RequestSpec

    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, num_threads=1, speculative="off")
    )
    reqs = [RequestSpec("a", 0.0, 10, 3), RequestSpec("b", 500.0, 10, 3)]  # 500 s apart: skipped, not slept
    result = replay(engine, reqs, clock="cpu")
    assert sorted(result.request_ids) == ["a", "b"]
    assert 500.0 < result.makespan_s < 510.0
    assert all(0 < m.ttft_s < 5.0 for m in result.requests)
