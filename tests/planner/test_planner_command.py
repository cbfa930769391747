"""`fastmode plan` prints what it promises (one JSON object, or a readable report)."""

from __future__ import annotations

import json

import pytest

REQUIRED_KEYS = {"step_time_s", "per_user_tok_s", "aggregate_tok_s", "usd_per_mtok", "fits", "devices"}


def _plan_json(cli, capsys, *argv):
    assert cli("plan", *argv, "--json") == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_has_required_keys(cli, capsys):
    r = _plan_json(cli, capsys, "--model", "llama-3.1-8b", "--hardware", "h100", "--tp", "1", "--batch", "16")
    assert REQUIRED_KEYS <= set(r)
    assert r["devices"] == 1 and r["fits"] is True and r["batch"] == 16
    assert r["aggregate_tok_s"] == pytest.approx(16 * r["per_user_tok_s"])


def test_plan_options_change_the_answer(cli, capsys):
    base = _plan_json(cli, capsys, "--model", "llama-3.1-70b", "--hardware", "h100", "--batch", "4", "--tp", "2")
    fp8 = _plan_json(
        cli, capsys, "--model", "llama-3.1-70b", "--hardware", "h100", "--batch", "4", "--tp", "2", "--format", "fp8"
    )
    longer = _plan_json(
        cli, capsys, "--model", "llama-3.1-70b", "--hardware", "h100", "--batch", "4", "--context", "65536", "--tp", "8"
    )
    assert fp8["per_user_tok_s"] > base["per_user_tok_s"] and fp8["weight_format"] == "fp8"
    assert longer["devices"] == 8 and longer["context_tokens"] == 65536
    spec = _plan_json(cli, capsys, "--model", "llama-3.1-8b", "--spec", "--spec-acceptance", "0.8")
    assert spec["speculative"]["speedup"] > 1 and spec["per_user_tok_s"] > spec["no_spec"]["per_user_tok_s"]


def test_plan_reports_a_load_that_does_not_fit(cli, capsys):
    r = _plan_json(cli, capsys, "--model", "llama-3.1-405b", "--hardware", "h100", "--tp", "1")
    assert r["fits"] is False and r["devices_needed"] >= 12


def test_plan_fleet_and_sweep(cli, capsys):
    r = _plan_json(
        cli,
        capsys,
        "--model",
        "llama-3.1-8b",
        "--sweep",
        "--max-batch",
        "64",
        "--fast-rps",
        "1",
        "--fast-min-tok-s",
        "120",
        "--standard-rps",
        "10",
        "--standard-max-ttft-s",
        "2",
    )
    assert [p["batch"] for p in r["bus_curve"]] == [1, 2, 4, 8, 16, 32, 64]
    tiers = {t["tier"]: t for t in r["fleet"]["tiers"]}
    assert set(tiers) == {"fast", "standard"} and tiers["fast"]["per_user_tok_s"] >= 120


def test_plan_text_report(cli, capsys):
    assert (
        cli("plan", "--model", "smollm2-135m", "--hardware", "local", "--format", "q4_1", "--sweep", "--max-batch", "8")
        == 0
    )
    text = capsys.readouterr().out
    assert "per-user" in text and "aggregate" in text and "$/Mtok" in text


def test_plan_calibration_file(cli, capsys, tmp_path):
    cal = tmp_path / "local.json"
    cal.write_text(json.dumps({"hardware": "local", "mem_bw_GBps": 20.0, "overhead_s": 0.0}))
    slow = _plan_json(cli, capsys, "--model", "smollm2-135m", "--hardware", "local", "--calibration", str(cal))
    base = _plan_json(cli, capsys, "--model", "smollm2-135m", "--hardware", "local")
    assert slow["mem_s"] > 2 * base["mem_s"] and slow["calibration"] == str(cal)


def test_plan_plots(cli, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    r = _plan_json(cli, capsys, "--model", "llama-3.1-8b", "--max-batch", "32", "--plot-dir", str(tmp_path))
    names = sorted(p.split("/")[-1] for p in r["plots"])
    assert names == ["bus_curve.png", "frontier.png"]
    for p in r["plots"]:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
