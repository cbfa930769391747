"""Time the real engine: decode steps by batch and context, prefill steps by chunk size.

Everything goes through `LLMEngine.step()`, so a measured step includes what a
user waits for: scheduling, the model forward, sampling, detokenisation and
bookkeeping, not only the matmuls.

Setup, per decode context c: an engine with max(batches) requests of c prompt
tokens, prefilled. The prompts share all but their last block: the prefix
cache computes the shared part once, so 64 x 512 tokens cost one 512-token
prefill plus 64 short ones (minutes saved on a 2-core machine). Each sequence
still has its own block table and the attention reads all of its context, so a
decode step does the same work as with distinct prompts. Per prefill chunk size
n: an engine with `max_num_batched_tokens = n`, to which each pass gives one
request of k*n tokens, prefilled in k steps of n tokens at contexts 0, n, 2n...

Then the sweep alternates a decode round and a prefill pass. A decode round
takes one step at every (context, batch) pair, starting one pair further each
round; a step at batch B runs with the scheduler's sequence cap set to B (the
other sequences stay resident, paused, and the least recently served go first,
so every sequence's context grows alike). A prefill pass prefills one prompt
per chunk size, in rotating order. `warmup` decode rounds and the first prefill
pass are untimed; each point keeps the mean of its timed steps (the expected
step, which the simulator adds up) and their median. Everything a sweep measures is thus spread
over the same minutes: on a shared machine whose speed drifts by tens of percent within
a minute, measuring one point after another would turn that drift into
differences between the points.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fastmode.calibrate.points import StepPoint
from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.loader import LoadedModel
from fastmode.sampling_params import SamplingParams

Progress = Callable[[str], None]

# Wall time is what a user waits for on a dedicated machine. On a shared one, other processes
# stretch and scatter it; the process's CPU time (with one torch thread) is what the step costs.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class SweepConfig:
    """What to measure. Batches and contexts in sequences and tokens."""

    batches: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 64)  # 12: above the kernels' switch at 8, near it
    contexts: tuple[int, ...] = (32, 128, 512)  # 32: short chats, where attention cost flattens out
    chunk_sizes: tuple[int, ...] = (32, 128, 512)
    prefill_tokens_per_size: int = 512  # prompt length cap per chunk size (k = this // n, 1..4)
    repeats: int = 5  # timed steps per point; their mean (and median) is kept
    warmup: int = 1  # untimed decode rounds (one step per batch size) before the timed ones
    rounds: int = 1  # passes over every context and chunk size (run.measure_interleaved), merged
    prefill_repeats: int = 2
    max_prefill_tokens_per_step: int = 8192  # admits a decode sweep's prompts in few steps
    num_threads: int | None = None  # torch threads (None = the engine's default)
    clock: str = "wall"  # "wall", or "cpu": process CPU time, immune to neighbours on a shared machine
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.batches or min(self.batches) < 1 or not self.contexts or min(self.contexts) < 1:
            raise ValueError("batches and contexts must be non-empty and >= 1")
        if self.chunk_sizes and min(self.chunk_sizes) < 2:
            raise ValueError("prefill chunk sizes must be >= 2 tokens (one token is a decode)")
        if self.repeats < 1 or self.warmup < 0 or self.prefill_repeats < 1 or self.rounds < 1:
            raise ValueError("repeats >= 1, warmup >= 0, prefill_repeats >= 1, rounds >= 1")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}")
        if self.clock == "cpu" and self.num_threads != 1:
            raise ValueError("clock 'cpu' needs num_threads = 1: process CPU time sums every thread's time")


def _point_stats(times: list[float]) -> dict[str, float]:
    """StepPoint's step_s (the mean), median_s and spread of a point's timed steps."""
    med = statistics.median(times)
    return {"step_s": statistics.fmean(times), "median_s": med, "spread": (max(times) - min(times)) / med}


def sweep_engine(
    loaded: LoadedModel, sweep: SweepConfig, max_seqs: int, budget: int, tokens: int, prefix_caching: bool = False
) -> LLMEngine:
    dtype_bytes = 4 if str(loaded.dtype).endswith("float32") else 2
    gib = max(0.01, 1.2 * tokens * loaded.config.kv_bytes_per_token(dtype_bytes) / 2**30)
    cfg = EngineConfig(
        model=str(loaded.path),
        dtype="float32" if dtype_bytes == 4 else "bfloat16",
        kv_cache_gib=gib,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        fast_lane_max_batch=None,
        aging_s=None,
        enable_prefix_caching=prefix_caching,
        num_threads=sweep.num_threads,
        speculative="off",
    )  # plain steps: one token per sequence
    return LLMEngine(cfg, loaded=loaded)


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


class _DecodeGrid:
    """One engine per decode context, prefilled; `round()` steps every (context, batch) pair once."""

    def __init__(self, loaded: LoadedModel, sweep: SweepConfig, progress: Progress):
        self.sweep, self.clock = sweep, CLOCKS[sweep.clock]
        rng = random.Random(sweep.seed)
        vocab, bmax = loaded.config.vocab_size, max(sweep.batches)
        steps_needed = (sweep.warmup + sweep.repeats) * len(sweep.batches)  # at most, per sequence
        max_len = loaded.config.max_position_embeddings
        self.engines: dict[int, LLMEngine] = {}
        for ctx in sorted(sweep.contexts):
            if ctx + steps_needed + 2 > max_len:
                raise ValueError(f"context {ctx} + {steps_needed} decode steps exceeds the model's {max_len} positions")
            budget = max(ctx, min(bmax * ctx, sweep.max_prefill_tokens_per_step))
            engine = sweep_engine(loaded, sweep, bmax, budget, bmax * (ctx + steps_needed + 64), prefix_caching=True)
            params = SamplingParams(temperature=0.0, max_tokens=steps_needed + 32, ignore_eos=True)
            sched = engine.scheduler
            tail = min(engine.scheduler_config.block_size, max(1, ctx // 2))  # private tokens per prompt
            shared = _prompt(rng, vocab, ctx - tail)
            progress(f"decode sweep: prefilling {bmax} x {ctx} tokens ({ctx - tail} shared)")
            for i in range(bmax):
                engine.add_request(shared + _prompt(rng, vocab, tail), params)
                if i == 0:  # the first prompt's blocks enter the prefix cache once it is computed
                    while sched.waiting or any(s.is_prefilling for s in sched.running):
                        engine.step()
            while sched.waiting or any(s.is_prefilling for s in sched.running):
                engine.step()
            self.engines[ctx] = engine
        self.pairs = [(c, b) for c in sorted(sweep.contexts) for b in sorted(sweep.batches, reverse=True)]
        self.times: dict[tuple[int, int], list[float]] = {p: [] for p in self.pairs}
        self.contexts: dict[tuple[int, int], list[float]] = {p: [] for p in self.pairs}

    def round(self, rnd: int) -> None:
        timed = rnd >= self.sweep.warmup
        for i in range(len(self.pairs)):
            ctx, b = pair = self.pairs[(rnd + i) % len(self.pairs)]
            engine = self.engines[ctx]
            sched = engine.scheduler
            full = sched.config
            sched.config = dataclasses.replace(full, max_num_seqs=b)  # the rest stay resident, paused
            try:
                ctx_now = statistics.fmean(s.num_computed_tokens for s in sched.running)
                t0 = self.clock()
                out = engine.step()
                dt = self.clock() - t0
            finally:
                sched.config = full
            if len(out) != b:
                raise RuntimeError(f"decode sweep: a step at batch {b} produced {len(out)} tokens")
            if timed:
                self.times[pair].append(dt)
                self.contexts[pair].append(ctx_now)

    def points(self, progress: Progress) -> list[StepPoint]:
        points = []
        for ctx, b in self.pairs:
            st = _point_stats(self.times[ctx, b])
            points.append(
                StepPoint(
                    "decode",
                    num_decodes=b,
                    decode_context=statistics.fmean(self.contexts[ctx, b]),
                    num_samples=len(self.times[ctx, b]),
                    **st,
                )
            )
            progress(
                f"decode batch {b:>3} context {ctx:>5}: {st['step_s'] * 1e3:8.2f} ms mean, "
                f"{st['median_s'] * 1e3:8.2f} ms median (spread {st['spread']:.0%})"
            )
        return points


class _PrefillSweep:
    """One engine per chunk size; `pass_()` prefills one prompt per chunk size, timing each step."""

    def __init__(self, loaded: LoadedModel, sweep: SweepConfig):
        self.clock = CLOCKS[sweep.clock]
        self.rng = random.Random(sweep.seed + 1)
        self.vocab = loaded.config.vocab_size
        self.sizes = sorted(sweep.chunk_sizes)
        self.k = {n: max(1, min(4, sweep.prefill_tokens_per_size // n)) for n in self.sizes}
        self.engines = {n: sweep_engine(loaded, sweep, 1, n, n * self.k[n] + 64) for n in self.sizes}
        self.by_ctx: dict[int, dict[int, list[float]]] = {n: {} for n in self.sizes}
        self.params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def pass_(self, rep: int) -> None:
        """The first pass (rep 0) warms up and is not timed."""
        for i in range(len(self.sizes)):
            n = self.sizes[(rep + i) % len(self.sizes)]
            engine = self.engines[n]
            engine.add_request(_prompt(self.rng, self.vocab, n * self.k[n]), self.params)
            while engine.has_unfinished():
                ctx = engine.scheduler.running[0].num_computed_tokens if engine.scheduler.running else 0
                t0 = self.clock()
                engine.step()
                if rep:
                    self.by_ctx[n].setdefault(ctx, []).append(self.clock() - t0)

    def points(self, progress: Progress) -> list[StepPoint]:
        points = []
        for n in self.sizes:
            for ctx, times in sorted(self.by_ctx[n].items()):
                st = _point_stats(times)
                points.append(StepPoint("prefill", prefill_tokens=n, prefill_context=ctx, num_samples=len(times), **st))
                progress(
                    f"prefill chunk {n:>4} after {ctx:>5}: {st['step_s'] * 1e3:8.2f} ms mean, "
                    f"{st['median_s'] * 1e3:8.2f} ms median (spread {st['spread']:.0%})"
                )
        return points


def sweep_units(
    loaded: LoadedModel, sweep: SweepConfig, progress: Progress = lambda s: None, points: list[StepPoint] | None = None
) -> Iterator[None]:
    """The sweep of measure_sweep, one unit (a decode round or a prefill pass) per iteration, so
    that a caller can spread it over other work (a load test, between the load's steps). Building
    the engines is part of the first unit. When the iteration ends, the measured points have been
    appended to `points`."""
    grid = _DecodeGrid(loaded, sweep, progress)
    prefill = _PrefillSweep(loaded, sweep) if sweep.chunk_sizes else None
    decode_rounds, prefill_passes = _unit_counts(sweep)
    for r in range(max(decode_rounds, prefill_passes)):
        if r < decode_rounds:
            grid.round(r)
            yield
        if r < prefill_passes:
            prefill.pass_(r)
            yield
    if points is not None:
        points += grid.points(progress) + (prefill.points(progress) if prefill else [])


def _unit_counts(sweep: SweepConfig) -> tuple[int, int]:
    """(decode rounds, prefill passes) of a sweep: the warm-up ones included."""
    return sweep.warmup + sweep.repeats, sweep.prefill_repeats + 1 if sweep.chunk_sizes else 0


def units_per_sweep(sweep: SweepConfig) -> int:
    """How many units sweep_units yields."""
    return sum(_unit_counts(sweep))


def measure_sweep(loaded: LoadedModel, sweep: SweepConfig, progress: Progress = lambda s: None) -> list[StepPoint]:
    """Every decode point (contexts x batches), then every prefill point (chunk sizes x contexts),
    measured interleaved as the module docstring describes."""
    points: list[StepPoint] = []
    for _ in sweep_units(loaded, sweep, progress, points):
        pass
    return points
