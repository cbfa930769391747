"""A measured engine step, in the terms the cost model prices. No torch.

`step_s` is the mean of the timed steps, not their median: the simulator adds
step times up, so what it needs from each point is the expected step. On a
shared machine a step's time has a right tail (VM exits, interrupts, a slow
spell caught by a few samples), which a median leaves out, so a cost model
fitted to medians prices a load's steps too low. The median is kept beside the
mean as a diagnostic.

A decode point is B sequences each decoding one token at (mean) context c; a
prefill point is one chunk of n prompt tokens after `prefill_context` tokens
already in the KV cache. The cost model is linear in each decoding sequence's
context, so B copies of the mean context price the same as the real contexts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepPoint:
    """One measured point. `step_s` is the mean time of `engine.step()` over the timed steps, seconds."""

    kind: str  # "decode" or "prefill"
    step_s: float  # mean: what the fit uses
    num_decodes: int = 0
    decode_context: float = 0.0  # mean tokens already in each decoding sequence's KV cache
    prefill_tokens: int = 0
    prefill_context: int = 0  # tokens in the KV cache before this chunk
    num_samples: int = 1  # timed steps behind step_s and median_s
    spread: float = 0.0  # (max - min) / median of the timed steps: how noisy the machine was
    median_s: float = 0.0  # median of the timed steps (0: not recorded in the file)

    def __post_init__(self) -> None:
        if self.kind not in ("decode", "prefill"):
            raise ValueError(f"kind must be decode or prefill, got {self.kind!r}")
        if self.step_s <= 0:
            raise ValueError("step_s must be > 0")

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.num_decodes

    def cost_args(self) -> tuple[list[tuple[int, int]], list[float]]:
        """(prefill_chunks, decode_context_lens) for `CostModel.step_cost`."""
        chunks = [(self.prefill_tokens, self.prefill_context)] if self.prefill_tokens else []
        return chunks, [self.decode_context] * self.num_decodes

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if v or k in ("kind", "step_s")}
        return {k: round(v, 9) if isinstance(v, float) else v for k, v in d.items()}

    @classmethod
    def from_json(cls, d: dict) -> StepPoint:
        return cls(**d)
