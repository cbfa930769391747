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
from typing import Any


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


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


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="measure the engine on this machine and fit the cost model",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="as the engine resolves it (auto: bf16 only where the CPU computes it natively)")
    p.add_argument("--hardware", default="local", help="catalog entry the calibration applies to (default local)")
    p.add_argument("--batches", type=_ints, default=(1, 2, 4, 8, 12, 16, 32, 64),
                   help="decode batch sizes, comma-separated (12: just above the kernel switch at 8)")
    p.add_argument("--contexts", type=_ints, default=(32, 128, 512), help="decode context lengths (tokens)")
    p.add_argument("--chunks", type=_ints, default=(32, 128, 512), help="prefill chunk sizes (tokens)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per point (their mean is fitted)")
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over the whole sweep, each point's steps averaged over them: on a shared machine "
                        "whose speed drifts, 2-4 spread a slow spell over every point (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="time steps by wall clock, or by process CPU time (needs --threads 1; for shared machines)")
    p.add_argument("--quick", action="store_true", help="tiny sweep for tests: batches 1,2,4, contexts 16,32, chunks 8,32")
    p.add_argument("--out", default="~/.cache/fastmode/calibration-local.json", help="calibration JSON to write")
    p.add_argument("--refit", metavar="FILE", help="re-fit the points stored in a calibration file; measure nothing")
    p.add_argument("--split-tokens", type=_split, default=None, metavar="auto|N",
                   help="fit steps of at most N tokens apart from larger ones (0: one fit); auto (default): at the "
                        "engine's kernel switch (8 tokens with GGUF blocks run natively), where the points allow")
    p.add_argument("--usd-per-hour", type=float, default=None, help="machine price (default: the catalog's)")
    p.add_argument("--fast-lane-max-batch", type=int, default=4)
    p.add_argument("--standard-batch", type=int, default=64, help="a full standard batch (engine max_num_seqs)")
    p.add_argument("--price-context", type=int, default=None, help="context for prices (default: largest measured)")
    p.add_argument("--spec-acceptance", type=float, default=0.6,
                   help="draft acceptance assumed for the speculation threshold (default 0.6)")
    p.add_argument("--spec-draft-len", type=int, default=4, help="draft length k for the threshold (default 4)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def sweep_from_args(args: argparse.Namespace):
    from fastmode.calibrate.measure import SweepConfig

    if args.quick:
        return SweepConfig(batches=(1, 2, 4), contexts=(16, 32), chunk_sizes=(8, 32), prefill_tokens_per_size=64,
                           repeats=2, warmup=1, prefill_repeats=1, rounds=args.rounds, num_threads=args.threads,
                           clock=args.clock)
    return SweepConfig(batches=args.batches, contexts=args.contexts, chunk_sizes=args.chunks, repeats=args.repeats,
                       rounds=args.rounds, num_threads=args.threads, clock=args.clock)


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
    run = calibrate_loaded(loaded, sweep, args.hardware, args.usd_per_hour, progress, points, fitted_from,
                           args.split_tokens)
    usd = run.calibration.get("usd_per_hour") or 0.0
    ctx = args.price_context or (max(p.decode_context for p in run.points) if args.refit else max(sweep.contexts))
    ctx = int(round(ctx))
    prices = tier_prices(run.cost_model, usd, ctx, {"fast": args.fast_lane_max_batch, "standard": args.standard_batch})
    # Where n-gram speculation (a free draft) stops paying on this machine: the engine's
    # --speculative-max-batch. Stored in the calibration file next to the fit it comes from.
    spec = SpecConfig(acceptance=args.spec_acceptance, draft_len=args.spec_draft_len, draft_cost_ratio=0.0)
    spec_max_batch = break_even_batch(run.cost_model, ctx, spec, max_batch=max(args.standard_batch, 1))
    run.calibration["speculative_max_batch"] = {"value": spec_max_batch, "acceptance": spec.acceptance,
                                                "draft_len": spec.draft_len, "context": ctx}
    path = write_calibration(run.calibration, args.out)
    fit = run.fit
    return {"path": str(path), "calibration": run.calibration,
            "fit": {**fit.calibration_fields(), "max_abs_rel_error": fit.max_abs_rel_error,
                    "rms_rel_error": fit.rms_rel_error, "excluded_points": list(fit.excluded)},
            "prices": [p.to_dict() for p in prices], "usd_per_hour": usd,
            "speculative_max_batch": spec_max_batch, "wall_s": time.perf_counter() - t0}


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
    for label, g in ([(f"steps of <= {split} tokens", f["small_step"]), ("larger steps" + tiles, f)] if split
                     else [("fit", f)]):
        print(f"{label}: overhead {g['overhead_s'] * 1e3:.3f} ms/step, {g['per_token_s'] * 1e6:.1f} us/token, "
              f"{g['per_seq_s'] * 1e3:.3f} ms/sequence, {g['per_kv_token_s'] * 1e6:.2f} us/cached token read, "
              f"effective bandwidth {g['mem_bw_GBps']:.1f} GB/s, eta_c {g['eta_c']:.3f}")
    pts = report["calibration"]["points"]
    print(f"     error max {f['max_abs_rel_error']:.1%}, rms {f['rms_rel_error']:.1%} over {len(pts)} points"
          + "".join(f"; left out as an outlier: {pts[i]['kind']} batch {pts[i].get('num_decodes', 1)} "
                    f"({pts[i]['fit_rel_error']:+.0%})" for i in f["excluded_points"]))
    print(format_prices([TierPrice(**p) for p in report["prices"]], report["usd_per_hour"] or 0.0))
    sm = report["calibration"]["speculative_max_batch"]
    print(f"speculation pays up to {report['speculative_max_batch']} decoding sequences "
          f"(acceptance {sm['acceptance']}, k {sm['draft_len']}, context {sm['context']}): "
          f"serve with --speculative-max-batch {max(1, report['speculative_max_batch'])}")
    print(f"wrote {report['path']} in {report['wall_s']:.0f} s")
    return 0
