"""Catalog files load, every figure names a source, and calibration files override."""

from __future__ import annotations

import json

import pytest

from fastmode.planner.catalog import (
    calibration_points,
    hardware_entry,
    hardware_names,
    load_hardware,
    load_model,
    model_names,
)
from fastmode.planner.hardware import Calibration
from fastmode.planner.sram_fit import fit_sram, points_from_catalog

REQUIRED_HARDWARE = {"h100", "h200", "b200", "gb200", "mi300x", "wse-3", "groq-lpu", "local"}
REQUIRED_MODELS = {
    "smollm2-135m",
    "smollm2-135m-spark",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "glm-4.7",
    "gpt-oss-120b",
}


def test_catalogs_hold_the_required_entries():
    assert REQUIRED_HARDWARE <= set(hardware_names())
    assert REQUIRED_MODELS <= set(model_names())
    for name in hardware_names():
        load_hardware(name)
    for name in model_names():
        load_model(name)


@pytest.mark.parametrize("name", sorted(REQUIRED_HARDWARE))
def test_every_hardware_figure_has_a_source(name):
    entry = hardware_entry(name)
    numeric = [k for k, v in entry.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    missing = [k for k in numeric if k not in entry["sources"]]
    assert not missing, f"{name}: figures without a source: {missing}"


def test_every_model_names_its_sources():
    for name in model_names():
        m = load_model(name)
        assert "shape" in m.sources and m.sources["shape"]


def test_calibration_file_overrides_efficiencies(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps(
            {
                "hardware": "local",
                "mem_bw_GBps": 40.0,
                "eta_m": 0.9,
                "overhead_s": 0.004,
                "per_token_s": 1e-4,
                "fitted_from": "fastmode calibrate, smollm2-135m",
            }
        )
    )
    hw = load_hardware("local", path)
    assert hw.mem_bw_bytes_per_s == 40e9 and hw.eta_m == 0.9 and hw.per_token_s == 1e-4
    assert str(path) in hw.sources["overhead_s"]
    assert load_hardware("local").mem_bw_bytes_per_s == 47e9  # the catalog itself is untouched


def test_calibration_rejects_typos_and_wrong_hardware(tmp_path):
    with pytest.raises(ValueError, match="unknown keys"):
        Calibration.from_dict({"hardware": "local", "eta_mem": 0.5})
    with pytest.raises(ValueError, match="not 'h100'"):
        load_hardware("h100", Calibration.from_dict({"hardware": "local", "eta_m": 0.5}))
    with pytest.raises(ValueError):
        load_hardware("local", Calibration.from_dict({"hardware": "local", "eta_m": 1.5}))


@pytest.mark.parametrize("name,tolerance", [("wse-3", 0.6), ("groq-lpu", 0.1)])
def test_sram_floor_is_the_fit_of_its_published_points(name, tolerance):
    hw = load_hardware(name)
    models = {n: load_model(n) for n in model_names()}
    fit = fit_sram(hw, points_from_catalog(calibration_points(name), models))
    assert hw.layer_floor_s == pytest.approx(fit.layer_floor_s, rel=0.05)
    assert hw.overhead_s == pytest.approx(fit.overhead_s, rel=0.05, abs=1e-6)
    assert fit.max_abs_rel_error < tolerance
