"""Does a step under a tiered load cost what a calibration step of the same shape costs? A script, not a test.

    python benchmarks/validation/load_twin_steps.py                  # ~4 min on 2 cores
    python benchmarks/validation/load_twin_steps.py --batch 2 --requests 120

When a validation run (benchmarks/validation/sim_validation.py) finds the load's steps slower than
the fitted cost model, this separates two explanations: the engine under load does more
work per step than the calibration's engines (its state, its scheduler, its mix of steps),
or the steps cost the same and the fit priced something else than what a load adds up.

It replays the validation's seeded tiered load (its defaults, at --rate) on the engine.
Every --every-s seconds of the load, with the replay's clock stopped, a twin engine built
as the calibration sweep builds its engines (calibrate.measure.sweep_engine) runs 3 decode
steps at --batch over sequences of its own, whose contexts pass through the load's range.
So both sets of steps are timed in the same minutes of the same process: the load's decode
steps at that batch and the twin's, each in a band of mean context, their mean and median,
and the ratios. Prints the machine; writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4, help="decode batch compared (default 4, the fast lane's cap)")
    p.add_argument("--requests", type=int, default=200, help="requests in the load (default 200)")
    p.add_argument(
        "--rate", type=float, default=1.75, help="requests/s (default 1.75, near sim_validation's own choice)"
    )
    p.add_argument("--every-s", type=float, default=1.0, help="seconds of load between the twin's bursts (default 1)")
    p.add_argument("--bands", default="60-100,100-140,60-140", help="mean-context bands compared")
    p.add_argument("--out", default="runs/load_twin_steps.json")
    return p.parse_args(argv)


def summary(times: list[float]) -> dict:
    return {"n": len(times), "mean_s": statistics.fmean(times), "median_s": statistics.median(times)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.batch < 1 or args.requests < 1 or args.rate <= 0 or args.every_s <= 0:
        raise SystemExit("--batch, --requests, --rate and --every-s must be positive")
    bands = [tuple(int(x) for x in b.split("-")) for b in args.bands.split(",")]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.validation
    import torch

    from benchmarks.validation import sim_validation as sv
    from benchmarks.validation.replay import replay
    from fastmode.calibrate.measure import SweepConfig, sweep_engine
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.loader import load_model
    from fastmode.sampling_params import SamplingParams

    torch.set_num_threads(1)
    vargs = sv.parse_args(["--rate", str(args.rate), "--duration-s", str(args.requests / args.rate)])
    loaded = load_model(vargs.model, vargs.dtype)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    workload, _ = sv.make_workload(vargs, None, None, 1.0, log)
    dtype = "float32" if str(loaded.dtype).endswith("float32") else "bfloat16"
    engine = LLMEngine(
        EngineConfig(
            dtype=dtype,
            kv_cache_gib=0.5,
            max_num_seqs=vargs.max_num_seqs,
            fast_lane_max_batch=vargs.fast_lane_max_batch,
            num_threads=1,
            speculative="off",
        ),
        loaded=loaded,
    )
    hi = max(b for _, b in bands)
    twin = sweep_engine(loaded, SweepConfig(num_threads=1, clock="cpu"), args.batch, 512, args.batch * (hi + 64))
    rng = random.Random(0)
    vocab = loaded.config.vocab_size
    lo = min(a for a, _ in bands)
    twin_steps: list[tuple[float, float]] = []  # (mean context, seconds)

    def burst() -> int:
        if not twin.has_unfinished():  # new sequences from the lowest band's context up to the highest's
            for _ in range(args.batch):
                twin.add_request(
                    [rng.randrange(vocab) for _ in range(lo)],
                    SamplingParams(temperature=0.0, max_tokens=hi - lo + 1, ignore_eos=True),
                )
            while twin.scheduler.waiting or any(s.is_prefilling for s in twin.scheduler.running):
                twin.step()
        for _ in range(3):
            ctx = statistics.fmean(s.num_computed_tokens for s in twin.scheduler.running)
            t0 = time.process_time()
            out = twin.step()
            dt = time.process_time() - t0
            if len(out) == args.batch:
                twin_steps.append((ctx, dt))
            if not twin.has_unfinished():
                break
        return len(twin_steps)

    log(f"replaying {len(workload)} requests at {args.rate}/s, the twin every {args.every_s} s of load...")
    t0 = time.perf_counter()
    real = replay(engine, workload, seed=vargs.seed, clock="cpu", probe=burst, probe_every_s=args.every_s)
    load_steps = [
        (statistics.fmean(ctxs), dt)
        for (chunks, ctxs), (_, dt, _) in zip(real.shapes, real.steps)
        if not chunks and len(ctxs) == args.batch
    ]
    rows = []
    for a, b in bands:
        ld = [dt for c, dt in load_steps if a <= c < b]
        tw = [dt for c, dt in twin_steps if a <= c < b]
        if ld and tw:
            L, T = summary(ld), summary(tw)
            rows.append(
                {
                    "band": [a, b],
                    "load": L,
                    "twin": T,
                    "ratio_mean": L["mean_s"] / T["mean_s"],
                    "ratio_median": L["median_s"] / T["median_s"],
                }
            )
    machine = sv.machine_info(1)
    rep = {
        "machine": machine,
        "model": loaded.name,
        "batch": args.batch,
        "rate": args.rate,
        "requests": len(workload),
        "wall_s": time.perf_counter() - t0,
        "bands": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=2) + "\n")
    print(
        f"machine: {machine['processor']}, {machine['cpus']} CPUs, 1 torch thread, cpu clock; {loaded.name}; "
        f"{len(workload)} requests at {args.rate}/s, {real.num_steps} steps"
    )
    print(f"decode steps at batch {args.batch}: the load's vs the twin's (a calibration-style engine), same minutes")
    print(
        f"  {'context':<9}{'load n':>7}{'mean ms':>9}{'median':>8}{'twin n':>8}{'mean ms':>9}{'median':>8}"
        f"{'load/twin mean':>16}{'median':>8}{'mean/median load':>18}{'twin':>6}"
    )
    for r in rows:
        L, T = r["load"], r["twin"]
        print(
            f"  {r['band'][0]:>3}-{r['band'][1]:<5}{L['n']:>7}{L['mean_s'] * 1e3:>9.2f}{L['median_s'] * 1e3:>8.2f}"
            f"{T['n']:>8}{T['mean_s'] * 1e3:>9.2f}{T['median_s'] * 1e3:>8.2f}{r['ratio_mean']:>16.3f}"
            f"{r['ratio_median']:>8.3f}{L['mean_s'] / L['median_s']:>18.3f}{T['mean_s'] / T['median_s']:>6.3f}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
