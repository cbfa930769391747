"""The agent eval's figures per route: per-step accuracy p, observed success by chain
length n beside p^n, wall time and metered cost per task, and time and cost to a
correct result; the text table, the JSON document and the plot.

Time (cost) to a correct result is what a user pays for one right answer when a
wrong end result is noticed and the task rerun: the route's total wall time
(metered cost) over all its runs divided by the runs that came out right. For
the verifier route the retries are inside each run, so they are paid for there.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.evals.agent.loop import TaskRecord
from fastmode.evals.stats import Proportion, proportion


@dataclass
class RouteSummary:
    route: str
    description: str
    records: list[TaskRecord]
    p: Proportion  # right steps / scored steps (after retries)
    p_first: Proportion  # right first attempts / scored steps
    success: Proportion
    by_n: dict[int, Proportion]
    wall_s_per_task: float
    cost_usd_per_task: float
    machine_s_per_task: float
    time_to_correct_s: float | None  # None: no run came out right
    cost_to_correct_usd: float | None
    chain_inputs: dict[str, float]
    notes: list[str] = field(default_factory=list)

    def predicted(self, n: int) -> float:
        """p^n from the measured per-step accuracy."""
        return self.p.value**n

    def to_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "description": self.description,
            "num_tasks": len(self.records),
            "p_step": self.p.to_dict(),
            "p_step_first_attempt": self.p_first.to_dict(),
            "success": self.success.to_dict(),
            "by_n": {
                str(n): {
                    **prop.to_dict(),
                    "predicted_p_n": self.predicted(n),
                    "predicted_ci95": [self.p.low**n, self.p.high**n],
                }
                for n, prop in sorted(self.by_n.items())
            },
            "wall_s_per_task": self.wall_s_per_task,
            "cost_usd_per_task": self.cost_usd_per_task,
            "machine_s_per_task": self.machine_s_per_task,
            "time_to_correct_s": self.time_to_correct_s,
            "cost_to_correct_usd": self.cost_to_correct_usd,
            "chain_inputs": self.chain_inputs,
            "notes": self.notes,
            "tasks": [r.to_dict() for r in self.records],
        }


def summarize(route: str, records: Sequence[TaskRecord], description: str = "") -> RouteSummary:
    scored = [s for r in records for s in r.steps if s.right is not None]
    p = proportion(sum(bool(s.right) for s in scored), len(scored))
    p_first = proportion(sum(bool(s.first_right) for s in scored), len(scored))
    solved = sum(r.solved for r in records)
    by_n = {
        n: proportion(sum(r.solved for r in records if r.n == n), sum(r.n == n for r in records))
        for n in sorted({r.n for r in records})
    }
    totals = [r.totals() for r in records]
    wall = sum(r.wall_s for r in records)
    cost = sum(t["cost_usd"] for t in totals)
    count = max(1, len(records))
    notes = (
        [f"{sum(r.error is not None for r in records)} runs ended by an HTTP error"]
        if any(r.error for r in records)
        else []
    )
    return RouteSummary(
        route=route,
        description=description,
        records=list(records),
        p=p,
        p_first=p_first,
        success=proportion(solved, len(records)),
        by_n=by_n,
        wall_s_per_task=wall / count,
        cost_usd_per_task=cost / count,
        machine_s_per_task=sum(t["machine_s"] for t in totals) / count,
        time_to_correct_s=wall / solved if solved else None,
        cost_to_correct_usd=cost / solved if solved else None,
        chain_inputs=chain_inputs(records, p.value),
        notes=notes,
    )


def chain_inputs(records: Sequence[TaskRecord], p_step: float) -> dict[str, float]:
    """The per-step figures `fastmode chain --from-agent-eval` prices a pipeline with.

    A step's time is latency_s (mean time to first token) plus tokens_per_step / tok_s,
    which together give back the measured mean step time; the price per output token
    is the metered cost of a step (its prompt's prefill included) over its output
    tokens. Retries are inside a step's figures.
    """
    steps = [s for r in records for s in r.steps]
    attempts = [a for s in steps for a in s.attempts]
    num_steps = max(1, len(steps))
    step_s = sum(a.latency_s for a in attempts) / num_steps
    ttfts = [a.ttft_s for a in attempts if a.ttft_s is not None]
    # Per step, a retried step's attempts all wait for their first token.
    latency_s = (statistics.fmean(ttfts) * len(attempts) / num_steps) if ttfts else 0.0
    tokens = sum(a.completion_tokens for a in attempts)
    tokens_per_step = tokens / num_steps
    decode_s = max(step_s - latency_s, 1e-9)
    cost = sum(a.cost_usd for a in attempts)
    return {
        "p_step": p_step,
        "tokens_per_step": tokens_per_step,
        "tok_s": tokens_per_step / decode_s if tokens_per_step else 0.0,
        "latency_s": latency_s,
        "usd_per_mtok": cost / tokens * 1e6 if tokens else 0.0,
        "step_s": step_s,
        "step_cost_usd": cost / num_steps,
    }


# --- the table ---------------------------------------------------------------------------


def _pct(p: Proportion) -> str:
    return f"{100 * p.value:.0f}% [{100 * p.low:.0f}, {100 * p.high:.0f}]"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table_rows(summaries: Sequence[RouteSummary]) -> list[list[str]]:
    """Rows of [metric, value per route]; the first row is the header."""
    rows = [["metric"] + [s.route for s in summaries]]
    rows.append(["tasks run"] + [str(len(s.records)) for s in summaries])
    rows.append(["per-step accuracy p"] + [_pct(s.p) for s in summaries])
    if any(s.p_first.value != s.p.value for s in summaries):
        rows.append(["  first attempt"] + [_pct(s.p_first) for s in summaries])
    rows.append(["task success"] + [_pct(s.success) for s in summaries])
    lengths = sorted({n for s in summaries for n in s.by_n})
    for n in lengths:
        cells = []
        for s in summaries:
            prop = s.by_n.get(n)
            cells.append(
                "-"
                if prop is None
                else f"{prop.num_correct}/{prop.num_total} = {100 * prop.value:.0f}% vs {100 * s.predicted(n):.0f}%"
            )
        rows.append([f"  n={n}: observed vs p^n"] + cells)
    rows.append(["wall s / task"] + [f"{s.wall_s_per_task:.2f}" for s in summaries])
    rows.append(["metered $ / task"] + [f"{s.cost_usd_per_task:.2e}" for s in summaries])
    rows.append(["time to correct result (s)"] + [_opt(s.time_to_correct_s, ".2f") for s in summaries])
    rows.append(["cost to correct result ($)"] + [_opt(s.cost_to_correct_usd, ".2e") for s in summaries])
    rows.append(["mean step s"] + [f"{s.chain_inputs['step_s']:.3f}" for s in summaries])
    rows.append(["output tok/s (after first token)"] + [f"{s.chain_inputs['tok_s']:.1f}" for s in summaries])
    rows.append(["retried attempts"] + [str(sum(r.totals()["retries"] for r in s.records)) for s in summaries])
    return rows


def format_table(summaries: Sequence[RouteSummary]) -> str:
    rows = table_rows(summaries)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("[low, high] = 95% Wilson interval; p^n = the measured p to the power of the chain length")
    return "\n".join(lines)


def markdown_table(summaries: Sequence[RouteSummary]) -> str:
    rows = table_rows(summaries)
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(out)


def to_json(summaries: Sequence[RouteSummary], run: dict[str, Any]) -> dict[str, Any]:
    """The full record: the run's settings and, per route, its figures and every step of every task."""
    return {"kind": "fastmode-agent-eval", "run": run, "routes": [s.to_dict() for s in summaries]}


# --- the plot ----------------------------------------------------------------------------


def plot(summaries: Sequence[RouteSummary], path: str | Path) -> Path:
    """Left: task success against chain length, observed (markers) and p^n (lines).
    Right: time to a correct result against its cost, one point per route."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_n, ax_tc) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(summaries):
        color = colors[i % len(colors)]
        ns = sorted(s.by_n)
        if not ns:
            continue
        # Routes often score alike (greedy decoding is the same on every main-model route): a small
        # sideways offset per route keeps every route's markers visible.
        shift = 0.08 * (i - (len(summaries) - 1) / 2)
        ax_n.plot(
            [n + shift for n in ns], [100 * s.by_n[n].value for n in ns], "o", color=color, label=f"{s.route} observed"
        )
        grid = list(range(1, max(ns) + 1))
        ax_n.plot(
            grid, [100 * s.predicted(n) for n in grid], "--", color=color, label=f"{s.route} p^n, p={s.p.value:.2f}"
        )
        if s.time_to_correct_s is not None and s.cost_to_correct_usd is not None:
            ax_tc.plot(s.cost_to_correct_usd, s.time_to_correct_s, "o", color=color, markersize=8)
            ax_tc.annotate(s.route, (s.cost_to_correct_usd, s.time_to_correct_s), textcoords="offset points",
                           xytext=(5, 4), fontsize=8)  # fmt: skip
    ax_n.set_xlabel("chain length n (calls, the answer included)")
    ax_n.set_ylabel("task success (%)")
    ax_n.set_ylim(-3, 103)
    ax_n.set_title("success against chain length: observed and p^n")
    ax_n.grid(True, alpha=0.3)
    ax_n.legend(fontsize=7, ncol=2)
    ax_tc.set_xlabel("metered cost to a correct result ($)")
    ax_tc.set_ylabel("wall time to a correct result (s)")
    missing = [s.route for s in summaries if s.time_to_correct_s is None]
    ax_tc.set_title("time and cost to a correct result, per route")
    if missing:
        ax_tc.text(0.02, 0.02, "no correct result: " + ", ".join(missing), transform=ax_tc.transAxes, fontsize=8)
    ax_tc.grid(True, alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
