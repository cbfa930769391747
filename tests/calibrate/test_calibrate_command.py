"""`fastmode calibrate --quick` and its sweep on the tiny test model (seconds)."""

from __future__ import annotations

import json

import pytest

from fastmode.calibrate.calibration_file import load_points
from fastmode.cli import main
from fastmode.planner.catalog import load_hardware
from fastmode.planner.hardware import Calibration


def test_quick_calibration_writes_a_file_the_planner_accepts(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert (
        main(
            [
                "calibrate",
                "--quick",
                "--model",
                str(tiny_llama_dir),
                "--dtype",
                "float32",
                "--threads",
                "1",
                "--clock",
                "cpu",
                "--out",
                str(out),
                "--usd-per-hour",
                "0.2",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    d = json.loads(out.read_text())
    assert d["hardware"] == "local" and d["weight_format"] == "fp32" and d["usd_per_hour"] == 0.2
    hw = load_hardware("local", calibration=str(out))
    assert hw.overhead_s == pytest.approx(d["overhead_s"]) and hw.eta_c == pytest.approx(d["eta_c"])
    assert hw.mem_bw_bytes_per_s == pytest.approx(d["mem_bw_GBps"] * 1e9)
    assert Calibration.load(out).fitted_from.startswith(f"fastmode calibrate: {tiny_llama_dir.name} fp32")
    points = load_points(out)
    kinds = {p.kind for p in points}
    assert (
        kinds == {"decode", "prefill"} and len(points) == 3 * 2 + 4 + 2
    )  # 3 batches x 2 contexts; chunk 8 at 4 contexts, 32 at 2
    assert {p.num_decodes for p in points if p.kind == "decode"} == {1, 2, 4}
    assert all(p.step_s > 0 for p in points)
    tiers = {p["tier"]: p for p in report["prices"]}
    assert tiers["standard"]["multiplier"] == 1.0 and tiers["fast"]["batch"] == 4
    # The speculation threshold (planner.speculative.break_even_batch on the fitted model) is stored with the fit.
    b = report["speculative_max_batch"]
    assert d["speculative_max_batch"] == {"value": b, "acceptance": 0.6, "draft_len": 4, "context": 32}
    assert 0 <= b <= 64
    # The simulator takes the file as it is.
    assert (
        main(
            [
                "simulate",
                "--model",
                "smollm2-135m",
                "--hardware",
                "local",
                "--calibration",
                str(out),
                "--num-requests",
                "10",
                "--rate",
                "1",
                "--output-len",
                "8",
                "--kv-cache-gib",
                "0.2",
                "--json",
            ]
        )
        == 0
    )
    sim = json.loads(capsys.readouterr().out)
    assert sim["aggregate"]["num_requests"] == 10
    assert sim["setup"]["weight_format"] == "fp32"  # taken from the calibration file


def test_cpu_clock_needs_one_thread():
    from fastmode.calibrate.measure import SweepConfig

    with pytest.raises(ValueError, match="num_threads = 1"):
        SweepConfig(clock="cpu", num_threads=2)


def test_decode_sweep_rotates_batches_and_rounds_merge_by_mean(tiny_llama_dir):
    """Every batch size is measured in every round (the engine really ran B sequences: the sweep
    raises otherwise), rounds merge into the mean of all their steps, and points line up across rounds."""
    import dataclasses

    from fastmode.calibrate.measure import SweepConfig, _point_stats
    from fastmode.calibrate.points import StepPoint
    from fastmode.calibrate.run import measure_interleaved, merge_rounds
    from fastmode.loader import load_model

    loaded = load_model(str(tiny_llama_dir), "float32")
    sweep = SweepConfig(
        batches=(1, 3, 8),
        contexts=(16,),
        chunk_sizes=(8,),
        prefill_tokens_per_size=16,
        repeats=3,
        warmup=1,
        prefill_repeats=1,
        rounds=2,
        num_threads=1,
    )
    points = measure_interleaved(loaded, sweep)
    decodes = [p for p in points if p.kind == "decode"]
    assert [p.num_decodes for p in decodes] == [8, 3, 1]
    assert all(p.num_samples == 3 * 2 for p in decodes)  # repeats x rounds
    # One round of warmup and three timed ones, one step per batch size each: contexts grow by a few tokens.
    assert all(16 <= p.decode_context <= 16 + 4 * 3 for p in decodes)
    assert [p.prefill_context for p in points if p.kind == "prefill"] == [0, 8]

    assert all(p.median_s > 0 for p in points)
    # A point keeps its timed steps' mean as step_s (what a simulation adds up), their median beside it.
    assert _point_stats([0.010, 0.010, 0.010, 0.040]) == {"step_s": 0.0175, "median_s": 0.010, "spread": 3.0}
    a = StepPoint("decode", 0.010, num_decodes=4, decode_context=100.0, num_samples=5, spread=0.1, median_s=0.009)
    rounds = [
        [dataclasses.replace(a, step_s=t, median_s=md, decode_context=c, num_samples=n)]
        for t, md, c, n in ((0.010, 0.009, 100, 5), (0.030, 0.020, 102, 10), (0.012, 0.011, 104, 5))
    ]
    (m,) = merge_rounds(rounds)
    # The mean of all 20 steps: a round in a slow spell counts by its samples, as the load's steps would.
    assert m.step_s == pytest.approx((0.010 * 5 + 0.030 * 10 + 0.012 * 5) / 20)
    assert m.median_s == 0.011 and m.decode_context == 102.0 and m.num_samples == 20
    assert m.spread == pytest.approx((0.030 - 0.010) / m.step_s)
    (old_file,) = merge_rounds([[dataclasses.replace(a, median_s=0.0)], [a]])  # a point saved before median_s
    assert old_file.median_s == 0.0 and old_file.step_s == 0.010
    with pytest.raises(ValueError, match="different points"):
        merge_rounds([[a], [dataclasses.replace(a, num_decodes=8)]])


def test_sweep_units_spread_the_sweep_and_measure_what_measure_sweep_does(tiny_llama_dir):
    """sweep_units yields once per decode round and prefill pass (what a load test interleaves
    with its own steps), and leaves behind the same points, in the same order, as measure_sweep."""
    from fastmode.calibrate.measure import SweepConfig, measure_sweep, sweep_units, units_per_sweep
    from fastmode.loader import load_model

    loaded = load_model(str(tiny_llama_dir), "float32")
    sweep = SweepConfig(
        batches=(1, 3),
        contexts=(16,),
        chunk_sizes=(8,),
        prefill_tokens_per_size=16,
        repeats=3,
        warmup=1,
        prefill_repeats=2,
        num_threads=1,
    )
    assert units_per_sweep(sweep) == (1 + 3) + (2 + 1)
    points: list = []
    units = sweep_units(loaded, sweep, points=points)
    n = 0
    for _ in units:
        n += 1
        assert points == []  # filled only once the whole sweep has run
    assert n == units_per_sweep(sweep)
    direct = measure_sweep(loaded, sweep)
    key = lambda p: (p.kind, p.num_decodes, p.prefill_tokens, p.prefill_context)  # noqa: E731
    assert [key(p) for p in points] == [key(p) for p in direct] and all(p.step_s > 0 for p in points)
    assert {p.num_samples for p in points if p.kind == "decode"} == {3}


def test_calibrate_flags_default_to_the_sweep_config():
    """CalibrateOptions spells out SweepConfig's defaults (building the CLI must not import the engine)."""
    from fastmode.calibrate.command import CalibrateOptions, sweep_from_args
    from fastmode.calibrate.measure import SweepConfig
    from fastmode.cli import build_parser

    opts, sweep = CalibrateOptions(), SweepConfig()
    assert (opts.batches, opts.contexts, opts.chunks, opts.repeats, opts.rounds, opts.threads, opts.clock) == (
        sweep.batches,
        sweep.contexts,
        sweep.chunk_sizes,
        sweep.repeats,
        sweep.rounds,
        sweep.num_threads,
        sweep.clock,
    )
    args = build_parser().parse_args(["calibrate", "--batches", "1,4", "--contexts", "256", "--split-tokens", "auto"])
    assert sweep_from_args(args).batches == (1, 4) and sweep_from_args(args).contexts == (256,)
    assert args.split_tokens is None
