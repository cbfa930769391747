"""fastmode's discrete-event simulator: the engine's own Scheduler on a cost-model clock.

Module map (each one concept; none imports torch):

- distributions  seeded token-length distributions and arrival processes
- workload       RequestSpec, WorkloadConfig, generate / load / save JSONL workloads
- step_timer     StepTimer: SchedulerOutput -> seconds via planner.CostModel (cached, exact)
- simulator      simulate(): the step loop around fastmode.engine.scheduler.Scheduler
- report         per-tier TTFT / TPOT / tok/s / $/Mtok summaries and the text table
- command        `fastmode simulate`

See docs/simulator.md for what it assumes and how it is validated.
"""

from fastmode.sim.distributions import ArrivalProcess, LengthDist
from fastmode.sim.simulator import SimConfig, SimResult, kv_cache_blocks, simulate
from fastmode.sim.step_timer import StepTimer
from fastmode.sim.workload import RequestSpec, WorkloadConfig, generate_workload, load_jsonl, save_jsonl

__all__ = [
    "ArrivalProcess",
    "LengthDist",
    "RequestSpec",
    "SimConfig",
    "SimResult",
    "StepTimer",
    "WorkloadConfig",
    "generate_workload",
    "kv_cache_blocks",
    "load_jsonl",
    "save_jsonl",
    "simulate",
]
