"""A speed reference: one fixed pair of steps, timed again and again on an engine of its own.

The machines fastmode is validated on are shared VMs whose speed drifts by 10-30% over
minutes. A calibration measures the shape of the step-time curve (what a batch, a context,
a prefill chunk costs); it cannot say how fast the machine runs five minutes later, while a
load test is being measured. The probe can: the same work every time, so the ratio of its
times at two moments is the machine's relative speed between them, whatever the cost
model says.

One probe: `batch` prompts of `prompt_tokens` fixed tokens, prefilled in one step, then
`decode_steps` decode steps over all of them, every step timed together: a compute-bound
prefill and memory-bound decodes, the two kinds of step a served load spends its time in.
The requests then finish (max_tokens = decode_steps + 1) and free their blocks, and prefix
caching is off, so every probe computes the same thing. The default, 2 x 16 tokens and 3
decodes, takes ~0.2 s on a 2-vCPU VM (SmolLM2-135M, one thread).
The engine shares the loaded weights with whatever engine it sits beside and has its own
scheduler and KV cache: probing changes no other engine's state.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from fastmode.calibrate.measure import CLOCKS, SweepConfig, sweep_engine
from fastmode.loader import LoadedModel
from fastmode.sampling_params import SamplingParams


@dataclass
class SpeedProbe:
    """Call it to run one probe; `times` keeps every probe's seconds on the sweep's clock."""

    loaded: LoadedModel
    sweep: SweepConfig  # its clock and thread count are the ones used
    batch: int = 2
    prompt_tokens: int = 16
    decode_steps: int = 3
    times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.batch < 1 or self.prompt_tokens < 2 or self.decode_steps < 0:
            raise ValueError("a probe needs batch >= 1, prompt_tokens >= 2 and decode_steps >= 0")
        tokens = self.batch * self.prompt_tokens
        self.engine = sweep_engine(
            self.loaded, self.sweep, self.batch, tokens, self.batch * (self.prompt_tokens + self.decode_steps + 1) + 64
        )
        rng = random.Random(f"probe-{self.sweep.seed}")
        vocab = self.loaded.config.vocab_size
        self.prompts = [[rng.randrange(vocab) for _ in range(self.prompt_tokens)] for _ in range(self.batch)]
        self.params = SamplingParams(temperature=0.0, max_tokens=self.decode_steps + 1, ignore_eos=True)
        self.clock = CLOCKS[self.sweep.clock]

    def __call__(self) -> float:
        for p in self.prompts:
            self.engine.add_request(p, self.params)
        t0 = self.clock()
        outputs = [len(self.engine.step()) for _ in range(self.decode_steps + 1)]
        dt = self.clock() - t0
        if outputs != [self.batch] * (self.decode_steps + 1) or self.engine.has_unfinished():
            raise RuntimeError(
                f"speed probe: expected a prefill step and {self.decode_steps} decode steps of "
                f"{self.batch} sequences each, got {outputs} outputs"
            )
        self.times.append(dt)
        return dt

    def take(self) -> list[float]:
        """The times since the last take(), and start afresh."""
        out, self.times = self.times, []
        return out


def relative_speed(during: list[float], reference: list[float]) -> float:
    """How much longer the probe took during a span than in the reference span: the ratio of
    medians (1.10: the machine ran 10% slower). Medians, as a stray slow probe is common on a VM."""
    if not during or not reference:
        raise ValueError("relative_speed needs probe times in both spans")
    return statistics.median(during) / statistics.median(reference)


def speed_profile(
    samples: list[tuple[float, float]], reference: list[float], window: int = 5
) -> tuple[tuple[float, float], ...]:
    """The machine's pace over a replay, as a speed profile (pace.py): each probe's time
    (`samples`: (at_s, seconds), in time order) over the reference median, smoothed by a centred
    running median of `window` probes so that one stray probe moves nothing, and held from midway
    after the previous probe to midway before the next (the first from 0)."""
    if not samples or not reference:
        raise ValueError("speed_profile needs probe times during the replay and in the reference span")
    if window < 1:
        raise ValueError("window must be >= 1")
    at = [t for t, _ in samples]
    if any(b <= a for a, b in zip(at, at[1:])):
        raise ValueError("probe samples must be in increasing time order")
    ref = statistics.median(reference)
    ratios = [s / ref for _, s in samples]
    h = window // 2
    smooth = [statistics.median(ratios[max(0, i - h) : i + h + 1]) for i in range(len(ratios))]
    starts = [0.0] + [(a + b) / 2 for a, b in zip(at, at[1:])]
    return tuple(zip(starts, smooth))
