"""The reliability calculator reproduces the seeds' table and its formulas."""

from __future__ import annotations

import json
import random

import pytest

from fastmode.planner.chain import Mode, evaluate_chain, expected_steps, seed_modes, seed_table


def test_seed_table_to_stated_precision():
    table = {round(r["p_step"], 2): round(r["p_success"] * 100, 1) for r in seed_table(10)}
    assert table[0.8] == 10.7
    assert table[0.9] == 34.9
    assert table[0.68] == 2.1  # 0.9 x 58.4/77.3
    assert table[0.75] == 5.6


def test_spark_p_step_comes_from_the_benchmark_ratio():
    spark = [m for m in seed_modes() if m.name == "spark-0.68"][0]
    assert spark.p_step == pytest.approx(0.9 * 58.4 / 77.3, abs=0.005)


def test_strategy_formulas():
    p, n = 0.9, 10
    assert expected_steps(p, n, "pipeline") == pytest.approx(n / p**n)
    assert expected_steps(p, n, "step") == pytest.approx(n / p)
    assert expected_steps(p, 1, "restart") == pytest.approx(1 / p)
    assert expected_steps(1.0, n, "restart") == n
    assert expected_steps(p, n, "step") < expected_steps(p, n, "restart") < expected_steps(p, n, "pipeline")


def test_restart_formula_by_simulation():
    rng, p, n, trials, total = random.Random(0), 0.8, 5, 20_000, 0
    for _ in range(trials):
        streak = 0
        while streak < n:
            total += 1
            streak = streak + 1 if rng.random() < p else 0
    assert total / trials == pytest.approx(expected_steps(p, n, "restart"), rel=0.03)


def test_time_and_cost_scale_with_expected_steps():
    m = Mode("m", 0.9, 100.0, 10.0, tokens_per_step=500, latency_s=0.5)
    r = evaluate_chain(m, 10, "pipeline")
    assert r.expected_time_s == pytest.approx(r.expected_steps * (0.5 + 5.0))
    assert r.expected_cost_usd == pytest.approx(r.expected_steps * 500 * 10.0 / 1e6)


def test_chain_command_json(cli, capsys):
    assert cli("chain", "--json", "--strategy", "pipeline") == 0
    out = json.loads(capsys.readouterr().out)
    assert {"n_steps", "p_n_table", "modes", "strategies", "results"} <= set(out)
    assert set(out["strategies"]) == {"pipeline"}
    assert len(out["results"]) == len(out["modes"]) == 4


def test_chain_command_custom_modes_and_text(cli, capsys):
    assert cli("chain", "--mode", "a:0.95:100:5", "--mode", "b:0.7:1000:1", "--steps", "5") == 0
    text = capsys.readouterr().out
    assert "0.800^5" in text and "strategy 'step'" in text and "a " in text
    with pytest.raises(SystemExit):
        cli("chain", "--mode", "broken:1.5")
