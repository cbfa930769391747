"""One accelerator (or CPU) as the cost model sees it, and calibration overrides.

Peak figures are the vendor's dense (no-sparsity) numbers; the efficiency
factors `eta_m` and `eta_c` turn them into what a real engine achieves. SRAM
machines (Cerebras WSE-3, Groq LPU) are not limited by their bandwidth in
practice, so they carry an empirical per-layer latency floor and a chip-to-chip
hop latency fitted to published speeds (see `sram_fit`).

An engine may switch kernels with the number of tokens a step processes (ours,
on a CPU with AMX tiles, runs steps of up to 8 tokens on vector FMAs and larger
ones on the tiles: docs/kernels.md). Its step time then follows two lines with a
bend, which one set of figures cannot fit, so a calibrated entry may carry a
second set, `small_step`, that prices steps of at most `small_step_max_tokens`.
Where the larger steps' kernel computes rows in tiles (AMX: 16), `token_tile`
rounds their token count up to whole tiles.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

KINDS = ("hbm", "sram", "cpu")
# The engine-dependent figures a kernel regime changes (fastmode calibrate fits them per regime).
REGIME_FIELDS = ("mem_bw_bytes_per_s", "eta_m", "eta_c", "overhead_s", "per_token_s", "per_seq_s", "per_kv_token_s")


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
    # Steps of at most this many tokens are priced with `small_step`'s figures in place of these
    # (a REGIME_FIELDS name -> value, SI); 0 and {} for one regime, as every catalog entry has.
    small_step_max_tokens: int = 0
    small_step: dict[str, float] = field(default_factory=dict)
    # Steps above small_step_max_tokens run their linears in row tiles of this many tokens (AMX: 16):
    # a step's token count rounds up to a whole number of tiles. 0: no tiles (small steps never tile).
    token_tile: int = 0
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
        for name in (
            "link_bw_bytes_per_s",
            "allreduce_latency_s",
            "scaleout_bw_bytes_per_s",
            "scaleout_latency_s",
            "overhead_s",
            "per_token_s",
            "per_seq_s",
            "per_kv_token_s",
            "layer_floor_s",
            "hop_latency_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0")
        if self.scaleup_domain < 1:
            raise ValueError(f"{self.name}: scaleup_domain must be >= 1")
        if self.usd_per_hour is not None and self.usd_per_hour < 0:
            raise ValueError(f"{self.name}: usd_per_hour must be >= 0")
        if self.token_tile < 0 or self.token_tile != int(self.token_tile):
            raise ValueError(f"{self.name}: token_tile must be a whole number >= 0")
        object.__setattr__(self, "token_tile", int(self.token_tile))
        if self.small_step_max_tokens < 0:
            raise ValueError(f"{self.name}: small_step_max_tokens must be >= 0")
        if bool(self.small_step_max_tokens) != bool(self.small_step):
            raise ValueError(
                f"{self.name}: small_step_max_tokens and small_step come together (a split needs "
                "the small steps' figures, and figures need a split)"
            )
        unknown = set(self.small_step) - set(REGIME_FIELDS)
        if unknown:
            raise ValueError(f"{self.name}: small_step may set only {REGIME_FIELDS}, not {sorted(unknown)}")
        if self.small_step:
            self._small  # noqa: B018 -- builds the small-step figures, so out-of-range values fail here

    @cached_property
    def _small(self) -> Hardware:
        return dataclasses.replace(self, small_step_max_tokens=0, small_step={}, token_tile=0, **self.small_step)

    def at_step_tokens(self, tokens: int) -> Hardware:
        """The figures that price a step processing `tokens` tokens: `small_step`'s up to
        `small_step_max_tokens`, this entry's own above."""
        return self._small if 0 < tokens <= self.small_step_max_tokens else self

    def tiled_tokens(self, tokens: int) -> int:
        """The token rows a step's linears compute: `tokens` rounded up to whole tiles."""
        t = self.token_tile
        return -(-tokens // t) * t if t > 1 else tokens

    @property
    def is_sram(self) -> bool:
        return self.kind == "sram"

    @property
    def usable_mem_bytes(self) -> float:
        return self.mem_bytes * self.usable_mem_frac

    def slowed(self, factor: float) -> Hardware:
        """This machine with every time it takes multiplied by `factor` (rates divided by it):
        e.g. re-anchoring a calibration to a shared machine that runs 20% slower now (1.2)."""
        if factor <= 0:
            raise ValueError("factor must be > 0")
        times = (
            "allreduce_latency_s",
            "scaleout_latency_s",
            "overhead_s",
            "per_token_s",
            "per_seq_s",
            "per_kv_token_s",
            "layer_floor_s",
            "hop_latency_s",
        )
        rates = ("mem_bw_bytes_per_s", "link_bw_bytes_per_s", "scaleout_bw_bytes_per_s")
        small = {k: v * factor if k in times else v / factor if k in rates else v for k, v in self.small_step.items()}
        return dataclasses.replace(
            self,
            peak_tflops={k: v / factor for k, v in self.peak_tflops.items()},
            **{k: getattr(self, k) * factor for k in times},
            **{k: getattr(self, k) / factor for k in rates},
            small_step=small,
        )

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
    "token_tile": ("token_tile", 1.0),
    "usd_per_hour": ("usd_per_hour", 1.0),
}
# Provenance keys: recorded, never applied.
CALIBRATION_INFO_KEYS = (
    "hardware",
    "fitted_from",
    "created",
    "model",
    "weight_format",
    "weight_format_figures",  # a format the catalog does not name: its bytes per parameter by class
    "notes",
    "points",
    "speculative_max_batch",
)  # an engine setting derived from the fit (fastmode calibrate)
# The kernel-regime split: {"small_step_max_tokens": 8, "small_step": {calibration keys of REGIME_FIELDS}}.
SMALL_STEP_KEYS = ("small_step_max_tokens", "small_step")


