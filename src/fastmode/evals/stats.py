"""Confidence intervals for accuracy and for the p^n chain argument.

Accuracy on a few dozen items is a noisy estimate, so every number the eval
reports carries a 95% interval. We use the Wilson score interval rather than
the textbook normal ("Wald") interval p +- z*sqrt(p(1-p)/n): Wald collapses to
zero width at p = 0 or 1 and undercovers for small n, which is exactly the
regime of a 135M model on a 40-item category.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Two-sided 95% normal quantile.
Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Proportion:
    """`num_correct` out of `num_total`, with its point estimate and Wilson interval."""

    num_correct: int
    num_total: int
    low: float
    high: float

    @property
    def value(self) -> float:
        """The point estimate k/n (0.0 when n is 0, with the interval [0, 1])."""
        return self.num_correct / self.num_total if self.num_total else 0.0

    def to_dict(self) -> dict[str, float | int | list[float]]:
        return {
            "correct": self.num_correct,
            "total": self.num_total,
            "accuracy": self.value,
            "ci95": [self.low, self.high],
        }


def wilson_interval(num_correct: int, num_total: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n.

        centre    = (p + z^2/2n) / (1 + z^2/n)
        halfwidth = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)

    With no trials there is no information, so the interval is [0, 1].
    """
    if not 0 <= num_correct <= num_total:
        raise ValueError(f"need 0 <= correct <= total, got {num_correct}/{num_total}")
    if num_total == 0:
        return 0.0, 1.0
    n = num_total
    p = num_correct / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At k = 0 (k = n) the bound is exactly 0 (1); compute it so, not as a
    # difference of two nearly equal floats.
    low = 0.0 if num_correct == 0 else max(0.0, centre - half)
    high = 1.0 if num_correct == n else min(1.0, centre + half)
    return low, high


def proportion(num_correct: int, num_total: int) -> Proportion:
    """Bundle a count with its Wilson 95% interval."""
    low, high = wilson_interval(num_correct, num_total)
    return Proportion(num_correct, num_total, low, high)


@dataclass(frozen=True)
class ChainSuccess:
    """Success rate of an n-step pipeline whose steps each succeed with p."""

    num_steps: int
    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float | int | list[float]]:
        return {"steps": self.num_steps, "success": self.value, "ci95": [self.low, self.high]}


def chain_success(p: Proportion, num_steps: int = 10) -> ChainSuccess:
    """p^n with the interval [low^n, high^n].

    x -> x^n is increasing on [0, 1], so mapping the endpoints of a 95%
    interval for p gives a 95% interval for p^n: the event "p in [lo, hi]" is
    the same event as "p^n in [lo^n, hi^n]". This assumes independent steps of
    equal difficulty, the fast-mode articles' simplification, not a property of real
    agent pipelines.
    """
    return ChainSuccess(num_steps, p.value**num_steps, p.low**num_steps, p.high**num_steps)
