"""The speed probe (benchmarks/validation/probe.py) and the replay clock that leaves it out of a load."""

from __future__ import annotations

import time

import pytest

from benchmarks.validation.probe import SpeedProbe, relative_speed
from benchmarks.validation.replay import ReplayClock


@pytest.fixture(scope="module")
def tiny_loaded(tiny_llama_dir):
    from fastmode.loader import load_model

    return load_model(str(tiny_llama_dir), "float32")


def test_probe_repeats_the_same_work_and_frees_its_blocks(tiny_loaded):
    from fastmode.calibrate.measure import SweepConfig

    probe = SpeedProbe(tiny_loaded, SweepConfig(num_threads=1, clock="cpu"), batch=3, prompt_tokens=12, decode_steps=2)
    sched = probe.engine.scheduler
    seen = []
    real_schedule = sched.schedule

    def recording(now_s):  # what each of the probe's steps computes
        out = real_schedule(now_s)
        seen.append(sorted((x.num_tokens, x.seq.num_computed_tokens) for x in out.scheduled))
        return out

    sched.schedule = recording
    for _ in range(3):
        assert probe() > 0
        assert sched.block_manager.num_free_blocks == sched.config.num_blocks  # nothing held between probes
    # Every probe: one prefill step of 3 x 12 tokens from scratch (no prefix cache), then two decodes of 3.
    assert seen == [[(12, 0)] * 3, [(1, 12)] * 3, [(1, 13)] * 3] * 3
    assert len(probe.times) == 3
    assert len(probe.take()) == 3 and probe.times == []


def test_probe_rejects_an_empty_shape(tiny_loaded):
    from fastmode.calibrate.measure import SweepConfig

    with pytest.raises(ValueError, match="batch >= 1"):
        SpeedProbe(tiny_loaded, SweepConfig(), batch=0)
    with pytest.raises(ValueError, match="prompt_tokens >= 2"):
        SpeedProbe(tiny_loaded, SweepConfig(), prompt_tokens=1)
    with pytest.raises(ValueError, match="decode_steps >= 0"):
        SpeedProbe(tiny_loaded, SweepConfig(), decode_steps=-1)


def test_relative_speed_is_a_ratio_of_medians():
    assert relative_speed([2.0, 2.2, 9.0], [1.0, 1.0, 1.1, 5.0]) == pytest.approx(2.2 / 1.05)
    with pytest.raises(ValueError, match="both spans"):
        relative_speed([], [1.0])


def test_replay_clock_skips_idle_time_and_leaves_out_what_it_is_told():
    now = [10.0]
    clock = ReplayClock(lambda: now[0])
    clock.skip_to(15.0)
    assert clock() == 15.0
    clock.skip_to(12.0)  # never backwards
    assert clock() == 15.0

    def work():
        now[0] += 3.0

    assert clock.left_out(work) is None
    assert clock() == 15.0
    now[0] += 1.0
    assert clock() == 16.0


def test_replay_leaves_the_probe_out_of_the_load(tiny_llama_dir):
    """A probe after every step that takes 0.2 s of wall time: it runs as often as asked, and
    neither the makespan nor any request's latency contains it."""
    from benchmarks.validation.replay import replay
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.sim.workload import RequestSpec

    engine = LLMEngine(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, num_threads=1, speculative="off")
    )
    calls = []

    def probe():
        calls.append(time.perf_counter())
        time.sleep(0.2)
        return len(calls)

    reqs = [RequestSpec("a", 0.0, 10, 6), RequestSpec("b", 0.01, 12, 6)]
    with pytest.raises(ValueError, match="probe_every_s"):
        replay(engine, reqs, probe=probe, probe_every_s=0)
    result = replay(engine, reqs, probe=probe, probe_every_s=1e-9)
    assert sorted(result.request_ids) == ["a", "b"]
    assert len(calls) == result.num_steps >= 6
    assert [v for _, v in result.probes] == list(range(1, len(calls) + 1))  # each probe's return, in order
    at = [t for t, _ in result.probes]
    assert at == sorted(at) and at[-1] <= result.makespan_s
    assert result.makespan_s < 0.2 * len(calls) / 2  # the probes' 0.2 s each are not in the load's time
    assert all(m.e2e_s < 0.2 * len(calls) / 2 for m in result.requests)
    sched = engine.scheduler
    assert sched.block_manager.num_free_blocks == sched.config.num_blocks


def test_speed_profile_is_smoothed_and_held_between_probes():
    from benchmarks.validation.probe import speed_profile

    ref = [0.1, 0.1, 0.1, 0.3]  # median 0.1
    samples = [(1.0, 0.1), (3.0, 0.1), (5.0, 0.5), (7.0, 0.12), (9.0, 0.12), (11.0, 0.12)]
    prof = speed_profile(samples, ref, window=3)
    assert [t for t, _ in prof] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    # The stray 0.5 at 5 s moves nothing: running medians of 3 (2 at the ends).
    assert [f for _, f in prof] == pytest.approx([1.0, 1.0, 1.2, 1.2, 1.2, 1.2])
    assert [f for _, f in speed_profile(samples, ref, window=1)] == pytest.approx([1.0, 1.0, 5.0, 1.2, 1.2, 1.2])
    with pytest.raises(ValueError, match="increasing"):
        speed_profile([(2.0, 0.1), (1.0, 0.1)], ref)
    with pytest.raises(ValueError, match="needs probe times"):
        speed_profile([], ref)
    with pytest.raises(ValueError, match="window"):
        speed_profile(samples, ref, window=0)
