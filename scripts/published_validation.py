"""Set the planner's predictions beside published GPU and SRAM-machine measurements.

    .venv/bin/python scripts/published_validation.py           # prints the table and summary
    .venv/bin/python scripts/published_validation.py --write   # also rewrites the section of docs/planner.md

The measurements, each with its source, are in src/fastmode/data/catalog/published.json.
Each is predicted exactly as `fastmode plan` does it (`layout_for_load` + `evaluate`, no
speculation): per-user tok/s, or aggregate tok/s at the published batch or concurrency, at the
entry's mean context. Error is predicted / published - 1, so positive means the planner is
optimistic. Points whose published figure a catalog efficiency or latency floor was fitted to
are marked `fitted` and left out of the summary. Deterministic; well under a second.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from importlib import resources
from pathlib import Path
from typing import Any

from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.operating_point import evaluate, layout_for_load

DOC = Path(__file__).resolve().parent.parent / "docs" / "planner.md"
START = "<!-- published-validation:start -->"
END = "<!-- published-validation:end -->"
SECTION_TITLE = "## Validation against published measurements"
METRICS = ("per_user_tok_s", "aggregate_tok_s")
REQUIRED = (
    "id",
    "hardware",
    "model",
    "weight_format",
    "tp",
    "batch",
    "metric",
    "value",
    "context_tokens",
    "includes_prefill",
    "date",
    "source",
    "source_short",
    "used_for_fit",
)
WITHIN = 0.25  # the summary counts independent points within this relative error


def load_points() -> list[dict[str, Any]]:
    """The entries of published.json, in file order."""
    ref = resources.files("fastmode").joinpath("data/catalog/published.json")
    return json.loads(ref.read_text(encoding="utf-8"))["points"]


def predict(point: dict[str, Any]):
    """(CostModel, OperatingPoint) exactly as `fastmode plan` builds them for this entry."""
    hw = load_hardware(point["hardware"])
    model = load_model(point["model"])
    batch, context = int(point["batch"]), int(point["context_tokens"])
    cm = layout_for_load(hw, model, batch, context, point["tp"], weight_format=point["weight_format"])
    return cm, evaluate(cm, batch, context)


def with_prefill(point: dict[str, Any], cm, op) -> float | None:
    """A rough end-to-end figure for entries whose published number includes prefill.

    The same cost model prices each of the batch's prompts (prefilled one after
    another, `CostModel.prefill_time_s`) plus `output_tokens` decode steps at the
    operating point's step time. An explanation of the gap, not the prediction:
    `plan` itself reports decode only.
    """
    if not point["includes_prefill"] or "input_tokens" not in point:
        return None
    batch, out_tokens = int(point["batch"]), int(point["output_tokens"])
    total_s = batch * cm.prefill_time_s(int(point["input_tokens"])) + out_tokens * op.step_time_s
    per_user = out_tokens / total_s
    return per_user if point["metric"] == "per_user_tok_s" else per_user * batch * op.microbatches


def rows() -> list[dict[str, Any]]:
    """One row per published entry: the entry plus the prediction and its relative error."""
    out = []
    for p in load_points():
        cm, op = predict(p)
        predicted = float(getattr(op, p["metric"]))
        e2e = with_prefill(p, cm, op)
        out.append(
            {
                **p,
                "predicted": predicted,
                "error": predicted / float(p["value"]) - 1.0,
                "with_prefill": e2e,
                "error_with_prefill": None if e2e is None else e2e / float(p["value"]) - 1.0,
                "devices": op.devices,
                "fits": bool(op.fits),
                "bound": op.bound,
            }
        )
    return out


def summary(table: list[dict[str, Any]]) -> str:
    indep = [r for r in table if not r["used_for_fit"]]
    plain = [abs(r["error"]) for r in indep]
    adjusted = [abs(r["error"] if r["error_with_prefill"] is None else r["error_with_prefill"]) for r in indep]
    fitted = [abs(r["error"]) for r in table if r["used_for_fit"]]
    return (
        f"**Independent points: {len(plain)}; median |error| {statistics.median(plain):.0%}; "
        f"within {WITHIN:.0%}: {sum(e <= WITHIN for e in plain)} of {len(plain)}.** "
        f"With prefill priced in for the * rows: median |error| {statistics.median(adjusted):.0%}, "
        f"within {WITHIN:.0%}: {sum(e <= WITHIN for e in adjusted)} of {len(adjusted)}. "
        f"Fitted points (not a check): {len(fitted)}, median |error| {statistics.median(fitted):.0%}."
    )


def _pct(e: float) -> str:
    return "0%" if abs(e) < 0.005 else f"{e:+.0%}"


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def render(table: list[dict[str, Any]] | None = None) -> str:
    """The markdown that goes between the markers in docs/planner.md."""
    table = rows() if table is None else table
    lines = [
        "| hardware | model | format | tp | batch | ctx | metric | published | predicted | error | "
        "+prefill (error) | fitted? | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        tp = str(r["tp"]) if r["tp"] is not None else f"auto ({r['devices']})"
        metric = "per-user" if r["metric"] == "per_user_tok_s" else "aggregate"
        published = _num(float(r["value"])) + (" *" if r["includes_prefill"] else "")
        predicted = _num(r["predicted"]) + ("" if r["fits"] else " (does not fit)")
        e2e = "" if r["with_prefill"] is None else f"{_num(r['with_prefill'])} ({_pct(r['error_with_prefill'])})"
        lines.append(
            f"| {r['hardware']} | {r['model']} | {r['weight_format']} | {tp} | {r['batch']} | "
            f"{r['context_tokens']} | {metric} | {published} | {predicted} | {_pct(r['error'])} | {e2e} | "
            f"{'fitted' if r['used_for_fit'] else 'independent'} | {r['source_short']} |"
        )
    lines += [
        "",
        "Published and predicted are output tok/s. * the published figure's time includes prefill work (the "
        "request's own prompt in end-to-end tok/s, or other requests' prompts interleaved under concurrency); "
        "the planner prices decode only. +prefill: the same cost model with each prompt's prefill added "
        "(a batch's prompts one after another, then its output_tokens decode steps), for the * rows. "
        "tp auto: the planner's layout (fewest chips that hold the model and the batch's KV). "
        "Error = predicted / published - 1 (positive: the planner is optimistic).",
        "",
        summary(table),
    ]
    return "\n".join(lines)


def write_doc(text: str, doc: Path = DOC) -> None:
    """Replace what lies between the markers (appending the section if it has none)."""
    content = doc.read_text(encoding="utf-8")
    if START in content and END in content:
        head, rest = content.split(START, 1)
        _, tail = rest.split(END, 1)
        content = f"{head}{START}\n{text}\n{END}{tail}"
    else:
        content = content.rstrip("\n") + f"\n\n{SECTION_TITLE}\n\n{START}\n{text}\n{END}\n"
    doc.write_text(content, encoding="utf-8")


def doc_section(doc: Path = DOC) -> str | None:
    """What docs/planner.md currently holds between the markers (None if they are missing)."""
    content = doc.read_text(encoding="utf-8")
    if START not in content or END not in content:
        return None
    return content.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"rewrite the section of {DOC.name} between the markers")
    args = parser.parse_args(argv)
    table = rows()
    if not all(math.isfinite(r["predicted"]) and r["predicted"] > 0 for r in table):
        raise SystemExit("a prediction is not a positive finite number")
    text = render(table)
    print(text)
    if args.write:
        write_doc(text)
        print(f"\nwrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
