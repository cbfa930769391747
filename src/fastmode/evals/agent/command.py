"""`fastmode eval --agent`: the agent task suite through a live server, per route.

    fastmode eval --agent                                   # every task on every route
    fastmode eval --agent --routes standard,spark --per-length 2 --json runs/agent.json --plot runs/agent.png
    fastmode eval --agent --url http://127.0.0.1:8000 --tasks agent-001,agent-02 --load 0

The eval starts `fastmode serve` itself (the embedded model and its Spark
student) unless `--url` names a running server, keeps `--load` standard-tier
streams decoding on the main model for the whole run, and runs every task on
every route in turn, alternating the routes' order from one task to the next
so slow drifts of a shared machine fall on all routes alike. Before a task's timed
runs it runs once, untimed, per model: each route then finds the task's prompts in
the prefix cache, instead of the first route to run paying the prefill for the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.evals.agent.routes import DEFAULT_RETRIES, ROUTES


@dataclass(frozen=True)
class AgentOptions:
    """What `fastmode eval --agent` runs; each field is one flag."""

    agent: bool = False  # run the agent task suite through the server instead of the one-shot suite
    routes: str = "all"  # comma-separated subset of: standard,fast,fast-ngram,spark,spark-retry
    tasks: tuple[str, ...] = field(default=(), metadata={"metavar": "IDS"})  # task ids or id prefixes (none: all)
    lengths: tuple[int, ...] = field(default=(), metadata={"metavar": "NS"})  # chain lengths to run (none: 1-10)
    per_length: int | None = field(default=None, metadata={"metavar": "N"})  # at most N tasks per chain length
    retries: int = DEFAULT_RETRIES  # the verifier route's extra attempts per rejected step
    load: int = 2  # standard-tier streams decoding on the main model during the run (0: none)
    url: str | None = None  # a running fastmode server to use; none: start one
    serve_args: str = ""  # extra flags for the server the eval starts, as one string
    seed: int = 0  # seeds the verifier's sampled retries
    extra_turns: int = 2  # calls allowed beyond the reference's length
    plot: Path | None = field(default=None, metadata={"parse": Path, "metavar": "PATH"})  # write the PNG plot here


def _uptime_load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run_agent(args: argparse.Namespace) -> int:
    """Run the suite, print the table, and write the JSON record and the plot where asked."""
    import httpx

    from fastmode.evals.agent.loop import run_task
    from fastmode.evals.agent.report import format_table, plot, summarize, to_json
    from fastmode.evals.agent.routes import BackgroundLoad, parse_routes, served_models, server_process
    from fastmode.evals.agent.tasks import load_agent_tasks
    from fastmode.evals.report import write_json

    try:
        tasks = load_agent_tasks(ids=args.tasks or None, steps=args.lengths or None, limit_per_length=args.per_length)
        routes = parse_routes(args.routes)
    except ValueError as e:
        print(f"fastmode eval: {e}", file=sys.stderr)
        return 2
    if args.retries < 0 or args.load < 0 or args.extra_turns < 0:
        print("fastmode eval: --retries, --load and --extra-turns must be >= 0", file=sys.stderr)
        return 2

    started = time.time()
    start_load = _uptime_load()
    server = contextlib.nullcontext(args.url.rstrip("/")) if args.url else server_process(shlex.split(args.serve_args))
    print(f"[agent] {len(tasks)} tasks x {len(routes)} routes; load average {start_load}", file=sys.stderr)
    with server as url, httpx.Client(base_url=url, timeout=900.0) as client:
        models = served_models(client)
        skipped = [r.name for r in routes if r.model not in models]
        if skipped:
            print(f"[agent] the server serves no {', '.join(sorted({ROUTES[n].model for n in skipped}))} model: "
                  f"skipping {', '.join(skipped)}", file=sys.stderr)  # fmt: skip
            routes = [r for r in routes if r.model in models]
        if not routes:
            print("fastmode eval: no route can run on this server", file=sys.stderr)
            return 2
        # Warm-up, not recorded: the first request of each model compiles its grammar and fills caches.
        for model_key in dict.fromkeys(r.model for r in routes):
            route = next(r for r in routes if r.model == model_key)
            run_task(client, route.request(models, 0), tasks[0], route_name="warm-up", extra_turns=0)
        records: dict[str, list] = {r.name: [] for r in routes}
        load = BackgroundLoad(url, models["main"], args.load)

        def write_record(complete: bool) -> None:
            """The JSON record of the tasks run so far: rewritten after every task, so an
            interrupted run keeps what it measured (`run.complete` says whether it finished)."""
            run_info: dict[str, Any] = {
                "command": "fastmode " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                "complete": complete,
                "models": models,
                "routes": {r.name: {**vars(r), "retries": args.retries if r.verifier else 0} for r in routes},
                "tasks": [t.id for t in tasks],
                "seed": args.seed,
                "extra_turns": args.extra_turns,
                "server": args.url or "started by the eval",
                "serve_args": args.serve_args,
                "background_load": load.to_dict() if args.load and "main" in models else None,
                "started_unix": started,
                "wall_s": time.time() - started,
                "load_average_start": start_load,
                "load_average_end": _uptime_load(),
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            }
            done = [summarize(r.name, records[r.name], r.description) for r in routes]
            write_json(args.json, to_json(done, run_info))

        with load if args.load and "main" in models else contextlib.nullcontext():
            for i, task in enumerate(tasks):
                order = routes if i % 2 == 0 else routes[::-1]
                # Untimed, once per model: the task's whole trajectory enters the prefix cache, so no
                # route pays prefill that a route run before it on the same task would have saved it.
                for model_key in dict.fromkeys(r.model for r in order):
                    route = next(r for r in order if r.model == model_key)
                    run_task(
                        client,
                        route.request(models, 0),
                        task,
                        route_name="warm-up",
                        seed=args.seed,
                        extra_turns=args.extra_turns,
                    )
                cells = []
                for route in order:
                    rec = run_task(
                        client,
                        route.request(models, args.retries),
                        task,
                        route_name=route.name,
                        seed=args.seed,
                        extra_turns=args.extra_turns,
                    )
                    records[route.name].append(rec)
                    right = sum(bool(s.right) for s in rec.steps)
                    cells.append(f"{route.name} {'ok' if rec.solved else 'no'} {right}/{task.steps} {rec.wall_s:.1f}s")
                print(f"[agent] {i + 1}/{len(tasks)} {task.id} n={task.steps}: " + "; ".join(cells), file=sys.stderr)
                if args.json is not None:
                    write_record(complete=False)
    summaries = [summarize(r.name, records[r.name], r.description) for r in routes]
    print(format_table(summaries))
    print(f"load average: {start_load} at the start, {_uptime_load()} at the end")
    if args.json is not None:
        write_record(complete=True)
        print(f"[agent] wrote {args.json}", file=sys.stderr)
    if args.plot is not None:
        print(f"[agent] wrote {plot(summaries, args.plot)}", file=sys.stderr)
    return 0
