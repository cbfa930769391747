"""StepTimer's cached affine shortcut must equal CostModel.step_cost exactly."""

from __future__ import annotations

import dataclasses
import random

import pytest

from fastmode.planner.catalog import load_hardware, load_model, model_names
from fastmode.planner.cost_model import CostModel
from fastmode.sim.step_timer import StepTimer

CALIBRATED = {"overhead_s": 0.004, "per_token_s": 2e-4, "per_seq_s": 3e-3, "per_kv_token_s": 5e-6}


@pytest.mark.parametrize("model", model_names())
@pytest.mark.parametrize("hardware", ["h100", "wse-3", "local", "local-calibrated"])
def test_step_timer_matches_cost_model(model, hardware):
    hw = load_hardware(hardware.removesuffix("-calibrated"))
    if hardware.endswith("-calibrated"):  # every calibrated term on, the per-KV-token one included
        hw = dataclasses.replace(hw, **CALIBRATED)
    cm = CostModel(hw, load_model(model), tp={"h100": 8}.get(hardware, 1 if hw.kind == "cpu" else None))
    timer = StepTimer(cm, check_every=0)
    rng = random.Random(0)
    for _ in range(300):
        chunks = [(rng.choice([64, 512]), rng.choice([0, 512]))] if rng.random() < 0.3 else []
        contexts = [rng.randrange(0, 20_000) for _ in range(rng.choice([1, 4, 64]))]
        ref = cm.step_cost(chunks, contexts).total_s
        assert timer.step_s(chunks, contexts) == pytest.approx(ref, rel=1e-9)
    if cm.model.num_sliding_layers == 0:
        assert timer.num_direct < timer.num_calls / 2  # the shortcut was actually used


def test_step_timer_check_catches_drift():
    cm = CostModel(load_hardware("h100"), load_model("llama-3.1-8b"), tp=1)
    timer = StepTimer(cm, check_every=1)
    timer.step_s([], [100, 200])
    timer.step_s([], [100, 200])  # probed and checked: fine
    key = ((), 2)
    coef = list(timer._coef[key])
    coef[0] *= 2  # pretend the cost model stopped being affine in the contexts
    timer._coef[key] = tuple(coef)
    with pytest.raises(RuntimeError, match="drifted"):
        timer.step_s([], [100, 200])
