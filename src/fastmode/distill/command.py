"""`fastmode distill`: build Spark, a smaller student of the default model.

    fastmode distill                          # 10 of 30 layers, 60 minutes, into the cache folder
    fastmode distill --max-minutes 5 --out runs/spark-smoke
    fastmode distill --resume --out runs/spark-smoke --max-minutes 10   # continue, bit for bit
    fastmode distill --init-from runs/spark-smoke --out runs/spark-more  # a new run from an exported student

Ctrl-C stops after the current step, checkpoints and exports; --resume continues.
See docs/spark.md for what is stored and how to measure the result.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.distill.defaults import DEFAULT_MIX
from fastmode.flags import add_dataclass_args


def _parse_mix(text: str) -> dict[str, float]:
    try:
        return {k.strip(): float(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mix wants name=weight,...; got {text!r}") from None


_parse_mix.__name__ = "mix"  # argparse names the type in its error messages


@dataclass(frozen=True)
class DistillCommandOptions:
    """What `fastmode distill` runs; each field is one flag.

    The training defaults are TrainConfig's and DistillOptions' (a test holds them equal); they are
    spelled out here because those modules import torch, and building the CLI must not.
    """

    model: str | None = None  # teacher (none: the embedded SmolLM2-135M-Instruct)
    out: Path | None = field(
        default=None, metadata={"parse": Path, "metavar": "DIR"}
    )  # output folder (none: <cache>/spark/<teacher>-spark)
    resume: bool = False  # continue the checkpoint in --out
    init_from: Path | None = field(
        default=None, metadata={"parse": Path, "metavar": "SPARK"}
    )  # start from this exported student (file or folder), not from the teacher's layers; fresh optimizer
    num_layers: int = 10  # student layers
    select_layers: str = field(
        default="importance", metadata={"choices": ("importance", "even")}
    )  # keep the layers whose removal costs most (greedy, measured), or spread them evenly
    importance_windows: int = field(default=8, metadata={"metavar": "N"})  # 64-token windows importance is measured on
    seq_len: int = 256  # tokens per training window
    batch_size: int = 4  # windows per step
    lr: float = 5e-4  # peak AdamW learning rate
    warmup_steps: int = 20  # steps of linear lr warm-up
    max_steps: int | None = None  # stop at step N (none: at the time budget)
    decay_steps: int | None = None  # cosine-decay the lr to 10% at step N (none: constant after warm-up)
    max_minutes: float = 60.0  # training time budget, summed over resumes
    temperature: float = 1.0  # distillation temperature T
    ce_weight: float = 0.1  # weight of the next-token CE term
    seed: int = 0  # seed of the data order and the student's initialisation
    checkpoint_every: int = field(default=25, metadata={"metavar": "STEPS"})  # steps between checkpoints
    mix: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIX), metadata={"parse": _parse_mix, "metavar": "NAME=WEIGHT,..."}
    )  # share of training windows per source
    answer_max_tokens: int = 128  # length cap of the teacher's answers
    format: str = field(
        default="auto", metadata={"choices": ("auto", "fp32", "bf16", "int8", "q4_1")}
    )  # weight storage; auto = most precise that fits --max-mb
    max_mb: float = 50.0  # size limit of the exported file (MB)
    quantize_aware_from: int | None = field(
        default=None, metadata={"metavar": "STEP"}
    )  # train through Q4_1 rounding from this step on (none: from 0 for a Q4_1 student; on --resume, as saved)


def register(subparsers: Any) -> None:
    """Add the `distill` subcommand to the `fastmode` parser."""
    p = subparsers.add_parser(
        "distill",
        help="distill the Spark student from the default model",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    add_dataclass_args(p, DistillCommandOptions, title="distill")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the teacher in fp32, train, export, print the record."""
    from fastmode.distill.pipeline import DistillOptions, run_distill, teacher_config
    from fastmode.distill.spark import default_spark_dir
    from fastmode.distill.train import TrainConfig
    from fastmode.loader import load_model

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        from fastmode.distill.forward import check_supported

        check_supported(teacher_config(args.model))  # before the teacher's weights are loaded
    except ValueError as e:
        print(f"fastmode distill: error: {e}", file=sys.stderr)
        return 2
    teacher = load_model(args.model, dtype="float32", weights="dequantize")  # the student trains on fp32 copies
    cfg = TrainConfig(
        num_layers=args.num_layers,
        layer_selection=args.select_layers,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        decay_steps=args.decay_steps,
        temperature=args.temperature,
        ce_weight=args.ce_weight,
        seed=args.seed,
        quantize_aware_from=args.quantize_aware_from,
    )
    opts = DistillOptions(
        out_dir=args.out or default_spark_dir(teacher.name),
        model=args.model,
        resume=args.resume,
        max_steps=args.max_steps,
        max_minutes=args.max_minutes,
        checkpoint_every=args.checkpoint_every,
        mix=args.mix or dict(DEFAULT_MIX),
        answer_max_tokens=args.answer_max_tokens,
        export_format=args.format,
        max_bytes=int(args.max_mb * 1e6),
        importance_windows=args.importance_windows,
        init_from=args.init_from,
    )
    try:
        info = run_distill(teacher, cfg, opts)
    except KeyboardInterrupt:  # a second Ctrl-C: the last periodic checkpoint is still there
        return 130
    s = info["summary"]
    print(json.dumps(info, indent=2))
    print(
        f"\nSpark: {info['path']} ({info['file_bytes'] / 1e6:.1f} MB, {info['format']}), layers {info['layer_indices']}, "
        f"{s['steps']} steps / {s['tokens']} tokens in {s['train_minutes']} min; "
        f"probe KL {s['probe_kl_start']:.3f} -> {s['probe_kl_end']:.3f} nats/token"
    )
    return 0
