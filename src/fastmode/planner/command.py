"""`fastmode plan`: what a model costs and delivers on a given piece of hardware.

    fastmode plan --model llama-3.1-8b --hardware h100 --batch 16 --json
    fastmode plan --model llama-3.1-70b --hardware h200 --sweep --plot-dir runs/plots
    fastmode plan --model llama-3.1-8b --hardware h100 --spec \\
        --fast-rps 2 --fast-min-tok-s 150 --standard-rps 20 --standard-max-ttft-s 2

Prints one JSON object with --json, a readable report otherwise. Everything is
computed by the cost model (no engine, no torch); see docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from fastmode.flags import add_dataclass_args
from fastmode.planner.catalog import hardware_names, model_names
from fastmode.planner.weight_format import FORMATS

TIERS = ("fast", "standard", "flex")


@dataclass(frozen=True)
class PlanOptions:
    """What `fastmode plan` evaluates; each field is one flag."""

    model: str = field(metadata={"choices": model_names})  # catalog model
    hardware: str = field(default="h100", metadata={"choices": hardware_names})  # catalog hardware
    tp: str = "auto"  # devices the model is split over, or 'auto' (fewest that fit)
    weight_format: str | None = field(
        default=None, metadata={"aliases": ("format",), "choices": lambda: sorted(FORMATS)}
    )  # weight storage format (none: the model's)
    dtype_bytes: float | None = None  # store every tensor at this many bytes/param (overrides --format)
    kv_dtype_bytes: float = 2.0  # bytes per KV element
    batch: int = 1  # sequences decoding together
    context: int = 4096  # mean context tokens per sequence while decoding
    calibration: str | None = None  # calibration JSON overriding the hardware's efficiencies (docs/planner.md)
    usd_per_hour: float | None = None  # price per device-hour, overriding the catalog
    spec: bool = False  # evaluate with speculative decoding
    spec_acceptance: float = 0.7  # per-token acceptance rate a
    spec_draft_len: int = 4  # draft tokens k per verify
    spec_draft_cost: float = 0.05  # draft/target per-token cost ratio c
    sweep: bool = False  # add the bus curve (batch 1..--max-batch)
    max_batch: int = 256  # largest batch of the bus curve and the fleet search
    plot_dir: str | None = None  # write bus_curve.png and frontier.png here
    prompt_tokens: int = 2000  # mean prompt tokens (all tiers)
    output_tokens: int = 500  # mean output tokens (all tiers)
    ttft_quantile: float = 0.9  # quantile of TTFT the fleet's SLOs hold at
    max_utilization: float = 0.85  # busiest a replica may run
    fast_rps: float = 0.0  # fast requests/s
    fast_min_tok_s: float = 0.0  # fast per-user tok/s SLO
    fast_max_ttft_s: float = math.inf  # fast TTFT SLO (s)
    standard_rps: float = 0.0  # standard requests/s
    standard_min_tok_s: float = 0.0  # standard per-user tok/s SLO
    standard_max_ttft_s: float = math.inf  # standard TTFT SLO (s)
    flex_rps: float = 0.0  # flex requests/s
    flex_min_tok_s: float = 0.0  # flex per-user tok/s SLO
    flex_max_ttft_s: float = math.inf  # flex TTFT SLO (s)
    pools_out: str | None = None  # write the fleet as a pools spec file for `fastmode serve --ray --pools FILE`
    json: bool = False  # print one JSON object


_GROUPS = {
    "machine and load": (
        "model",
        "hardware",
        "tp",
        "weight_format",
        "dtype_bytes",
        "kv_dtype_bytes",
        "batch",
        "context",
        "calibration",
        "usd_per_hour",
    ),
    "speculative decoding": ("spec", "spec_acceptance", "spec_draft_len", "spec_draft_cost"),
    "sweeps and plots": ("sweep", "max_batch", "plot_dir"),
    "fleet recommendation (any --TIER-rps > 0 turns it on)": (
        "prompt_tokens",
        "output_tokens",
        "ttft_quantile",
        "max_utilization",
        *(f"{t}_{x}" for t in TIERS for x in ("rps", "min_tok_s", "max_ttft_s")),
        "pools_out",
    ),
    "output": ("json",),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="predict speed and price of a model on a hardware (cost model)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for title, names in _GROUPS.items():
        add_dataclass_args(p, PlanOptions, only=names, title=title)
    p.set_defaults(func=run)


def build_report(args: argparse.Namespace) -> dict[str, Any]:
    """Everything `fastmode plan` prints, as a JSON-ready dict."""
    from fastmode.planner.catalog import load_hardware, load_model
    from fastmode.planner.fleet import TierDemand, recommend_fleet
    from fastmode.planner.operating_point import bus_curve, evaluate, layout_for_load, power_of_two_batches
    from fastmode.planner.speculative import SpecConfig

    hw = load_hardware(args.hardware, args.calibration)
    model = load_model(args.model)
    cost_kwargs = {
        "weight_format": args.weight_format,
        "dtype_bytes": args.dtype_bytes,
        "kv_dtype_bytes": args.kv_dtype_bytes,
    }
    tp = None if str(args.tp) == "auto" else int(args.tp)
    cm = layout_for_load(hw, model, args.batch, args.context, tp, **cost_kwargs)
    spec = SpecConfig(args.spec_acceptance, args.spec_draft_len, args.spec_draft_cost) if args.spec else None
    point = evaluate(cm, args.batch, args.context, spec, usd_per_hour_per_device=args.usd_per_hour)
    report: dict[str, Any] = point.to_dict()
    report.update(
        {
            "tp": cm.num_devices,
            "devices_needed": cm.devices_needed(args.batch, args.context),
            "devices_needed_weights_only": cm.devices_needed(),
            "weight_bytes": cm.weight_bytes,
            "kv_bytes_per_token": model.kv_bytes_per_token(args.kv_dtype_bytes),
            "crossover_batch": cm.crossover_batch(args.context),
            "calibration": args.calibration,
            "assumptions": [
                "decode only: every sequence at --context tokens; prefill not in the step time",
                "$/Mtok counts output tokens; price per device-hour from the catalog unless --usd-per-hour",
                "efficiencies eta_m/eta_c/overhead from the catalog or the calibration file",
            ],
        }
    )
    if args.spec:
        report["no_spec"] = {
            k: v
            for k, v in evaluate(cm, args.batch, args.context, None, usd_per_hour_per_device=args.usd_per_hour)
            .to_dict()
            .items()
            if k in ("step_time_s", "per_user_tok_s", "aggregate_tok_s", "usd_per_mtok")
        }
    batches = power_of_two_batches(args.max_batch)
    if args.sweep or args.plot_dir:
        report["bus_curve"] = [p.to_dict() for p in bus_curve(cm, batches, args.context, spec, args.usd_per_hour)]
    demands = [
        TierDemand(
            t,
            getattr(args, f"{t}_rps"),
            args.prompt_tokens,
            args.output_tokens,
            getattr(args, f"{t}_min_tok_s"),
            getattr(args, f"{t}_max_ttft_s"),
        )
        for t in TIERS
        if getattr(args, f"{t}_rps") > 0
    ]
    if demands:
        fleet = recommend_fleet(
            cm,
            demands,
            spec or SpecConfig(args.spec_acceptance, args.spec_draft_len, args.spec_draft_cost),
            batches,
            args.max_utilization,
            args.ttft_quantile,
            args.usd_per_hour,
        )
        report["fleet"] = fleet.to_dict()
        if args.pools_out:
            from pathlib import Path

            Path(args.pools_out).write_text(json.dumps(fleet.pools_spec(), indent=2) + "\n", encoding="utf-8")
            report["pools_out"] = args.pools_out
    if args.plot_dir:
        report["plots"] = _write_plots(args, cm, model, batches, spec, cost_kwargs)
    return report


def _write_plots(args, cm, model, batches, spec, cost_kwargs) -> list[str]:
    from pathlib import Path

    from fastmode.planner.catalog import hardware_names, load_hardware
    from fastmode.planner.operating_point import bus_curve, frontier
    from fastmode.planner.plots import plot_bus_curve, plot_frontier

    out = Path(args.plot_dir)
    paths = [plot_bus_curve(bus_curve(cm, batches, args.context, spec, args.usd_per_hour), out / "bus_curve.png")]
    series = {}
    for name in hardware_names():
        hw = load_hardware(name, args.calibration) if name == args.hardware else load_hardware(name)
        if hw.kind == "cpu" and name != args.hardware:
            continue  # the local CPU only belongs on the plot when asked about
        price = args.usd_per_hour if name == args.hardware else None
        series[name] = frontier(hw, model, batches, args.context, spec, price, **cost_kwargs)
    paths.append(
        plot_frontier(
            series, out / "frontier.png", f"{model.name}: per-user speed vs price, {args.context}-token context"
        )
    )
    return [str(p) for p in paths]


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.3e}"
    return str(v)


def render_text(r: dict[str, Any]) -> str:
    """A human-readable version of `build_report`'s dict."""
    est = " (estimated price)" if r["price_is_estimate"] else ""
    lines = [
        f"{r['model']} on {r['devices']}x {r['hardware']} [{r['weight_format']}], batch {r['batch']}"
        f"{' x ' + str(r['microbatches']) + ' microbatches' if r['microbatches'] > 1 else ''}, "
        f"context {r['context_tokens']}",
        f"  step time        {_fmt(r['step_time_s'] * 1e3)} ms ({r['bound']}-bound; mem {_fmt(r['mem_s'] * 1e3)} ms,"
        f" compute {_fmt(r['comp_s'] * 1e3)} ms, comm {_fmt(r['comm_s'] * 1e3)} ms, overhead {_fmt(r['overhead_s'] * 1e3)} ms)",
        f"  per-user         {_fmt(r['per_user_tok_s'])} tok/s",
        f"  aggregate        {_fmt(r['aggregate_tok_s'])} tok/s",
        f"  price            {_fmt(r['usd_per_mtok'])} $/Mtok at {_fmt(r['usd_per_hour'])} $/h{est}",
        f"  fits             {r['fits']} ({_fmt(r['memory_per_device_bytes'] / 1e9)} GB per device; "
        f"needs {r['devices_needed']} device(s), {r['devices_needed_weights_only']} for weights alone)",
        f"  compute-bound from batch {r['crossover_batch']} at this context"
        if r["crossover_batch"]
        else "  memory-bound at every batch at this context (each sequence's KV read outweighs its FLOPs)",
    ]
    if r.get("speculative"):
        s = r["speculative"]
        lines.append(
            f"  speculation      a={s['acceptance']} k={s['draft_len']} c={s['draft_cost_ratio']}: "
            f"{_fmt(s['expected_tokens'])} tokens/verify, speed-up {_fmt(s['speedup'])}x "
            f"(closed form {_fmt(s['closed_form_speedup'])}x)"
        )
    if r.get("bus_curve"):
        lines += ["", "  batch  per-user tok/s  aggregate tok/s     $/Mtok  bound"]
        lines += [
            f"  {p['batch']:>5}  {p['per_user_tok_s']:>14,.1f}  {p['aggregate_tok_s']:>15,.0f}  "
            f"{_fmt(p['usd_per_mtok']):>9}  {p['bound']}"
            for p in r["bus_curve"]
        ]
    if r.get("fleet"):
        f = r["fleet"]
        lines += ["", f"  fleet (TTFT at p{int(f['ttft_quantile'] * 100)}, utilisation <= {f['max_utilization']}):"]
        for t in f["tiers"]:
            if not t["feasible"]:
                lines.append(f"    {t['tier']:<9} infeasible: {t['reason']}")
                continue
            lines.append(
                f"    {t['tier']:<9} {t['replicas']} replica(s) x {r['devices']} dev, batch cap {t['batch_cap']}, "
                f"spec {'on' if t['speculative'] else 'off'}: {_fmt(t['per_user_tok_s'])} tok/s/user, "
                f"TTFT {_fmt(t['ttft_s'])} s, util {_fmt(t['utilization'])}, {_fmt(t['usd_per_mtok'])} $/Mtok"
            )
        lines.append(f"    total {_fmt(f['usd_per_hour'])} $/h on {f['devices']} devices")
        lines += [f"    note: {n}" for n in f["notes"]]
    if r.get("plots"):
        lines += ["", *[f"  wrote {p}" for p in r["plots"]]]
    if r.get("pools_out"):
        lines += ["", f"  wrote the pools spec {r['pools_out']} (fastmode serve --ray --pools {r['pools_out']})"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.pools_out and not any(getattr(args, f"{t}_rps") > 0 for t in TIERS):
        print("fastmode plan: --pools-out writes the fleet recommendation; give a --TIER-rps > 0", file=sys.stderr)
        return 2
    report = build_report(args)
    print(json.dumps(json_safe(report), allow_nan=False) if args.json else render_text(report))
    return 0


def json_safe(v: Any) -> Any:
    """Plain JSON: numpy scalars to Python numbers, inf/nan to null."""
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
