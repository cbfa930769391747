"""Render eval reports: a JSON document and a plain-text comparison table.

The table puts models side by side (one column each) because the question
the eval answers is comparative: how much accuracy does Spark give up, and
does speculative decoding change anything (it must not).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastmode.evals.runner import ModelReport, agreement
from fastmode.evals.stats import Proportion
from fastmode.evals.tasks import CATEGORIES


def _pct(p: Proportion) -> str:
    return f"{100 * p.value:.1f}% [{100 * p.low:.1f}, {100 * p.high:.1f}]"


def _chain(report: ModelReport) -> str:
    # Three significant figures: p^10 of a weak model is far below 0.01%,
    # and printing it as 0.00% would hide how far below.
    c = report.chain
    return f"{100 * c.value:.3g}% [{100 * c.low:.3g}, {100 * c.high:.3g}]"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ppl(report: ModelReport, kind: str) -> str:
    if not report.perplexity or kind not in report.perplexity:
        return "-"
    return f"{report.perplexity[kind].perplexity:.2f}"


def table_rows(reports: Sequence[ModelReport], baseline: ModelReport | None = None) -> list[list[str]]:
    """Rows of [metric, value per model]; the first row is the header."""
    rows = [["metric"] + [_label(r) for r in reports]]
    first = reports[0]
    rows.append([f"accuracy (n={first.accuracy.num_total})"] + [_pct(r.accuracy) for r in reports])
    for category in CATEGORIES:
        if category in first.per_category:
            n = first.per_category[category].num_total
            rows.append(
                [f"  {category} (n={n})"]
                + [_pct(r.per_category[category]) if category in r.per_category else "-" for r in reports]
            )
    rows.append([f"{first.chain.num_steps}-step chain p^{first.chain.num_steps}"] + [_chain(r) for r in reports])
    rows.append(["decode tok/s (batch 1)"] + [_num(r.decode_tok_s, ".1f") for r in reports])
    for kind in ("prose", "code", "all"):
        rows.append([f"perplexity ({kind})"] + [_ppl(r, kind) for r in reports])
    if baseline is not None and any(r.speculative not in (None, "off") for r in reports):
        rows.append(
            [f"identical to {baseline.name}"]
            + [_pct(agreement(baseline, r)) if r.speculative not in (None, "off") else "-" for r in reports]
        )
    return rows


def _label(report: ModelReport) -> str:
    if report.speculative in (None, "off"):
        return report.name
    return f"{report.name} +{report.speculative}"


def format_table(reports: Sequence[ModelReport], baseline: ModelReport | None = None) -> str:
    """A fixed-width text table; intervals are 95% Wilson (chain: propagated)."""
    rows = table_rows(reports, baseline)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("[low, high] = 95% confidence interval (Wilson; chain = endpoints ^ steps)")
    return "\n".join(lines)


def to_json(reports: Sequence[ModelReport], suite: dict[str, Any]) -> dict[str, Any]:
    """The full machine-readable report, per-item responses included."""
    return {"suite": suite, "models": [r.to_dict() for r in reports]}


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write `document` as indented UTF-8 JSON, creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
