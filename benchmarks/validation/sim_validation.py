"""Validate the simulator against the real engine on this machine. A script, not a test.

    python benchmarks/validation/sim_validation.py                     # calibrate, then validate (~17 min on 2 cores)
    python benchmarks/validation/sim_validation.py --calibration ~/.cache/fastmode/calibration-local.json
    python benchmarks/validation/sim_validation.py --quick             # small sweep and a short load (~2 min)

1. Measurement, in rounds before, during and after the load test (--rounds-before,
   --rounds-during, --rounds-after; 1, 4, 1): each round is `fastmode calibrate`'s
   sweep (decode batches 1-64 at contexts 32, 128, 512; prefill chunks 32, 128, 512)
   plus held-out points it does not fit (decode at context 256, prefill chunks of
   256), interleaved, the batch sizes taking turns. Each point keeps the mean of its
   timed steps over all rounds (and their median, for the diagnostic below). The rounds during the load run one unit (a decode round or a prefill
   pass, 2-5 s) at a time between the load's steps, with the load's clock stopped,
   spread over its duration.
   Why: this VM's speed drifts by 10-30% within minutes, in spells of 15-30 s.
   Calibrating first and validating later measures the drift between the two, not
   the cost model; with the held-out points inside the same rounds, and most of the
   rounds measured in the load's own minutes, the calibration covers the same span
   of time as what it is checked against. (Rounds only before and after the load
   leave the load's own minutes out, and the machine drifts away from both.)
2. Step times: the cost model is fitted to the calibration points only (as
   `fastmode calibrate` would) and its prediction set beside each held-out
   point. Target: |error| <= 10%.
3. Tiered load: one seeded workload (fast / standard / flex arrivals) is replayed on the
   real engine in wall-clock time, --replays times (3), each on a fresh engine, and simulated
   with the same scheduler config and the calibrated cost model. Per-tier mean TTFT and TPOT
   over the replays' requests pooled are compared. Target: <= 15%. Each replay's own errors,
   and how far the replays' own means lie apart, are printed beside it.
   Why replays: on a shared VM one 15-s spell that runs slow moves the flex tier's mean TTFT
   of a single 180-s load by far more than the target; no prediction made before the load can
   know when such a spell comes. Replaying the same load measures that noise (the replays'
   spread) and averages it down, as a repeated measurement does.
4. Speed reference: a fixed set of steps on an engine of its own (probe.py) runs
   twice after every decode round and every prefill pass of the rounds before and after the load, and every
   --probe-every-s seconds of the load, with the replay's clock stopped. Its time during
   the load over its median in the rounds is the machine's pace during the load relative
   to the calibration, measured without the load's own steps. Printed beside the verdict,
   not in it: the tiers compared again with the load simulated at that pace, followed over
   the load's time (a speed profile: pace.py), and the correlation, window by window, of the
   probe's pace with the load's own steps' (measured over predicted), which tells the
   machine's drift from anything the engine does under load.
   Also printed, as a diagnostic and not for the verdict: the simulation at the speed
   the engine's own steps ran during the load, and each round's speed relative to the
   merged points, which shows the drift.
   (No re-anchoring on calibration points re-measured just before the load: the drift
   changes faster than the load test lasts.)

Prints a table with the machine and writes everything as JSON (--out).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.validation

STEP_TARGET = 0.10
TIER_TARGET = 0.15


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF dir or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see --clock)")
    p.add_argument(
        "--clock",
        default="cpu",
        choices=["wall", "cpu"],
        help="cpu (default): time everything in process CPU time, so that other processes on a shared "
        "machine do not distort it (needs --threads 1); wall: real time, for a dedicated machine",
    )
    p.add_argument("--calibration", help="use this calibration file instead of calibrating")
    p.add_argument("--calibration-out", default="runs/calibration-local.json")
    p.add_argument("--check-context", type=int, default=256)
    p.add_argument("--check-batches", default="1,2,4,8,12,16,32,64")
    p.add_argument("--check-chunk", type=int, default=256)
    p.add_argument(
        "--duration-s",
        type=float,
        default=180.0,
        help="seconds of arrivals in the load test (default 180: ~60 flex requests, whose mean TTFT is the noisiest figure)",
    )
    p.add_argument(
        "--replays",
        type=int,
        default=3,
        help="replays of the same load, each on a fresh engine; the verdict compares the simulation "
        "with their pooled per-tier means (default 3: see the module's docstring, step 3)",
    )
    p.add_argument("--rate", type=float, default=None, help="requests/s (default: chosen for --concurrency)")
    p.add_argument(
        "--concurrency",
        type=float,
        default=3.0,
        help="mean requests in the system the default rate aims at (simulated; Little's law)",
    )
    p.add_argument("--tier-mix", default="fast=0.3,standard=0.5,flex=0.2")
    p.add_argument("--prompt-len", default="uniform:16:128")
    p.add_argument("--output-len", default="uniform:8:48")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--fast-lane-max-batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds-before", type=int, default=1, help="measurement rounds before the load test (default 1)")
    p.add_argument(
        "--rounds-during",
        type=int,
        default=4,
        help="measurement rounds run during the load test, one decode round or prefill pass at a time "
        "between the load's steps with its clock stopped, spread over its duration (default 4)",
    )
    p.add_argument("--rounds-after", type=int, default=1, help="measurement rounds after the load test (default 1)")
    p.add_argument("--quick", action="store_true", help="quick sweep, one round each side and a 25 s load")
    p.add_argument(
        "--probe-every-s",
        type=float,
        default=2.0,
        help="seconds of load between speed probes (default 2; the probe also runs after every decode "
        "round and prefill pass of the measurement rounds)",
    )
    p.add_argument(
        "--skip-step-check", action="store_true", help="only the load test, no measurement rounds (needs --calibration)"
    )
    p.add_argument("--out", default="runs/sim_validation.json")
    return p.parse_args(argv)


def machine_info(threads: int) -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": threads,
        "python": platform.python_version(),
        "load_avg_start": os.getloadavg(),
    }


def err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def sweep_config(args, contexts: tuple[int, ...], chunks: tuple[int, ...], rounds: int):
    from fastmode.calibrate.measure import SweepConfig

    if args.quick:
        return SweepConfig(
            batches=(1, 4, 16, 64),
            contexts=contexts,
            chunk_sizes=chunks,
            repeats=3,
            prefill_repeats=2,
            rounds=rounds,
            num_threads=args.threads,
            clock=args.clock,
        )
    # Four prefill passes per round, not calibrate's two: a prefill step lasts 0.1-2.5 s, so a round
    # holds few of them, and with two a point can move by tens of percent between rounds.
    return SweepConfig(
        batches=tuple(int(b) for b in args.check_batches.split(",")),
        contexts=contexts,
        chunk_sizes=chunks,
        prefill_repeats=4,
        rounds=rounds,
        num_threads=args.threads,
        clock=args.clock,
    )


def plan_points(args) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(contexts, chunk sizes) each round measures: the calibration's (unless a file gives the
    calibration) and the held-out ones."""
    cal_ctx, cal_chunks = (
        ((), ()) if args.calibration else (((32, 512), (32, 512)) if args.quick else ((32, 128, 512), (32, 128, 512)))
    )
    if args.check_context in cal_ctx or args.check_chunk in cal_chunks:
        raise SystemExit("--check-context / --check-chunk must differ from the calibration's contexts and chunks")
    return tuple(sorted({*cal_ctx, args.check_context})), tuple(sorted({*cal_chunks, args.check_chunk}))


