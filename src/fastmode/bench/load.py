"""How the bench sends: a closed loop of N workers, or an open loop of Poisson arrivals.

Closed loop (`--concurrency N`): N workers each send a request, wait for its
last chunk, and send the next. The load adapts to the server, so it measures
what N simultaneous users experience and the throughput the server reaches
with N sequences in flight; it can never overload the server.

Open loop (`--rate R`): requests arrive at exponential inter-arrival times of
mean 1/R seconds (a Poisson process, seeded) whether or not earlier ones have
finished, as independent users do. Past the server's capacity, queues and
latencies grow without bound over the run; that is the point of measuring it.
Each record keeps its scheduled arrival time next to its actual send time, so
a client that fell behind its schedule is visible.

A level ends after `num_requests` requests or, if only `duration_s` is given,
once no new request may start (requests in flight then run to their end).
Warmup requests (their own seeded stream, so they never change the measured
ones) are sent first, closed loop, and are not measured.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from fastmode.bench.client import BenchClient, RequestRecord
from fastmode.bench.workload import BenchRequest, Workload, WorkloadConfig

MODES = ("closed", "open")


@dataclass(frozen=True)
class LoadSpec:
    """One level of a sweep: `level` is a concurrency (closed) or requests/s (open)."""

    mode: str
    level: float
    num_requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.level <= 0 or (self.mode == "closed" and self.level != int(self.level)):
            raise ValueError("concurrency must be a positive integer, rate a positive number")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests, duration_s or both")
        if (self.num_requests is not None and self.num_requests < 1) or (
            self.duration_s is not None and self.duration_s <= 0
        ):
            raise ValueError("num_requests must be >= 1 and duration_s > 0")
        if self.warmup_requests < 0:
            raise ValueError("warmup_requests must be >= 0")

    @property
    def label(self) -> str:
        """'c16' or 'r2.5': short, file-name safe."""
        return f"c{int(self.level)}" if self.mode == "closed" else f"r{self.level:g}"

    @property
    def warmup_concurrency(self) -> int:
        return int(self.level) if self.mode == "closed" else 1


@dataclass
class LevelRun:
    """The records of one level and its measured window (perf_counter seconds)."""

    spec: LoadSpec
    records: list[RequestRecord]
    t0: float  # the measured part began (after warmup)
    t_end: float  # the last measured request ended
    warmup: list[RequestRecord] = field(default_factory=list)

    @property
    def window_s(self) -> float:
        return max(self.t_end - self.t0, 1e-9)


def _stop(num_requests: int | None, issued: int, deadline: float) -> bool:
    return (num_requests is not None and issued >= num_requests) or time.perf_counter() >= deadline


async def closed_loop(
    client: BenchClient,
    requests: Iterator[BenchRequest],
    concurrency: int,
    num_requests: int | None,
    duration_s: float | None,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
) -> list[RequestRecord]:
    """`concurrency` workers sending back to back; records in completion order."""
    records: list[RequestRecord] = []
    deadline = time.perf_counter() + duration_s if duration_s is not None else math.inf
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while not _stop(num_requests, issued, deadline):
            issued += 1  # one event loop: no other worker runs between the check and here
            rec = await client.send(next(requests))
            records.append(rec)
            on_done(rec)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


def poisson_arrivals(rate_per_s: float, seed: int) -> Iterator[float]:
    """Endless arrival times (s from 0, first after 0) of a Poisson process, seeded."""
    rng = np.random.default_rng([seed, 0x0A44])  # its own stream: the workload's draws stay put
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate_per_s))
        yield t


async def open_loop(
    client: BenchClient,
    requests: Iterator[BenchRequest],
    rate_per_s: float,
    num_requests: int | None,
    duration_s: float | None,
    seed: int = 0,
    on_done: Callable[[RequestRecord], None] = lambda r: None,
) -> list[RequestRecord]:
    """Send at Poisson arrival times, never waiting for answers; records in completion order."""
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    horizon = duration_s if duration_s is not None else math.inf

    async def one(req: BenchRequest, scheduled: float) -> None:
        rec = await client.send(req, scheduled_s=scheduled)
        records.append(rec)
        on_done(rec)

    tasks: list[asyncio.Task] = []
    for i, t in enumerate(poisson_arrivals(rate_per_s, seed)):
        if (num_requests is not None and i >= num_requests) or t > horizon:
            break
        delay = t0 + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(next(requests), t0 + t)))
    await asyncio.gather(*tasks)
    return records


async def run_level(client: BenchClient, workload: WorkloadConfig, spec: LoadSpec, progress: bool = False) -> LevelRun:
    """Warm up, then run one level of load and return what it measured."""
    from tqdm import tqdm

    warmup: list[RequestRecord] = []
    if spec.warmup_requests:
        warm = Workload(workload, stream=1)
        warmup = await closed_loop(
            client, iter(warm.take(spec.warmup_requests)), spec.warmup_concurrency, spec.warmup_requests, None
        )
    requests = iter(Workload(workload, stream=0))
    unit = f"concurrency {int(spec.level)}" if spec.mode == "closed" else f"{spec.level:g} req/s"
    with tqdm(total=spec.num_requests, desc=f"bench {unit}", unit="req", disable=not progress, leave=False) as bar:
        failed = 0

        def on_done(rec: RequestRecord) -> None:
            nonlocal failed
            failed += not rec.ok
            bar.update(1)
            if failed:
                bar.set_postfix(errors=failed, refresh=False)

        t0 = time.perf_counter()
        if spec.mode == "closed":
            records = await closed_loop(client, requests, int(spec.level), spec.num_requests, spec.duration_s, on_done)
        else:
            records = await open_loop(
                client, requests, spec.level, spec.num_requests, spec.duration_s, spec.seed, on_done
            )
    t_end = max((r.end_s for r in records), default=t0)
    return LevelRun(spec, records, t0, t_end, warmup)
