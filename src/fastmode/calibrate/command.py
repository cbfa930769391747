"""`fastmode calibrate`: measure this machine's engine and fit the cost model to it.

    fastmode calibrate                                   # embedded model, ~2 min on 2 cores
    fastmode calibrate --quick --model tests/tiny-llama  # seconds
    fastmode calibrate --batches 1,4,16,64 --contexts 256 --out runs/cal.json --usd-per-hour 0.1

Times `LLMEngine.step()` for decode batches x contexts and prefill chunks,
fits overhead, per-token cost, effective bandwidth and compute efficiency by
least squares, writes the calibration JSON (docs/planner.md) and prints the
fast lane's derived price against a standard batch. See docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from fastmode.flags import add_dataclass_args


def _split(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number of tokens, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("--split-tokens must be >= 0")
    return n


_split.__name__ = "auto|N"  # argparse names the type in its error messages


@dataclass(frozen=True)
class CalibrateOptions:
    """What `fastmode calibrate` measures, fits and prices; each field is one flag.

    The sweep's defaults are SweepConfig's (a test holds them equal); they are spelled out here
    because SweepConfig's module imports the engine, and building the CLI must not import torch.
    """

    model: str | None = None  # HF directory or .gguf (none: embedded SmolLM2-135M-Instruct)
    dtype: str = field(
        default="auto", metadata={"choices": ("auto", "bfloat16", "float32")}
    )  # as the engine resolves it (auto: bf16 only where the CPU computes it natively)
    hardware: str = "local"  # catalog entry the calibration applies to
    batches: tuple[int, ...] = (
        1,
        2,
        4,
        8,
        12,
        16,
        32,
        64,
    )  # decode batch sizes, comma-separated (12: just above the kernel switch at 8)
    contexts: tuple[int, ...] = (32, 128, 512)  # decode context lengths (tokens), comma-separated
    chunks: tuple[int, ...] = (32, 128, 512)  # prefill chunk sizes (tokens), comma-separated
    repeats: int = 5  # timed steps per point (their mean is fitted)
    rounds: int = 1  # passes over the whole sweep, each point's steps averaged over them: on a shared machine whose speed drifts, 2-4 spread a slow spell over every point
    threads: int | None = None  # torch threads (none: torch's)
    clock: str = field(
        default="wall", metadata={"choices": ("wall", "cpu")}
    )  # time steps by wall clock, or by process CPU time (needs --threads 1; for shared machines)
    quick: bool = False  # tiny sweep for tests: batches 1,2,4, contexts 16,32, chunks 8,32
    out: str = "~/.cache/fastmode/calibration-local.json"  # calibration JSON to write
    refit: str | None = field(
        default=None, metadata={"metavar": "FILE"}
    )  # re-fit the points stored in a calibration file; measure nothing
    split_tokens: int | None = field(
        default=None, metadata={"parse": _split, "metavar": "auto|N"}
    )  # fit steps of at most N tokens apart from larger ones (0: one fit); auto (none): at the engine's kernel switch (8 tokens with GGUF blocks run natively), where the points allow
    usd_per_hour: float | None = None  # machine price (none: the catalog's)
    fast_lane_max_batch: int = 4  # the fast lane's batch cap priced against a standard batch
    standard_batch: int = 64  # a full standard batch (engine max_num_seqs)
    price_context: int | None = None  # context for prices (none: largest measured)
    spec_acceptance: float = 0.6  # draft acceptance assumed for the speculation threshold
    spec_draft_len: int = 4  # draft length k for the threshold
    json: bool = False  # print one JSON object


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure the engine on this machine and fit the cost model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataclass_args(p, CalibrateOptions, title="calibrate")
    p.set_defaults(func=run)


def sweep_from_args(args: argparse.Namespace):
    from fastmode.calibrate.measure import SweepConfig

    if args.quick:
        return SweepConfig(
            batches=(1, 2, 4),
            contexts=(16, 32),
            chunk_sizes=(8, 32),
            prefill_tokens_per_size=64,
            repeats=2,
            warmup=1,
            prefill_repeats=1,
            rounds=args.rounds,
            num_threads=args.threads,
            clock=args.clock,
        )
    return SweepConfig(
        batches=args.batches,
        contexts=args.contexts,
        chunk_sizes=args.chunks,
        repeats=args.repeats,
        rounds=args.rounds,
        num_threads=args.threads,
        clock=args.clock,
    )


def calibrate(args: argparse.Namespace, progress=lambda s: None) -> dict[str, Any]:
    """Measure, fit, write; returns the report (calibration dict, fit, prices)."""
    import time
    from pathlib import Path

    from fastmode.calibrate.calibration_file import load_points, write_calibration
    from fastmode.calibrate.pricing import tier_prices
    from fastmode.calibrate.run import calibrate_loaded
    from fastmode.loader import load_model as load_engine_model
    from fastmode.planner.speculative import SpecConfig, break_even_batch

    sweep = sweep_from_args(args)
    t0 = time.perf_counter()
    loaded = load_engine_model(args.model, args.dtype)
    progress(f"loaded {loaded.name} ({args.dtype}) in {time.perf_counter() - t0:.1f} s")
    points, fitted_from = None, ""
    if args.refit:
        points = load_points(args.refit)
        fitted_from = f"re-fit of {args.refit}: " + json.loads(Path(args.refit).expanduser().read_text())["fitted_from"]
    run = calibrate_loaded(
        loaded, sweep, args.hardware, args.usd_per_hour, progress, points, fitted_from, args.split_tokens
    )
    usd = run.calibration.get("usd_per_hour") or 0.0
    ctx = args.price_context or (max(p.decode_context for p in run.points) if args.refit else max(sweep.contexts))
    ctx = int(round(ctx))
    prices = tier_prices(run.cost_model, usd, ctx, {"fast": args.fast_lane_max_batch, "standard": args.standard_batch})
    # Where n-gram speculation (a free draft) stops paying on this machine: the engine's
    # --speculative-max-batch. Stored in the calibration file next to the fit it comes from.
    spec = SpecConfig(acceptance=args.spec_acceptance, draft_len=args.spec_draft_len, draft_cost_ratio=0.0)
    spec_max_batch = break_even_batch(run.cost_model, ctx, spec, max_batch=max(args.standard_batch, 1))
    run.calibration["speculative_max_batch"] = {
        "value": spec_max_batch,
        "acceptance": spec.acceptance,
        "draft_len": spec.draft_len,
        "context": ctx,
    }
    path = write_calibration(run.calibration, args.out)
    fit = run.fit
    return {
        "path": str(path),
        "calibration": run.calibration,
        "fit": {
            **fit.calibration_fields(),
            "max_abs_rel_error": fit.max_abs_rel_error,
            "rms_rel_error": fit.rms_rel_error,
            "excluded_points": list(fit.excluded),
        },
        "prices": [p.to_dict() for p in prices],
        "usd_per_hour": usd,
        "speculative_max_batch": spec_max_batch,
        "wall_s": time.perf_counter() - t0,
    }


def run(args: argparse.Namespace) -> int:
    from fastmode.calibrate.pricing import TierPrice, format_prices

    progress = (lambda s: None) if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    report = calibrate(args, progress)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    f = report["fit"]
    split = f.get("small_step_max_tokens", 0)
    tiles = f" (in tiles of {f['token_tile']} tokens)" if f.get("token_tile") else ""
    for label, g in (
        [(f"steps of <= {split} tokens", f["small_step"]), ("larger steps" + tiles, f)] if split else [("fit", f)]
    ):
        print(
            f"{label}: overhead {g['overhead_s'] * 1e3:.3f} ms/step, {g['per_token_s'] * 1e6:.1f} us/token, "
            f"{g['per_seq_s'] * 1e3:.3f} ms/sequence, {g['per_kv_token_s'] * 1e6:.2f} us/cached token read, "
            f"effective bandwidth {g['mem_bw_GBps']:.1f} GB/s, eta_c {g['eta_c']:.3f}"
        )
    pts = report["calibration"]["points"]
    print(
        f"     error max {f['max_abs_rel_error']:.1%}, rms {f['rms_rel_error']:.1%} over {len(pts)} points"
        + "".join(
            f"; left out as an outlier: {pts[i]['kind']} batch {pts[i].get('num_decodes', 1)} "
            f"({pts[i]['fit_rel_error']:+.0%})"
            for i in f["excluded_points"]
        )
    )
    print(format_prices([TierPrice(**p) for p in report["prices"]], report["usd_per_hour"] or 0.0))
    sm = report["calibration"]["speculative_max_batch"]
    print(
        f"speculation pays up to {report['speculative_max_batch']} decoding sequences "
        f"(acceptance {sm['acceptance']}, k {sm['draft_len']}, context {sm['context']}): "
        f"serve with --speculative-max-batch {max(1, report['speculative_max_batch'])}"
    )
    print(f"wrote {report['path']} in {report['wall_s']:.0f} s")
    return 0
