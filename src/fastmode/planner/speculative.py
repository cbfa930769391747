"""Speculative decoding: a draft proposes k tokens, the target verifies them at once.

With per-token acceptance rate a (Leviathan et al. 2023, i.i.d. approximation), a
verify step yields on average

    E[tokens] = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens per sequence (the accepted prefix plus the target's own next token). With a
draft that costs c = t_draft / t_target per token, the closed-form speed-up is

    speedup = E[tokens] / (k*c + 1)

which assumes verifying k+1 tokens costs one ordinary step. That holds while the
step is memory-bound; once it is compute-bound the verify step costs up to (k+1)
steps and speculation loses. `spec_cycle` uses the real verify cost from the cost
model, so it reproduces both regimes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastmode.planner.cost_model import CostModel


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings. Invariants: 0 <= acceptance < 1, draft_len >= 1, draft_cost_ratio >= 0."""

    acceptance: float = 0.7
    draft_len: int = 4
    draft_cost_ratio: float = 0.05  # t_draft / t_target per token, at the same batch

    def __post_init__(self) -> None:
        if not 0 <= self.acceptance < 1:
            raise ValueError("acceptance must be in [0, 1)")
        if self.draft_len < 1:
            raise ValueError("draft_len must be >= 1")
        if self.draft_cost_ratio < 0:
            raise ValueError("draft_cost_ratio must be >= 0")

    @property
    def expected_tokens(self) -> float:
        return expected_tokens_per_verify(self.acceptance, self.draft_len)

    @property
    def closed_form_speedup(self) -> float:
        return closed_form_speedup(self.acceptance, self.draft_len, self.draft_cost_ratio)


def expected_tokens_per_verify(acceptance: float, draft_len: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens emitted per sequence per verify step."""
    a, k = acceptance, draft_len
    if a == 0:
        return 1.0
    if a == 1:  # every draft accepted (the limit of the formula)
        return k + 1.0
    return (1 - a ** (k + 1)) / (1 - a)


def closed_form_speedup(acceptance: float, draft_len: int, draft_cost_ratio: float) -> float:
    """Memory-bound speed-up: E[tokens] / (k*c + 1)."""
    return expected_tokens_per_verify(acceptance, draft_len) / (draft_len * draft_cost_ratio + 1)


@dataclass(frozen=True)
class SpecCycle:
    """One draft-then-verify cycle for a batch. Times in seconds."""

    draft_s: float
    verify_s: float
    tokens_per_seq: float  # expected tokens each sequence gains per cycle
    plain_step_s: float  # the ordinary decode step it replaces

    @property
    def cycle_s(self) -> float:
        return self.draft_s + self.verify_s

    @property
    def per_user_tok_s(self) -> float:
        return self.tokens_per_seq / self.cycle_s

    @property
    def speedup(self) -> float:
        """Per-user speed with speculation over per-user speed without it."""
        return self.tokens_per_seq * self.plain_step_s / self.cycle_s


def spec_cycle(
    target: CostModel, context_lens: Sequence[int], spec: SpecConfig, draft: CostModel | None = None
) -> SpecCycle:
    """Cost of one speculation cycle for a decode batch with these context lengths.

    The draft runs k sequential single-token steps: from its own cost model when
    given, else as `draft_cost_ratio` times the target's plain step. The target
    then verifies k+1 tokens per sequence in one step.
    """
    plain = target.decode_step_s(context_lens)
    k = spec.draft_len
    if draft is not None:
        draft_s = sum(draft.decode_step_s([c + i for c in context_lens]) for i in range(k))
    else:
        draft_s = k * spec.draft_cost_ratio * plain
    verify = target.step_s(decode_context_lens=context_lens, tokens_per_decode_seq=k + 1)
    return SpecCycle(draft_s, verify, spec.expected_tokens, plain)


def break_even_batch(
    target: CostModel, context_len: int, spec: SpecConfig, draft: CostModel | None = None, max_batch: int = 1024
) -> int:
    """Largest decode batch at which speculating with `spec` is still at least as fast
    per user as plain decoding (0 if it never is, `max_batch` if it always is).

    Speed-up falls as the batch grows (the verify step turns compute-bound and
    costs about k+1 plain steps), so the batches where it pays form a prefix
    1..B; B is found by bisection. The engine stops speculating above it
    (`SpecConfig.max_batch`, flag `--speculative-max-batch`; `fastmode calibrate` prints it).
    """

    def pays(b: int) -> bool:
        return spec_cycle(target, [context_len] * b, spec, draft).speedup >= 1.0

    if not pays(1):
        return 0
    lo, hi = 1, 2
    while hi <= max_batch and pays(hi):
        lo, hi = hi, hi * 2
    if hi > max_batch:
        return max_batch if pays(max_batch) else _bisect(pays, lo, max_batch)
    return _bisect(pays, lo, hi)


def _bisect(pays, lo: int, hi: int) -> int:
    """Largest b in [lo, hi) with pays(b), given pays(lo) and not pays(hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return lo
