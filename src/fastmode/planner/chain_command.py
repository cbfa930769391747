"""`fastmode chain`: expected time and cost to a correct n-step result, per mode.

    fastmode chain                       # the fast-mode articles' modes, 10 steps, all strategies
    fastmode chain --steps 20 --strategy step --json
    fastmode chain --mode mine:0.85:400:12 --mode cheap:0.7:2000:1

A mode is NAME:P_STEP:TOK_S:USD_PER_MTOK (output tokens). By default the modes are
those of the two articles on Anthropic's and OpenAI's fast modes: Opus 4.6 standard
and fast, and Codex-Spark. See fastmode.planner.chain for the three retry strategies
and their formulas.
"""

from __future__ import annotations

import argparse
import json


def _parse_mode(text: str):
    from fastmode.planner.chain import Mode

    parts = text.split(":")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError("mode must be NAME:P_STEP:TOK_S:USD_PER_MTOK")
    name, p, tok_s, usd = parts
    try:
        return Mode(name, float(p), float(tok_s), float(usd))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chain", help="reliability calculator: p^n, time and cost to a correct result",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="pipeline length n (default 10)")
    p.add_argument("--mode", action="append", type=_parse_mode, metavar="NAME:P:TOK_S:USD_PER_MTOK",
                   help="a mode to compare (repeatable); default: the fast-mode articles' Opus 4.6 "
                        "standard and fast, and Codex-Spark")
    p.add_argument("--strategy", choices=("pipeline", "restart", "step", "all"), default="all")
    p.add_argument("--tokens-per-step", type=int, default=1000, help="output tokens per step")
    p.add_argument("--latency-s", type=float, default=0.0, help="per-step TTFT + round trip (s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def build_report(args: argparse.Namespace) -> dict:
    import dataclasses

    from fastmode.planner.chain import STRATEGIES, STRATEGY_TEXT, compare, seed_modes, seed_table

    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    if args.mode:
        modes = [dataclasses.replace(m, tokens_per_step=args.tokens_per_step,
                                     latency_s=args.latency_s) for m in args.mode]
    else:
        modes = seed_modes(args.tokens_per_step, args.latency_s)
    strategies = STRATEGIES if args.strategy == "all" else (args.strategy,)
    return {
        "n_steps": args.steps,
        "p_n_table": seed_table(args.steps),
        "modes": [dataclasses.asdict(m) for m in modes],
        "strategies": {s: STRATEGY_TEXT[s] for s in strategies},
        "results": [r.to_dict() for r in compare(modes, args.steps, strategies)],
    }


def render_text(r: dict) -> str:
    n = r["n_steps"]
    lines = [f"p^n for n = {n} steps:"]
    lines += [f"  {row['p_step']:.3f}^{n} = {row['p_success'] * 100:5.1f}%   {row['source']}" for row in r["p_n_table"]]
    lines += ["", "modes:"]
    lines += [f"  {m['name']:<11} p={m['p_step']:.3f}  {m['tok_s']:g} tok/s  ${m['usd_per_mtok']:g}/Mtok  "
              f"{m['tokens_per_step']} tok/step  {m['note']}" for m in r["modes"]]
    for strategy, text in r["strategies"].items():
        lines += ["", f"strategy '{strategy}': {text}",
                  "  mode         P(one go)   E[steps]   E[time] s   E[cost] $"]
        lines += [f"  {x['mode']:<11} {x['p_success_once'] * 100:8.1f}%  {x['expected_steps']:9.1f}  "
                  f"{x['expected_time_s']:10.1f}  {x['expected_cost_usd']:10.3f}"
                  for x in r["results"] if x["strategy"] == strategy]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = build_report(args)
    print(json.dumps(report) if args.json else render_text(report))
    return 0
