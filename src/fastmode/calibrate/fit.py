"""Fit the cost model's engine-dependent parameters to measured step times. numpy only.

The planner prices a step (one device, tp = 1) as

    t = max(bytes / BW_eff, flops / (eta_c * peak))
        + overhead_s + per_token_s * tokens + per_seq_s * seqs + per_kv_token_s * kv

(kv: cached tokens the step's attention reads). With the hardware's own
efficiencies set to 1, CostModel gives m_i = bytes_i / BW and c_i = flops_i /
peak for each measured point, and the fit is

    t_i ~ max(u * m_i, v * c_i) + X_i . theta,   u > 0, v >= 1, theta >= 0

(BW_eff = BW / u, eta_c = 1 / v, X_i = (1, tokens, seqs, kv), each column read
back from CostModel itself so the fit charges exactly what the planner will).
For fixed (u, v) the rest is a non-negative linear least-squares problem,
solved exactly by enumerating which terms are active, for a whole grid of
(u, v) at once; the grid is refined around its best cell. Residuals are
relative ((pred - meas) / meas): step times span two orders of magnitude and
the validation target is a relative error.

Why the extra terms: on a CPU the engine's decode spends per sequence what a
prefill spends per ~4 tokens (a logits row, sampling, small-matrix
inefficiency), and its gather-based attention costs several times the KV
bytes' share of bandwidth, so per-token and bandwidth terms alone misfit it
badly (docs/simulator.md).

Kernel regimes: where the engine switches kernels at a step size (fastmode's
native kernels, with AMX tiles, from 9 rows), `split_tokens` fits steps of at most that many tokens
and the larger ones separately, each with all six parameters, and the result
prices each step with its own side's figures (`Hardware.small_step`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from fastmode.calibrate.points import StepPoint
from fastmode.planner.cost_model import CostModel
from fastmode.planner.hardware import Hardware
from fastmode.planner.model_spec import ModelSpec

# A tiny pull towards the catalog's values, so that parameters the data cannot
# pin down (eta_c when no point is compute-bound) stay where the catalog put them.
_PRIOR_WEIGHT = 1e-6
_BW_RANGE = 20.0  # the fitted bandwidth stays within this factor of the catalog's


LINEAR_TERMS = ("overhead_s", "per_token_s", "per_seq_s", "per_kv_token_s")


@dataclass(frozen=True)
class FitResult:
    """Fitted engine parameters and how well they reproduce the points."""

    mem_bw_GBps: float  # effective bandwidth (eta_m folded in, so eta_m = 1)
    eta_c: float  # achieved / peak FLOP/s of the compute dtype, in (0, 1]
    overhead_s: float  # per step
    per_token_s: float  # per token processed in a step
    per_seq_s: float  # per sequence in a step
    per_kv_token_s: float  # per cached token read by attention in a step
    rel_errors: tuple[float, ...]  # (pred - meas) / meas per point, in input order
    excluded: tuple[int, ...] = ()  # indices of points left out of the final fit as outliers
    # With a kernel-regime split: the fit of steps up to `small_step_max_tokens` tokens (its own
    # rel_errors and excluded index its own points); this result's figures price the larger steps,
    # and its rel_errors and excluded cover every point.
    small: FitResult | None = None
    small_step_max_tokens: int = 0
    token_tile: int = 0  # the larger steps' row tile (Hardware.token_tile) the fit priced them with

    @property
    def max_abs_rel_error(self) -> float:
        return max((abs(e) for e in self.rel_errors), default=0.0)

    @property
    def rms_rel_error(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.rel_errors)))) if self.rel_errors else 0.0

    def _regime_fields(self) -> dict[str, float]:
        """This fit's figures as Hardware fields (SI)."""
        return {
            "mem_bw_bytes_per_s": self.mem_bw_GBps * 1e9,
            "eta_m": 1.0,
            "eta_c": self.eta_c,
            **{k: getattr(self, k) for k in LINEAR_TERMS},
        }

    def apply(self, hw: Hardware) -> Hardware:
        """`hw` with the fitted figures (what a calibration file does to a catalog entry)."""
        split = (
            {"small_step_max_tokens": self.small_step_max_tokens, "small_step": self.small._regime_fields()}
            if self.small
            else {"small_step_max_tokens": 0, "small_step": {}}
        )
        return dataclasses.replace(hw, layer_floor_s=0.0, token_tile=self.token_tile, **self._regime_fields(), **split)

    def calibration_fields(self) -> dict:
        """The calibration-file keys (docs/planner.md) this fit sets."""
        own = {
            "mem_bw_GBps": round(self.mem_bw_GBps, 4),
            "eta_m": 1.0,
            "eta_c": round(self.eta_c, 6),
            **{k: float(f"{getattr(self, k):.6g}") for k in LINEAR_TERMS},
        }
        if self.token_tile:
            own["token_tile"] = self.token_tile
        if not self.small:
            return {**own, "layer_floor_s": 0.0}
        small = {k: v for k, v in self.small.calibration_fields().items() if k not in ("layer_floor_s", "token_tile")}
        return {**own, "layer_floor_s": 0.0, "small_step_max_tokens": self.small_step_max_tokens, "small_step": small}


