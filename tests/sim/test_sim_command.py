"""`fastmode simulate` end to end (no torch, well under a second per run)."""

from __future__ import annotations

import json

from fastmode.cli import main


def test_simulate_json(capsys):
    assert main(["simulate", "--num-requests", "60", "--rate", "10", "--output-len", "uniform:8:32",
                 "--prompt-len", "lognormal:200:0.5", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["aggregate"]["num_requests"] == 60
    assert rep["aggregate"]["kv_blocks_free_end"] == rep["aggregate"]["kv_blocks_total"]
    assert rep["setup"]["hardware"] == "h100" and rep["setup"]["usd_per_machine_hour"] == 2.95
    assert set(rep["tiers"]) <= {"fast", "standard", "flex"}


def test_simulate_saves_and_replays_a_workload(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    args = ["simulate", "--model", "smollm2-135m", "--hardware", "local", "--num-requests", "30", "--rate", "2",
            "--output-len", "16", "--prompt-len", "64", "--tier-mix", "fast=0.5,flex=0.5", "--kv-cache-gib", "0.5"]
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
