"""The engine stepping on its own thread, as the server runs it, against the same engine on the main thread.

    .venv/bin/python benchmarks/engine_thread.py --threads 2

Three configurations, each in a fresh process (an OpenMP runtime cannot be
reset inside one), taking turns for --repeats rounds:

- main: `LLM.generate` on the main thread, every request queued at once, at most
  --clients running (the reference);
- async: `AsyncEngine` as `fastmode serve` runs it: the model loaded on the main
  thread, steps on the engine thread, --clients closed-loop asyncio clients (no HTTP);
- async-two-pools: the same, but the main thread keeps its OpenMP worker pool
  (`engine/openmp.py` not applied): what the server did before.

Every request has a random --prompt-len-token prompt and decodes --tokens
tokens (greedy, ignore_eos). Prints output tok/s and the CPU cores the process
kept busy per configuration (best round, and every round in the JSON).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("main", "async", "async-two-pools")


def measure(mode: str, args: argparse.Namespace) -> dict:
    """One configuration in this process: {"tok_s", "cores"}."""
    import asyncio
    import random

    from fastmode import LLM, SamplingParams
    from fastmode.engine import async_engine

    rng = random.Random(0)
    prompts = [
        [rng.randrange(1000, 40000) for _ in range(args.prompt_len)] for _ in range(args.requests + args.clients)
    ]
    warm, timed = prompts[: args.clients], prompts[args.clients :]
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    # At most --clients sequences at once in every mode, so the main-thread reference batches as the clients do.
    llm = LLM(num_threads=args.threads, draft_model=None, enable_prefix_caching=False, max_num_seqs=args.clients)
    llm.generate(
        warm[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )  # load-time warm-up, main thread

    def clock() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    if mode == "main":
        llm.generate(warm, params)
        c0, t0 = clock(), time.perf_counter()
        outs = llm.generate(timed, params)
        wall = time.perf_counter() - t0
        tokens = sum(len(o.token_ids) for o in outs)
        return {"tok_s": tokens / wall, "cores": (clock() - c0) / wall}

    if mode == "async-two-pools":
        async_engine.release_thread_pool = lambda: False
    engine = async_engine.AsyncEngine(llm.engine, "bench")

    async def client(queue: list, counts: list) -> None:
        while queue:
            prompt = queue.pop()
            n = 0
            async for o in engine.generate(prompt, params):
                n = len(o.token_ids)
            counts.append(n)

    async def run(queue: list) -> tuple[int, float, float]:
        counts: list[int] = []
        c0, t0 = clock(), time.perf_counter()
        await asyncio.gather(*[client(queue, counts) for _ in range(args.clients)])
        return sum(counts), time.perf_counter() - t0, clock() - c0

    try:
        asyncio.run(run(list(warm)))
        tokens, wall, cpu = asyncio.run(run(list(timed)))
    finally:
        engine.shutdown()
    return {"tok_s": tokens / wall, "cores": cpu / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clients", type=int, default=16, help="concurrent requests (default 16)")
    p.add_argument("--requests", type=int, default=48, help="timed requests per configuration (default 48)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "engine_thread.json")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # internal: measure one configuration
    args = p.parse_args()

    if args.mode:
        print(json.dumps(measure(args.mode, args)))
        return

    from benchmarks.common import machine, write_json

    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("out", "mode", "repeats")]
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in MODES:
            proc = subprocess.run(
                [sys.executable, __file__, f"--mode={mode}", *forwarded], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[mode].append(res)
            print(f"round {r + 1} {mode:>16}: {res['tok_s']:7.1f} tok/s, {res['cores']:.2f} cores busy", flush=True)
    best = {m: max(rs, key=lambda x: x["tok_s"]) for m, rs in runs.items()}
    info = machine()
    print(
        f"\nmachine: {info['cpu']} ({info['isa']}), {info['cores']} cores; {args.clients} clients, "
        f"{args.requests} requests of {args.prompt_len} + {args.tokens} tokens, {args.threads} threads"
    )
    print(f"{'configuration':>16} {'out tok/s':>9} {'cores busy':>10} {'vs main':>8}")
    for m in MODES:
        print(
            f"{m:>16} {best[m]['tok_s']:9.1f} {best[m]['cores']:10.2f} {best[m]['tok_s'] / best['main']['tok_s']:7.2f}x"
        )
    out = write_json(
        args.out, {"machine": info, "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "best": best}
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
