"""Write the calibration JSON that `load_hardware(name, calibration=...)` applies. No torch.

Schema: docs/planner.md ("Calibration files"). The fitted figures go in the
numeric keys; how they were obtained goes in the provenance keys, including
every measured point, so a file can be re-fitted or audited later.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from fastmode.calibrate.fit import FitResult
from fastmode.calibrate.points import StepPoint
from fastmode.planner.catalog import load_hardware
from fastmode.planner.hardware import Calibration
from fastmode.planner.weight_format import FORMATS, WeightFormat, format_to_json

DEFAULT_PATH = Path("~/.cache/fastmode/calibration-local.json")


def calibration_dict(
    fit: FitResult,
    points: list[StepPoint],
    hardware: str,
    model: str,
    weight_format: str | WeightFormat,
    fitted_from: str,
    usd_per_hour: float | None = None,
    notes: str = "",
) -> dict[str, Any]:
    d: dict[str, Any] = {"hardware": hardware, **fit.calibration_fields()}
    if usd_per_hour is not None:
        d["usd_per_hour"] = usd_per_hour
    d.update(
        {
            "fitted_from": fitted_from,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "model": model,
            "weight_format": weight_format if isinstance(weight_format, str) else weight_format.name,
            **(
                {"weight_format_figures": format_to_json(weight_format)}
                if isinstance(weight_format, WeightFormat) and weight_format.name not in FORMATS
                else {}
            ),
            "notes": notes
            or (
                f"least-squares fit over {len(points) - len(fit.excluded)} of {len(points)} points "
                f"({len(fit.excluded)} outliers left out): max |error| {fit.max_abs_rel_error:.1%}, "
                f"rms {fit.rms_rel_error:.1%} (outliers included)"
                + (
                    f"; steps of at most {fit.small_step_max_tokens} tokens (the engine's small-row "
                    f"kernel) fitted apart, figures in small_step"
                    if fit.small
                    else ""
                )
                + (f"; larger steps priced in tiles of {fit.token_tile} tokens" if fit.token_tile else "")
            ),
            "points": [
                dict(p.to_json(), fit_rel_error=round(e, 5), **({"excluded": True} if i in fit.excluded else {}))
                for i, (p, e) in enumerate(zip(points, fit.rel_errors))
            ],
        }
    )
    # The planner's own validation (unknown keys, values out of range) fails here rather than at load time.
    load_hardware(hardware, calibration=Calibration.from_dict(d))
    return d


def write_calibration(d: dict[str, Any], path: str | Path = DEFAULT_PATH) -> Path:
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(d, indent=2) + "\n")
    return out


def load_points(path: str | Path) -> list[StepPoint]:
    """The measured points stored in a calibration file (for re-fitting or validation)."""
    d = json.loads(Path(path).expanduser().read_text())
    return [
        StepPoint.from_json({k: v for k, v in p.items() if k not in ("fit_rel_error", "excluded")})
        for p in d.get("points", [])
    ]