def _unit_hardware(hw: Hardware, **ones: float) -> Hardware:
    zero = {k: 0.0 for k in LINEAR_TERMS}
    return dataclasses.replace(hw, eta_m=1.0, eta_c=1.0, layer_floor_s=0.0, **{**zero, **ones})


def _design(points, hw, model, **cost_kwargs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, c, X): memory and compute seconds at 100% efficiency, and the linear terms' columns.

    Column j of X is what CostModel charges when parameter j is 1 and the others 0, so the
    fit and the planner cannot disagree about what "tokens", "seqs" or "kv" mean.
    """
    base = CostModel(_unit_hardware(hw), model, tp=1, **cost_kwargs)
    costs = [base.step_cost(*p.cost_args()) for p in points]
    cols = []
    for name in LINEAR_TERMS:
        cm = CostModel(_unit_hardware(hw, **{name: 1.0}), model, tp=1, **cost_kwargs)
        cols.append([cm.step_cost(*p.cost_args()).overhead_s for p in points])
    return np.array([c.mem_s for c in costs]), np.array([c.comp_s for c in costs]), np.array(cols).T


def _solve_grid(t: np.ndarray, m: np.ndarray, c: np.ndarray, X: np.ndarray, us: np.ndarray, vs: np.ndarray):
    """Best theta >= 0 for every (u, v); returns (sse (U, V), theta (U, V, k))."""
    w = 1.0 / t  # relative residuals
    r = (t - np.maximum(us[:, None, None] * m, vs[None, :, None] * c)) * w  # (U, V, N), weighted
    Xw = X * w[:, None]  # (N, k)
    k = X.shape[1]
    best_sse = (r**2).sum(-1)  # theta = 0
    best_theta = np.zeros(r.shape[:2] + (k,))
    for n in range(1, k + 1):
        for cols in itertools.combinations(range(k), n):
            A = Xw[:, cols]
            theta = r @ (np.linalg.pinv(A).T)  # (U, V, n): least squares on these columns
            sse = ((r - theta @ A.T) ** 2).sum(-1)
            ok = (theta >= 0).all(-1) & (sse < best_sse)
            best_sse = np.where(ok, sse, best_sse)
            full = np.zeros(r.shape[:2] + (k,))
            full[..., cols] = theta
            best_theta = np.where(ok[..., None], full, best_theta)
    return best_sse, best_theta


MIN_POINTS = 6  # one per parameter


def split_sizes(points: list[StepPoint], split_tokens: int) -> tuple[int, int]:
    """(points of at most `split_tokens` tokens, points of more)."""
    small = sum(p.tokens <= split_tokens for p in points)
    return small, len(points) - small


def fit_step_times(
    points: list[StepPoint],
    hw: Hardware,
    model: ModelSpec,
    weight_format: str | None = None,
    dtype_bytes: float | None = None,
    kv_dtype_bytes: float = 2.0,
    rounds: int = 4,
    outlier_error: float = 0.25,
    max_outlier_share: float = 0.1,
    split_tokens: int = 0,
    token_tile: int = 0,
) -> FitResult:
    """Least-squares fit of BW_eff, eta_c and the four linear terms for `model` on `hw` (tp = 1).

    `split_tokens` > 0 fits the points of at most that many tokens and the others separately
    (each side needs MIN_POINTS; `split_sizes` says how many it has). `token_tile` > 1 prices the
    larger steps (all steps without a split) in whole row tiles of that many tokens.

    One robust pass: if some points miss by more than `outlier_error` (relative), the worst of
    them (at most `max_outlier_share` of all points) are left out and the fit is redone. A
    step-time cliff the linear terms cannot express (e.g. allocator page faults once attention
    temporaries pass some size) would otherwise bend every other prediction towards it. The
    left-out points keep their errors in `rel_errors`, so a report still shows them.
    """
    kw = dict(
        weight_format=weight_format,
        dtype_bytes=dtype_bytes,
        kv_dtype_bytes=kv_dtype_bytes,
        rounds=rounds,
        outlier_error=outlier_error,
        max_outlier_share=max_outlier_share,
    )
    if split_tokens:
        n_small, n_large = split_sizes(points, split_tokens)
        if min(n_small, n_large) < MIN_POINTS:
            raise ValueError(
                f"a kernel-regime split at {split_tokens} tokens needs {MIN_POINTS} points on each side; "
                f"got {n_small} of at most {split_tokens} tokens and {n_large} of more"
            )
        idx_small = [i for i, p in enumerate(points) if p.tokens <= split_tokens]
        idx_large = [i for i, p in enumerate(points) if p.tokens > split_tokens]
        small = fit_step_times([points[i] for i in idx_small], hw, model, **kw)
        large = fit_step_times([points[i] for i in idx_large], hw, model, **kw, token_tile=token_tile)
        errors = [0.0] * len(points)
        for idx, part in ((idx_small, small), (idx_large, large)):
            for i, e in zip(idx, part.rel_errors):
                errors[i] = e
        excluded = sorted([idx_small[i] for i in small.excluded] + [idx_large[i] for i in large.excluded])
        return dataclasses.replace(
            large, rel_errors=tuple(errors), excluded=tuple(excluded), small=small, small_step_max_tokens=split_tokens
        )
    if len(points) < MIN_POINTS:
        raise ValueError(f"need at least {MIN_POINTS} measured points to fit 6 parameters")
    hw = dataclasses.replace(hw, token_tile=token_tile, small_step_max_tokens=0, small_step={})
    t = np.array([p.step_s for p in points])
    m, c, X = _design(
        points, hw, model, weight_format=weight_format, dtype_bytes=dtype_bytes, kv_dtype_bytes=kv_dtype_bytes
    )
    first = _fit_arrays(t, m, c, X, hw, rounds, np.ones(len(t), dtype=bool))
    errors = np.abs(first.rel_errors)
    worst = [int(i) for i in np.argsort(-errors)[: int(max_outlier_share * len(t))] if errors[i] > outlier_error]
    if not worst or len(t) - len(worst) < MIN_POINTS:
        return first
    keep = np.ones(len(t), dtype=bool)
    keep[worst] = False
    return dataclasses.replace(_fit_arrays(t, m, c, X, hw, rounds, keep), excluded=tuple(sorted(worst)))


def _fit_arrays(t, m, c, X, hw: Hardware, rounds: int, keep: np.ndarray) -> FitResult:
    """Fit on the points where `keep` is True; report errors for all of them."""
    tk, mk, ck, Xk = t[keep], m[keep], c[keep], X[keep]
    u_prior, v_prior = 1.0 / hw.eta_m, 1.0 / hw.eta_c
    # u = BW / BW_eff within 20x of the catalog's bandwidth; v = 1 / eta_c in [1, 1000]. Without
    # bounds a tiny model's step (all overhead) is fitted as well by an absurd 0.1 GB/s as by overhead_s.
    lo_u, hi_u, hi_v = np.log(1 / _BW_RANGE), np.log(_BW_RANGE), np.log(1e3)
    log_u = np.linspace(lo_u, hi_u, 61)
    log_v = np.linspace(0.0, hi_v, 61)
    for _ in range(rounds):
        sse, theta = _solve_grid(tk, mk, ck, Xk, np.exp(log_u), np.exp(log_v))
        prior = _PRIOR_WEIGHT * ((log_u[:, None] - np.log(u_prior)) ** 2 + (log_v[None, :] - np.log(v_prior)) ** 2)
        i, j = np.unravel_index(np.argmin(sse + prior), sse.shape)
        du, dv = log_u[1] - log_u[0], log_v[1] - log_v[0]
        best = (log_u[i], log_v[j], theta[i, j])
        log_u = np.clip(np.linspace(log_u[i] - 2 * du, log_u[i] + 2 * du, 41), lo_u, hi_u)
        log_v = np.clip(np.linspace(log_v[j] - 2 * dv, log_v[j] + 2 * dv, 41), 0.0, hi_v)
    lu, lv, th = best
    u, v = float(np.exp(lu)), float(np.exp(lv))
    pred = np.maximum(u * m, v * c) + X @ th
    return FitResult(
        hw.mem_bw_bytes_per_s / u / 1e9,
        1.0 / v,
        *(float(x) for x in th),
        rel_errors=tuple(float(e) for e in (pred - t) / t),
        token_tile=hw.token_tile,
    )


def predict_step_s(points: list[StepPoint], cost_model: CostModel) -> list[float]:
    """What `cost_model` says each point's step takes (for reports and validation)."""
    return [cost_model.step_cost(*p.cost_args()).total_s for p in points]
