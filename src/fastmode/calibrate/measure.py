"""Time the real engine: decode steps by batch and context, prefill steps by chunk size.

Everything goes through `LLMEngine.step()`, so a measured step includes what a
user waits for: scheduling, the model forward, sampling, detokenisation and
bookkeeping, not only the matmuls.

Decode sweep, per context c: admit max(batches) requests of c prompt tokens and
prefill them; then, round after round, take one step at each batch size B, the
scheduler's sequence cap set to B (the other sequences stay resident, paused,
and the least recently served go first, so every sequence's context grows
alike). `warmup` rounds go untimed, then `repeats` timed rounds, each starting
at the next batch size: the batch sizes take turns, so a slow spell of a shared
machine lands on all of them instead of on whichever was being measured. One
prefill per context serves every batch size, and the prompts share all but
their last block: the prefix cache computes the shared part once, so 64 x 512
tokens cost one 512-token prefill plus 64 short ones (minutes saved on a 2-core
machine). Each sequence still has its own block table and the attention reads
all of its context, so a decode step does the same work as with distinct
prompts.
Prefill sweep, per chunk size n: one request of k*n tokens with
`max_num_batched_tokens = n`, so it is prefilled in k steps of n tokens at
contexts 0, n, 2n, ...; repeated, medians kept.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Callable
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

    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    contexts: tuple[int, ...] = (32, 128, 512)  # 32: short chats, where attention cost flattens out
    chunk_sizes: tuple[int, ...] = (32, 128, 512)
    prefill_tokens_per_size: int = 512  # prompt length cap per chunk size (k = this // n, 1..4)
    repeats: int = 5  # timed steps per point; the median is kept
    warmup: int = 1  # untimed decode rounds (one step per batch size) before the timed ones
    rounds: int = 1  # passes over every context and chunk size (run.measure_interleaved); medians merged
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


def _median_point(times: list[float]) -> tuple[float, float]:
    med = statistics.median(times)
    return med, (max(times) - min(times)) / med


def _engine(loaded: LoadedModel, sweep: SweepConfig, max_seqs: int, budget: int, tokens: int,
            prefix_caching: bool = False) -> LLMEngine:
    dtype_bytes = 4 if str(loaded.dtype).endswith("float32") else 2
    gib = max(0.01, 1.2 * tokens * loaded.config.kv_bytes_per_token(dtype_bytes) / 2**30)
    cfg = EngineConfig(model=str(loaded.path), dtype="float32" if dtype_bytes == 4 else "bfloat16",
                       kv_cache_gib=gib, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                       fast_lane_max_batch=None, aging_s=None, enable_prefix_caching=prefix_caching,
                       num_threads=sweep.num_threads, speculative="off")  # plain steps: one token per sequence
    return LLMEngine(cfg, loaded=loaded)


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def measure_decode(loaded: LoadedModel, sweep: SweepConfig, progress: Progress = lambda s: None) -> list[StepPoint]:
    rng = random.Random(sweep.seed)
    vocab = loaded.config.vocab_size
    bmax = max(sweep.batches)
    steps_needed = (sweep.warmup + sweep.repeats) * len(sweep.batches)
    clock = CLOCKS[sweep.clock]
    points = []
    for ctx in sorted(sweep.contexts):
        max_len = loaded.config.max_position_embeddings
        if ctx + steps_needed + 2 > max_len:
            raise ValueError(f"context {ctx} + {steps_needed} decode steps exceeds the model's {max_len} positions")
        budget = max(ctx, min(bmax * ctx, sweep.max_prefill_tokens_per_step))
        engine = _engine(loaded, sweep, bmax, budget, bmax * (ctx + steps_needed + 64), prefix_caching=True)
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
        batches = sorted(sweep.batches, reverse=True)
        times: dict[int, list[float]] = {b: [] for b in batches}
        contexts: dict[int, list[float]] = {b: [] for b in batches}
        full = sched.config
        for rnd in range(sweep.warmup + sweep.repeats):
            for i in range(len(batches)):
                b = batches[(rnd + i) % len(batches)]
                sched.config = dataclasses.replace(full, max_num_seqs=b)  # the rest stay resident, paused
                ctx_now = statistics.fmean(s.num_computed_tokens for s in sched.running)
                t0 = clock()
                out = engine.step()
                dt = clock() - t0
                if len(out) != b:
                    raise RuntimeError(f"decode sweep: a step at batch {b} produced {len(out)} tokens")
                if rnd >= sweep.warmup:
                    times[b].append(dt)
                    contexts[b].append(ctx_now)
        sched.config = full
        for b in batches:
            med, spread = _median_point(times[b])
            points.append(StepPoint("decode", med, num_decodes=b, decode_context=statistics.fmean(contexts[b]),
                                    num_samples=len(times[b]), spread=spread))
            progress(f"decode batch {b:>3} context {ctx:>5}: {med * 1e3:8.2f} ms (spread {spread:.0%})")
        del engine
    return points


def measure_prefill(loaded: LoadedModel, sweep: SweepConfig, progress: Progress = lambda s: None) -> list[StepPoint]:
    rng = random.Random(sweep.seed + 1)
    vocab = loaded.config.vocab_size
    clock = CLOCKS[sweep.clock]
    points = []
    for n in sorted(sweep.chunk_sizes):
        k = max(1, min(4, sweep.prefill_tokens_per_size // n))
        engine = _engine(loaded, sweep, 1, n, n * k + 64)
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        by_ctx: dict[int, list[float]] = {}
        for rep in range(sweep.prefill_repeats + 1):  # the first pass warms up and is dropped
            engine.add_request(_prompt(rng, vocab, n * k), params)
            while engine.has_unfinished():
                ctx = engine.scheduler.running[0].num_computed_tokens if engine.scheduler.running else 0
                t0 = clock()
                engine.step()
                if rep:
                    by_ctx.setdefault(ctx, []).append(clock() - t0)
        for ctx, times in sorted(by_ctx.items()):
            med, spread = _median_point(times)
            points.append(StepPoint("prefill", med, prefill_tokens=n, prefill_context=ctx,
                                    num_samples=len(times), spread=spread))
            progress(f"prefill chunk {n:>4} after {ctx:>5}: {med * 1e3:8.2f} ms (spread {spread:.0%})")
        del engine
    return points
