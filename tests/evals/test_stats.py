"""Wilson intervals against known values, and the p^n chain interval."""

from __future__ import annotations

import math

import pytest

from fastmode.evals.stats import chain_success, proportion, wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Reference values: Wilson score interval, z = 1.95996 (e.g. R's
        # prop.test(k, n, correct = FALSE)$conf.int, or Newcombe 1998, table I).
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (81, 263, 0.2553, 0.3662),  # Newcombe (1998), example
        (15, 148, 0.0624, 0.1605),  # Newcombe (1998), example
    ],
)
def test_wilson_known_values(k: int, n: int, low: float, high: float) -> None:
    got_low, got_high = wilson_interval(k, n)
    assert got_low == pytest.approx(low, abs=1e-4)
    assert got_high == pytest.approx(high, abs=1e-4)


def test_wilson_properties() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for n in (1, 7, 40, 1000):
        for k in range(0, n + 1, max(1, n // 7)):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0
    # more data, narrower interval
    assert wilson_interval(80, 100)[1] - wilson_interval(80, 100)[0] < (
        wilson_interval(8, 10)[1] - wilson_interval(8, 10)[0]
    )
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_chain_success_matches_seed_numbers() -> None:
    # mission.md: 0.8^10 = 10.7%, 0.9^10 = 34.9%
    assert chain_success(proportion(80, 100)).value == pytest.approx(0.1074, abs=1e-4)
    assert chain_success(proportion(90, 100)).value == pytest.approx(0.3487, abs=1e-4)


def test_chain_interval_is_endpoints_to_the_power() -> None:
    p = proportion(30, 40)
    chain = chain_success(p, num_steps=10)
    assert chain.low == pytest.approx(p.low**10)
    assert chain.high == pytest.approx(p.high**10)
    assert chain.low <= chain.value <= chain.high
    assert math.isclose(chain_success(p, num_steps=1).value, p.value)
