"""Speculative decoding: closed form while memory-bound, a loss once compute-bound."""

from __future__ import annotations

import pytest

from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel
from fastmode.planner.speculative import SpecConfig, closed_form_speedup, expected_tokens_per_verify, spec_cycle


def test_expected_tokens_closed_form():
    assert expected_tokens_per_verify(0.7, 4) == pytest.approx(sum(0.7**i for i in range(5)))
    assert expected_tokens_per_verify(0.0, 4) == 1.0
    assert expected_tokens_per_verify(1.0, 4) == 5.0  # every draft accepted
    assert closed_form_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))


def test_memory_bound_speedup_matches_closed_form(h100, llama8b):
    spec = SpecConfig(acceptance=0.8, draft_len=4, draft_cost_ratio=0.05)
    cycle = spec_cycle(CostModel(h100, llama8b), [1024], spec)
    assert cycle.speedup == pytest.approx(spec.closed_form_speedup, rel=0.01)


def test_speculation_loses_once_compute_bound(h100, llama8b):
    cm = CostModel(h100, llama8b)
    spec = SpecConfig(acceptance=0.7, draft_len=4, draft_cost_ratio=0.05)
    speedups = [spec_cycle(cm, [128] * b, spec).speedup for b in (1, 64, 256, 1024)]
    assert all(a > b for a, b in zip(speedups, speedups[1:]))
    assert speedups[0] > 2 and speedups[-1] < 1


def test_draft_cost_model_can_stand_in_for_the_ratio():
    hw = load_hardware("local")
    target = CostModel(hw, load_model("smollm2-135m"))
    draft = CostModel(hw, load_model("smollm2-135m-spark"))
    spec = SpecConfig(acceptance=0.6, draft_len=3, draft_cost_ratio=0.0)
    with_draft = spec_cycle(target, [256] * 4, spec, draft)
    assert with_draft.draft_s > 0 and with_draft.speedup < spec_cycle(target, [256] * 4, spec).speedup


def test_spec_config_validation():
    with pytest.raises(ValueError):
        SpecConfig(acceptance=1.0)
    with pytest.raises(ValueError):
        SpecConfig(draft_len=0)


def test_break_even_batch_is_the_last_batch_where_speculation_pays(h100, llama8b):
    from fastmode.planner.speculative import break_even_batch

    cm = CostModel(h100, llama8b)
    spec = SpecConfig(acceptance=0.7, draft_len=4, draft_cost_ratio=0.05)
    b = break_even_batch(cm, 128, spec)
    assert 1 < b < 1024
    assert spec_cycle(cm, [128] * b, spec).speedup >= 1.0 > spec_cycle(cm, [128] * (b + 1), spec).speedup
    # Higher acceptance pays at larger batches; a draft as costly as the target never pays.
    assert break_even_batch(cm, 128, SpecConfig(acceptance=0.9, draft_len=4, draft_cost_ratio=0.05)) > b
    assert break_even_batch(cm, 128, SpecConfig(acceptance=0.1, draft_len=4, draft_cost_ratio=1.0)) == 0
