"""Fit an SRAM machine's per-layer latency floor to published batch-1 speeds.

A bytes/bandwidth model says a WSE-3 (21 PB/s) should decode Llama-3.1-8B at
over a million tok/s; Cerebras serves it near 2,000. What limits these machines
is latency: each layer takes a minimum time, and each chip-to-chip boundary a
token crosses adds a hop. So, per decode token at batch 1:

    t = overhead_s + num_layers * layer_floor_s + (pipeline_stages - 1) * hop_latency_s

The hop latency is not published for either vendor and is hard to separate from
the floor (on Groq a stage is about a layer), so it stays a stated assumption in
the catalog; this module fits `layer_floor_s` and `overhead_s` by least squares
on relative error, and reports each point's residual so docs can quote them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastmode.planner.cost_model import CostModel
from fastmode.planner.hardware import Hardware
from fastmode.planner.model_spec import ModelSpec


@dataclass(frozen=True)
class SramPoint:
    """One published batch-1 speed: `model` at `tok_s` stored in `weight_format`."""

    model: ModelSpec
    weight_format: str
    tok_s: float
    source: str = ""

    def __post_init__(self) -> None:
        if self.tok_s <= 0:
            raise ValueError("tok_s must be > 0")


@dataclass(frozen=True)
class SramFit:
    layer_floor_s: float
    overhead_s: float
    residuals: tuple[tuple[str, float, float], ...]  # (model, published tok/s, predicted tok/s)

    @property
    def max_abs_rel_error(self) -> float:
        return max(abs(pred / pub - 1) for _, pub, pred in self.residuals)


def fit_sram(hw: Hardware, points: Sequence[SramPoint]) -> SramFit:
    """Least-squares (relative error) fit of layer_floor_s and overhead_s, both >= 0."""
    if not points:
        raise ValueError("need at least one point")
    rows, rhs = [], []
    for p in points:
        cm = CostModel(hw, p.model, weight_format=p.weight_format)
        t_obs = 1.0 / p.tok_s
        hops = (cm.pipeline_stages - 1) * hw.hop_latency_s
        # Scale each row by 1/t_obs so the fit minimises relative, not absolute, error.
        rows.append([p.model.num_layers / t_obs, 1.0 / t_obs])
        rhs.append((t_obs - hops) / t_obs)
    a, b = np.asarray(rows), np.asarray(rhs)
    floor, overhead = np.linalg.lstsq(a, b, rcond=None)[0] if len(points) > 1 else (-1.0, -1.0)
    if overhead < 0 or floor < 0:
        # One point, or a negative intercept: put everything in the per-layer floor.
        floor = float(np.sum(a[:, 0] * b) / np.sum(a[:, 0] ** 2))
        overhead = 0.0
    fitted = dataclasses.replace(hw, layer_floor_s=float(floor), overhead_s=float(overhead))
    residuals = tuple((p.model.name, p.tok_s, predict_tok_s(fitted, p.model, p.weight_format)) for p in points)
    return SramFit(float(floor), float(overhead), residuals)


def predict_tok_s(hw: Hardware, model: ModelSpec, weight_format: str, context_len: int = 1024) -> float:
    """Batch-1 decode speed the cost model predicts on the fewest chips that hold the model."""
    cm = CostModel(hw, model, weight_format=weight_format)
    return 1.0 / cm.decode_step_s([context_len])


def points_from_catalog(entries: Sequence[dict[str, Any]], models: dict[str, ModelSpec]) -> list[SramPoint]:
    """Calibration points of a hardware catalog entry, those marked `"fit": true`."""
    return [
        SramPoint(models[e["model"]], e["weight_format"], float(e["tok_s"]), e.get("source", ""))
        for e in entries
        if e.get("fit", True)
    ]
