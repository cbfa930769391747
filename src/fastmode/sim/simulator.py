"""The discrete-event simulator: the engine's real Scheduler, a cost model for a clock.

One loop iteration is one engine step, exactly as `LLMEngine.step` runs it,
with `CostModel.step_cost` in place of the model runner:

    add every request that has arrived by `now`
    out = scheduler.schedule(now)                  # the real policy code
    dt  = cost_model.step_cost(chunks(out), decode_contexts(out)).total_s
    now += dt
    scheduler.update_from_output(out, {rid: [TOKEN] for sampling seqs}, now)
    attribute_step(out, dt)                        # the real metering code

When nothing is resident or waiting, the clock jumps to the next arrival.
Requests stop by length only (`ignore_eos`, one fixed token id), so the
outputs are lengths, not text. No torch here.

Speed (docs/simulator.md): a step costs tens of microseconds, mostly the
scheduler's Python. `simulate` skips the prefix cache while it cannot matter
(see there), and the loop reads fields directly where a property would cost a
call per sequence per step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastmode.engine.metering import RequestMetrics, attribute_step, request_metrics
from fastmode.engine.scheduler import Scheduler, SchedulerConfig
from fastmode.engine.sequence import Sequence, Status
from fastmode.planner.cost_model import CostModel
from fastmode.sampling_params import SamplingParams
from fastmode.sim.step_timer import StepTimer
from fastmode.sim.workload import RequestSpec

SAMPLED_TOKEN = 0  # every sampled token; never a stop token (stop_token_ids is empty)

# A step's seconds from its prefill chunks ((tokens, context) each), its decode contexts and the
# simulated time it starts at.
StepSeconds = Callable[[list[tuple[int, int]], list[int], float], float]


@dataclass(frozen=True)
class SimConfig:
    """How to simulate. `usd_per_machine_hour` prices the whole machine (all tp devices)."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    usd_per_machine_hour: float = 1.0
    record_steps: bool = False  # keep (now_s, step_s, batch, tokens) per step: memory grows with the run
    # Each step's time times a lognormal factor of mean 1 and this coefficient of variation, seeded:
    # the step-to-step spread of a real (shared) machine, which lengthens queues a fixed cost hides.
    step_jitter_cv: float = 0.0
    jitter_seed: int = 0

    def __post_init__(self) -> None:
        if self.usd_per_machine_hour < 0:
            raise ValueError("usd_per_machine_hour must be >= 0")
        if not 0 <= self.step_jitter_cv <= 10:
            raise ValueError("step_jitter_cv must be in [0, 10]")


@dataclass
class SimResult:
    """What a run produced. Times in simulated seconds unless suffixed `_wall_s`."""

    requests: list[RequestMetrics]  # one per finished request, in finishing order
    request_ids: list[str]
    makespan_s: float  # first arrival (t=0) to last finish
    busy_s: float  # sum of step times
    num_steps: int
    num_lane_steps: int  # steps taken while the fast lane was active
    num_preemptions: int
    num_free_blocks_end: int
    num_blocks: int
    wall_s: float  # real seconds the simulation took
    steps: list[tuple[float, float, int, int]] = field(default_factory=list)  # (end_s, step_s, seqs, tokens)


