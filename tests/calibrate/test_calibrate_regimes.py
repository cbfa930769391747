"""Kernel regimes: a step time that bends where the engine switches kernels is fitted per side,
priced per side by the cost model and the simulator's step timer, and kept in the calibration file."""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pytest

from fastmode.calibrate.calibration_file import calibration_dict, load_points
from fastmode.calibrate.command import _split
from fastmode.calibrate.fit import fit_step_times, split_sizes
from fastmode.calibrate.points import StepPoint
from fastmode.calibrate.run import choose_split, kernel_regimes
from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel
from fastmode.planner.hardware import Calibration
from fastmode.sim.step_timer import StepTimer

SPLIT = 8
# Large steps: a low fixed cost and a cheap token (tiles); small steps: dearer tokens (vector FMAs).
LARGE = dict(
    mem_bw_bytes_per_s=30e9,
    eta_m=1.0,
    eta_c=0.3,
    overhead_s=0.004,
    per_token_s=2e-4,
    per_seq_s=1e-3,
    per_kv_token_s=5e-6,
)
SMALL = dict(
    mem_bw_bytes_per_s=60e9,
    eta_m=1.0,
    eta_c=0.3,
    overhead_s=0.002,
    per_token_s=0.0,
    per_seq_s=4e-3,
    per_kv_token_s=3e-6,
)


def two_regime_hardware(tile=0):
    return dataclasses.replace(
        load_hardware("local"), **LARGE, small_step_max_tokens=SPLIT, small_step=SMALL, token_tile=tile
    )


def points(hw, noise=0.0, seed=0, batches=(1, 2, 4, 8, 16, 32, 64)):
    cm = CostModel(hw, load_model("smollm2-135m"), tp=1, weight_format="bf16")
    rng = np.random.default_rng(seed)
    pts = []
    for ctx in (32, 128, 512):
        for b in batches:
            t = cm.step_cost((), [ctx] * b).total_s * (1 + noise * rng.standard_normal())
            pts.append(StepPoint("decode", t, num_decodes=b, decode_context=ctx))
    for n in (32, 128, 512):
        for c in (0, n):
            pts.append(StepPoint("prefill", cm.step_cost([(n, c)]).total_s, prefill_tokens=n, prefill_context=c))
    return pts


def test_cost_model_prices_each_step_with_its_regime():
    hw = two_regime_hardware()
    model = load_model("smollm2-135m")
    cm = CostModel(hw, model, tp=1, weight_format="bf16")
    small = CostModel(dataclasses.replace(load_hardware("local"), **SMALL), model, tp=1, weight_format="bf16")
    large = CostModel(dataclasses.replace(load_hardware("local"), **LARGE), model, tp=1, weight_format="bf16")
    for ctx in ([100] * 8, [100] * 9, [5]):
        want = (small if len(ctx) <= SPLIT else large).step_cost((), ctx).total_s
        assert cm.step_cost((), ctx).total_s == pytest.approx(want, rel=1e-12)
    # A speculative verify of 2 x 5 tokens is a 10-token step; a 7-token prefill chunk is a small one.
    assert cm.step_cost((), [50, 50], 5).total_s == pytest.approx(large.step_cost((), [50, 50], 5).total_s, rel=1e-12)
    assert cm.step_cost([(7, 0)]).total_s == pytest.approx(small.step_cost([(7, 0)]).total_s, rel=1e-12)
    # The bend is real in these figures: 8 sequences cost more per sequence than 9 do.
    assert cm.decode_step_s([100] * 8) / 8 > cm.decode_step_s([100] * 9) / 9


def test_split_fit_recovers_both_regimes_where_one_fit_cannot():
    hw = two_regime_hardware()
    model = load_model("smollm2-135m")
    pts = points(hw)
    assert split_sizes(pts, SPLIT) == (12, 15)
    one = fit_step_times(pts, load_hardware("local"), model, weight_format="bf16")
    assert one.max_abs_rel_error > 0.10  # one line cannot follow the bend
    fit = fit_step_times(pts, load_hardware("local"), model, weight_format="bf16", split_tokens=SPLIT)
    assert fit.max_abs_rel_error < 1e-3 and fit.small_step_max_tokens == SPLIT
    assert fit.per_token_s == pytest.approx(LARGE["per_token_s"], rel=0.02)
    assert fit.per_kv_token_s == pytest.approx(LARGE["per_kv_token_s"], rel=0.02)
    # Decode-only small steps cannot tell a token from a sequence: what must hold is their sum.
    assert fit.small.per_token_s + fit.small.per_seq_s == pytest.approx(SMALL["per_seq_s"], rel=0.02)
    fitted = CostModel(fit.apply(load_hardware("local")), model, tp=1, weight_format="bf16")
    truth = CostModel(hw, model, tp=1, weight_format="bf16")
    for b in (1, 3, 8, 9, 24, 64):  # batch sizes and a context never measured
        assert fitted.decode_step_s([300] * b) == pytest.approx(truth.decode_step_s([300] * b), rel=0.01)


