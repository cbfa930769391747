"""Re-fit a saved validation run on a chosen subset of its measurement rounds, and compare
the tiers again. A diagnostic: no engine runs, only the fit and the simulator.

    python benchmarks/validation/sim_validation_refit.py runs/sim_validation.json --rounds during
    python benchmarks/validation/sim_validation_refit.py runs/sim_validation.json --rounds 0,3

benchmarks/validation/sim_validation.py keeps every round's points (`points_by_round`, in the order
before, during, after) and the load's real per-tier figures. The cost model is fitted, as that
script does, to the calibration points over the chosen rounds (held-out points left out): their
mean step times, as that script fits them, or with `--estimator median` their medians (for runs
whose points saved medians beside their means). The same seeded workload is then simulated with
the load's scheduler config and compared with the load's real per-tier means (the replays'
pooled means; each replay's own are printed too). Which rounds to trust is a choice to make
before looking at the answer; this shows what each gives. It also prints the run's own in-situ
table (its fit on the load's steps, with the drift taken out window by window) from the saved
`load.steps_priced` (per replay), for runs that saved it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def choose_rounds(spec: str, rounds: dict) -> list[int]:
    nb, nd, na = rounds["before"], rounds.get("during", 0), rounds["after"]
    named = {
        "all": range(nb + nd + na),
        "during": range(nb, nb + nd),
        "around": [*range(nb), *range(nb + nd, nb + nd + na)],
    }
    picked = list(named[spec]) if spec in named else [int(x) for x in spec.split(",")]
    if not picked or any(not 0 <= i < nb + nd + na for i in picked):
        raise SystemExit(
            f"--rounds {spec!r}: this run has rounds 0-{nb + nd + na - 1} ({nb} before, {nd} during, "
            f"{na} after); none chosen, or out of range"
        )
    return picked


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a JSON written by benchmarks/validation/sim_validation.py (with per-round points)")
    p.add_argument("--rounds", default="during", help="all, during, around (before and after), or indices like 0,3")
    p.add_argument(
        "--estimator",
        default="mean",
        choices=["mean", "median"],
        help="fit each point's mean step time (default) or its median (needs a run that saved medians)",
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.validation
    from benchmarks.validation import sim_validation as sv
    from benchmarks.validation.pace import simulate_at_pace
    from fastmode.calibrate.points import StepPoint
    from fastmode.calibrate.run import merge_rounds
    from fastmode.engine.scheduler import SchedulerConfig
    from fastmode.loader import load_model
    from fastmode.sim.report import summarize
    from fastmode.sim.simulator import SimConfig, simulate

    rep = json.loads(Path(args.run).read_text())
    if "points_by_round" not in rep or "rounds" not in rep:
        raise SystemExit(f"{args.run}: no per-round points (not a sim_validation.py run)")
    picked = choose_rounds(args.rounds, rep["rounds"])
    per_round = [[StepPoint.from_json(d) for d in rep["points_by_round"][i]] for i in picked]
    rate, n = rep["load"]["rate_per_s"], rep["load"]["num_requests"]
    vargs = sv.parse_args(["--rate", str(rate), "--duration-s", str(n / rate)])  # the same n requests
    merged = merge_rounds(per_round)
    if args.estimator == "median":
        if any(q.median_s <= 0 for q in merged):
            raise SystemExit(f"{args.run}: its points saved no medians beside their means: use --estimator mean")
        merged = sv.at_medians(merged)
    loaded = load_model(vargs.model, rep.get("dtype", "auto"))
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    cm, _ = sv.fit_cost_model(vargs, loaded, [q for q in merged if not sv.is_held_out(q, vargs)], log, final=False)
    sched = SchedulerConfig(**rep["load"]["scheduler"])
    workload, _ = sv.make_workload(vargs, cm, sched, 1.0, log)
    if len(workload) != rep["load"]["num_requests"]:
        raise SystemExit(
            f"regenerated {len(workload)} requests, the run replayed {rep['load']['num_requests']}: "
            "its workload options differ from this script's defaults"
        )
    sim_t = summarize(simulate(workload, cm, SimConfig(sched)).requests)  # prices do not move TTFT or TPOT
    steps = sv.check_steps([q for q in merged if sv.is_held_out(q, vargs)], cm)
    print(f"{args.run}: fitted to the {args.estimator}s of rounds {picked} of {rep['rounds']}")
    print("  held-out steps: worst " + (f"{max(abs(r['error']) for r in steps):.1%}" if steps else "-"))
    worst = 0.0
    for t, r in rep["load"]["tiers"].items():
        e_ttft = sv.err(sim_t[t].ttft_mean_s, r["real"]["ttft_mean_s"])
        e_tpot = sv.err(sim_t[t].tpot_mean_s, r["real"]["tpot_mean_s"])
        worst = max(worst, abs(e_ttft), abs(e_tpot))
        print(f"  {t:<9} TTFT {e_ttft:+.1%}  TPOT {e_tpot:+.1%}")
    print(f"  tier max |error| {worst:.1%}")
    replays = rep["load"].get("per_replay") or [rep["load"]]  # a run without per_replay replayed once
    for k, r in enumerate(replays if len(replays) > 1 else ()):
        level = f" (its steps x{sv.load_vs_fit(r['steps_priced']):.3f} the run's fit)" if "steps_priced" in r else ""
        print(
            f"  replay {k + 1} on its own{level}: "
            + ", ".join(
                f"{t} TTFT {sv.err(sim_t[t].ttft_mean_s, e['real']['ttft_mean_s']):+.1%} "
                f"TPOT {sv.err(sim_t[t].tpot_mean_s, e['real']['tpot_mean_s']):+.1%}"
                for t, e in r["tiers"].items()
            )
        )
    priced = [r["steps_priced"] for r in replays if "steps_priced" in r]
    if priced and args.rounds == "all" and args.estimator == "mean":
        # The run's own fit priced its steps; with all rounds' means this refit is that fit.
        for window_s in (15.0, 5.0):
            sim_p = summarize(
                [
                    m
                    for p in priced
                    for m in simulate_at_pace(workload, cm, SimConfig(sched), sv.own_pace(p, window_s)).requests
                ]
            )
            print(
                f"  at the engine's own pace per {window_s:g} s of load: "
                + ", ".join(
                    f"{t} TTFT {sv.err(sim_p[t].ttft_mean_s, r['real']['ttft_mean_s']):+.1%} "
                    f"TPOT {sv.err(sim_p[t].tpot_mean_s, r['real']['tpot_mean_s']):+.1%}"
                    for t, r in rep["load"]["tiers"].items()
                )
            )
    if priced:  # the run's own fit on the load's steps (this refit does not re-price them)
        print("  in situ, the run's own fit: error, and error with the drift taken out (15 s windows)")
        for kind, r in sv.step_errors_in_situ(priced).items():
            print(f"    {kind:<16}{r['num_steps']:>5} steps  {r['error']:+.1%}  {r['error_in_window']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
