"""The agent eval's arithmetic: per-step accuracy, success by n beside p^n, time and
cost to a correct result, the chain calculator's inputs, and their JSON and plot."""

from __future__ import annotations

import json

import pytest

from fastmode.evals.agent.loop import Attempt, StepRecord, TaskRecord
from fastmode.evals.agent.report import format_table, markdown_table, plot, summarize, to_json
from fastmode.planner.chain import modes_from_agent_eval


def _attempt(latency_s: float = 1.0, tokens: int = 20, cost: float = 1e-4, ttft: float = 0.2) -> Attempt:
    return Attempt("get", {"key": "k"}, "v", True, latency_s, ttft, 300, tokens, cost, 0.5, "default", "tool_calls")


def _step(turn: int, right: bool | None, first: bool | None = None, attempts: int = 1) -> StepRecord:
    return StepRecord(
        turn, "get", {"key": "k"}, "v", True, right, right if first is None else first,
        [_attempt() for _ in range(attempts)],
    )  # fmt: skip


def _record(n: int, rights: list[bool | None], solved: bool, wall_s: float = 2.0, **kw) -> TaskRecord:
    steps = [_step(i, r) for i, r in enumerate(rights)]
    return TaskRecord(f"t{n}-{len(rights)}", "f", n, "r", solved, solved, solved, "x", wall_s, steps, **kw)


def test_summary_counts_scored_steps_and_prices_correct_results():
    records = [
        _record(1, [True], True),
        _record(2, [True, True], True),
        _record(2, [True, False, None], False),  # off the path after a wrong step: the third is not scored
        _record(3, [False, None], False),
    ]
    s = summarize("r", records)
    assert (s.p.num_correct, s.p.num_total) == (4, 6)
    assert (s.success.num_correct, s.success.num_total) == (2, 4)
    assert {n: (p.num_correct, p.num_total) for n, p in s.by_n.items()} == {1: (1, 1), 2: (1, 2), 3: (0, 1)}
    assert s.predicted(3) == pytest.approx((4 / 6) ** 3)
    # 4 runs of 2 s and 8 requests of 1e-4 $ bought 2 right results.
    assert s.wall_s_per_task == pytest.approx(2.0)
    assert s.time_to_correct_s == pytest.approx(8.0 / 2)
    assert s.cost_to_correct_usd == pytest.approx(8e-4 / 2)
    ci = s.chain_inputs
    assert ci["p_step"] == pytest.approx(4 / 6)
    assert ci["step_s"] == pytest.approx(1.0) and ci["latency_s"] == pytest.approx(0.2)
    assert ci["tokens_per_step"] == pytest.approx(20) and ci["tok_s"] == pytest.approx(20 / 0.8)
    assert ci["usd_per_mtok"] == pytest.approx(1e-4 / 20 * 1e6)


def test_no_correct_result_has_no_time_to_correct():
    s = summarize("r", [_record(2, [False, None], False)])
    assert s.time_to_correct_s is None and s.cost_to_correct_usd is None
    assert "-" in format_table([s])


def test_retries_count_in_the_step_and_first_attempt_accuracy():
    rec = TaskRecord("t", "f", 1, "r", True, True, True, "x", 3.0, [_step(0, True, first=False, attempts=3)])
    s = summarize("r", [rec])
    assert s.p.value == 1.0 and s.p_first.value == 0.0
    assert rec.totals()["retries"] == 2 and rec.totals()["requests"] == 3
    assert s.chain_inputs["step_s"] == pytest.approx(3.0)  # three attempts of 1 s in one step
    assert "first attempt" in format_table([s])


def test_json_plot_and_chain_modes(tmp_path):
    good = summarize("standard", [_record(1, [True], True), _record(2, [True, False], False)])
    dead = summarize("spark", [_record(1, [False], False)])
    doc = json.loads(json.dumps(to_json([good, dead], {"command": "test"})))
    assert doc["kind"] == "fastmode-agent-eval" and [r["route"] for r in doc["routes"]] == ["standard", "spark"]
    assert doc["routes"][0]["by_n"]["2"]["predicted_p_n"] == pytest.approx((2 / 3) ** 2)
    assert doc["routes"][0]["tasks"][1]["steps"][1]["right"] is False
    modes, notes = modes_from_agent_eval(doc)
    assert [m.name for m in modes] == ["standard"] and notes and notes[0].startswith("spark")
    m = modes[0]
    assert m.p_step == pytest.approx(2 / 3)
    assert m.step_time_s == pytest.approx(good.chain_inputs["step_s"])  # latency + tokens / tok/s = measured
    assert m.step_cost_usd == pytest.approx(good.chain_inputs["step_cost_usd"])
    with pytest.raises(ValueError, match="agent"):
        modes_from_agent_eval({"kind": "something else"})
    assert plot([good, dead], tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert markdown_table([good, dead]).startswith("| metric | standard | spark |")


def test_chain_command_reads_the_agent_eval(tmp_path, capsys):
    from fastmode.cli import main

    path = tmp_path / "agent.json"
    good = summarize("fast", [_record(1, [True], True), _record(2, [True, True], True)])
    path.write_text(json.dumps(to_json([good], {})))
    assert main(["chain", "--from-agent-eval", str(path), "--steps", "3", "--strategy", "step", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in out["modes"]] == ["fast"] and out["modes"][0]["p_step"] == 1.0
    assert out["results"][0]["expected_time_s"] == pytest.approx(3 * good.chain_inputs["step_s"])
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(SystemExit, match="cannot read"):
        main(["chain", "--from-agent-eval", str(tmp_path / "other.json")])