def test_large_steps_priced_in_whole_tiles():
    """With 16-row tiles a step of 9-16 tokens computes 16 rows: its linears cost what 16 tokens'
    do, while its attention and per-sequence costs stay per sequence. Small steps never tile."""
    model = load_model("smollm2-135m")
    tiled = CostModel(two_regime_hardware(tile=16), model, tp=1, weight_format="bf16")
    plain = CostModel(two_regime_hardware(), model, tp=1, weight_format="bf16")
    assert tiled.hardware.tiled_tokens(9) == 16 and tiled.hardware.tiled_tokens(33) == 48
    assert tiled.hardware.at_step_tokens(5).token_tile == 0
    for b in (1, 8, 16, 32, 64):  # no rounding: the same price
        assert tiled.decode_step_s([100] * b) == pytest.approx(plain.decode_step_s([100] * b), rel=1e-12)
    t9, p16 = tiled.step_cost((), [0] * 9), plain.step_cost((), [0] * 16)
    assert t9.comp_s == pytest.approx(p16.comp_s, rel=1e-3)  # at context 0 the linears are nearly all of it
    h = tiled.hardware
    assert t9.overhead_s == pytest.approx(
        h.overhead_s + 16 * h.per_token_s + 9 * h.per_seq_s + 9 * h.per_kv_token_s, rel=1e-9
    )
    assert tiled.decode_step_s([100] * 9) > plain.decode_step_s([100] * 9)
    assert tiled.decode_step_s([100] * 9) < tiled.decode_step_s([100] * 16)  # 7 fewer sequences' attention


def test_tiled_fit_recovers_the_staircase():
    hw = two_regime_hardware(tile=16)
    model = load_model("smollm2-135m")
    pts = points(hw, batches=(1, 2, 4, 8, 12, 16, 24, 32, 64))
    fit = fit_step_times(pts, load_hardware("local"), model, weight_format="bf16", split_tokens=SPLIT, token_tile=16)
    assert fit.token_tile == 16 and fit.max_abs_rel_error < 1e-3
    untiled = fit_step_times(pts, load_hardware("local"), model, weight_format="bf16", split_tokens=SPLIT)
    assert untiled.max_abs_rel_error > 0.03  # a line through the stairs misses 12 and 24
    fitted = CostModel(fit.apply(load_hardware("local")), model, tp=1, weight_format="bf16")
    truth = CostModel(hw, model, tp=1, weight_format="bf16")
    for b in (9, 13, 20, 40):
        assert fitted.decode_step_s([300] * b) == pytest.approx(truth.decode_step_s([300] * b), rel=0.01)
    d = calibration_dict(fit, pts, "local", "smollm2-135m", "bf16", "test")
    assert d["token_tile"] == 16 and "token_tile" not in d["small_step"]
    assert load_hardware("local", calibration=Calibration.from_dict(d)).token_tile == 16


def test_split_fit_needs_points_on_both_sides():
    pts = [p for p in points(two_regime_hardware()) if p.tokens > SPLIT or p.num_decodes == 1]  # 3 small points
    with pytest.raises(ValueError, match="6 points on each side; got 3"):
        fit_step_times(
            pts, load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16", split_tokens=SPLIT
        )
    messages = []
    assert choose_split(pts, SPLIT, None, messages.append) == 0  # auto: too few points, one fit
    assert "fitting one set of figures" in messages[0]
    assert kernel_regimes("fp32") == (0, 0)  # dequantized weights: PyTorch matmuls, one kernel
    assert choose_split(pts, 0, None, messages.append) == 0  # one kernel: no split
    assert choose_split(pts, SPLIT, 4, messages.append) == 4  # as given
    assert choose_split(points(two_regime_hardware()), SPLIT, None, messages.append) == SPLIT and len(messages) == 1


