"""Replay a workload on the real engine, driven by the wall clock.

The twin of `fastmode.sim.simulate`: same workload, same scheduler config, but
`LLMEngine.step()` runs the model. Requests are injected when their arrival
time has passed; a request that arrives while a step runs is added right after
it, stamped with its true arrival time (through the engine's `clock` hook), so
its TTFT includes the wait for the running step, exactly as in the simulator.
Every request stops by length (`ignore_eos`), so both runs do the same work.
The simulator proposes no speculative drafts, so compare it with an engine
built with `speculative="off"`.

`clock="cpu"` runs the same loop on process CPU time (one torch thread): on a
shared machine, neighbours then stop inflating the engine's step times, which
is what the simulator's cost model describes (docs/simulator.md).

A speed probe (probe.py) can run every few seconds with the clock
stopped: the workload does not see it, and its times say how fast the machine
ran during the replay.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fastmode.engine.llm_engine import LLMEngine
from fastmode.engine.metering import RequestMetrics
from fastmode.sampling_params import SamplingParams
from fastmode.sim.workload import RequestSpec

T = TypeVar("T")


@dataclass
class ReplayResult:
    """Times in seconds from the start of the replay."""

    requests: list[RequestMetrics]
    request_ids: list[str]
    makespan_s: float
    busy_s: float  # wall time inside engine.step()
    num_steps: int
    steps: list[tuple[float, float, int]] = field(default_factory=list)  # (end_s, step_s, outputs)
    # What each step computed, as the cost model takes it: (prefill chunks, decode contexts), one per step.
    shapes: list[tuple[list[tuple[int, int]], list[int]]] = field(default_factory=list)
    mean_lateness_s: float = 0.0  # mean delay between an arrival and its injection (a running step, mostly)
    probes: list[tuple[float, object]] = field(default_factory=list)  # (at_s, what the probe returned)


def prompt_ids(spec: RequestSpec, index: int, vocab_size: int, seed: int = 0) -> list[int]:
    """Random in-vocabulary prompt ids; requests of one prefix group share their prefix."""
    rng = random.Random(f"{seed}-{index}")
    shared = spec.prefix_tokens if spec.prefix_group is not None else 0
    head = []
    if shared:
        g = random.Random(f"{seed}-group-{spec.prefix_group}")
        head = [g.randrange(vocab_size) for _ in range(shared)]
    return head + [rng.randrange(vocab_size) for _ in range(spec.prompt_tokens - shared)]


class ReplayClock:
    """The replay's clock: `base` plus an offset that skips idle gaps (CPU clock) and leaves out
    the time spent in speed probes, which the workload never sees.

    On the CPU clock (process CPU seconds, one torch thread) a step costs what it computes, not
    what neighbouring processes take from it; idle gaps between arrivals are skipped, as in the
    simulator.
    """

    def __init__(self, base: Callable[[], float]) -> None:
        self.base = base
        self.offset_s = 0.0

    def __call__(self) -> float:
        return self.base() + self.offset_s

    def skip_to(self, t: float) -> None:
        self.offset_s += max(0.0, t - self())

    def left_out(self, fn: Callable[[], T]) -> T:
        """Run `fn` with the clock stopped; returns what it returns."""
        t0 = self()
        out = fn()
        self.offset_s -= self() - t0
        return out


def replay(
    engine: LLMEngine,
    workload: list[RequestSpec],
    seed: int = 0,
    clock: str = "wall",
    probe: Callable[[], object] | None = None,
    probe_every_s: float = 2.0,
) -> ReplayResult:
    """Run `workload` on `engine` in real time ("wall") or CPU time ("cpu"); returns each request's metrics.

    `probe`: called after the first step and then after the first step that ends `probe_every_s`
    or more after the last call, with the clock stopped (a speed reference: probe.py);
    what it returns is kept in `ReplayResult.probes` with the time it ran.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError("clock must be 'wall' or 'cpu'")
    if probe is not None and probe_every_s <= 0:
        raise ValueError("probe_every_s must be > 0")
    pending = sorted(workload, key=lambda r: r.arrival_s)
    vocab = engine.loaded.config.vocab_size
    prompts = [prompt_ids(r, i, vocab, seed) for i, r in enumerate(pending)]  # built before the clock starts
    saved_clock = engine.clock
    shapes: list[tuple[list[tuple[int, int]], list[int]]] = []
    real_schedule = engine.scheduler.schedule

    def recording_schedule(now_s: float):  # the step's shape must be read before the runner advances it
        out = real_schedule(now_s)
        shapes.append(
            (
                [(x.num_tokens, x.seq.num_computed_tokens) for x in out.scheduled if x.num_tokens > 1],
                [x.seq.num_computed_tokens for x in out.scheduled if x.num_tokens == 1],
            )
        )
        return out

    engine.scheduler.schedule = recording_schedule  # an instance attribute: only this engine, only this run
    now_fn = ReplayClock(time.process_time if clock == "cpu" else saved_clock)
    engine.clock = now_fn  # the engine stamps first/last token times with the same clock
    metrics: list[RequestMetrics] = []
    rids: list[str] = []
    steps: list[tuple[float, float, int]] = []
    busy = lateness = 0.0
    i = num_steps = 0
    last_probe = None
    probes: list[tuple[float, object]] = []
    t0 = now_fn()
    try:
        while i < len(pending) or engine.has_unfinished():
            now = now_fn() - t0
            while i < len(pending) and pending[i].arrival_s <= now:
                spec = pending[i]
                arrival = t0 + spec.arrival_s
                engine.clock = lambda arrival=arrival: arrival  # stamp the true arrival time, not the injection time
                try:
                    engine.add_request(
                        prompts[i],
                        SamplingParams(temperature=0.0, max_tokens=spec.output_tokens, ignore_eos=True),
                        spec.tier,
                        spec.request_id,
                    )
                finally:
                    engine.clock = now_fn
                lateness += now - spec.arrival_s
                i += 1
            if not engine.has_unfinished():
                if clock == "cpu":
                    now_fn.skip_to(t0 + pending[i].arrival_s)
                else:
                    _wait_until(now_fn, t0 + pending[i].arrival_s)
                continue
            s0 = now_fn()
            outs = engine.step()
            dt = now_fn() - s0
            busy += dt
            num_steps += 1
            steps.append((now_fn() - t0, dt, len(outs)))
            for o in outs:
                if o.finished and o.metrics is not None:
                    metrics.append(o.metrics)
                    rids.append(o.request_id)
            if probe is not None and (last_probe is None or now_fn() - last_probe >= probe_every_s):
                last_probe = now_fn()
                probes.append((last_probe - t0, now_fn.left_out(probe)))
    finally:
        engine.clock = saved_clock
        del engine.scheduler.schedule
    return ReplayResult(
        metrics, rids, now_fn() - t0, busy, num_steps, steps, shapes, lateness / max(1, len(pending)), probes
    )


def _wait_until(clock, t: float) -> None:
    """Sleep until `t`, spinning for the last 2 ms: a plain sleep on a busy machine wakes up
    late by milliseconds, which would add to the TTFT of every request that arrives while idle."""
    while (left := t - clock()) > 0.002:
        time.sleep(min(0.05, left - 0.002))
    while clock() < t:
        pass
