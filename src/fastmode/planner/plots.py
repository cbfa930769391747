"""PNG plots of the planner's two pictures: the bus curve and the speed/price frontier.

matplotlib is imported inside the functions (Agg backend, no display needed) so
that importing the planner stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from fastmode.planner.operating_point import OperatingPoint


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bus_curve(points: Sequence[OperatingPoint], path: str | Path, title: str = "") -> Path:
    """Per-user tok/s (falls) and aggregate tok/s (rises) against batch size."""
    if not points:
        raise ValueError("no points to plot (does anything fit?)")
    plt = _pyplot()
    batches = [p.batch for p in points]
    fig, ax_user = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax_user.plot(batches, [p.per_user_tok_s for p in points], "o-", color="tab:blue", label="per-user tok/s")
    ax_user.set_xscale("log", base=2)
    ax_user.set_xlabel("batch size (sequences per step)")
    ax_user.set_ylabel("per-user tok/s", color="tab:blue")
    ax_agg = ax_user.twinx()
    ax_agg.plot(batches, [p.aggregate_tok_s for p in points], "s--", color="tab:red", label="aggregate tok/s")
    ax_agg.set_ylabel("aggregate tok/s", color="tab:red")
    p0 = points[0]
    ax_user.set_title(
        title or f"bus curve: {p0.model} on {p0.devices}x {p0.hardware}, {p0.context_tokens}-token context"
    )
    ax_user.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_frontier(series: Mapping[str, Sequence[OperatingPoint]], path: str | Path, title: str = "") -> Path:
    """$/Mtok against per-user tok/s, one line per hardware (batch sweep along each).

    Hardware whose price is an estimate is drawn dashed; each line's ends are
    labelled with their batch sizes.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    drawn = 0
    for name, points in series.items():
        pts = [p for p in points if p.usd_per_mtok is not None]
        if not pts:
            continue
        style = "--" if pts[0].price_is_estimate else "-"
        xs, ys = [p.per_user_tok_s for p in pts], [p.usd_per_mtok for p in pts]
        lo, hi = min(p.devices for p in pts), max(p.devices for p in pts)
        devices = f"{lo}" if lo == hi else f"{lo}-{hi}"
        label = f"{name} ({devices} dev{', est. price' if pts[0].price_is_estimate else ''})"
        ax.plot(xs, ys, style, marker="o", markersize=3, label=label)
        for p in (pts[0], pts[-1]) if len(pts) > 1 else pts[:1]:
            ax.annotate(
                f"B={p.batch}" + (f"/{p.devices}d" if lo != hi else ""),
                (p.per_user_tok_s, p.usd_per_mtok),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
        drawn += 1
    if not drawn:
        plt.close(fig)
        raise ValueError("no hardware with a price to plot")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-user output tok/s")
    ax.set_ylabel("$ per million output tokens")
    ax.set_title(title or "speed / price frontier")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path) -> Path:
    """Write `fig` as PNG to `path` (creating its folder) and release it."""
    plt = _pyplot()

    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