def test_calibration_file_keeps_and_applies_the_split(tmp_path):
    pts = points(two_regime_hardware(), noise=0.01)
    fit = fit_step_times(
        pts, load_hardware("local"), load_model("smollm2-135m"), weight_format="bf16", split_tokens=SPLIT
    )
    d = calibration_dict(fit, pts, "local", "smollm2-135m", "bf16", "test")
    assert d["small_step_max_tokens"] == SPLIT and set(d["small_step"]) == {
        "mem_bw_GBps",
        "eta_m",
        "eta_c",
        "overhead_s",
        "per_token_s",
        "per_seq_s",
        "per_kv_token_s",
    }
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(d))
    hw = load_hardware("local", calibration=path)
    assert hw.small_step_max_tokens == SPLIT
    assert hw.at_step_tokens(SPLIT).per_seq_s == pytest.approx(fit.small.per_seq_s, rel=1e-5)
    assert hw.at_step_tokens(SPLIT + 1).per_token_s == pytest.approx(fit.per_token_s, rel=1e-5)
    assert "calibration file" in hw.sources["small_step"]
    assert [p.step_s for p in load_points(path)] == pytest.approx([p.step_s for p in pts], rel=1e-6)
    # A file without a split keeps the entry's single regime.
    plain = {k: v for k, v in d.items() if k not in ("small_step", "small_step_max_tokens")}
    assert load_hardware("local", calibration=Calibration.from_dict(plain)).small_step_max_tokens == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"small_step_max_tokens": 8, "small_step": {}}, "come together"),
        ({"small_step": {"overhead_s": 0.01}}, "come together"),
        ({"small_step_max_tokens": 8, "small_step": {"usd_per_hour": 1.0}}, "only the engine's own figures"),
        ({"small_step_max_tokens": 8, "small_step": {"overhead": 0.01}}, "unknown keys"),
        ({"small_step_max_tokens": 8, "small_step": {"eta_c": 1.5}}, "eta_c must be in"),
        ({"small_step_max_tokens": -1, "small_step": {"overhead_s": 0.01}}, "whole number"),
        ({"small_step_max_tokens": 8.5, "small_step": {"overhead_s": 0.01}}, "whole number"),
        ({"small_step_max_tokens": 8, "small_step": [0.01]}, "must be an object"),
        ({"small_step_max_tokens": 8, "small_step": {"token_tile": 16}}, "only the engine's own figures"),
        ({"token_tile": 2.5}, "token_tile must be a whole number"),
        ({"token_tile": -16}, "token_tile must be a whole number"),
    ],
)
def test_calibration_rejects_a_malformed_split(change, message):
    with pytest.raises(ValueError, match=message):
        load_hardware("local", calibration=Calibration.from_dict({"hardware": "local", **change}))


def test_hardware_validates_and_slows_both_regimes():
    hw = two_regime_hardware()
    with pytest.raises(ValueError, match="may set only"):
        dataclasses.replace(hw, small_step={"layer_floor_s": 1.0})
    with pytest.raises(ValueError, match="come together"):
        dataclasses.replace(hw, small_step={})
    slow = hw.slowed(2.0)
    for tokens in (1, SPLIT, SPLIT + 1, 100):
        fast_cost = CostModel(hw, load_model("smollm2-135m"), tp=1, weight_format="bf16").step_cost((), [64] * tokens)
        slow_cost = CostModel(slow, load_model("smollm2-135m"), tp=1, weight_format="bf16").step_cost((), [64] * tokens)
        assert slow_cost.total_s == pytest.approx(2.0 * fast_cost.total_s, rel=1e-9)


def test_step_timer_follows_the_regimes_exactly():
    cm = CostModel(two_regime_hardware(tile=16), load_model("smollm2-135m"), tp=1, weight_format="bf16")
    timer = StepTimer(cm, check_every=0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        b = int(rng.integers(1, 41))
        chunks = [(int(rng.integers(2, 12)), 0)] if rng.random() < 0.2 else []
        contexts = [int(c) for c in rng.integers(0, 2000, size=b)]
        assert timer.step_s(chunks, contexts) == pytest.approx(cm.step_cost(chunks, contexts).total_s, rel=1e-9)
    assert timer.num_direct < timer.num_calls


def test_split_tokens_option():
    assert _split("auto") is None and _split("0") == 0 and _split("8") == 8
    for bad in ("-1", "eight"):
        with pytest.raises(argparse.ArgumentTypeError):
            _split(bad)