def is_held_out(p, args) -> bool:
    if p.kind == "prefill":
        return p.prefill_tokens == args.check_chunk
    # A decode point's context is the nominal one plus the few tokens its sweep decoded.
    return args.check_context <= p.decode_context < args.check_context + 64


def fit_cost_model(args, loaded, cal_points, log, final: bool = True):
    """The calibrated cost model: from --calibration, or fitted to this run's calibration points.
    Only the final fit (all rounds) is written to --calibration-out."""
    from fastmode.calibrate.calibration_file import write_calibration
    from fastmode.calibrate.run import calibrate_loaded, engine_model_spec
    from fastmode.planner.catalog import load_hardware
    from fastmode.planner.cost_model import CostModel

    spec, fmt = engine_model_spec(loaded)
    if args.calibration:
        cal = json.loads(Path(args.calibration).expanduser().read_text())
        if cal.get("model") != loaded.name or cal.get("weight_format") != fmt:
            log(
                f"warning: {args.calibration} is for {cal.get('model')} {cal.get('weight_format')}, "
                f"validating {loaded.name} {fmt}"
            )
        hw = load_hardware(cal["hardware"], calibration=args.calibration)
        return CostModel(hw, spec, tp=1, weight_format=fmt), {"file": args.calibration, **cal}
    sweep = sweep_config(args, (args.check_context,), (args.check_chunk,), 1)  # only its thread count is read
    run = calibrate_loaded(
        loaded,
        sweep,
        points=cal_points,
        fitted_from=(
            f"benchmarks/validation/sim_validation.py: {loaded.name} {fmt}, {len(cal_points)} points, "
            f"{args.rounds_before} + {args.rounds_during} + {args.rounds_after} rounds before, during and after a load test, "
            f"{args.threads} threads, {args.clock} clock"
        ),
    )
    if not final:
        return run.cost_model, run.calibration
    path = write_calibration(run.calibration, args.calibration_out)
    log(f"calibration written to {path}: fit max |error| {run.fit.max_abs_rel_error:.1%}")
    return run.cost_model, {"file": str(path), **run.calibration}


def check_steps(held_out, cm) -> list[dict]:
    rows = []
    for p in held_out:
        pred = cm.step_cost(*p.cost_args()).total_s
        rows.append(
            {
                "kind": p.kind,
                "batch": p.num_decodes,
                "context": round(p.decode_context or p.prefill_context),
                "tokens": p.tokens,
                "measured_s": p.step_s,
                "predicted_s": pred,
                "error": err(pred, p.step_s),
                "spread": p.spread,
            }
        )
    return rows


def round_speeds(per_round, merged) -> list[float]:
    """Each round's speed: the median over points of its step time / the merged one (1.10 = 10% slower)."""
    return [statistics.median(p.step_s / m.step_s for p, m in zip(points, merged)) for points in per_round]


