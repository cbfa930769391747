"""published.json is well formed, scripts/published_validation.py predicts every entry, and
the table in docs/planner.md is what the script produces now."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from fastmode.planner.catalog import calibration_points, hardware_names, load_hardware, load_model, model_names
from fastmode.planner.sram_fit import fit_sram, points_from_catalog
from fastmode.planner.weight_format import FORMATS

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "published_validation.py"


@pytest.fixture(scope="module")
def pv():
    spec = importlib.util.spec_from_file_location("published_validation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def table(pv):
    return pv.rows()


def test_every_entry_is_complete_and_sourced(pv):
    points = pv.load_points()
    assert len(points) >= 10
    assert len({p["id"] for p in points}) == len(points)
    for p in points:
        missing = [k for k in pv.REQUIRED if k not in p]
        assert not missing, f"{p.get('id')}: missing {missing}"
        assert isinstance(p["source"], str) and len(p["source"].strip()) > 20, p["id"]
        assert p["source_short"].strip(), p["id"]
        assert p["hardware"] in hardware_names() and p["model"] in model_names(), p["id"]
        assert p["weight_format"] in FORMATS, p["id"]
        assert p["metric"] in pv.METRICS, p["id"]
        assert p["tp"] is None or (isinstance(p["tp"], int) and p["tp"] >= 1), p["id"]
        assert isinstance(p["batch"], int) and p["batch"] >= 1, p["id"]
        assert p["value"] > 0 and p["context_tokens"] >= 0, p["id"]
        assert isinstance(p["used_for_fit"], bool) and isinstance(p["includes_prefill"], bool), p["id"]
        if "input_tokens" in p:
            assert p["context_tokens"] == p["input_tokens"] + p["output_tokens"] // 2, p["id"]


def test_spans_gpus_and_sram_machines(pv):
    points = pv.load_points()
    kinds = {load_hardware(p["hardware"]).is_sram for p in points}
    assert kinds == {True, False}
    assert {p["metric"] for p in points} == set(pv.METRICS)
    assert sum(not p["used_for_fit"] for p in points) >= 8


def test_one_finite_positive_prediction_per_entry(pv, table):
    assert [r["id"] for r in table] == [p["id"] for p in pv.load_points()]
    for r in table:
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0, r["id"]
        assert math.isfinite(r["error"]), r["id"]
        if r["with_prefill"] is not None:
            assert 0 < r["with_prefill"] <= r["predicted"], r["id"]


def test_calibration_points_are_the_fitted_entries(pv):
    """Every SRAM calibration point is in published.json, marked fitted exactly when the fit used it."""
    points = pv.load_points()
    for name in hardware_names():
        for cal in calibration_points(name):
            match = [
                p
                for p in points
                if p["hardware"] == name
                and p["model"] == cal["model"]
                and p["value"] == cal["tok_s"]
                and p["weight_format"] == cal["weight_format"]
            ]
            assert len(match) == 1, (name, cal["model"])
            assert match[0]["used_for_fit"] == cal.get("fit", True), (name, cal["model"])


def test_fitted_points_are_reproduced(table):
    """Fitted points come back as fitted: within 10% of the published figure, except where the
    catalog's own least-squares fit has a larger residual (WSE-3: four points, two parameters);
    there the prediction must equal the fit's."""
    fitted = [r for r in table if r["used_for_fit"]]
    assert fitted
    models = {n: load_model(n) for n in model_names()}
    for r in fitted:
        hw = load_hardware(r["hardware"])
        if not hw.is_sram:
            assert abs(r["error"]) <= 0.10, r["id"]
            continue
        fit = fit_sram(hw, points_from_catalog(calibration_points(r["hardware"]), models))
        (fit_pred,) = [pred for m, pub, pred in fit.residuals if m == r["model"] and pub == r["value"]]
        assert r["predicted"] == pytest.approx(fit_pred, rel=0.03), r["id"]
        if r["hardware"] != "wse-3":
            assert abs(r["error"]) <= 0.10, r["id"]


def test_docs_section_matches_the_script(pv, table):
    section = pv.doc_section()
    assert section is not None, "docs/planner.md lacks the published-validation markers"
    assert section == pv.render(table), "stale: run scripts/published_validation.py --write"
