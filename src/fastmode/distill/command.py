"""`fastmode distill`: build Spark, a smaller student of the default model.

    fastmode distill                          # 10 of 30 layers, 60 minutes, into the cache folder
    fastmode distill --max-minutes 5 --out runs/spark-smoke
    fastmode distill --resume --out runs/spark-smoke --max-minutes 10   # continue, bit for bit

Ctrl-C stops after the current step, checkpoints and exports; --resume continues.
See docs/spark.md for what is stored and how to measure the result.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any


def _parse_mix(text: str) -> dict[str, float]:
    try:
        return {k.strip(): float(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mix wants name=weight,...; got {text!r}") from None


def register(subparsers: Any) -> None:
    """Add the `distill` subcommand to the `fastmode` parser."""
    from fastmode.distill.defaults import DEFAULT_MIX

    p = subparsers.add_parser(
        "distill", help="distill the Spark student from the default model",
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    p.add_argument("--model", default=None, help="teacher (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output folder (default: <cache>/spark/<teacher>-spark)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--num-layers", type=int, default=10, help="student layers, spread evenly over the teacher's")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per training window")
    p.add_argument("--batch-size", type=int, default=4, help="windows per step")
    p.add_argument("--lr", type=float, default=5e-4, help="peak AdamW learning rate")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=None, help="stop at step N (default: at the time budget)")
    p.add_argument("--decay-steps", type=int, default=None,
                   help="cosine-decay the lr to 10%% at step N (default: constant after warm-up)")
    p.add_argument("--max-minutes", type=float, default=60.0, help="training time budget, summed over resumes")
    p.add_argument("--temperature", type=float, default=1.0, help="distillation temperature T")
    p.add_argument("--ce-weight", type=float, default=0.1, help="weight of the next-token CE term")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=25, metavar="STEPS")
    p.add_argument("--mix", type=_parse_mix, default=None,
                   help="source weights, default " + ",".join(f"{k}={v}" for k, v in DEFAULT_MIX.items()))
    p.add_argument("--answer-max-tokens", type=int, default=128, help="length cap of the teacher's answers")
    p.add_argument("--format", choices=("auto", "fp32", "bf16", "int8"), default="auto",
                   help="weight storage; auto = most precise that fits --max-mb")
    p.add_argument("--max-mb", type=float, default=50.0, help="size limit of the exported file (MB)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the teacher in fp32, train, export, print the record."""
    from fastmode.distill.defaults import DEFAULT_MIX
    from fastmode.distill.pipeline import DistillOptions, run_distill
    from fastmode.distill.spark import default_spark_dir
    from fastmode.distill.train import TrainConfig
    from fastmode.loader import load_model

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    teacher = load_model(args.model, dtype="float32", weights="dequantize")  # the student trains on fp32 copies
    cfg = TrainConfig(num_layers=args.num_layers, seq_len=args.seq_len, batch_size=args.batch_size, lr=args.lr,
                      warmup_steps=args.warmup_steps, decay_steps=args.decay_steps, temperature=args.temperature,
                      ce_weight=args.ce_weight, seed=args.seed)
    opts = DistillOptions(
        out_dir=args.out or default_spark_dir(teacher.name), model=args.model, resume=args.resume, max_steps=args.max_steps,
        max_minutes=args.max_minutes, checkpoint_every=args.checkpoint_every, mix=args.mix or dict(DEFAULT_MIX),
        answer_max_tokens=args.answer_max_tokens, export_format=args.format, max_bytes=int(args.max_mb * 1e6),
    )
    try:
        info = run_distill(teacher, cfg, opts)
    except KeyboardInterrupt:  # a second Ctrl-C: the last periodic checkpoint is still there
        return 130
    s = info["summary"]
    print(json.dumps(info, indent=2))
    print(f"\nSpark: {info['path']} ({info['file_bytes'] / 1e6:.1f} MB, {info['format']}), layers {info['layer_indices']}, "
          f"{s['steps']} steps / {s['tokens']} tokens in {s['train_minutes']} min; "
          f"probe KL {s['probe_kl_start']:.3f} -> {s['probe_kl_end']:.3f} nats/token")
    return 0
