"""Load the hardware and model catalogs shipped in fastmode/data/catalog/.

The JSON files use the units people quote (GB, GB/s, TFLOP/s) so that they can
be checked against a datasheet at a glance; this module converts them to the SI
units of `Hardware` and `ModelSpec`. Every numeric figure must name a source.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from fastmode.planner.hardware import Calibration, Hardware
from fastmode.planner.model_spec import ModelSpec

CATALOG_DIR = "data/catalog"

# JSON key -> (Hardware field, scale to SI). Keys not listed pass through unchanged.
_HW_UNITS: dict[str, tuple[str, float]] = {
    "mem_GB": ("mem_bytes", 1e9),
    "mem_bw_GBps": ("mem_bw_bytes_per_s", 1e9),
    "link_bw_GBps": ("link_bw_bytes_per_s", 1e9),
    "scaleout_bw_GBps": ("scaleout_bw_bytes_per_s", 1e9),
}
_TFLOPS_SUFFIX = "_tflops"
_HW_INFO_KEYS = ("calibration_points", "_about")


def _read_json(filename: str) -> Any:
    ref = resources.files("fastmode").joinpath(f"{CATALOG_DIR}/{filename}")
    return json.loads(ref.read_text(encoding="utf-8"))


def hardware_from_entry(entry: dict[str, Any]) -> Hardware:
    """Convert one catalog entry (human units) to a validated `Hardware`."""
    kwargs: dict[str, Any] = {}
    peaks: dict[str, float] = {}
    for key, value in entry.items():
        if key in _HW_INFO_KEYS:
            continue
        if key.endswith(_TFLOPS_SUFFIX):
            peaks[key[: -len(_TFLOPS_SUFFIX)]] = float(value)
        elif key in _HW_UNITS:
            field_name, scale = _HW_UNITS[key]
            kwargs[field_name] = float(value) * scale
        else:
            kwargs[key] = value
    return Hardware(peak_tflops=peaks, **kwargs)


@lru_cache(maxsize=1)
def _hardware_entries() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _read_json("hardware.json")["hardware"]}


@lru_cache(maxsize=1)
def _model_entries() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _read_json("models.json")["models"]}


def hardware_names() -> list[str]:
    return list(_hardware_entries())


def model_names() -> list[str]:
    return list(_model_entries())


def hardware_entry(name: str) -> dict[str, Any]:
    """The raw catalog entry (human units, sources, calibration points)."""
    entries = _hardware_entries()
    if name not in entries:
        raise KeyError(f"unknown hardware {name!r}; known: {', '.join(entries)}")
    return entries[name]


def load_hardware(name: str, calibration: str | Path | Calibration | None = None) -> Hardware:
    """Hardware `name` from the catalog, with a calibration file's overrides applied."""
    hw = hardware_from_entry(hardware_entry(name))
    if calibration is None:
        return hw
    cal = calibration if isinstance(calibration, Calibration) else Calibration.load(calibration)
    return cal.apply(hw)


def load_model(name: str) -> ModelSpec:
    entries = _model_entries()
    if name not in entries:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(entries)}")
    return ModelSpec.from_dict(entries[name])


def calibration_points(hardware_name: str) -> list[dict[str, Any]]:
    """Published speeds an SRAM entry was fitted to (empty for other hardware)."""
    return list(hardware_entry(hardware_name).get("calibration_points", []))
