"""The least-squares fit recovers known parameters and reproduces step times."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fastmode.calibrate.fit import fit_step_times
from fastmode.calibrate.points import StepPoint
from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel

TRUE = dict(
    mem_bw_bytes_per_s=30e9,
    eta_m=1.0,
    eta_c=0.3,
    overhead_s=0.004,
    per_token_s=2e-4,
    per_seq_s=3e-3,
    per_kv_token_s=5e-6,
)


def synthetic_points(noise=0.0, seed=0, batches=(1, 2, 4, 8, 16, 32, 64)):
    hw = dataclasses.replace(load_hardware("local"), **TRUE)
    cm = CostModel(hw, load_model("smollm2-135m"), tp=1, weight_format="bf16")
    rng = np.random.default_rng(seed)
    pts = []
    for ctx in (128, 512):
        for b in batches:
            t = cm.step_cost((), [ctx] * b).total_s * (1 + noise * rng.standard_normal())
            pts.append(StepPoint("decode", t, num_decodes=b, decode_context=ctx))
    for n in (32, 128, 512):
        for c in (0, n):
            t = cm.step_cost([(n, c)]).total_s * (1 + noise * rng.standard_normal())
            pts.append(StepPoint("prefill", t, prefill_tokens=n, prefill_context=c))
    return pts


def test_fit_recovers_exact_parameters():
    fit = fit_step_times(synthetic_points(), load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16")
    assert fit.mem_bw_GBps == pytest.approx(30.0, rel=0.01)
    assert fit.eta_c == pytest.approx(0.3, rel=0.01)
    assert fit.overhead_s == pytest.approx(0.004, rel=0.02)
    assert fit.per_token_s == pytest.approx(2e-4, rel=0.02)
    assert fit.per_seq_s == pytest.approx(3e-3, rel=0.02)
    assert fit.per_kv_token_s == pytest.approx(5e-6, rel=0.02)
    assert fit.max_abs_rel_error < 1e-3


def test_fit_with_noise_reproduces_step_times():
    pts = synthetic_points(noise=0.03, seed=1)
    fit = fit_step_times(pts, load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16")
    assert fit.rms_rel_error < 0.05 and fit.max_abs_rel_error < 0.12
    # The fitted hardware, through the planner, predicts clean (noise-free) step times within 5%.
    cm = CostModel(fit.apply(load_hardware("local")), load_model("smollm2-135m"), tp=1, weight_format="bf16")
    for clean in synthetic_points():
        assert cm.step_cost(*clean.cost_args()).total_s == pytest.approx(clean.step_s, rel=0.05)


def test_fit_keeps_parameters_in_range_and_needs_points():
    pts = synthetic_points()
    fit = fit_step_times(pts, load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16")
    assert 0 < fit.eta_c <= 1
    assert min(fit.overhead_s, fit.per_token_s, fit.per_seq_s, fit.per_kv_token_s) >= 0
    with pytest.raises(ValueError, match="at least 6"):
        fit_step_times(pts[:5], load_hardware("local"), load_model("smollm2-135m"))


def test_fit_without_the_extra_terms_keeps_them_at_zero():
    """Data made with per_seq_s = per_kv_token_s = 0 (the catalog's engine) are fitted with them ~0."""
    global TRUE
    saved = TRUE
    TRUE = {**saved, "per_seq_s": 0.0, "per_kv_token_s": 0.0}
    try:
        fit = fit_step_times(
            synthetic_points(), load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16"
        )
    finally:
        TRUE = saved
    assert fit.per_seq_s < 1e-5 and fit.per_kv_token_s < 1e-8 and fit.max_abs_rel_error < 1e-3


def test_step_point_json_round_trip_and_validation():
    p = StepPoint("decode", 0.01, num_decodes=8, decode_context=130.5, num_samples=5, spread=0.1)
    assert StepPoint.from_json(p.to_json()) == p
    assert p.cost_args() == ([], [130.5] * 8)
    q = StepPoint("prefill", 0.2, prefill_tokens=128, prefill_context=256)
    assert q.cost_args() == ([(128, 256)], []) and q.tokens == 128
    with pytest.raises(ValueError):
        StepPoint("mixed", 0.1)
    with pytest.raises(ValueError):
        StepPoint("decode", 0.0)


def test_one_cliff_point_is_left_out_not_fitted():
    pts = synthetic_points()
    pts[7] = StepPoint(
        "decode", pts[7].step_s * 3, num_decodes=pts[7].num_decodes, decode_context=pts[7].decode_context
    )
    fit = fit_step_times(pts, load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16")
    assert fit.excluded == (7,)
    assert fit.rel_errors[7] == pytest.approx(1 / 3 - 1, abs=0.01)  # reported, not hidden
    assert max(abs(e) for i, e in enumerate(fit.rel_errors) if i != 7) < 1e-3
    assert fit.per_seq_s == pytest.approx(3e-3, rel=0.02)
