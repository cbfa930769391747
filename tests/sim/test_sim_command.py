"""`fastmode simulate` end to end (no torch, well under a second per run)."""

from __future__ import annotations

import json

from fastmode.cli import main


def test_simulate_json(capsys):
    assert (
        main(
            [
                "simulate",
                "--num-requests",
                "60",
                "--rate",
                "10",
                "--output-len",
                "uniform:8:32",
                "--prompt-len",
                "lognormal:200:0.5",
                "--json",
            ]
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert rep["aggregate"]["num_requests"] == 60
    assert rep["aggregate"]["kv_blocks_free_end"] == rep["aggregate"]["kv_blocks_total"]
    assert rep["setup"]["hardware"] == "h100" and rep["setup"]["usd_per_machine_hour"] == 2.95
    assert set(rep["tiers"]) <= {"fast", "standard", "flex"}


def test_simulate_saves_and_replays_a_workload(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    args = [
        "simulate",
        "--model",
        "smollm2-135m",
        "--hardware",
        "local",
        "--num-requests",
        "30",
        "--rate",
        "2",
        "--output-len",
        "16",
        "--prompt-len",
        "64",
        "--tier-mix",
        "fast=0.5,flex=0.5",
        "--kv-cache-gib",
        "0.5",
    ]
    assert main(args + ["--save-workload", str(path), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(path.read_text().splitlines()) == 30
    assert main(args + ["--workload", str(path), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["tiers"] == second["tiers"]


def test_simulate_text_report(capsys):
    assert main(["simulate", "--num-requests", "20", "--fast-lane-max-batch", "none", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "on 2x h100" in out and "fast lane None" in out and "aggregate:" in out


def test_simulate_step_jitter_flag(capsys):
    args = ["simulate", "--num-requests", "60", "--rate", "10", "--output-len", "uniform:8:32", "--json"]
    runs = []
    for extra in (
        [],
        ["--step-jitter-cv", "0.3"],
        ["--step-jitter-cv", "0.3"],
        ["--step-jitter-cv", "0.3", "--seed", "1"],
    ):
        assert main(args + extra) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[1]["setup"]["step_jitter_cv"] == 0.3 and runs[0]["setup"]["step_jitter_cv"] == 0.0
    assert runs[1]["tiers"] == runs[2]["tiers"]  # seeded
    assert runs[1]["aggregate"]["makespan_s"] != runs[0]["aggregate"]["makespan_s"]
    assert runs[3]["aggregate"]["makespan_s"] != runs[1]["aggregate"]["makespan_s"]
    assert main(args + ["--step-jitter-cv", "-1"]) == 2
    assert "step_jitter_cv must be in [0, 10]" in capsys.readouterr().err
    assert main(["simulate", "--rate", "-1"]) == 2
    assert "rate_per_s must be > 0" in capsys.readouterr().err