def _overrides(d: dict[str, Any], where: str, allowed: tuple[str, ...] | None = None) -> dict[str, float]:
    """Calibration-file keys -> Hardware field name -> SI value (None values skipped)."""
    out = {}
    for k, v in d.items():
        if k not in CALIBRATION_FIELDS or v is None:
            continue
        name, scale = CALIBRATION_FIELDS[k]
        if allowed is not None and name not in allowed:
            raise ValueError(
                f"calibration {where}: small_step cannot set {k!r} (only the engine's own figures: "
                f"{sorted(c for c, (f, _) in CALIBRATION_FIELDS.items() if f in allowed)})"
            )
        out[name] = float(v) * scale
    return out


@dataclass(frozen=True)
class Calibration:
    """Measured overrides for one hardware entry (schema in docs/planner.md)."""

    hardware: str
    overrides: dict[str, float]  # Hardware field name -> SI value
    fitted_from: str = ""
    path: str = ""
    small_step_max_tokens: int = 0  # with small_step: the figures of steps up to this many tokens
    small_step: dict[str, float] = field(default_factory=dict)  # Hardware field name -> SI value

    def __post_init__(self) -> None:
        known = {f for f, _ in CALIBRATION_FIELDS.values()}
        unknown = set(self.overrides) - known
        if unknown:
            raise ValueError(f"calibration overrides unknown fields: {sorted(unknown)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any], path: str = "") -> Calibration:
        where = path or "(dict)"
        if "hardware" not in d:
            raise ValueError(f"calibration {where}: missing 'hardware'")
        unknown = set(d) - set(CALIBRATION_FIELDS) - set(CALIBRATION_INFO_KEYS) - set(SMALL_STEP_KEYS)
        if unknown:
            raise ValueError(f"calibration {where}: unknown keys {sorted(unknown)}")
        small = d.get("small_step") or {}
        if not isinstance(small, dict):
            raise ValueError(f"calibration {where}: small_step must be an object of calibration keys")
        bad = set(small) - set(CALIBRATION_FIELDS)
        if bad:
            raise ValueError(f"calibration {where}: small_step has unknown keys {sorted(bad)}")
        split = d.get("small_step_max_tokens") or 0
        if not isinstance(split, int) or isinstance(split, bool) or split < 0:
            raise ValueError(f"calibration {where}: small_step_max_tokens must be a whole number >= 0")
        if bool(split) != bool(small):
            raise ValueError(f"calibration {where}: small_step_max_tokens and small_step come together")
        fitted = d.get("fitted_from", "")
        return cls(
            str(d["hardware"]),
            _overrides(d, where),
            fitted if isinstance(fitted, str) else json.dumps(fitted),
            path,
            split,
            _overrides(small, where, REGIME_FIELDS),
        )

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))

    def apply(self, hw: Hardware) -> Hardware:
        """Return `hw` with the measured fields replaced (validated again). A calibration with a
        kernel-regime split replaces the entry's split; one without keeps the entry's."""
        if self.hardware != hw.name:
            raise ValueError(f"calibration is for {self.hardware!r}, not {hw.name!r}")
        note = f"calibration file {self.path or '(inline)'}" + (
            f", fitted from {self.fitted_from}" if self.fitted_from else ""
        )
        changed = list(self.overrides) + (list(SMALL_STEP_KEYS) if self.small_step_max_tokens else [])
        sources = dict(hw.sources) | {k: note for k in changed}
        split = (
            {"small_step_max_tokens": self.small_step_max_tokens, "small_step": dict(self.small_step)}
            if self.small_step_max_tokens
            else {}
        )
        return dataclasses.replace(hw, **self.overrides, **split, sources=sources)
