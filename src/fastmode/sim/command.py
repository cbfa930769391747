"""`fastmode simulate`: run the engine's scheduler against a cost model.

    fastmode simulate --model llama-3.1-8b --hardware h100 --rate 8 --num-requests 2000 \\
        --tier-mix fast=0.1,standard=0.8,flex=0.1 --prompt-len 512 --output-len lognormal:128:0.6
    fastmode simulate --model smollm2-135m --hardware local --calibration ~/.cache/fastmode/calibration-local.json \\
        --kv-cache-gib 1 --workload runs/load.jsonl --json

Lengths: N, uniform:LO:HI or lognormal:MEAN:SIGMA[:MAX]. No torch, no model
weights: the step times come from the planner's cost model (docs/simulator.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="simulate the real scheduler on a hardware cost model",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from fastmode.planner.catalog import hardware_names, model_names
    from fastmode.planner.weight_format import FORMATS

    g = p.add_argument_group("machine")
    g.add_argument("--model", default="llama-3.1-8b", choices=model_names())
    g.add_argument("--hardware", default="h100", choices=hardware_names())
    g.add_argument("--tp", default="auto", help="devices the model is split over, or 'auto' (fewest that hold the weights)")
    g.add_argument("--format", dest="weight_format", choices=sorted(FORMATS),
                   help="weight storage (default: the calibration file's, else the model's)")
    g.add_argument("--kv-dtype-bytes", type=float, default=2.0)
    g.add_argument("--calibration", help="calibration JSON applied to the hardware (fastmode calibrate writes one)")
    g.add_argument("--usd-per-hour", type=float, help="per device-hour (default: the catalog's)")
    g = p.add_argument_group("scheduler (defaults are the engine's)")
    g.add_argument("--fast-lane-max-batch", default="4", help="batch cap while fast work exists, or 'none'")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--aging-s", type=float, default=60.0, help="0 disables aging")
    g.add_argument("--kv-cache-gib", type=float, help="KV cache size (default: all memory the weights leave)")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--step-jitter-cv", type=float, default=0.0,
                   help="spread each step's time by a mean-1 lognormal factor of this coefficient of variation "
                        "(seeded by --seed): a shared machine's step-to-step noise (default 0)")
    g = p.add_argument_group("workload")
    g.add_argument("--workload", help="JSONL workload file (replaces the generated one)")
    g.add_argument("--save-workload", help="write the generated workload here as JSONL")
    g.add_argument("--num-requests", type=int, default=1000)
    g.add_argument("--rate", type=float, default=8.0, help="mean requests/s")
    g.add_argument("--arrival", default="poisson", choices=["poisson", "gamma", "onoff"])
    g.add_argument("--burstiness", type=float, default=2.0, help="gamma: coefficient of variation of inter-arrival times")
    g.add_argument("--on-s", type=float, default=10.0, help="onoff: seconds of arrivals per burst")
    g.add_argument("--off-s", type=float, default=10.0, help="onoff: quiet seconds between bursts")
    g.add_argument("--prompt-len", default="512")
    g.add_argument("--output-len", default="128")
    g.add_argument("--tier-mix", default="fast=0.1,standard=0.8,flex=0.1")
    g.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def build_workload(args: argparse.Namespace):
    from fastmode.sim.distributions import ArrivalProcess, LengthDist
    from fastmode.sim.workload import WorkloadConfig, generate_workload, load_jsonl, save_jsonl

    if args.workload:
        return load_jsonl(args.workload), {"file": args.workload}
    cfg = WorkloadConfig(
        num_requests=args.num_requests,
        arrival=ArrivalProcess(args.arrival, args.rate, args.burstiness, args.on_s, args.off_s),
        prompt_len=LengthDist.parse(args.prompt_len), output_len=LengthDist.parse(args.output_len),
        tier_mix=args.tier_mix, seed=args.seed)
    reqs = generate_workload(cfg)
    if args.save_workload:
        save_jsonl(reqs, args.save_workload)
    return reqs, {"num_requests": cfg.num_requests, "arrival": args.arrival, "rate_per_s": args.rate,
                  "prompt_len": str(cfg.prompt_len), "output_len": str(cfg.output_len),
                  "tier_mix": {t.value: s for t, s in cfg.tier_mix}, "seed": cfg.seed}


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    from fastmode.engine.scheduler import SchedulerConfig
    from fastmode.planner.catalog import load_hardware, load_model
    from fastmode.planner.cost_model import CostModel
    from fastmode.sim.report import sim_report
    from fastmode.sim.simulator import SimConfig, kv_cache_blocks, simulate

    hw = load_hardware(args.hardware, args.calibration)
    model = load_model(args.model)
    tp = None if str(args.tp) == "auto" else int(args.tp)
    fmt = args.weight_format
    if fmt is None and args.calibration:  # price the weights as the calibrated engine held them
        fmt = json.loads(Path(args.calibration).expanduser().read_text()).get("weight_format")
    cm = CostModel(hw, model, tp=tp, weight_format=fmt, kv_dtype_bytes=args.kv_dtype_bytes)
    lane = None if str(args.fast_lane_max_batch).lower() in ("none", "0", "off") else int(args.fast_lane_max_batch)
    sched = SchedulerConfig(
        num_blocks=kv_cache_blocks(cm, args.block_size, args.kv_cache_gib), block_size=args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        fast_lane_max_batch=lane, aging_s=args.aging_s or None, max_model_len=model.max_context_tokens,
        enable_prefix_caching=not args.no_prefix_caching)
    usd_device = args.usd_per_hour if args.usd_per_hour is not None else (hw.usd_per_hour or 0.0)
    usd_machine = usd_device * cm.num_devices
    workload, wl_info = build_workload(args)
    result = simulate(workload, cm, SimConfig(sched, usd_machine, step_jitter_cv=args.step_jitter_cv,
                                              jitter_seed=args.seed))
    report = sim_report(result, usd_machine)
    report["setup"] = {"model": model.name, "hardware": hw.name, "tp": cm.num_devices,
                       "weight_format": cm.fmt.name, "calibration": args.calibration,
                       "usd_per_machine_hour": usd_machine, "scheduler": sched.__dict__, "workload": wl_info,
                       "step_jitter_cv": args.step_jitter_cv}
    return report


def run(args: argparse.Namespace) -> int:
    from fastmode.sim.report import format_report

    try:
        report = build_report(args)
    except ValueError as e:  # a bad figure in the arguments or the workload file: say which, no traceback
        print(f"fastmode simulate: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    s = report["setup"]
    lane = s["scheduler"]["fast_lane_max_batch"]
    title = (f"{s['model']} on {s['tp']}x {s['hardware']} [{s['weight_format']}], fast lane {lane}, "
             f"max {s['scheduler']['max_num_seqs']} seqs, {s['scheduler']['num_blocks']:,} KV blocks, "
             f"{s['usd_per_machine_hour']:.2f} $/machine-hour")
    print(format_report(report, title))
    return 0
