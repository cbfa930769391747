"""Simulate at the machine's pace over time: the cost model's step times scaled by a speed profile.

A speed profile is ((from_s, factor), ...), from_s ascending and the first at 0: a step that
starts at simulated time t takes the cost model's time times the factor in effect at t.
sim_validation builds one from the speed probe's times during a replay (probe.speed_profile),
or from the engine's own steps (sim_validation.own_pace), and simulates the replayed load at it.
No torch.
"""

from __future__ import annotations

import bisect
import itertools
import math

from fastmode.planner.cost_model import CostModel
from fastmode.sim.simulator import SimConfig, SimResult, simulate
from fastmode.sim.step_timer import StepTimer
from fastmode.sim.workload import RequestSpec

SpeedProfile = tuple[tuple[float, float], ...]


class PacedStepTime:
    """`simulate`'s step_seconds: the cost model's time (StepTimer) times the profile's factor
    where the step starts."""

    def __init__(self, cost_model: CostModel, profile: SpeedProfile):
        if not profile:
            raise ValueError("speed_profile: empty (simulate without one instead)")
        starts = [t for t, _ in profile]
        if starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            raise ValueError("speed_profile: start times must begin at 0 and increase")
        if not all(0 < f < math.inf for _, f in profile):
            raise ValueError("speed_profile: every factor must be positive and finite")
        self.timer = StepTimer(cost_model)
        self.starts = starts
        self.factors = [f for _, f in profile]

    def __call__(self, chunks: list[tuple[int, int]], contexts: list[int], start_s: float) -> float:
        return self.timer.step_s(chunks, contexts) * self.factors[bisect.bisect_right(self.starts, start_s) - 1]


def simulate_at_pace(
    workload: list[RequestSpec], cost_model: CostModel, config: SimConfig, profile: SpeedProfile
) -> SimResult:
    """`simulate` with each step at the profile's pace; an empty profile is the plain simulation."""
    if not profile:
        return simulate(workload, cost_model, config)
    return simulate(workload, cost_model, config, PacedStepTime(cost_model, profile))
