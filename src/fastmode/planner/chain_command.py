"""`fastmode chain`: expected time and cost to a correct n-step result, per mode.

    fastmode chain                       # the fast-mode articles' modes, 10 steps, all strategies
    fastmode chain --steps 20 --strategy step --json
    fastmode chain --mode mine:0.85:400:12 --mode cheap:0.7:2000:1
    fastmode chain --from-agent-eval runs/agent.json --steps 5   # the routes as measured

A mode is NAME:P_STEP:TOK_S:USD_PER_MTOK (output tokens). By default the modes are
those of the two articles on Anthropic's and OpenAI's fast modes: Opus 4.6 standard
and fast, and Codex-Spark. `--from-agent-eval` takes them instead from the routes
`fastmode eval --agent --json` measured: per-step accuracy, time to first token,
output rate, output per step and metered price. See fastmode.planner.chain for
the three retry strategies and their formulas.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from fastmode.flags import add_dataclass_args
from fastmode.planner.chain import Mode


def _parse_mode(text: str) -> Mode:
    parts = text.split(":")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError("mode must be NAME:P_STEP:TOK_S:USD_PER_MTOK")
    name, p, tok_s, usd = parts
    try:
        return Mode(name, float(p), float(tok_s), float(usd))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


_parse_mode.__name__ = "mode"  # argparse names the type in its error messages


@dataclass(frozen=True)
class ChainOptions:
    """What `fastmode chain` compares; each field is one flag."""

    steps: int = 10  # pipeline length n
    mode: tuple[Mode, ...] = field(
        default=(), metadata={"parse": _parse_mode, "metavar": "NAME:P:TOK_S:USD_PER_MTOK"}
    )  # a mode to compare; none given: the fast-mode articles' Opus 4.6 standard and fast, and Codex-Spark
    strategy: str = field(
        default="all", metadata={"choices": ("pipeline", "restart", "step", "all")}
    )  # retry strategy to price, or all of them
    tokens_per_step: int = 1000  # output tokens per step
    latency_s: float = 0.0  # per-step TTFT + round trip (s)
    from_agent_eval: Path | None = field(
        default=None, metadata={"parse": Path, "metavar": "PATH"}
    )  # price the routes measured by `fastmode eval --agent --json PATH` (their own tokens and latency per step)
    json: bool = False  # print one JSON object


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chain",
        help="reliability calculator: p^n, time and cost to a correct result",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dataclass_args(p, ChainOptions, repeatable=("mode",), title="chain")
    p.set_defaults(func=run)


def build_report(args: argparse.Namespace) -> dict:
    import dataclasses

    from fastmode.planner.chain import STRATEGIES, STRATEGY_TEXT, compare, seed_modes, seed_table

    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    modes = [dataclasses.replace(m, tokens_per_step=args.tokens_per_step, latency_s=args.latency_s) for m in args.mode]
    notes: list[str] = []
    if args.from_agent_eval is not None:
        modes += _measured_modes(args.from_agent_eval, notes)
    elif not modes:
        modes = seed_modes(args.tokens_per_step, args.latency_s)
    strategies = STRATEGIES if args.strategy == "all" else (args.strategy,)
    return {
        "n_steps": args.steps,
        "p_n_table": seed_table(args.steps),
        "modes": [dataclasses.asdict(m) for m in modes],
        "strategies": {s: STRATEGY_TEXT[s] for s in strategies},
        "results": [r.to_dict() for r in compare(modes, args.steps, strategies)],
        "notes": notes,
    }


def _measured_modes(path: Path, notes: list[str]) -> list:
    """The routes of an agent eval's JSON as modes; a clear exit for a file that is not one."""
    from fastmode.planner.chain import modes_from_agent_eval

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        modes, skipped = modes_from_agent_eval(document)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"fastmode chain: cannot read {path}: {e}") from None
    notes += skipped
    if not modes:
        raise SystemExit(f"fastmode chain: no route in {path} can be priced: {'; '.join(skipped)}")
    return modes


def render_text(r: dict) -> str:
    n = r["n_steps"]
    lines = [f"p^n for n = {n} steps:"]
    lines += [f"  {row['p_step']:.3f}^{n} = {row['p_success'] * 100:5.1f}%   {row['source']}" for row in r["p_n_table"]]
    lines += ["", "modes:"]
    lines += [
        f"  {m['name']:<11} p={m['p_step']:.3f}  {m['tok_s']:g} tok/s  ${m['usd_per_mtok']:g}/Mtok  "
        f"{m['tokens_per_step']} tok/step  {m['note']}"
        for m in r["modes"]
    ]
    lines += [f"  not priced: {note}" for note in r.get("notes", [])]
    for strategy, text in r["strategies"].items():
        lines += ["", f"strategy '{strategy}': {text}", "  mode         P(one go)   E[steps]   E[time] s   E[cost] $"]
        lines += [
            f"  {x['mode']:<11} {x['p_success_once'] * 100:8.1f}%  {x['expected_steps']:9.1f}  "
            f"{x['expected_time_s']:10.1f}  {x['expected_cost_usd']:10.4g}"
            for x in r["results"]
            if x["strategy"] == strategy
        ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    report = build_report(args)
    print(json.dumps(report) if args.json else render_text(report))
    return 0
