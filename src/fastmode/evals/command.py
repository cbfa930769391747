"""`fastmode eval`: accuracy, speed and perplexity of one or more models, side by side.

    fastmode eval                                   # the embedded model
    fastmode eval --model teacher.gguf --model spark/ --speculative ngram --json runs/eval.json
    fastmode eval --limit 5 --no-speed --no-perplexity   # a quick smoke run
    fastmode eval --agent --json runs/agent.json --plot runs/agent.png   # the agent tasks, per route

Every `--model` is evaluated plainly. With `--speculative ngram|draft` the
first model (the teacher) is evaluated once more with speculative decoding,
and the table shows how often its output is identical to the plain run; all
runs then generate in batches of 4, where the engine actually speculates.

`--agent` runs the multi-step tool-use suite instead, through a live server on
every route (standard, fast, fast with n-gram speculation, Spark, Spark with a
verifier); see fastmode.evals.agent.command for its flags.
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.engine.config import CacheConfig, LoadConfig
from fastmode.evals.agent.command import AgentOptions
from fastmode.flags import add_dataclass_args

SPECULATIVE_CHOICES = ("off", "ngram", "draft")
# The engine speculates only while few sequences decode together (its
# speculative_max_batch, 4 by default). A speculative comparison therefore
# runs in small batches, and so does its baseline: the same batch shapes on
# both sides keep float rounding identical, so any text difference is the
# speculative decoder's doing.
SPEC_BATCH_SIZE = 4


@dataclass(frozen=True)
class EvalOptions:
    """What `fastmode eval` runs, beyond how each model is loaded; each field is one flag."""

    model: tuple[str, ...] = field(
        default=(), metadata={"metavar": "PATH"}
    )  # model path or name ('default' = the embedded model, 'spark' = its Spark); none: the embedded model
    speculative: str = field(
        default="off", metadata={"choices": SPECULATIVE_CHOICES}
    )  # also evaluate the first model with this speculative mode
    limit: int | None = field(default=None, metadata={"metavar": "N"})  # at most N items per category (a quick run)
    categories: str | None = field(
        default=None, metadata={"metavar": "LIST"}
    )  # comma-separated subset of: factual,arithmetic,code,format
    json: Path | None = field(
        default=None, metadata={"parse": Path, "metavar": "PATH"}
    )  # write the full report, per-item answers included, to PATH
    batch_size: int | None = field(
        default=None, metadata={"metavar": "N"}
    )  # prompts per generate call (none: all at once, or 4 for every run when --speculative is on)
    chain_steps: int = field(default=10, metadata={"metavar": "N"})  # steps in the p^N pipeline estimate
    speed: bool = True  # run the batch-1 speed probe
    perplexity: bool = True  # measure held-out perplexity


def register(subparsers: Any) -> None:
    """Add the `eval` subcommand to the `fastmode` parser."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate models on the built-in task suite",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    add_dataclass_args(p, EvalOptions, repeatable=("model",), title="eval")
    add_dataclass_args(p, LoadConfig, only=("dtype", "weights"), title="model loading")
    add_dataclass_args(p, CacheConfig, only=("kv_cache_dtype",), title="model loading (KV cache)")
    add_dataclass_args(p, AgentOptions, title="agent tasks (--agent)")
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
    if args.agent:
        from fastmode.evals.agent.command import run_agent

        return run_agent(args)
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
        print(f"[eval] {label}{' +' + speculative if speculative else ''}: {len(tasks)} items", file=sys.stderr)
        llm = _load(model, args.dtype, args.weights, args.kv_cache_dtype)
        try:
            report = evaluate(
                llm,
                tasks,
                speculative,
                name=label,
                measure_speed=args.speed,
                measure_perplexity=args.perplexity,
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
