"""Spark's learning curve, and how far its training would have to go to reach a target accuracy.

    .venv/bin/python scripts/spark_curve.py                     # the shipped Spark's train_log.jsonl
    .venv/bin/python scripts/spark_curve.py --log DIR/train_log.jsonl --bin 50
    .venv/bin/python scripts/spark_curve.py --eval runs/spark_eval.json --students A B C

The curve: training-batch KL and CE (nats/token), averaged over bins of steps, with the tokens seen
by each bin's end. A fit of KL against ln(tokens) over the bins from `--fit-from` on gives the KL
gained per doubling of the training tokens.

With `--eval`, the JSON of `fastmode eval --model default --model A --model B ...` (the teacher
first) and `--students A B ...`, the Spark folders in the same order: each student's accuracy
against the tokens it was trained on (its `spark.json`, through any `--init-from` runs before it).
A least-squares line of accuracy against log2(tokens) over the students that scored above zero
extrapolates to the target, 60% of the teacher's accuracy, and the log's tokens per second turn
those tokens into hours of this machine. It is an extrapolation from a few points, printed as such.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from fastmode.distill.spark import packaged_spark_dir

TARGET_SHARE = 0.6  # of the teacher's accuracy


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def lineage_tokens(folder: Path) -> int:
    """Tokens a student was trained on, counting the runs it was started from (`--init-from`)."""
    summary = json.loads((folder / "spark.json").read_text())["summary"]
    tokens, prior = summary["tokens"], summary.get("init_from")
    while prior:
        tokens += prior["tokens"]
        prior = prior.get("init_from")
    return tokens


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def curve(rows: list[dict], tokens_per_step: int, bin_steps: int, fit_from: int) -> None:
    print(f"{'steps':>11} {'tokens':>8} {'KL':>6} {'CE':>6} {'lr':>8}")
    points = []
    for start in range(0, len(rows), bin_steps):
        part = rows[start : start + bin_steps]
        kl, ce = (sum(r[k] for r in part) / len(part) for k in ("kl", "ce"))
        tokens = part[-1]["step"] * tokens_per_step
        print(
            f"{part[0]['step']:>5}-{part[-1]['step']:<5} {tokens / 1e3:>7.0f}k {kl:>6.3f} {ce:>6.3f} {part[-1]['lr']:>8.1e}"
        )
        if part[0]["step"] >= fit_from and len(part) == bin_steps:
            points.append((math.log(tokens), kl))
    if len(points) >= 2:
        _, slope = line_fit([p[0] for p in points], [p[1] for p in points])
        print(
            f"\nKL against ln(tokens), bins from step {fit_from} on ({len(points)} bins): "
            f"{slope * math.log(2):+.3f} nats/token per doubling of the tokens"
        )


def projection(eval_json: Path, students: list[Path], tokens_per_s: float) -> None:
    models = json.loads(eval_json.read_text())["models"]
    if len(models) != len(students) + 1:
        raise SystemExit(f"{eval_json} has {len(models)} models; expected the teacher and {len(students)} students")
    teacher = models[0]["accuracy"]["accuracy"]
    target = TARGET_SHARE * teacher
    print(f"\nteacher {teacher:.1%}; target {TARGET_SHARE:.0%} of it = {target:.1%}")
    points = []
    for folder, model in zip(students, models[1:]):
        tokens, acc = lineage_tokens(folder), model["accuracy"]
        (low, high), value = acc["ci95"], acc["accuracy"]
        print(f"  {str(folder):<60} {tokens / 1e3:>7.0f}k tokens  {value:.1%} [{low:.1%}, {high:.1%}]")
        if value > 0:
            points.append((math.log2(tokens), value))
    if len(points) < 2:
        print("fewer than two students above zero: no line to extrapolate")
        return
    intercept, slope = line_fit([p[0] for p in points], [p[1] for p in points])
    print(f"accuracy against log2(tokens) over {len(points)} students: {slope:+.2%} per doubling")
    if slope <= 0:
        print("accuracy does not rise with tokens over these points: no projection")
        return
    need = 2 ** ((target - intercept) / slope)
    print(
        f"extrapolated: {target:.1%} at {need / 1e6:.1f}M tokens, "
        f"{need / tokens_per_s / 3600:.0f} h at this log's {tokens_per_s:.0f} tokens/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=packaged_spark_dir() / "train_log.jsonl")
    ap.add_argument("--bin", type=int, default=40, help="steps per bin")
    ap.add_argument("--tokens-per-step", type=int, default=None, help="none: from spark.json beside the log")
    ap.add_argument("--fit-from", type=int, default=101, help="first step of the KL fit (past a format change)")
    ap.add_argument("--eval", type=Path, default=None, help="fastmode eval --json output, the teacher first")
    ap.add_argument("--students", type=Path, nargs="*", default=[], help="Spark folders, in --eval's order")
    args = ap.parse_args()

    rows = read_log(args.log)
    per_step = args.tokens_per_step
    if per_step is None:
        config = json.loads((args.log.parent / "spark.json").read_text())["summary"]["config"]
        per_step = config["seq_len"] * config["batch_size"]
    curve(rows, per_step, args.bin, args.fit_from)
    # Rate of the log's last bin: this machine's training speed now, not an average over older machines.
    last = rows[-args.bin :]
    seconds = last[-1]["elapsed_s"] - (rows[-args.bin - 1]["elapsed_s"] if len(rows) > args.bin else 0.0)
    tokens_per_s = len(last) * per_step / seconds
    print(f"training speed over the last {len(last)} steps: {tokens_per_s:.0f} tokens/s")
    if args.eval is not None:
        projection(args.eval, args.students, tokens_per_s)


if __name__ == "__main__":
    main()