def make_workload(args, cm, sched_cfg, usd, log):
    """A seeded tiered workload; its rate is chosen with the simulator for the target concurrency."""
    from fastmode.sim.distributions import ArrivalProcess, LengthDist
    from fastmode.sim.simulator import SimConfig, simulate
    from fastmode.sim.workload import WorkloadConfig, generate_workload

    def workload(rate):
        n = max(5, round(rate * args.duration_s))
        return generate_workload(
            WorkloadConfig(
                n,
                ArrivalProcess("poisson", rate),
                LengthDist.parse(args.prompt_len),
                LengthDist.parse(args.output_len),
                args.tier_mix,
                args.seed,
            )
        )

    def concurrency(rate):  # time-averaged requests in the system: sum of latencies / makespan
        r = simulate(workload(rate), cm, SimConfig(sched_cfg, usd))
        return sum(m.e2e_s for m in r.requests) / r.makespan_s

    if args.rate:
        return workload(args.rate), args.rate
    lo, hi = 0.001, 100.0  # bisect the rate (log scale) on simulated concurrency
    for _ in range(14):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if concurrency(mid) < args.concurrency else (lo, mid)
    rate = round((lo * hi) ** 0.5, 4)
    log(f"load: {rate} requests/s for {args.duration_s:.0f} s (simulated concurrency ~{args.concurrency:g})")
    return workload(rate), rate


def steps_priced(real, cm) -> list[tuple[str, float, float, float]]:
    """(kind, end_s, measured_s, predicted_s) for each step the real engine took under load."""
    out = []
    for (chunks, contexts), (end_s, measured, _) in zip(real.shapes, real.steps):
        if not chunks and not contexts:
            continue
        b = len(contexts)
        kind = (
            ("prefill+decode" if contexts else "prefill")
            if chunks
            else f"decode {b if b <= 4 else '5-8' if b <= 8 else '9-16'}"
        )
        out.append((kind, end_s, measured, cm.step_cost(chunks, contexts).total_s))
    return out


