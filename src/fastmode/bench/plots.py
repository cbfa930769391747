"""PNG plots of a bench run: latency against throughput over a sweep, and per-tier CDFs.

The sweep plot is the serving trade-off in one picture: each point is a load
level (its label beside it), x the aggregate output tok/s it reached, y the
latency each tier paid for it. The CDFs show a whole distribution where the
table shows three percentiles: a fast tier whose TTFT CDF has a long tail is
not fast for everyone. matplotlib is imported inside the functions (Agg
backend, no display needed), as in the planner's plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastmode.bench.load import LevelRun

TIER_COLORS = {"fast": "tab:red", "standard": "tab:blue", "flex": "tab:green", "*": "black"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_latency_vs_throughput(levels: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """TTFT and TPOT (p50 solid, p99 dashed) per tier against aggregate output tok/s, one point per level."""
    if len(levels) < 2:
        raise ValueError("a latency/throughput curve needs at least two load levels")
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    xs = [lv["aggregate"]["output_tok_s"] for lv in levels]
    tiers = sorted(
        {t for lv in levels for t in lv["tiers"]}, key=lambda t: list(TIER_COLORS).index(t) if t in TIER_COLORS else 99
    )
    for ax, metric, name in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        for tier in tiers:
            color = TIER_COLORS.get(tier)
            for q, style in (("p50", "o-"), ("p99", "s--")):
                pts = [
                    (x, lv["tiers"][tier][metric][q])
                    for x, lv in zip(xs, levels)
                    if tier in lv["tiers"] and lv["tiers"][tier][metric][q] is not None
                ]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, label=f"{tier} {q}", alpha=1.0 if q == "p50" else 0.6)
        for x, lv in zip(xs, levels):
            ax.annotate(
                lv["label"],
                (x, 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="gray",
            )
        ax.set_xlabel("aggregate output tok/s")
        ax.set_ylabel(f"{name} (s)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "latency against throughput")
    return _save(fig, path)


def plot_cdfs(run: LevelRun, path: str | Path, title: str = "") -> Path:
    """Empirical CDFs of TTFT and TPOT, one line per tier, completed requests only."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    by_tier: dict[str, list] = {}
    for r in run.records:
        if r.ok:
            by_tier.setdefault(r.tier, []).append(r)
    for ax, name, get in ((axes[0], "TTFT", lambda r: r.ttft_s), (axes[1], "TPOT", lambda r: r.tpot_s)):
        for tier in sorted(by_tier, key=lambda t: list(TIER_COLORS).index(t) if t in TIER_COLORS else 99):
            x = np.sort([v for v in map(get, by_tier[tier]) if v is not None])
            if x.size:  # from (first, 0): the curve rises at each value
                ax.step(
                    np.r_[x[0], x],
                    np.r_[0.0, np.arange(1, x.size + 1) / x.size],
                    where="post",
                    color=TIER_COLORS.get(tier),
                    label=f"{tier} (n={x.size})",
                )
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title or f"per-tier CDFs at {run.spec.label}")
    return _save(fig, path)


def write_plots(
    runs: Sequence[LevelRun], levels: Sequence[dict[str, Any]], out_dir: str | Path, title: str = ""
) -> list[Path]:
    """cdf_<label>.png for every level, latency_vs_throughput.png when there are two or more."""
    out = Path(out_dir)
    paths = [
        plot_cdfs(run, out / f"cdf_{run.spec.label}.png", f"{title} per-tier CDFs at {run.spec.label}".strip())
        for run in runs
    ]
    if len(levels) >= 2:
        paths.append(
            plot_latency_vs_throughput(
                levels, out / "latency_vs_throughput.png", f"{title} latency against throughput".strip()
            )
        )
    return paths
