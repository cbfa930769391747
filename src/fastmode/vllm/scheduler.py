"""fastmode's fast lane as a vLLM v1 scheduler.

    --scheduler-cls fastmode.vllm.FastLaneScheduler \\
    --additional-config '{"fastmode": {"lane_max_batch": 2, "fast_priority_at_most": -1}}'

A subclass of vLLM's own `Scheduler` (or `AsyncScheduler`, where vLLM runs asynchronous
scheduling, as it does on GPUs): vLLM still decides how many tokens each scheduled request gets,
allocates KV blocks, chunks prefills and speculates. The lane decides who takes part in a step
(lane.py): before vLLM's `schedule` runs, `self.running` is narrowed to the requests the plan
puts in this step and the admission limit to the lane's free slots; afterwards the paused
requests are put back, still holding their KV. vLLM's model runner already handles a running
request that a step leaves out (its token budget does the same), so nothing else changes.

Two more changes to vLLM's behaviour, both from fastmode's scheduler:
- the waiting queue is ordered by tier (queue.py), and a preempted request keeps its place;
- victims: vLLM preempts the last entry of `self.running` when memory runs out, and this class
  keeps that list in importance order, so flex goes first, then standard, latest arrival first;
  while the lane is active, paused lower-tier requests are preempted first when the step's
  requests (or the fast requests it admits) would not fit in the free KV blocks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping

import vllm
from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from fastmode.engine.tiers import Tier
from fastmode.vllm.compat import check_vllm_version
from fastmode.vllm.lane import LaneConfig, Resident, classify, importance_key, plan_step
from fastmode.vllm.queue import TierRequestQueue

check_vllm_version(vllm.__version__)  # at import: `--scheduler-cls` fails at start-up, not mid-request

# Under vLLM's logger tree: vLLM gives handlers (its format, VLLM_LOGGING_LEVEL) to "vllm" and its
# children only, so a logger named after this module would print nothing below WARNING.
logger = init_logger("vllm.plugins.fastmode")


class FastLaneScheduler(Scheduler):
    """vLLM's scheduler with fastmode's tiers and fast lane. Named by `--scheduler-cls`; builds an
    `AsyncFastLaneScheduler` where vLLM's config asks for asynchronous scheduling.

    Invariants: while any fast request is resident or waiting, no step schedules more than
    `lane_max_batch` requests; a paused request keeps its KV blocks; `self.running` holds every
    resident request between steps."""

    def __new__(cls, *args, **kwargs):
        target = cls
        if cls is FastLaneScheduler:
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            if vllm_config is not None and vllm_config.scheduler_config.async_scheduling:
                target = AsyncFastLaneScheduler
        return super().__new__(target)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        additional = self.vllm_config.additional_config
        self.lane_config = LaneConfig.from_additional_config(additional if isinstance(additional, Mapping) else None)
        # The waiting queue applies the operator's policy (priority order or arrival order) within
        # each tier; vLLM's own victim choice then only needs `self.running`'s order, its FCFS rule.
        self._by_priority = self.policy == SchedulingPolicy.PRIORITY
        self.policy = SchedulingPolicy.FCFS
        self._tiers: dict[str, Tier] = {}
        self._last_step: dict[str, int] = {}  # request id -> the last step it took part in (rotation)
        self.waiting = TierRequestQueue(self.tier_of, self._by_priority)
        self.kv_holding_waiting = TierRequestQueue(self.tier_of, self._by_priority)
        self.num_lane_steps = 0
        self._lane_open = False
        self.num_lane_preemptions = 0  # preempted by the lane (slots or memory), before vLLM's own step
        self._warned_tiers: set[str] = set()
        logger.info(
            "fastmode fast lane: lane_max_batch=%d, fast_priority_at_most=%s, waiting order: tier, %s",
            self.lane_config.lane_max_batch,
            self.lane_config.fast_priority_at_most,
            "priority, arrival" if self._by_priority else "arrival",
        )

    # -- tiers ---------------------------------------------------------------
    def tier_of(self, request: Request) -> Tier:
        return self._tiers.get(request.request_id, Tier.STANDARD)

    def _classify(self, request: Request) -> Tier:
        params = request.sampling_params
        extra = params.extra_args if params is not None else None
        service_tier = extra.get("service_tier") if isinstance(extra, Mapping) else None
        try:
            return classify(service_tier, request.priority, self.lane_config)
        except ValueError as e:  # only reachable around the middleware, which answers 400 for it
            if str(service_tier) not in self._warned_tiers:
                self._warned_tiers.add(str(service_tier))
                logger.warning("%s; served as standard", e)
            return Tier.STANDARD

    def add_request(self, request: Request) -> None:
        if request.request_id not in self.requests:  # a streaming update keeps the session's tier
            self._tiers[request.request_id] = self._classify(request)
        super().add_request(request)

    def _forget_finished(self) -> None:
        if len(self._tiers) > len(self.requests):
            live = self.requests
            self._tiers = {k: v for k, v in self._tiers.items() if k in live}
            self._last_step = {k: v for k, v in self._last_step.items() if k in live}

    # -- the step ------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._forget_finished()
        running = self.running
        tiers = [self.tier_of(r) for r in running]
        num_fast_waiting = self.waiting.num_fast() + self.kv_holding_waiting.num_fast()
        if num_fast_waiting == 0 and Tier.FAST not in tiers:
            self._note_lane(False, running, num_fast_waiting)
            if self._by_priority or Tier.FLEX in tiers:
                # vLLM preempts the last of `running`: make that the least important. With standard
                # requests under FCFS, vLLM's own order (admission) stands: the step is stock vLLM's.
                by = self._by_priority
                order = sorted(
                    range(len(running)),
                    key=lambda i: importance_key(tiers[i], running[i].priority, running[i].arrival_time, by),
                )
                self.running = [running[i] for i in order]
            out = super().schedule(throttle_prefills)
            self._note_scheduled(out)
            return out

        residents = [
            Resident(tier, r.priority, r.arrival_time, self._last_step.get(r.request_id, -1))
            for r, tier in zip(running, tiers)
        ]
        streaming = self.num_waiting_for_streaming_input  # sessions between turns hold a slot too
        cap = self.max_num_active_reqs
        plan = plan_step(
            residents, num_fast_waiting, self.lane_config.lane_max_batch, cap - streaming, self._by_priority
        )
        self._note_lane(True, running, num_fast_waiting)

        step = [running[i] for i in plan.step]
        paused = [running[i] for i in plan.paused]
        evict = [running[i] for i in plan.evict]
        victims = [running[i] for i in plan.victims]
        admit = list(itertools.islice(self._fast_waiting(), plan.num_admit))
        short = self._num_blocks_short(step, admit)
        while short > 0 and victims:
            victim = victims.pop(0)
            short -= self._num_blocks_held(victim)
            paused.remove(victim)
            evict.append(victim)
        now = time.monotonic()
        for victim in evict:  # back to the waiting queue at its arrival time; recomputed on return
            self._preempt_request(victim, now)
        self.num_lane_preemptions += len(evict)
        self.num_lane_steps += 1

        self.running = step
        self.max_num_active_reqs = len(step) + plan.num_admit + streaming
        try:
            out = super().schedule(throttle_prefills)
        finally:
            self.max_num_active_reqs = cap
            self.running = self.running + paused  # vLLM's step may have preempted or admitted some
        self._note_scheduled(out)
        return out

    def _note_lane(self, active: bool, running: list[Request], num_fast_waiting: int) -> None:
        if active != self._lane_open:
            self._lane_open = active
            logger.debug(
                "fast lane %s at step %d: %d resident, %d fast waiting",
                "opened" if active else "closed",
                self.current_step + 1,
                len(running),
                num_fast_waiting,
            )

    def _fast_waiting(self):
        return itertools.chain(self.kv_holding_waiting.iter_fast(), self.waiting.iter_fast())

    def _note_scheduled(self, out: SchedulerOutput) -> None:
        step = self.current_step
        for request_id in out.num_scheduled_tokens:
            self._last_step[request_id] = step

    # -- memory --------------------------------------------------------------
    def _num_blocks_short(self, step: list[Request], admit: list[Request]) -> int:
        """KV blocks the step's requests (and the fast requests it admits, whole prompts, as vLLM
        reserves them) need beyond the free ones; an estimate erring high: it ignores prefix-cache
        hits and counts sliding-window groups as full ones."""
        sizes = [g.kv_cache_spec.block_size for g in self.kv_cache_config.kv_cache_groups]
        blocks_of = self.kv_cache_manager.coordinator.get_blocks
        need = 0
        for r in step:
            new = min(
                r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens,
                self.max_num_scheduled_tokens,
            )
            tokens = r.num_computed_tokens + max(0, new) + self.num_lookahead_tokens
            need += sum(max(0, cdiv(tokens, size) - len(held)) for size, held in zip(sizes, blocks_of(r.request_id)))
        for r in admit:
            need += sum(
                max(0, cdiv(r.num_tokens, size) - len(held)) for size, held in zip(sizes, blocks_of(r.request_id))
            )
        return need - self.kv_cache_manager.block_pool.get_num_free_blocks()

    def _num_blocks_held(self, request: Request) -> int:
        return sum(len(held) for held in self.kv_cache_manager.coordinator.get_blocks(request.request_id))


class AsyncFastLaneScheduler(FastLaneScheduler, AsyncScheduler):
    """The same lane over vLLM's asynchronous scheduling (the next step is scheduled while the
    current one runs); `FastLaneScheduler` builds this one when vLLM's config asks for it."""
