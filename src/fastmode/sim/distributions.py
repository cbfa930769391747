"""Seeded random draws for workloads: token-length distributions and arrival processes.

Everything here is numpy and vectorised: a 100k-request workload is drawn in
milliseconds. Lengths are token counts (>= 1); times are seconds from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LENGTH_KINDS = ("fixed", "uniform", "lognormal")
ARRIVAL_KINDS = ("poisson", "gamma", "onoff")


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution.

    - fixed:     always `a` tokens
    - uniform:   integers in [a, b]
    - lognormal: mean `a` tokens, `b` = sigma of the underlying normal (spread);
                 long-tailed like real prompt/answer lengths
    Draws are clipped to [1, max_tokens] (max_tokens 0 = no cap).
    """

    kind: str = "fixed"
    a: float = 128.0
    b: float = 0.0
    max_tokens: int = 0

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"length kind must be one of {LENGTH_KINDS}, got {self.kind!r}")
        if self.a < 1:
            raise ValueError("lengths must be >= 1 token")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError("uniform:LO:HI needs HI >= LO")
        if self.kind == "lognormal" and self.b <= 0:
            raise ValueError("lognormal:MEAN:SIGMA needs SIGMA > 0")
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")

    @classmethod
    def parse(cls, text: str | int) -> LengthDist:
        """'256' | 'fixed:256' | 'uniform:64:512' | 'lognormal:256:0.8[:MAX]'."""
        parts = str(text).strip().split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", float(parts[0]))
            kind, nums = parts[0], [float(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(
                f"cannot parse length {text!r}; use N, uniform:LO:HI or lognormal:MEAN:SIGMA[:MAX]"
            ) from None
        if kind == "fixed" and len(nums) == 1:
            return cls("fixed", nums[0])
        if kind in ("uniform", "lognormal") and len(nums) in (2, 3):
            return cls(kind, nums[0], nums[1], int(nums[2]) if len(nums) == 3 else 0)
        raise ValueError(f"cannot parse length {text!r}; use N, uniform:LO:HI or lognormal:MEAN:SIGMA[:MAX]")

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        tail = f":{self.max_tokens}" if self.max_tokens else ""
        return f"{self.kind}:{self.a:g}:{self.b:g}{tail}"

    @property
    def mean(self) -> float:
        """Mean before clipping, tokens."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` integer lengths, shape (n,)."""
        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1, size=n).astype(np.float64)
        else:  # mean of a lognormal is exp(mu + sigma^2/2), so solve for mu
            mu = np.log(self.a) - self.b**2 / 2
            x = rng.lognormal(mu, self.b, size=n)
        x = np.maximum(1, np.rint(x))
        if self.max_tokens:
            x = np.minimum(x, self.max_tokens)
        return x.astype(np.int64)


@dataclass(frozen=True)
class ArrivalProcess:
    """When requests arrive; `rate_per_s` is always the long-run mean rate.

    - poisson: exponential inter-arrival times (coefficient of variation 1)
    - gamma:   Gamma inter-arrival times with coefficient of variation `cv`
               (cv > 1 clusters arrivals into bursts; cv < 1 smooths them)
    - onoff:   Poisson at rate * (on_s + off_s) / on_s during `on_s`-second
               windows, nothing for `off_s` seconds between them
    """

    kind: str = "poisson"
    rate_per_s: float = 1.0
    cv: float = 2.0
    on_s: float = 10.0
    off_s: float = 10.0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"arrival kind must be one of {ARRIVAL_KINDS}, got {self.kind!r}")
        if self.rate_per_s <= 0:
            raise ValueError("rate_per_s must be > 0")
        if self.cv <= 0 or self.on_s <= 0 or self.off_s < 0:
            raise ValueError("cv and on_s must be > 0, off_s >= 0")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` sorted arrival times in seconds, the first one after 0, shape (n,)."""
        if self.kind == "poisson":
            return np.cumsum(rng.exponential(1.0 / self.rate_per_s, size=n))
        if self.kind == "gamma":
            shape = 1.0 / self.cv**2  # Gamma(k, theta): cv = 1/sqrt(k), mean = k*theta
            return np.cumsum(rng.gamma(shape, 1.0 / (self.rate_per_s * shape), size=n))
        period = self.on_s + self.off_s
        on_rate = self.rate_per_s * period / self.on_s
        t_on = np.cumsum(rng.exponential(1.0 / on_rate, size=n))  # time counted only while "on"
        return np.floor(t_on / self.on_s) * period + np.mod(t_on, self.on_s)