def window_sums(priced, window_s: float) -> dict[int, tuple[float, float]]:
    """Window index (end_s // window_s) -> (measured, predicted) seconds of the load's steps in it."""
    sums: dict[int, list[float]] = {}
    for _, end_s, m, p in priced:
        w = sums.setdefault(int(end_s // window_s), [0.0, 0.0])
        w[0] += m
        w[1] += p
    return {i: (m, p) for i, (m, p) in sums.items()}


def drift_tracking(priced, probes: list[tuple[float, float]], ref: float, window_s: float = 15.0) -> dict:
    """Does the probe see what the load's own steps saw? Per window of the load: the engine's
    measured over predicted step time, beside the probe's mean time over its reference; and the
    correlation of the two series. High: the load's slow and fast spells are the machine's
    (the probe shares nothing with the load but the machine), not the engine's under load."""
    pairs = []
    for i, (m, p) in sorted(window_sums(priced, window_s).items()):
        w = i * window_s
        seen = [s / ref for t, s in probes if w <= t < w + window_s]
        if seen:
            pairs.append([w, m / p, statistics.fmean(seen)])
    r = statistics.correlation([a for _, a, _ in pairs], [b for _, _, b in pairs]) if len(pairs) >= 3 else None
    return {"window_s": window_s, "windows": pairs, "correlation": r}


def step_errors_in_situ(replays: list) -> dict:
    """The cost model's error on the steps the real engine took under load (`replays`: each
    replay's steps, from steps_priced), by kind of step.

    This separates the cost model's error from scheduling feedback: the same composition of
    prefill chunks and decodes, measured vs predicted, step by step. `error_in_window` takes
    the machine's drift out: each step's predicted time is first scaled by its window's
    (`window_s` of load) measured over predicted time, all kinds together, so what is left is
    how each kind's cost stands against the others', the cost model's shape under this load.
    """
    window_s = 15.0
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for priced in replays:
        pace = window_sums(priced, window_s)
        for kind, end_s, measured, predicted in priced:
            m, p = pace[int(end_s // window_s)]
            groups.setdefault(kind, []).append((measured, predicted, predicted * m / p))
    out = {}
    for kind, rows in sorted(groups.items()):
        meas, pred, paced = (sum(r[i] for r in rows) for i in range(3))
        out[kind] = {
            "num_steps": len(rows),
            "measured_mean_s": meas / len(rows),
            "predicted_mean_s": pred / len(rows),
            "error": err(pred, meas),
            "error_in_window": err(paced, meas),
        }
    return out


def sampling_band(workload, priced, cm, sched, usd, seeds: int = 8) -> dict:
    """How far per-tier means move by chance alone: the load simulated `seeds` times with each
    step's time spread as the engine's own steps spread around the cost model's price (their
    coefficient of variation, in situ). A diagnostic, not the verdict."""
    from fastmode.sim.report import summarize
    from fastmode.sim.simulator import SimConfig, simulate

    ratios = [measured / predicted for _, _, measured, predicted in priced]
    mean = statistics.fmean(ratios)
    cv = statistics.pstdev(ratios) / mean
    runs = [
        summarize(simulate(workload, cm, SimConfig(sched, usd, step_jitter_cv=cv, jitter_seed=k)).requests)
        for k in range(seeds)
    ]
    band = {}
    for t in runs[0]:
        ttft = [r[t].ttft_mean_s for r in runs]
        tpot = [r[t].tpot_mean_s for r in runs]
        band[t] = {"ttft_mean_s": [min(ttft), max(ttft)], "tpot_mean_s": [min(tpot), max(tpot)]}
    return {"cv": cv, "seeds": seeds, "tiers": band}


def tier_errors(real_t: dict, sim_t: dict) -> dict:
    out = {}
    for t in real_t:
        a, b = real_t[t], sim_t[t]
        out[t] = {
            "num_requests": a.num_requests,
            "real": {
                "ttft_mean_s": a.ttft_mean_s,
                "ttft_p50_s": a.ttft_p50_s,
                "tpot_mean_s": a.tpot_mean_s,
                "tok_s_p50": a.tok_s_p50,
            },
            "sim": {
                "ttft_mean_s": b.ttft_mean_s,
                "ttft_p50_s": b.ttft_p50_s,
                "tpot_mean_s": b.tpot_mean_s,
                "tok_s_p50": b.tok_s_p50,
            },
            "ttft_error": err(b.ttft_mean_s, a.ttft_mean_s),
            "tpot_error": err(b.tpot_mean_s, a.tpot_mean_s),
        }
    return out


def tails(points, priced) -> dict:
    """How far each step's mean sits above its median: over the calibration points (mean /
    median of each point's timed steps, the median over points), and over the load's steps
    (measured / predicted: mean and median). A tail that lifts the load's mean above its median
    is what a fit to the points' medians would miss."""
    ratios = [p.step_s / p.median_s for p in points if p.median_s > 0]
    load = [m / q for _, _, m, q in priced]
    return {
        "points_mean_over_median": statistics.median(ratios) if ratios else None,
        "load_measured_over_predicted": {
            "mean": statistics.fmean(load),
            "median": statistics.median(load),
            "total": sum(m for *_, m, _ in priced) / sum(q for *_, q in priced),
        },
    }


def at_medians(points) -> list:
    """The points with each one's median step time in place of its mean (a diagnostic fit: what
    leaving out the steps' tail costs)."""
    import dataclasses

    return [dataclasses.replace(p, step_s=p.median_s) for p in points if p.median_s > 0]


def simulated_tiers(loads: list[dict], cm, profiles: list[tuple] | None = None) -> dict:
    """Per-tier errors of the replayed loads simulated with `cm`, each replay at its own pace
    (`profiles`, one speed profile per replay: pace.py) if given: the real requests of all
    replays pooled against the simulated requests of all replays, so a tier's mean is the mean
    over every replay's requests."""
    from benchmarks.validation.pace import simulate_at_pace
    from fastmode.sim.report import summarize
    from fastmode.sim.simulator import SimConfig

    real, sim = [], []
    for k, load in enumerate(loads):
        cfg = SimConfig(load["sched"], load["usd"])
        sim += simulate_at_pace(load["workload"], cm, cfg, profiles[k] if profiles else ()).requests
        real += load["real"].requests
    return tier_errors(summarize(real), summarize(sim))


def own_pace(priced, window_s: float) -> tuple:
    """The pace the engine's own steps ran at over the load, as a speed profile (pace.py):
    per `window_s` of load, their measured over predicted time (a window without steps keeps the
    previous window's pace). Simulating the load at it asks whether the simulator's scheduling and
    queueing reproduce the tiers once it knows when the machine ran slow or fast: a diagnostic,
    since the pace is read off the very run it is compared with."""
    sums = window_sums(priced, window_s)
    profile, pace = [], 1.0
    for i in range(max(sums, default=-1) + 1):
        if i in sums and sums[i][1] > 0:
            pace = sums[i][0] / sums[i][1]
        profile.append((i * window_s, pace))
    return tuple(profile)


def slowed(cm, factor: float):
    import dataclasses

    return dataclasses.replace(cm, hardware=cm.hardware.slowed(factor))


def replay_loads(args, loaded, cm, log, probe=None) -> list[dict]:
    """Replay a seeded tiered load (the rate chosen with the simulator and `cm`) --replays times,
    each time on a fresh engine (an empty KV cache: no prefix cached by the previous replay), with
    the speed probe every --probe-every-s seconds, the clock stopped."""
    from benchmarks.validation.replay import replay
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine

    fmt_dtype = "float32" if str(loaded.dtype).endswith("float32") else "bfloat16"
    loads: list[dict] = []
    for k in range(args.replays):
        # Speculation off: the simulator has no model of draft acceptance (docs/simulator.md).
        engine = LLMEngine(
            EngineConfig(
                dtype=fmt_dtype,
                kv_cache_gib=0.5,
                max_num_seqs=args.max_num_seqs,
                fast_lane_max_batch=args.fast_lane_max_batch,
                num_threads=args.threads,
                speculative="off",
            ),
            loaded=loaded,
        )
        usd = engine.config.usd_per_machine_hour
        if not loads:
            workload, rate = make_workload(args, cm, engine.scheduler_config, usd, log)
        log(f"replay {k + 1} of {args.replays}: {len(workload)} requests on the real engine...")
        real = replay(engine, workload, seed=args.seed, clock=args.clock, probe=probe, probe_every_s=args.probe_every_s)
        loads.append({"workload": workload, "rate": rate, "real": real, "sched": engine.scheduler_config, "usd": usd})
    return loads


def replay_figures(load: dict, cm) -> dict:
    """One replay on its own: its tiers against the simulation, and its steps priced by `cm`."""
    from fastmode.sim.report import summarize
    from fastmode.sim.simulator import SimConfig, simulate

    real = load["real"]
    sim = simulate(load["workload"], cm, SimConfig(load["sched"], load["usd"]))
    priced = steps_priced(real, cm)
    return {
        "tiers": tier_errors(summarize(real.requests), summarize(sim.requests)),
        "load_vs_fit": load_vs_fit(priced),
        "steps_priced": [[k, round(e, 4), round(m, 6), round(p, 6)] for k, e, m, p in priced],
        "real": {
            "makespan_s": real.makespan_s,
            "busy_s": real.busy_s,
            "num_steps": real.num_steps,
            "mean_step_s": statistics.fmean(s[1] for s in real.steps),
            "mean_lateness_s": real.mean_lateness_s,
        },
        "sim": {
            "makespan_s": sim.makespan_s,
            "busy_s": sim.busy_s,
            "num_steps": sim.num_steps,
            "mean_step_s": sim.busy_s / sim.num_steps,
            "num_preemptions": sim.num_preemptions,
        },
    }


def load_vs_fit(priced) -> float:
    """The load's steps' measured time over the cost model's price for them, in total: 1.05, the
    engine ran 5% slower under the load than the fit says."""
    predicted = sum(p for *_, p in priced)
    return sum(m for *_, m, _ in priced) / predicted if predicted > 0 else 1.0


def replay_spread(per_replay: list[dict]) -> dict:
    """How far the replays' own per-tier means lie apart: (max - min) / mean over the replays, per
    tier and figure. The same workload on the same engine, minutes apart: the machine's noise on
    one replay. One prediction can be within x of every replay only where they lie at most ~2x apart."""
    out = {}
    for t in per_replay[0]["tiers"]:
        out[t] = {}
        for fig in ("ttft_mean_s", "tpot_mean_s"):
            xs = [r["tiers"][t]["real"][fig] for r in per_replay]
            out[t][fig] = (max(xs) - min(xs)) / statistics.fmean(xs)
    return out


def compare_load(loads: list[dict], cm, profiles: list[tuple] | None = None) -> dict:
    """Simulate the replayed workload with `cm` and compare it with the replays' pooled per-tier
    means (the verdict); each replay on its own; and, as diagnostics, at the machine's pace during
    each replay as the probe measured it (`profiles`: the probe's time over its median in the
    measurement rounds, over the replay's time), at the speed and pace the engine's own steps ran."""
    per_replay = [replay_figures(load, cm) for load in loads]
    priced = [[tuple(s) for s in r["steps_priced"]] for r in per_replay]
    flat = [s for p in priced for s in p]
    during = load_vs_fit(flat)
    first = loads[0]
    return {
        "rate_per_s": first["rate"],
        "num_requests": len(first["workload"]),
        "replays": len(loads),
        "tiers": simulated_tiers(loads, cm),
        "per_replay": per_replay,
        "replay_spread": replay_spread(per_replay),
        "at_probe_speed": {"tiers": simulated_tiers(loads, cm, profiles)} if profiles else None,
        "at_in_situ_speed": {"factor": during, "tiers": simulated_tiers(loads, slowed(cm, during))},
        "at_own_pace": {f"{w:g}": simulated_tiers(loads, cm, [own_pace(p, w) for p in priced]) for w in (15.0, 5.0)},
        "sampling_band": sampling_band(first["workload"], flat, cm, first["sched"], first["usd"]),
        "steps_in_situ": step_errors_in_situ(priced),
        "scheduler": dict(first["sched"].__dict__),
    }


def print_tiers(tiers: dict) -> None:
    for t, r in tiers.items():
        print(
            f"  {t:<9}{r['num_requests']:>4}{r['real']['ttft_mean_s'] * 1e3:>9.0f}ms{r['sim']['ttft_mean_s'] * 1e3:>8.0f}ms"
            f"{r['ttft_error']:>+8.1%}{r['real']['tpot_mean_s'] * 1e3:>9.1f}ms{r['sim']['tpot_mean_s'] * 1e3:>8.1f}ms"
            f"{r['tpot_error']:>+8.1%}"
        )


def print_report(rep: dict) -> None:
    m = rep["machine"]
    print(
        f"\nmachine: {m['processor']}, {m['cpus']} CPUs, torch threads {m['torch_threads']}, {rep['clock']} clock, "
        f"load avg {m['load_avg_start'][0]:.2f} -> {m['load_avg_end'][0]:.2f}; model {rep['model']} {rep['dtype']}"
    )
    c = rep["calibration"]
    split = c.get("small_step_max_tokens", 0)
    tiles = f" (tiles of {c['token_tile']})" if c.get("token_tile") else ""
    for label, g in (
        [(f"steps <= {split} tokens", c["small_step"]), ("larger steps" + tiles, c)] if split else [("", c)]
    ):
        print(
            f"calibration {label}: overhead {g['overhead_s'] * 1e3:.2f} ms, {g['per_token_s'] * 1e6:.1f} us/token, "
            f"{g['per_seq_s'] * 1e3:.2f} ms/seq, {g['mem_bw_GBps']:.1f} GB/s, eta_c {g['eta_c']:.3f}"
        )
    print(f"  from {c.get('file')}")
    print(f"\nstep time, held-out points (target |error| <= {STEP_TARGET:.0%})")
    print(f"  {'kind':<8}{'batch':>6}{'ctx':>6}{'tokens':>7}{'measured ms':>13}{'sim ms':>10}{'error':>9}{'spread':>8}")
    for r in rep["steps"]:
        print(
            f"  {r['kind']:<8}{r['batch']:>6}{r['context']:>6}{r['tokens']:>7}{r['measured_s'] * 1e3:>13.2f}"
            f"{r['predicted_s'] * 1e3:>10.2f}{r['error']:>+9.1%}{r['spread']:>8.0%}"
        )
    L = rep["load"]
    print(
        f"\ntiered load: {L['num_requests']} requests at {L['rate_per_s']} req/s, replayed {L['replays']} times, "
        f"max_num_seqs {L['scheduler']['max_num_seqs']}, fast lane {L['scheduler']['fast_lane_max_batch']}; "
        f"the replays' requests pooled (target |error| <= {TIER_TARGET:.0%})"
    )
    print(
        f"  {'tier':<9}{'n':>4}{'TTFT real':>11}{'TTFT sim':>10}{'error':>8}{'TPOT real':>11}{'TPOT sim':>10}{'error':>8}"
    )
    print_tiers(L["tiers"])
    for k, r in enumerate(L["per_replay"]):
        print(
            f"  replay {k + 1} on its own (its steps x{r['load_vs_fit']:.3f} the fit's time): "
            + ", ".join(f"{t} TTFT {e['ttft_error']:+.1%} TPOT {e['tpot_error']:+.1%}" for t, e in r["tiers"].items())
            + f"; makespan real {r['real']['makespan_s']:.1f} s, sim {r['sim']['makespan_s']:.1f} s; steps real "
            f"{r['real']['num_steps']}, sim {r['sim']['num_steps']}; mean step real "
            f"{r['real']['mean_step_s'] * 1e3:.1f} ms, sim {r['sim']['mean_step_s'] * 1e3:.1f} ms; busy real "
            f"{r['real']['busy_s'] / r['real']['makespan_s']:.0%}, sim {r['sim']['busy_s'] / r['sim']['makespan_s']:.0%}"
        )
    print(
        "  the replays' own means apart ((max - min) / mean): "
        + ", ".join(
            f"{t} TTFT {x['ttft_mean_s']:.1%} TPOT {x['tpot_mean_s']:.1%}" for t, x in L["replay_spread"].items()
        )
    )
    P = L.get("at_probe_speed")
    if P:
        print(
            f"  at the machine's pace during the load as the probe measured it (mean x{rep['probe']['load_speed_mean']:.3f} "
            "the rounds' median, followed over time):"
        )
        print_tiers(P["tiers"])
    V = L["at_in_situ_speed"]
    print(
        f"  diagnostic, simulated at the speed the engine ran during the load (x{V['factor']:.3f}): "
        + ", ".join(f"{t} TTFT {r['ttft_error']:+.1%} TPOT {r['tpot_error']:+.1%}" for t, r in V["tiers"].items())
    )
    for window, tiers in L.get("at_own_pace", {}).items():
        print(
            f"  diagnostic, at the engine's own pace per {window} s of load (its steps' measured / predicted): "
            + ", ".join(f"{t} TTFT {r['ttft_error']:+.1%} TPOT {r['tpot_error']:+.1%}" for t, r in tiers.items())
        )
    B = L["sampling_band"]
    print(
        f"  diagnostic, chance alone: {B['seeds']} simulations with the engine's step-to-step spread "
        f"(CV {B['cv']:.2f}) put the tiers' means at "
        + ", ".join(
            f"{t} TTFT {b['ttft_mean_s'][0] * 1e3:.0f}-{b['ttft_mean_s'][1] * 1e3:.0f} ms TPOT "
            f"{b['tpot_mean_s'][0] * 1e3:.1f}-{b['tpot_mean_s'][1] * 1e3:.1f} ms"
            for t, b in B["tiers"].items()
        )
    )
    print(
        "  in situ: the cost model on the real engine's own steps under this load (last column: with each "
        "step's 15 s of load at its own pace, the drift taken out)"
    )
    for kind, r in L["steps_in_situ"].items():
        print(
            f"    {kind:<16}{r['num_steps']:>5} steps  measured {r['measured_mean_s'] * 1e3:7.1f} ms  "
            f"predicted {r['predicted_mean_s'] * 1e3:7.1f} ms  {r['error']:+.1%}  {r['error_in_window']:+.1%}"
        )
    speeds = rep["round_speeds"]
    nb, nd = rep["rounds"]["before"], rep["rounds"].get("during", 0)
    print(
        "  drift: each round's step times over the merged points' (median over points): "
        + " ".join(f"{x:.3f}" for x in speeds[:nb])
        + " | during the load: "
        + " ".join(f"{x:.3f}" for x in speeds[nb : nb + nd])
        + " | "
        + " ".join(f"{x:.3f}" for x in speeds[nb + nd :])
    )
    pr = rep["probe"]
    if pr["round_speeds"]:
        prof = [f for p in pr["load_profiles"] or () for _, f in p]
        tenths = [prof[min(len(prof) - 1, k * len(prof) // 10)] for k in range(10)] if prof else []
        print(
            f"  drift, the probe ({pr['batch']} x {pr['prompt_tokens']}-token prefill + {pr['decode_steps']} decodes, "
            f"median {statistics.median(t for r in pr['rounds_s'] for t in r) * 1e3:.0f} ms in the rounds) "
            "over its median in the rounds, by round: "
            + " ".join(f"{x:.3f}" for x in pr["round_speeds"][:nb])
            + " | load (replays in turn), by tenths: "
            + " ".join(f"{x:.2f}" for x in tenths)
            + " | "
            + " ".join(f"{x:.3f}" for x in pr["round_speeds"][nb:])
        )
    for k, tr in enumerate(pr.get("tracking") or ()):
        if tr["correlation"] is not None:
            print(
                f"  drift tracking, replay {k + 1}, per {tr['window_s']:.0f} s of load: the engine's steps (measured / "
                f"predicted) vs the probe: correlation {tr['correlation']:.2f} over {len(tr['windows'])} windows; steps "
                + " ".join(f"{a:.2f}" for _, a, _ in tr["windows"])
                + "; probe "
                + " ".join(f"{b:.2f}" for _, _, b in tr["windows"])
            )
    T = rep.get("tails")
    if T:
        ld = T["load_measured_over_predicted"]
        print(
            f"  tails: a calibration point's mean step over its median: x{T['points_mean_over_median']:.3f} (median "
            f"over points); the load's steps, measured / predicted: total x{ld['total']:.3f}, mean x{ld['mean']:.3f}, "
            f"median x{ld['median']:.3f}"
        )
    M = rep.get("fit_on_medians")
    if M:
        worst = max((abs(r["error"]) for r in M["steps"]), default=float("nan"))
        print(
            f"  diagnostic, fitted to the points' medians: held-out steps worst "
            f"{worst:.1%}; "
            + ", ".join(f"{t} TTFT {r['ttft_error']:+.1%} TPOT {r['tpot_error']:+.1%}" for t, r in M["tiers"].items())
        )
    v = rep["verdict"]
    ok = lambda b: "PASS" if b else "FAIL"  # noqa: E731
    print(
        f"\nstep max |error| {v['step_max_abs_error']:.1%} ({ok(v['steps_pass'])}), "
        f"tier max |error| {v['tier_max_abs_error']:.1%} at the calibration's speed, replays pooled "
        f"({ok(v['tiers_pass'])}; each replay on its own: "
        + " ".join(f"{e:.1%}" for e in v["tier_max_abs_error_by_replay"])
        + f", {v['replays_passing']} of {len(v['tier_max_abs_error_by_replay'])} within the target), "
        + (
            f"(diagnostic: {v['tier_max_abs_error_at_probe_speed']:.1%} at the probe's pace); "
            if v["tiers_pass_at_probe_speed"] is not None
            else ""
        )
        + f"run took {rep['wall_s']:.0f} s"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.duration_s = min(args.duration_s, 25.0)
        args.rounds_before, args.rounds_after = min(args.rounds_before, 1), min(args.rounds_after, 1)
        args.rounds_during, args.replays = min(args.rounds_during, 1), min(args.replays, 2)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    import torch

    from benchmarks.validation.probe import SpeedProbe, relative_speed, speed_profile
    from fastmode.calibrate.measure import sweep_units, units_per_sweep
    from fastmode.calibrate.run import merge_rounds
    from fastmode.loader import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    rep = {"machine": machine_info(torch.get_num_threads()), "dtype": args.dtype, "clock": args.clock}
    loaded = load_model(args.model, args.dtype)
    rep["model"] = loaded.name
    log(f"loaded {loaded.name} in {time.perf_counter() - t0:.0f} s")
    if args.skip_step_check:
        if not args.calibration:
            raise SystemExit("--skip-step-check needs --calibration (the rounds are what calibrates)")
        args.rounds_before = args.rounds_during = args.rounds_after = 0
    if min(args.rounds_before, args.rounds_during, args.rounds_after) < 0:
        raise SystemExit("--rounds-before, --rounds-during and --rounds-after must be >= 0")
    if args.replays < 1:
        raise SystemExit("--replays must be >= 1")
    if args.rounds_before < 1 and not args.skip_step_check:
        raise SystemExit("--rounds-before must be >= 1 (its fit chooses the load's rate)")
    contexts, chunks = plan_points(args)
    probe = SpeedProbe(loaded, sweep_config(args, contexts, chunks, 1))
    for _ in range(3):  # warm-up, not kept
        probe()
    probe.take()
    probes: list[list[float]] = []  # the probe's times, per measurement round

    def probe_twice() -> None:  # ~20 probes a round
        for _ in range(2):
            probe()

    def measure(n: int) -> list:
        """`n` rounds of the sweep, the probe twice after each of its units (a decode round or a
        prefill pass), so the probe samples the same minutes."""
        rounds = []
        for k in range(n):
            log(f"measurement round {k + 1} of {n}")
            points: list = []
            for _ in sweep_units(loaded, sweep_config(args, contexts, chunks, 1), log, points):
                probe_twice()
            rounds.append(points)
            probes.append(probe.take())
        return rounds

    before = measure(args.rounds_before)
    merged = merge_rounds(before)
    cm_before, _ = fit_cost_model(args, loaded, [p for p in merged if not is_held_out(p, args)], log, final=False)
    during: list[list] = []

    def during_units():
        for k in range(args.rounds_during):
            log(f"measurement round {k + 1} of {args.rounds_during} during the load")
            points: list = []
            yield from sweep_units(loaded, sweep_config(args, contexts, chunks, 1), log, points)
            during.append(points)

    units = during_units()
    per_unit = max(
        1,
        round(
            args.duration_s
            * args.replays
            / max(1, args.rounds_during * units_per_sweep(sweep_config(args, contexts, chunks, 1)))
            / args.probe_every_s
        ),
    )
    ticks = itertools.count(1)

    def tick() -> float:
        """Every --probe-every-s of load: the probe; every `per_unit` ticks, the next unit of the
        rounds measured during the load."""
        if next(ticks) % per_unit == 0:
            next(units, None)
        return probe()

    loads = replay_loads(args, loaded, cm_before, log, tick)
    probe.take()  # the load's probes are in load["real"].probes, with their times
    for _ in units:  # what the load left of those rounds
        pass
    after = measure(args.rounds_after)
    merged = merge_rounds(before + during + after)
    rep["rounds"] = {
        "before": len(before),
        "during": len(during),
        "after": len(after),
        "ticks_per_unit_during": per_unit,
    }
    rep["round_speeds"] = round_speeds(before + during + after, merged)
    ref = [t for r in probes for t in r]
    on_load = [load["real"].probes for load in loads]  # per replay
    profiles = [speed_profile(o, ref) for o in on_load] if ref and all(on_load) else None
    rep["probe"] = {
        "batch": probe.batch,
        "prompt_tokens": probe.prompt_tokens,
        "decode_steps": probe.decode_steps,
        "every_s": args.probe_every_s,
        "rounds_s": probes,
        "load_s": on_load,
        "round_speeds": [relative_speed(r, ref) for r in probes] if ref else [],
        "load_speed_mean": statistics.fmean(s for o in on_load for _, s in o) / statistics.median(ref)
        if profiles
        else None,
        "load_profiles": profiles,
    }
    rep["points_by_round"] = [[p.to_json() for p in points] for points in before + during + after]
    cm, rep["calibration"] = fit_cost_model(args, loaded, [p for p in merged if not is_held_out(p, args)], log)
    rep["calibration"].pop("points", None)
    rep["steps"] = [] if args.skip_step_check else check_steps([p for p in merged if is_held_out(p, args)], cm)
    rep["load"] = compare_load(loads, cm, profiles)
    cal_points = [p for p in merged if not is_held_out(p, args)]
    rep["tails"] = tails(cal_points, [s for r in rep["load"]["per_replay"] for s in r["steps_priced"]])
    if not args.calibration and len(at_medians(cal_points)) == len(cal_points):  # a paired diagnostic: same data
        cm_med, _ = fit_cost_model(args, loaded, at_medians(cal_points), log, final=False)
        held = at_medians([p for p in merged if is_held_out(p, args)])
        rep["fit_on_medians"] = {"steps": check_steps(held, cm_med), "tiers": simulated_tiers(loads, cm_med)}
    if profiles:
        rep["probe"]["tracking"] = [
            drift_tracking(r["steps_priced"], o, statistics.median(ref))
            for r, o in zip(rep["load"]["per_replay"], on_load)
        ]
    rep["machine"]["load_avg_end"] = os.getloadavg()
    step_err = max((abs(r["error"]) for r in rep["steps"]), default=float("nan"))
    tier_max = lambda tiers: max(max(abs(r["ttft_error"]), abs(r["tpot_error"])) for r in tiers.values())  # noqa: E731
    tier_err = tier_max(rep["load"]["tiers"])
    by_replay = [tier_max(r["tiers"]) for r in rep["load"]["per_replay"]]
    at_probe = rep["load"]["at_probe_speed"]
    probe_err = tier_max(at_probe["tiers"]) if at_probe else float("nan")
    rep["verdict"] = {
        "step_max_abs_error": step_err,
        "steps_pass": step_err <= STEP_TARGET,
        "tier_max_abs_error": tier_err,
        "tiers_pass": tier_err <= TIER_TARGET,
        "tier_max_abs_error_by_replay": by_replay,
        "replays_passing": sum(e <= TIER_TARGET for e in by_replay),
        "tier_max_abs_error_at_probe_speed": probe_err,
        "tiers_pass_at_probe_speed": probe_err <= TIER_TARGET if at_probe else None,
    }
    rep["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=2) + "\n")
    print_report(rep)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
