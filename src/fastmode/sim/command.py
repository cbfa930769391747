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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.flags import add_dataclass_args
from fastmode.planner.catalog import hardware_names, model_names
from fastmode.planner.weight_format import FORMATS, format_from_calibration


@dataclass(frozen=True)
class SimulateOptions:
    """What `fastmode simulate` runs: machine, scheduler and workload; each field is one flag."""

    model: str = field(default="llama-3.1-8b", metadata={"choices": model_names})  # catalog model
    hardware: str = field(default="h100", metadata={"choices": hardware_names})  # catalog hardware
    tp: str = "auto"  # devices the model is split over, or 'auto' (fewest that hold the weights)
    weight_format: str | None = field(
        default=None, metadata={"aliases": ("format",), "choices": lambda: sorted(FORMATS)}
    )  # weight storage (none: the calibration file's, else the model's)
    kv_dtype_bytes: float = 2.0  # bytes per KV element
    calibration: str | None = None  # calibration JSON applied to the hardware (fastmode calibrate writes one)
    usd_per_hour: float | None = None  # per device-hour (none: the catalog's)
    fast_lane_max_batch: str = "4"  # batch cap while fast work exists, or 'none'
    max_num_seqs: int = 64  # resident sequences (holding KV) at once
    max_num_batched_tokens: int = 512  # tokens per step: bounds prefill chunks
    block_size: int = 16  # tokens per KV block
    aging_s: float = 60.0  # waiting this long promotes a request one tier for admission; 0 disables aging
    kv_cache_gib: float | None = None  # KV cache size (none: all memory the weights leave)
    prefix_caching: bool = True  # reuse cached KV blocks of shared prompt prefixes
    step_jitter_cv: float = 0.0  # spread each step's time by a mean-1 lognormal factor of this coefficient of variation (seeded by --seed): a shared machine's step-to-step noise
    workload: str | None = None  # JSONL workload file (replaces the generated one)
    save_workload: str | None = None  # write the generated workload here as JSONL
    num_requests: int = 1000  # requests generated
    rate: float = 8.0  # mean requests/s
    arrival: str = field(default="poisson", metadata={"choices": ("poisson", "gamma", "onoff")})  # arrival process
    burstiness: float = 2.0  # gamma: coefficient of variation of inter-arrival times
    on_s: float = 10.0  # onoff: seconds of arrivals per burst
    off_s: float = 10.0  # onoff: quiet seconds between bursts
    prompt_len: str = "512"  # prompt tokens: N, uniform:LO:HI or lognormal:MEAN:SIGMA[:MAX]
    output_len: str = "128"  # output tokens: N, uniform:LO:HI or lognormal:MEAN:SIGMA[:MAX]
    tier_mix: str = "fast=0.1,standard=0.8,flex=0.1"  # share of requests per tier
    seed: int = 0  # seed of the generated workload and the step jitter
    json: bool = False  # print one JSON object


_GROUPS = {
    "machine": ("model", "hardware", "tp", "weight_format", "kv_dtype_bytes", "calibration", "usd_per_hour"),
    "scheduler (defaults are the engine's)": (
        "fast_lane_max_batch",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "aging_s",
        "kv_cache_gib",
        "prefix_caching",
        "step_jitter_cv",
    ),
    "workload": (
        "workload",
        "save_workload",
        "num_requests",
        "rate",
        "arrival",
        "burstiness",
        "on_s",
        "off_s",
        "prompt_len",
        "output_len",
        "tier_mix",
        "seed",
    ),
    "output": ("json",),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate the real scheduler on a hardware cost model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for title, names in _GROUPS.items():
        add_dataclass_args(p, SimulateOptions, only=names, title=title)
    p.set_defaults(func=run)


def build_workload(args: argparse.Namespace):
    from fastmode.sim.distributions import ArrivalProcess, LengthDist
    from fastmode.sim.workload import WorkloadConfig, generate_workload, load_jsonl, save_jsonl

    if args.workload:
        return load_jsonl(args.workload), {"file": args.workload}
    cfg = WorkloadConfig(
        num_requests=args.num_requests,
        arrival=ArrivalProcess(args.arrival, args.rate, args.burstiness, args.on_s, args.off_s),
        prompt_len=LengthDist.parse(args.prompt_len),
        output_len=LengthDist.parse(args.output_len),
        tier_mix=args.tier_mix,
        seed=args.seed,
    )
    reqs = generate_workload(cfg)
    if args.save_workload:
        save_jsonl(reqs, args.save_workload)
    return reqs, {
        "num_requests": cfg.num_requests,
        "arrival": args.arrival,
        "rate_per_s": args.rate,
        "prompt_len": str(cfg.prompt_len),
        "output_len": str(cfg.output_len),
        "tier_mix": {t.value: s for t, s in cfg.tier_mix},
        "seed": cfg.seed,
    }


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
        fmt = format_from_calibration(json.loads(Path(args.calibration).expanduser().read_text()))
    cm = CostModel(hw, model, tp=tp, weight_format=fmt, kv_dtype_bytes=args.kv_dtype_bytes)
    lane = None if str(args.fast_lane_max_batch).lower() in ("none", "0", "off") else int(args.fast_lane_max_batch)
    sched = SchedulerConfig(
        num_blocks=kv_cache_blocks(cm, args.block_size, args.kv_cache_gib),
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        fast_lane_max_batch=lane,
        aging_s=args.aging_s or None,
        max_model_len=model.max_context_tokens,
        enable_prefix_caching=args.prefix_caching,
    )
    usd_device = args.usd_per_hour if args.usd_per_hour is not None else (hw.usd_per_hour or 0.0)
    usd_machine = usd_device * cm.num_devices
    workload, wl_info = build_workload(args)
    result = simulate(
        workload, cm, SimConfig(sched, usd_machine, step_jitter_cv=args.step_jitter_cv, jitter_seed=args.seed)
    )
    report = sim_report(result, usd_machine)
    report["setup"] = {
        "model": model.name,
        "hardware": hw.name,
        "tp": cm.num_devices,
        "weight_format": cm.fmt.name,
        "calibration": args.calibration,
        "usd_per_machine_hour": usd_machine,
        "scheduler": sched.__dict__,
        "workload": wl_info,
        "step_jitter_cv": args.step_jitter_cv,
    }
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
    title = (
        f"{s['model']} on {s['tp']}x {s['hardware']} [{s['weight_format']}], fast lane {lane}, "
        f"max {s['scheduler']['max_num_seqs']} seqs, {s['scheduler']['num_blocks']:,} KV blocks, "
        f"{s['usd_per_machine_hour']:.2f} $/machine-hour"
    )
    print(format_report(report, title))
    return 0
