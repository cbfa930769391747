"""`fastmode eval`: accuracy, speed and perplexity of one or more models, side by side.

    fastmode eval                                   # the embedded model
    fastmode eval --model teacher.gguf --model spark/ --speculative ngram --json runs/eval.json
    fastmode eval --limit 5 --no-speed --no-perplexity   # a quick smoke run

Every `--model` is evaluated plainly. With `--speculative ngram|draft` the
first model (the teacher) is evaluated once more with speculative decoding,
and the table shows how often its output is identical to the plain run; all
runs then generate in batches of 4, where the engine actually speculates.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

SPECULATIVE_CHOICES = ("off", "ngram", "draft")
# The engine speculates only while few sequences decode together (its
# speculative_max_batch, 4 by default). A speculative comparison therefore
# runs in small batches, and so does its baseline: the same batch shapes on
# both sides keep float rounding identical, so any text difference is the
# speculative decoder's doing.
SPEC_BATCH_SIZE = 4


def register(subparsers: Any) -> None:
    """Add the `eval` subcommand to the `fastmode` parser."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate models on the built-in task suite",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    p.add_argument("--model", action="append", default=None, metavar="PATH",
                   help="model path or name ('default' = the embedded model, 'spark' = its Spark); "
                        "repeat to compare (default: the embedded model)")
    p.add_argument("--speculative", choices=SPECULATIVE_CHOICES, default="off",
                   help="also evaluate the first model with this speculative mode")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="at most N items per category (a quick run)")
    p.add_argument("--categories", default=None, metavar="LIST",
                   help="comma-separated subset of: factual,arithmetic,code,format")
    p.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="write the full report, per-item answers included, to PATH")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default=None,
                   help="weights dtype passed to LLM (default: the LLM's own default)")
    p.add_argument("--weights", choices=("native", "native-int8", "dequantize"), default=None,
                   help="GGUF weights passed to LLM: native blocks with fp32 or int8 activations, or "
                        "dequantized (default: the LLM's own default, native)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "float16", "float32", "bfloat16"), default=None,
                   help="KV cache element type passed to LLM (default: the LLM's own default, auto: float16 "
                        "under float32 compute)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N",
                   help="prompts per generate call (default: all at once, or "
                        f"{SPEC_BATCH_SIZE} for every run when --speculative is on)")
    p.add_argument("--chain-steps", type=int, default=10, metavar="N",
                   help="steps in the p^N pipeline estimate (default 10)")
    p.add_argument("--no-speed", action="store_true", help="skip the batch-1 speed probe")
    p.add_argument("--no-perplexity", action="store_true", help="skip held-out perplexity")
    p.set_defaults(func=run)


def _label(model: str | None) -> str:
    return "default" if model is None else (Path(model).name or model)


def _load(model: str | None, dtype: str | None, weights: str | None = None, kv_cache_dtype: str | None = None) -> Any:
    from fastmode import LLM  # torch comes in here, not at CLI start-up

    kwargs: dict[str, Any] = {"model": model}
    for name, value in (("dtype", dtype), ("weights", weights), ("kv_cache_dtype", kv_cache_dtype)):
        if value is not None:
            kwargs[name] = value
    return LLM(**kwargs)


def run(args: argparse.Namespace) -> int:
    """Evaluate every model, print the table, optionally write JSON."""
    from fastmode.evals.report import format_table, to_json, write_json
    from fastmode.evals.runner import evaluate
    from fastmode.evals.tasks import load_tasks

    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    try:
        tasks = load_tasks(categories=categories, limit_per_category=args.limit)
    except ValueError as exc:
        print(f"fastmode eval: {exc}", file=sys.stderr)
        return 2
    models: list[str | None] = [None if m == "default" else m for m in args.model] if args.model else [None]
    runs: list[tuple[str | None, str | None]] = [(m, None) for m in models]
    batch_size = args.batch_size
    if args.speculative != "off":
        runs.append((models[0], args.speculative))
        batch_size = batch_size or SPEC_BATCH_SIZE

    reports = []
    for model, speculative in runs:
        label = _label(model)
        print(f"[eval] {label}{' +' + speculative if speculative else ''}: "
              f"{len(tasks)} items", file=sys.stderr)
        llm = _load(model, args.dtype, args.weights, args.kv_cache_dtype)
        try:
            report = evaluate(
                llm, tasks, speculative, name=label,
                measure_speed=not args.no_speed,
                measure_perplexity=not args.no_perplexity,
                chain_steps=args.chain_steps,
                batch_size=batch_size,
            )
        except NotImplementedError as exc:
            # The LLM lacks a feature this run asked for (speculative, score).
            print(f"fastmode eval: {exc}", file=sys.stderr)
            return 2
        reports.append(report)
        del llm
        gc.collect()  # free one model's weights before loading the next

    print(format_table(reports, baseline=reports[0]))
    if args.json is not None:
        suite = {
            "num_items": len(tasks),
            "categories": {c: sum(t.category == c for t in tasks) for c in dict.fromkeys(t.category for t in tasks)},
            "limit_per_category": args.limit,
            "batch_size": batch_size,
        }
        write_json(args.json, to_json(reports, suite))
        print(f"[eval] wrote {args.json}", file=sys.stderr)
    return 0
