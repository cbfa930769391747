"""`fastmode bench`: load an OpenAI-compatible endpoint (ours or a peer's) and measure it per tier.

    fastmode bench --base-url http://127.0.0.1:8000 --concurrency 1,4,16 --num-requests 64 \\
        --tier-mix fast=0.2,standard=0.8 --json runs/bench.json --plots runs/bench
    fastmode bench --rate 2 --duration-s 60 --prompts synthetic --input-len uniform:64:256 \\
        --output-len 128 --slo-ttft-s fast=0.5,standard=2 --slo-tpot-s 0.05
    fastmode bench --base-url http://127.0.0.1:8080 --no-tier-field --ignore-eos    # llama.cpp's llama-server

Closed loop (--concurrency, a sweep: one run per level) or open loop (--rate,
Poisson arrivals; also a sweep). Lengths: N, fixed:N, uniform:LO:HI or
lognormal:MEAN:SIGMA[:MAX]; synthetic prompt lengths are approximate (the
client does not tokenize). Tiers go out as service_tier: fast=priority,
standard=default, flex=flex. Metric definitions: docs/bench.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_NUM_REQUESTS = 100


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="load-test an OpenAI-compatible endpoint; latency and goodput per tier",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("endpoint")
    g.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (a trailing /v1 is accepted)")
    g.add_argument("--model", help="model to ask for (default: the first id GET /v1/models lists)")
    g.add_argument("--api-key", help="sent as Authorization: Bearer (default: FASTMODE_API_KEY, else none)")
    g.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                   help="/v1/chat/completions or /v1/completions")
    g.add_argument("--no-tier-field", action="store_true",
                   help="do not send service_tier (peers that refuse unknown fields); tiers stay labels")
    g.add_argument("--no-usage", action="store_true",
                   help="do not send stream_options.include_usage; output tokens are then counted as chunks")
    g.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true so every answer runs to max_tokens")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--extra-body", type=json.loads, default={}, metavar="JSON",
                   help="fields merged into every request body, e.g. '{\"cache_prompt\": false}'")
    g.add_argument("--timeout-s", type=float, default=600.0, help="limit on one whole request")
    g = p.add_argument_group("load (one run per level)")
    lv = g.add_mutually_exclusive_group()
    lv.add_argument("--concurrency", help="closed loop: comma-separated worker counts, e.g. 1,4,16 (default 1)")
    lv.add_argument("--rate", help="open loop: comma-separated Poisson arrival rates in requests/s, e.g. 0.5,1,2")
    g.add_argument("--num-requests", type=int,
                   help=f"measured requests per level (default {DEFAULT_NUM_REQUESTS} unless --duration-s is given)")
    g.add_argument("--duration-s", type=float, help="stop starting requests after this long (per level)")
    g.add_argument("--warmup-requests", type=int, default=0, help="unmeasured requests sent before each level")
    g.add_argument("--seed", type=int, default=0, help="seeds prompts, lengths, tier order and arrivals")
    g = p.add_argument_group("workload")
    g.add_argument("--prompts", default="project",
                   help="'project' (the packaged prompt set), 'synthetic' (--input-len words), or a file, one prompt a line")
    g.add_argument("--input-len", default="128", help="synthetic prompt length in (approximate) tokens")
    out_len = g.add_mutually_exclusive_group()
    out_len.add_argument("--output-len", default="128", help="max_tokens per request (a length distribution)")
    out_len.add_argument("--max-tokens", type=int, help="same as --output-len N")
    g.add_argument("--tier-mix", default="standard=1", help="e.g. fast=0.2,standard=0.8 (exact counts per block)")
    g = p.add_argument_group("SLOs for goodput (SECONDS for every tier, or TIER=SECONDS,...)")
    g.add_argument("--slo-ttft-s", help="time to first token limit")
    g.add_argument("--slo-tpot-s", help="time per output token limit")
    g.add_argument("--slo-e2e-s", help="end-to-end latency limit")
    g = p.add_argument_group("output")
    g.add_argument("--json", dest="json_out", metavar="OUT.json", help="write the results here ('-': stdout, no table)")
    g.add_argument("--plots", metavar="DIR", help="write PNG plots here")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _levels(text: str, kind: type) -> list:
    try:
        vals = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"cannot parse levels {text!r}: use comma-separated numbers") from None
    if not vals:
        raise ValueError("no levels given")
    return vals


def build_specs(args: argparse.Namespace):
    """The workload config and one LoadSpec per level, validated before anything is sent."""
    from fastmode.bench.load import LoadSpec
    from fastmode.bench.workload import DURATION_BLOCK, WorkloadConfig, load_prompt_set

    num = args.num_requests
    if num is None and args.duration_s is None:
        num = DEFAULT_NUM_REQUESTS
    if args.rate:
        mode, levels = "open", _levels(args.rate, float)
    else:
        mode, levels = "closed", _levels(args.concurrency or "1", int)
    specs = [LoadSpec(mode, lv, num, args.duration_s, args.warmup_requests, args.seed) for lv in levels]
    output_len = str(args.max_tokens) if args.max_tokens is not None else args.output_len
    workload = WorkloadConfig(prompts=args.prompts, input_len=args.input_len, output_len=output_len,
                              tier_mix=args.tier_mix, seed=args.seed, block_size=num or DURATION_BLOCK)
    load_prompt_set(workload.prompts)  # a missing or empty prompt file fails here, before any request
    return workload, specs


async def run_bench(args: argparse.Namespace) -> tuple[dict[str, Any], list]:
    """Every level of the sweep; returns (JSON report, LevelRuns)."""
    from fastmode.bench.client import TIER_FIELD, BenchClient, EndpointConfig, first_model_id
    from fastmode.bench.load import run_level
    from fastmode.bench.stats import SLO, finite, summarize_level
    from fastmode.server.config import api_key_from_env  # torch-free: a dataclass and os.environ

    workload, specs = build_specs(args)
    slo = SLO.parse(args.slo_ttft_s, args.slo_tpot_s, args.slo_e2e_s)
    api_key = api_key_from_env(args.api_key)
    model = args.model or await first_model_id(args.base_url, api_key, min(args.timeout_s, 30.0))
    cfg = EndpointConfig(args.base_url, model, args.endpoint, api_key, tier_field=not args.no_tier_field,
                         ignore_eos=args.ignore_eos, temperature=args.temperature, include_usage=not args.no_usage,
                         extra_body=args.extra_body, timeout_s=args.timeout_s)
    progress = not args.no_progress and sys.stderr.isatty()
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    runs, levels = [], []
    async with BenchClient(cfg) as client:
        for spec in specs:
            run_ = await run_level(client, workload, spec, progress)
            level = summarize_level(run_, slo)
            level["requests"] = [r.to_json(run_.t0) for r in sorted(run_.records, key=lambda r: r.index)]
            runs.append(run_)
            levels.append(finite(level))
    setup = {
        "base_url": cfg.base_url, "url": cfg.url, "model": model, "endpoint": cfg.endpoint,
        "service_tier_field": {t.value: v for t, v in TIER_FIELD.items()} if cfg.tier_field else None,
        "ignore_eos": cfg.ignore_eos, "temperature": cfg.temperature, "include_usage": cfg.include_usage,
        "extra_body": cfg.extra_body, "timeout_s": cfg.timeout_s,
        "mode": specs[0].mode, "levels": [s.level for s in specs], "num_requests": specs[0].num_requests,
        "duration_s": specs[0].duration_s, "warmup_requests": specs[0].warmup_requests, "seed": workload.seed,
        "prompts": workload.prompts, "input_len": str(workload.input_len) if workload.prompts == "synthetic" else None,
        "output_len": str(workload.output_len), "tier_mix": {t.value: s for t, s in workload.tier_mix},
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s}, "started_at": started,
    }
    return {"setup": setup, "levels": levels}, runs


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


COLUMNS = ("tier", "reqs", "ok", "err", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50 ms", "TPOT p99 ms",
           "ITL p99 ms", "e2e p50", "e2e p99", "tok/s p50", "out tok/s", "goodput")


def table_rows(level: dict[str, Any]) -> list[list[str]]:
    """One row per tier, then 'all'."""
    rows = []
    for name, t in [*level["tiers"].items(), ("all", level["aggregate"])]:
        tok = t["tok_s_per_request"]["p50"]
        share = t["goodput"]["share"]
        rows.append([name, str(t["num_requests"]), str(t["completed"]), str(t["failed"]),
                     _s(t["ttft_s"]["p50"]), _s(t["ttft_s"]["p90"]), _s(t["ttft_s"]["p99"]),
                     _ms(t["tpot_s"]["p50"]), _ms(t["tpot_s"]["p99"]), _ms(t["itl_s"]["p99"]),
                     _s(t["e2e_s"]["p50"]), _s(t["e2e_s"]["p99"]), "-" if tok is None else f"{tok:.1f}",
                     f"{t['output_tok_s']:.1f}", "-" if share is None else f"{share:.0%}"])
    return rows


def level_title(level: dict[str, Any]) -> str:
    what = f"concurrency {level['concurrency']}" if level["mode"] == "closed" else f"{level['rate_req_s']:g} req/s (Poisson)"
    a = level["aggregate"]
    return (f"{what}: {a['completed']}/{a['num_requests']} completed in {level['window_s']:.1f} s, "
            f"{a['output_tok_s']:.1f} output tok/s, {a['request_s']:.2f} req/s, "
            f"goodput {a['goodput']['request_s']:.2f} req/s")


def format_level(level: dict[str, Any]) -> str:
    """A fixed-width table (times in s unless marked ms), with the errors under it."""
    rows = [list(COLUMNS)] + table_rows(level)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [level_title(level)]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    errors = level["aggregate"]["errors"]
    if errors:
        lines.append("errors: " + ", ".join(f"{k}: {v}" for k, v in errors.items()))
    return "\n".join(lines)


def print_level(level: dict[str, Any]) -> None:
    """rich's table on a terminal wide enough for it, the plain one otherwise (pipes, logs, tests)."""
    rows = table_rows(level)
    try:
        if not sys.stdout.isatty():
            raise ImportError
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(format_level(level) + "\n")
        return
    heads = [c.replace(" ", "\n", 1) for c in COLUMNS]  # two-line headers: "TTFT" over "p50"
    need = 1 + sum(max(len(x) for x in [*h.split("\n"), *(r[i] for r in rows)]) + 3 for i, h in enumerate(heads))
    console = Console()
    if console.width < need:  # rich would squeeze the numbers into ellipses
        print(format_level(level) + "\n")
        return
    table = Table(title=level_title(level), title_justify="left", box=box.SIMPLE_HEAD)
    for i, h in enumerate(heads):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if level["aggregate"]["errors"]:
        console.print("errors: " + ", ".join(f"{k}: {v}" for k, v in level["aggregate"]["errors"].items()))


def run(args: argparse.Namespace) -> int:
    import httpx

    try:
        if not isinstance(args.extra_body, dict):
            raise ValueError("--extra-body must be a JSON object")
        report, runs = asyncio.run(run_bench(args))
    except (ValueError, RuntimeError, OSError, httpx.HTTPError) as e:
        print(f"fastmode bench: {e}", file=sys.stderr)
        return 2
    to_stdout = args.json_out == "-"
    if not to_stdout:
        for level in report["levels"]:
            print_level(level)
    if args.json_out:
        text = json.dumps(report, indent=2)
        if to_stdout:
            print(text)
        else:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(text + "\n")
            print(f"results: {args.json_out}")
    if args.plots:
        from fastmode.bench.plots import write_plots

        paths = write_plots(runs, report["levels"], args.plots, report["setup"]["model"])
        if not to_stdout:
            print("plots: " + ", ".join(str(p) for p in paths))
    return 0 if any(lv["aggregate"]["completed"] for lv in report["levels"]) else 1
