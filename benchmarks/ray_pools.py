"""One machine's cores as one server with a fast lane, or as two pools on Ray Serve?

Side A: `fastmode serve --num-threads 2`, one engine whose fast lane caps the
batch while fast work runs. Side B: `fastmode serve --ray --pools fast=1,standard=1
--num-threads 1`, two one-thread engines behind Ray Serve's ingress, the fast
pool's engine holding at most 8 sequences. Both sides get the same closed-loop
load over HTTP: `--standard-streams` standard streams and `--fast-streams` fast
streams (service_tier=priority), each request `--output-tokens` long
(ignore_eos), for `--duration-s` seconds. Both servers stay up for the whole
run and are measured alternately (A B B A A B); each figure is the median of
the three runs of its side. `--control` adds a third side, one server with one
engine thread (A B C C B A A B C): on a loaded machine a two-thread engine's
OpenMP regions wait for descheduled threads, and this side tells that apart
from what the pools themselves change.

Per side: fast-tier decode speed per request (tok/s after the first token),
fast TTFT p50, standard output throughput (tok/s, all standard streams
together), and the price per million output tokens two ways: metered (the
engines' machine time, `usage.cost_usd`) and by the hour (the machine's price
times the run's wall time over all tokens out). Both sides' engines are priced
so the machine costs `--usd-per-hour` either way: one engine at the full price,
or each one-thread replica at half of it.

    .venv/bin/python benchmarks/ray_pools.py --control        # ~15 min on a busy 2-core machine
    .venv/bin/python benchmarks/ray_pools.py --duration-s 10  # quick look

Writes runs/ray_pools.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine, pct, write_json  # noqa: E402

PROMPTS = [
    "Explain how a CPU cache works.",
    "Write a short story about a lighthouse keeper.",
    "List five uses of Python dictionaries.",
    "What causes the seasons on Earth?",
    "Describe the water cycle for a child.",
    "Give advice for a first job interview.",
    "Summarize the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
]
FASTMODE = str(Path(sys.executable).with_name("fastmode"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(side: str, args) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    common = [
        "serve",
        "--port",
        str(port),
        "--kv-cache-gib",
        str(args.kv_cache_gib),
        "--speculative",
        "off",
        "--no-serve-spark",
        "--log-level",
        "warning",
    ]
    if side == "one server":
        cmd = [FASTMODE, *common, "--num-threads", "2", "--usd-per-machine-hour", str(args.usd_per_hour)]
    elif side == "one server, 1 thread":
        cmd = [FASTMODE, *common, "--num-threads", "1", "--usd-per-machine-hour", str(args.usd_per_hour)]
    else:
        half = str(args.usd_per_hour / 2)
        cmd = [FASTMODE, *common, "--num-threads", "1", "--usd-per-machine-hour", half]
        cmd += ["--ray", "--pools", "fast=1,standard=1"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{side} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{side} did not start in {args.start_timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


async def stream_once(client: httpx.AsyncClient, url: str, model: str, tier: str, k: int, args) -> dict | None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}],
        "max_tokens": args.output_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "service_tier": "priority" if tier == "fast" else "default",
    }
    t0 = time.perf_counter()
    times, usage = [], None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"tier": tier, "error": r.status_code}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                times.append(time.perf_counter())
    return {"tier": tier, "start": t0, "times": times, "usage": usage}


async def measure(url: str, args) -> dict:
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=100)) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        records: list[dict] = []
        t_end = time.perf_counter() + args.duration_s

        async def worker(tier: str, w: int) -> None:
            k = w
            while time.perf_counter() < t_end:
                rec = await stream_once(client, url, model, tier, k, args)
                if rec is not None:
                    records.append(rec)
                k += 7

        t0 = time.perf_counter()
        tasks = [worker("standard", i) for i in range(args.standard_streams)]
        tasks += [worker("fast", 100 + i) for i in range(args.fast_streams)]
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return summarize(records, wall, args)


def summarize(records: list[dict], wall_s: float, args) -> dict:
    ok = [r for r in records if "error" not in r and len(r["times"]) > 1]
    out: dict = {"wall_s": wall_s, "errors": sum("error" in r for r in records)}
    tokens_all = 0
    cost_all = 0.0
    for tier in ("fast", "standard"):
        rs = [r for r in ok if r["tier"] == tier]
        speeds = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]) for r in rs]
        ttft = [r["times"][0] - r["start"] for r in rs]
        tokens = sum(r["usage"]["completion_tokens"] for r in rs if r["usage"])
        cost = sum(r["usage"].get("cost_usd", 0.0) for r in rs if r["usage"])
        tokens_all += tokens
        cost_all += cost
        out[tier] = {
            "requests": len(rs),
            "decode_tok_s_p50": pct(speeds, 50),
            "ttft_s_p50": pct(ttft, 50),
            "throughput_tok_s": tokens / wall_s,
            "metered_usd_per_mtok": cost / tokens * 1e6 if tokens else None,
        }
    out["hourly_usd_per_mtok"] = args.usd_per_hour * wall_s / 3600 / tokens_all * 1e6 if tokens_all else None
    out["metered_usd_per_mtok"] = cost_all / tokens_all * 1e6 if tokens_all else None
    return out


def median_of(runs: list[dict]) -> dict:
    def med(path):
        vals = []
        for r in runs:
            v = r
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            if v is not None:
                vals.append(v)
        return statistics.median(vals) if vals else None

    keys = ("decode_tok_s_p50", "ttft_s_p50", "throughput_tok_s", "metered_usd_per_mtok", "requests")
    return {
        "fast": {k: med(("fast", k)) for k in keys},
        "standard": {k: med(("standard", k)) for k in keys},
        "hourly_usd_per_mtok": med(("hourly_usd_per_mtok",)),
        "metered_usd_per_mtok": med(("metered_usd_per_mtok",)),
        "errors": sum(r["errors"] for r in runs),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--standard-streams", type=int, default=8)
    ap.add_argument("--fast-streams", type=int, default=2)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--kv-cache-gib", type=float, default=0.25)
    ap.add_argument("--usd-per-hour", type=float, default=1.0, help="the machine's price")
    ap.add_argument("--start-timeout-s", type=float, default=600.0)
    ap.add_argument(
        "--control",
        action="store_true",
        help="also measure one server with one engine thread: on a loaded machine a two-thread engine's "
        "OpenMP regions wait for descheduled threads, which this side separates from the pools' effect",
    )
    ap.add_argument("--out", default="runs/ray_pools.json")
    args = ap.parse_args()
    sides = ("one server", "two pools", "one server, 1 thread") if args.control else ("one server", "two pools")
    # Alternating so that a drift in the shared machine's load reaches every side alike.
    order = (0, 1, 2, 2, 1, 0, 0, 1, 2) if args.control else (0, 1, 1, 0, 0, 1)
    procs = {}
    try:
        for side in sides:
            procs[side] = start(side, args)
            print(f"{side}: up at {procs[side][1]}", file=sys.stderr)
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for i, side in enumerate(order):
            name = sides[side]
            # A short warm-up run before the first measured run of each side.
            if not runs[name]:
                asyncio.run(measure(procs[name][1], argparse.Namespace(**{**vars(args), "duration_s": 5.0})))
            r = asyncio.run(measure(procs[name][1], args))
            r["load_average"] = os.getloadavg()
            runs[name].append(r)
            print(f"run {i + 1}/{len(order)} {name}: {json.dumps(r)}", file=sys.stderr)
    finally:
        for proc, _ in procs.values():
            stop(proc)
    result = {
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "median": {s: median_of(runs[s]) for s in sides},
        "runs": runs,
        "load_average_after": os.getloadavg(),
    }
    write_json(args.out, result)
    print(f"\nload average {os.getloadavg()}; medians of 3 runs each, sides alternating")
    print(
        f"{'':22} {'fast tok/s':>11} {'fast TTFT':>10} {'std tok/s':>10} {'$/Mtok metered':>15} {'$/Mtok hourly':>14}"
    )
    for s in sides:
        m = result["median"][s]
        print(
            f"{s:22} {m['fast']['decode_tok_s_p50'] or 0:11.1f} {m['fast']['ttft_s_p50'] or 0:9.2f}s "
            f"{m['standard']['throughput_tok_s'] or 0:10.1f} {m['metered_usd_per_mtok'] or 0:15.3f} "
            f"{m['hourly_usd_per_mtok'] or 0:14.3f}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
