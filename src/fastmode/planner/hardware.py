"""One accelerator (or CPU) as the cost model sees it, and calibration overrides.

Peak figures are the vendor's dense (no-sparsity) numbers; the efficiency
factors `eta_m` and `eta_c` turn them into what a real engine achieves. SRAM
machines (Cerebras WSE-3, Groq LPU) are not limited by their bandwidth in
practice, so they carry an empirical per-layer latency floor and a chip-to-chip
hop latency fitted to published speeds (see `sram_fit`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("hbm", "sram", "cpu")


@dataclass(frozen=True)
class Hardware:
    """Per-device figures. Units are in the names; bandwidths are bytes/s one way.

    Invariants: capacities, bandwidths and peaks are > 0; 0 < eta <= 1;
    `usable_mem_frac` of `mem_bytes` holds weights and KV (the rest is runtime,
    activations and fragmentation).
    """

    name: str
    kind: str  # "hbm" (GPU), "sram" (weights in on-chip SRAM), "cpu"
    peak_tflops: dict[str, float]  # by compute dtype, dense
    mem_bytes: float
    mem_bw_bytes_per_s: float
    link_bw_bytes_per_s: float = 0.0  # scale-up link per device, one direction
    allreduce_latency_s: float = 0.0  # one small all-reduce inside the scale-up domain
    scaleup_domain: int = 1  # devices one fast-link domain holds (8 for HGX, 72 for NVL72)
    scaleout_bw_bytes_per_s: float = 0.0  # per device, across nodes
    scaleout_latency_s: float = 0.0
    eta_m: float = 0.8  # achieved / peak memory bandwidth
    eta_c: float = 0.6  # achieved / peak FLOP/s
    overhead_s: float = 0.0  # fixed per engine step (launch, scheduling, sampling)
    per_token_s: float = 0.0  # per token processed in a step (host-side work)
    per_seq_s: float = 0.0  # per sequence in a step (sampling, per-sequence host work); calibrated engines
    per_kv_token_s: float = 0.0  # per cached token a sequence's attention reads in a step; calibrated engines
    layer_floor_s: float = 0.0  # SRAM machines: minimum time per layer per step
    hop_latency_s: float = 0.0  # SRAM machines: per pipeline-stage boundary crossed
    usable_mem_frac: float = 0.9
    usd_per_hour: float | None = None  # per device; None when no public figure exists
    price_is_estimate: bool = False
    display_name: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}")
        if not self.peak_tflops or "bf16" not in self.peak_tflops:
            raise ValueError(f"{self.name}: peak_tflops needs at least a 'bf16' entry")
        if any(v <= 0 for v in self.peak_tflops.values()):
            raise ValueError(f"{self.name}: peak_tflops must be > 0")
        for name in ("mem_bytes", "mem_bw_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{self.name}: {name} must be > 0")
        for name in ("eta_m", "eta_c", "usable_mem_frac"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{self.name}: {name} must be in (0, 1]")
        for name in ("link_bw_bytes_per_s", "allreduce_latency_s", "scaleout_bw_bytes_per_s",
                     "scaleout_latency_s", "overhead_s", "per_token_s", "per_seq_s", "per_kv_token_s",
                     "layer_floor_s", "hop_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0")
        if self.scaleup_domain < 1:
            raise ValueError(f"{self.name}: scaleup_domain must be >= 1")
        if self.usd_per_hour is not None and self.usd_per_hour < 0:
            raise ValueError(f"{self.name}: usd_per_hour must be >= 0")

    @property
    def is_sram(self) -> bool:
        return self.kind == "sram"

    @property
    def usable_mem_bytes(self) -> float:
        return self.mem_bytes * self.usable_mem_frac

    def slowed(self, factor: float) -> "Hardware":
        """This machine with every time it takes multiplied by `factor` (rates divided by it):
        e.g. re-anchoring a calibration to a shared machine that runs 20% slower now (1.2)."""
        if factor <= 0:
            raise ValueError("factor must be > 0")
        times = ("allreduce_latency_s", "scaleout_latency_s", "overhead_s", "per_token_s", "per_seq_s",
                 "per_kv_token_s", "layer_floor_s", "hop_latency_s")
        rates = ("mem_bw_bytes_per_s", "link_bw_bytes_per_s", "scaleout_bw_bytes_per_s")
        return dataclasses.replace(self, peak_tflops={k: v / factor for k, v in self.peak_tflops.items()},
                                   **{k: getattr(self, k) * factor for k in times},
                                   **{k: getattr(self, k) / factor for k in rates})

    def peak_flops(self, compute_dtype: str) -> float:
        """Peak FLOP/s for a compute dtype; falls back to bf16 when the device lacks it."""
        return 1e12 * self.peak_tflops.get(compute_dtype, self.peak_tflops["bf16"])


# ---- calibration files --------------------------------------------------------
# JSON keys a calibration file may set, mapped to (Hardware field, scale to SI).
CALIBRATION_FIELDS: dict[str, tuple[str, float]] = {
    "mem_bw_GBps": ("mem_bw_bytes_per_s", 1e9),
    "eta_m": ("eta_m", 1.0),
    "eta_c": ("eta_c", 1.0),
    "overhead_s": ("overhead_s", 1.0),
    "per_token_s": ("per_token_s", 1.0),
    "per_seq_s": ("per_seq_s", 1.0),
    "per_kv_token_s": ("per_kv_token_s", 1.0),
    "layer_floor_s": ("layer_floor_s", 1.0),
    "hop_latency_s": ("hop_latency_s", 1.0),
    "allreduce_latency_s": ("allreduce_latency_s", 1.0),
    "usd_per_hour": ("usd_per_hour", 1.0),
}
# Provenance keys: recorded, never applied.
CALIBRATION_INFO_KEYS = ("hardware", "fitted_from", "created", "model", "weight_format", "notes", "points",
                         "speculative_max_batch")  # an engine setting derived from the fit (fastmode calibrate)


@dataclass(frozen=True)
class Calibration:
    """Measured overrides for one hardware entry (schema in docs/planner.md)."""

    hardware: str
    overrides: dict[str, float]  # Hardware field name -> SI value
    fitted_from: str = ""
    path: str = ""

    def __post_init__(self) -> None:
        known = {f for f, _ in CALIBRATION_FIELDS.values()}
        unknown = set(self.overrides) - known
        if unknown:
            raise ValueError(f"calibration overrides unknown fields: {sorted(unknown)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: str = "") -> "Calibration":
        if "hardware" not in d:
            raise ValueError(f"calibration {path or '(dict)'}: missing 'hardware'")
        unknown = set(d) - set(CALIBRATION_FIELDS) - set(CALIBRATION_INFO_KEYS)
        if unknown:
            raise ValueError(f"calibration {path or '(dict)'}: unknown keys {sorted(unknown)}")
        overrides = {CALIBRATION_FIELDS[k][0]: float(v) * CALIBRATION_FIELDS[k][1]
                     for k, v in d.items() if k in CALIBRATION_FIELDS and v is not None}
        fitted = d.get("fitted_from", "")
        return cls(str(d["hardware"]), overrides, fitted if isinstance(fitted, str) else json.dumps(fitted), path)

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))

    def apply(self, hw: Hardware) -> Hardware:
        """Return `hw` with the measured fields replaced (validated again)."""
        if self.hardware != hw.name:
            raise ValueError(f"calibration is for {self.hardware!r}, not {hw.name!r}")
        note = f"calibration file {self.path or '(inline)'}" + (f", fitted from {self.fitted_from}" if self.fitted_from else "")
        sources = dict(hw.sources) | {k: note for k in self.overrides}
        return dataclasses.replace(hw, **self.overrides, sources=sources)
