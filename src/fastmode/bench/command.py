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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.flags import add_dataclass_args

DEFAULT_NUM_REQUESTS = 100


def _json_object(text: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None


@dataclass(frozen=True)
class BenchOptions:
    """What `fastmode bench` sends, how hard and what it reports; each field is one flag."""

    base_url: str = "http://127.0.0.1:8000"  # server root (a trailing /v1 is accepted)
    model: str | None = None  # model to ask for (none: the first id GET /v1/models lists)
    api_key: str | None = None  # sent as Authorization: Bearer (none: FASTMODE_API_KEY, else none)
    endpoint: str = field(
        default="chat", metadata={"choices": ("chat", "completions")}
    )  # /v1/chat/completions or /v1/completions
    tier_field: bool = True  # send service_tier (--no-tier-field: peers that refuse unknown fields; tiers stay labels)
    usage: bool = True  # send stream_options.include_usage (--no-usage: output tokens are then counted as chunks)
    ignore_eos: bool = False  # send ignore_eos: true so every answer runs to max_tokens
    temperature: float = 0.0  # sampling temperature (0: greedy)
    extra_body: dict[str, Any] = field(
        default_factory=dict, metadata={"parse": _json_object, "metavar": "JSON"}
    )  # fields merged into every request body, e.g. '{"cache_prompt": false}'
    timeout_s: float = 600.0  # limit on one whole request
    concurrency: str | None = field(
        default=None, metadata={"exclusive": "load"}
    )  # closed loop: comma-separated worker counts, e.g. 1,4,16 (none: 1)
    rate: str | None = field(
        default=None, metadata={"exclusive": "load"}
    )  # open loop: comma-separated Poisson arrival rates in requests/s, e.g. 0.5,1,2
    num_requests: int | None = (
        None  # measured requests per level (none: DEFAULT_NUM_REQUESTS = 100 unless --duration-s is given)
    )
    duration_s: float | None = None  # stop starting requests after this long (per level)
    warmup_requests: int = 0  # unmeasured requests sent before each level
    seed: int = 0  # seeds prompts, lengths, tier order and arrivals
    prompts: str = (
        "project"  # 'project' (the packaged prompt set), 'synthetic' (--input-len words), or a file, one prompt a line
    )
    input_len: str = "128"  # synthetic prompt length in (approximate) tokens
    output_len: str = field(
        default="128", metadata={"exclusive": "output"}
    )  # max_tokens per request (a length distribution)
    max_tokens: int | None = field(default=None, metadata={"exclusive": "output"})  # same as --output-len N
    tier_mix: str = "standard=1"  # e.g. fast=0.2,standard=0.8 (exact counts per block)
    slo_ttft_s: str | None = None  # time to first token limit
    slo_tpot_s: str | None = None  # time per output token limit
    slo_e2e_s: str | None = None  # end-to-end latency limit
    json_out: str | None = field(
        default=None, metadata={"aliases": ("json",), "metavar": "OUT.json"}
    )  # write the results here ('-': stdout, no table)
    plots: str | None = field(default=None, metadata={"metavar": "DIR"})  # write PNG plots here
    progress: bool = True  # show a progress bar (on a terminal)


_GROUPS = {
    "endpoint": (
        "base_url",
        "model",
        "api_key",
        "endpoint",
        "tier_field",
        "usage",
        "ignore_eos",
        "temperature",
        "extra_body",
        "timeout_s",
    ),
    "load (one run per level)": ("concurrency", "rate", "num_requests", "duration_s", "warmup_requests", "seed"),
    "workload": ("prompts", "input_len", "output_len", "max_tokens", "tier_mix"),
    "SLOs for goodput (SECONDS for every tier, or TIER=SECONDS,...)": ("slo_ttft_s", "slo_tpot_s", "slo_e2e_s"),
    "output": ("json_out", "plots", "progress"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint; latency and goodput per tier",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for title, names in _GROUPS.items():
        add_dataclass_args(p, BenchOptions, only=names, title=title)
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
    workload = WorkloadConfig(
        prompts=args.prompts,
        input_len=args.input_len,
        output_len=output_len,
        tier_mix=args.tier_mix,
        seed=args.seed,
        block_size=num or DURATION_BLOCK,
    )
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
    cfg = EndpointConfig(
        args.base_url,
        model,
        args.endpoint,
        api_key,
        tier_field=args.tier_field,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        include_usage=args.usage,
        extra_body=args.extra_body,
        timeout_s=args.timeout_s,
    )
    progress = args.progress and sys.stderr.isatty()
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
        "base_url": cfg.base_url,
        "url": cfg.url,
        "model": model,
        "endpoint": cfg.endpoint,
        "service_tier_field": {t.value: v for t, v in TIER_FIELD.items()} if cfg.tier_field else None,
        "ignore_eos": cfg.ignore_eos,
        "temperature": cfg.temperature,
        "include_usage": cfg.include_usage,
        "extra_body": cfg.extra_body,
        "timeout_s": cfg.timeout_s,
        "mode": specs[0].mode,
        "levels": [s.level for s in specs],
        "num_requests": specs[0].num_requests,
        "duration_s": specs[0].duration_s,
        "warmup_requests": specs[0].warmup_requests,
        "seed": workload.seed,
        "prompts": workload.prompts,
        "input_len": str(workload.input_len) if workload.prompts == "synthetic" else None,
        "output_len": str(workload.output_len),
        "tier_mix": {t.value: s for t, s in workload.tier_mix},
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
        "started_at": started,
    }
    return {"setup": setup, "levels": levels}, runs


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


COLUMNS = (
    "tier",
    "reqs",
    "ok",
    "err",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "TPOT p50 ms",
    "TPOT p99 ms",
    "ITL p99 ms",
    "e2e p50",
    "e2e p99",
    "tok/s p50",
    "out tok/s",
    "goodput",
)


def table_rows(level: dict[str, Any]) -> list[list[str]]:
    """One row per tier, then 'all'."""
    rows = []
    for name, t in [*level["tiers"].items(), ("all", level["aggregate"])]:
        tok = t["tok_s_per_request"]["p50"]
        share = t["goodput"]["share"]
        rows.append(
            [
                name,
                str(t["num_requests"]),
                str(t["completed"]),
                str(t["failed"]),
                _s(t["ttft_s"]["p50"]),
                _s(t["ttft_s"]["p90"]),
                _s(t["ttft_s"]["p99"]),
                _ms(t["tpot_s"]["p50"]),
                _ms(t["tpot_s"]["p99"]),
                _ms(t["itl_s"]["p99"]),
                _s(t["e2e_s"]["p50"]),
                _s(t["e2e_s"]["p99"]),
                "-" if tok is None else f"{tok:.1f}",
                f"{t['output_tok_s']:.1f}",
                "-" if share is None else f"{share:.0%}",
            ]
        )
    return rows


def level_title(level: dict[str, Any]) -> str:
    what = (
        f"concurrency {level['concurrency']}"
        if level["mode"] == "closed"
        else f"{level['rate_req_s']:g} req/s (Poisson)"
    )
    a = level["aggregate"]
    return (
        f"{what}: {a['completed']}/{a['num_requests']} completed in {level['window_s']:.1f} s, "
        f"{a['output_tok_s']:.1f} output tok/s, {a['request_s']:.2f} req/s, "
        f"goodput {a['goodput']['request_s']:.2f} req/s"
    )


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