def kv_cache_blocks(cost_model: CostModel, block_size: int = 16, kv_cache_gib: float | None = None) -> int:
    """KV blocks for a machine: `kv_cache_gib` if given, else all usable memory the weights leave."""
    per_block = cost_model.model.kv_bytes_per_token(cost_model.kv_dtype_bytes) * block_size
    if kv_cache_gib is not None:
        free = kv_cache_gib * 2**30
    else:
        free = cost_model.num_devices * cost_model.hardware.usable_mem_bytes - cost_model.weight_bytes
    blocks = int(free // per_block)
    if blocks < 1:
        raise ValueError(
            f"no room for a KV cache: {cost_model.model.name} weights fill "
            f"{cost_model.num_devices}x {cost_model.hardware.name} (raise --tp)"
        )
    return blocks


@functools.lru_cache(maxsize=4096)
def _sampling_params(max_tokens: int) -> SamplingParams:
    # Frozen, so requests of one length can share it; building one per request costs ~5 us.
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def make_sequence(spec: RequestSpec, index: int) -> Sequence:
    """The Sequence the engine would build for `spec` (prompt ids are synthetic)."""
    params = _sampling_params(spec.output_tokens)
    return Sequence(spec.request_id, spec.prompt_token_ids(index), params, spec.tier, spec.arrival_s)


def simulate(
    workload: list[RequestSpec],
    cost_model: CostModel,
    config: SimConfig = SimConfig(),
    step_seconds: StepSeconds | None = None,
) -> SimResult:
    """Run `workload` to completion; every request must finish (or this raises).

    `step_seconds` prices each step in place of the cost model (StepTimer), e.g. to follow a
    machine whose speed changes over time; `config.step_jitter_cv` still applies on top of it.
    """
    t_wall = time.perf_counter()
    result = None
    if config.scheduler.enable_prefix_caching and not any(r.prefix_group is not None for r in workload):
        # Without prefix groups every synthetic prompt is unique from its first block on
        # (RequestSpec.prompt_token_ids), so the prefix cache can only ever serve a preempted
        # request its own blocks back. Until a first preemption the cache changes nothing, not
        # even the number of free blocks, yet hashing and evicting every block costs about a
        # quarter of the run: run without it, and start over with it if a request is preempted.
        result = _run(workload, cost_model, config, step_seconds, skip_prefix_cache=True)
    if result is None:
        result = _run(workload, cost_model, config, step_seconds)
    result.wall_s = time.perf_counter() - t_wall
    return result


def _jitter(cv: float, seed: int):
    """A seeded source of mean-1 lognormal factors with coefficient of variation `cv`; None for 0."""
    if cv <= 0:
        return None
    sigma = math.sqrt(math.log1p(cv * cv))
    rng = random.Random(seed)
    return functools.partial(rng.lognormvariate, -sigma * sigma / 2, sigma)


def _run(
    workload: list[RequestSpec],
    cost_model: CostModel,
    config: SimConfig,
    step_seconds: StepSeconds | None = None,
    skip_prefix_cache: bool = False,
) -> SimResult | None:
    """One simulation. With `skip_prefix_cache` the scheduler runs without its prefix cache,
    and this returns None at the first preemption, from where the result could differ."""
    t_wall = time.perf_counter()
    sched_cfg = config.scheduler
    if skip_prefix_cache:
        sched_cfg = dataclasses.replace(sched_cfg, enable_prefix_caching=False)
    sched = Scheduler(sched_cfg)
    step_time = StepTimer(cost_model)
    jitter = _jitter(config.step_jitter_cv, config.jitter_seed)
    pending = sorted(workload, key=lambda r: r.arrival_s)
    max_len = sched_cfg.max_model_len
    usd = config.usd_per_machine_hour
    metrics: list[RequestMetrics] = []
    rids: list[str] = []
    steps: list[tuple[float, float, int, int]] = []
    now = busy = 0.0
    i = num_steps = lane_steps = 0
    n = len(pending)
    one_token = [SAMPLED_TOKEN]  # shared by every sampling sequence: the scheduler only reads it

    while True:
        while i < n and pending[i].arrival_s <= now:
            spec = pending[i]
            if spec.prompt_tokens + spec.output_tokens > max_len:
                raise ValueError(
                    f"{spec.request_id}: prompt + output = {spec.prompt_tokens + spec.output_tokens} "
                    f"tokens exceeds max_model_len {max_len}"
                )
            sched.add(make_sequence(spec, i))
            i += 1
        if not sched.has_work:
            if i == n:
                break  # everything arrived and finished
            now = pending[i].arrival_s  # idle: skip to the next arrival
            continue
        out = sched.schedule(now)
        if out.preempted and skip_prefix_cache:
            return None
        if not out.scheduled:  # out.is_empty
            if i < n:  # nothing fits until more work arrives or leaves: wait for the next arrival
                now = max(now, pending[i].arrival_s)
                continue
            raise RuntimeError(
                f"scheduler stalled at t={now:.3f}s with {len(sched.waiting)} waiting, "
                f"{len(sched.running)} running and no arrivals left"
            )
        # One pass over the batch: what the cost model needs, and who samples a token. Both read
        # num_computed_tokens, so they must be taken before the update advances it.
        chunks, contexts, sampled = [], [], {}
        for s in out.scheduled:
            seq = s.seq
            computed = seq.num_computed_tokens
            if s.num_tokens > 1:
                chunks.append((s.num_tokens, computed))
            else:
                contexts.append(computed)
            if s.emits_token:
                sampled[seq.request_id] = one_token
        dt = step_time.step_s(chunks, contexts) if step_seconds is None else step_seconds(chunks, contexts, now)
        if jitter is not None:
            dt *= jitter()
        now += dt
        busy += dt
        num_steps += 1
        lane_steps += out.lane_active
        if config.record_steps:
            steps.append((now, dt, len(out.scheduled), out.total_tokens))
        attribute_step(out, dt)
        for seq in sched.update_from_output(out, sampled, now):
            if seq.status is Status.FINISHED:
                metrics.append(request_metrics(seq, usd))
                rids.append(seq.request_id)

    return SimResult(
        metrics,
        rids,
        now,
        busy,
        num_steps,
        lane_steps,
        sched.num_preemptions,
        sched.block_manager.num_free_blocks,
        config.scheduler.num_blocks,
        time.perf_counter() - t_wall,
        steps,
    )
