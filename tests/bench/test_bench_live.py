"""`fastmode bench` against our real server (uvicorn on a free port, the tiny model).

Greedy on the tiny model, LONG_PROMPT runs to max_tokens without EOS and
SHORT_PROMPT stops at once (tests/server/conftest.py), which makes output
token counts predictable without `ignore_eos`.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fastmode.bench.client import BenchClient, EndpointConfig
from fastmode.bench.load import LoadSpec, run_level
from fastmode.bench.stats import SLO, summarize_level
from fastmode.bench.workload import WorkloadConfig
from fastmode.cli import main
from tests.server.conftest import LONG_PROMPT, SHORT_PROMPT, server, tiny_loaded  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def long_prompts(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text(LONG_PROMPT + "\n")
    return str(f)


def bench(server, tmp_path, *argv: str) -> tuple[int, dict]:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--base-url", server.url + "/v1", "--json", str(out), "--no-progress", *argv])
    return rc, json.loads(out.read_text())


def test_closed_loop_sweep_counts_tiers_tokens_and_plots(server, tmp_path, long_prompts, capsys):
    rc, rep = bench(
        server,
        tmp_path,
        "--concurrency",
        "1,3",
        "--num-requests",
        "5",
        "--max-tokens",
        "6",
        "--tier-mix",
        "fast=0.2,standard=0.8",
        "--prompts",
        long_prompts,
        "--warmup-requests",
        "1",
        "--slo-ttft-s",
        "fast=30,standard=60",
        "--plots",
        str(tmp_path / "plots"),
    )
    assert rc == 0
    assert rep["setup"]["model"] == server.model  # found through GET /v1/models
    assert rep["setup"]["service_tier_field"] == {"fast": "priority", "standard": "default", "flex": "flex"}
    assert [lv["concurrency"] for lv in rep["levels"]] == [1, 3]
    for lv in rep["levels"]:
        assert lv["warmup"] == {"requests": 1, "failed": 0}
        fast, std = lv["tiers"]["fast"], lv["tiers"]["standard"]
        assert (fast["num_requests"], std["num_requests"]) == (1, 4)  # the mix, exactly
        assert fast["served_tiers"] == {"priority": 1} and std["served_tiers"] == {"default": 4}
        agg = lv["aggregate"]
        assert agg["completed"] == 5 and agg["failed"] == 0 and agg["errors"] == {}
        assert agg["output_tokens"] == 30 and agg["output_tokens_from_usage"] is True
        assert agg["goodput"]["good"] == 5 and agg["goodput"]["share"] == 1.0
        assert agg["output_tok_s"] == pytest.approx(30 / lv["window_s"])
        assert agg["ttft_s"]["p50"] <= agg["ttft_s"]["p99"] <= agg["e2e_s"]["max"]
        assert sorted(r["index"] for r in lv["requests"]) == list(range(5))
        for r in lv["requests"]:
            assert r["ok"] and r["status"] == 200 and r["finish_reason"] == "length"
            assert r["output_tokens"] == 6 and r["prompt_tokens"] > 0
            assert 0 < r["ttft_s"] <= r["e2e_s"] and r["tpot_s"] > 0
    # The same seeded requests at every level.
    tiers = [[r["tier"] for r in lv["requests"]] for lv in rep["levels"]]
    assert tiers[0] == tiers[1]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "cdf_c1.png",
        "cdf_c3.png",
        "latency_vs_throughput.png",
    ]
    out = capsys.readouterr().out
    assert "concurrency 3: 5/5 completed" in out and "fast " in out and "standard " in out


def test_open_loop_poisson(server, long_prompts, capsys):
    cfg = EndpointConfig(server.url, server.model)
    wl = WorkloadConfig(prompts=long_prompts, output_len="4", tier_mix="fast=0.5,flex=0.5", block_size=8, seed=1)
    spec = LoadSpec("open", 20.0, num_requests=8, warmup_requests=1, seed=1)

    async def go():
        async with BenchClient(cfg) as client:
            return await run_level(client, wl, spec, progress=True)

    run = asyncio.run(go())
    level = summarize_level(run, SLO())
    assert level["mode"] == "open" and level["rate_req_s"] == 20.0 and level["label"] == "r20"
    assert {t: s["num_requests"] for t, s in level["tiers"].items()} == {"fast": 4, "flex": 4}
    assert level["aggregate"]["completed"] == 8 and level["aggregate"]["output_tokens"] == 32
    scheduled = sorted(r.scheduled_s - run.t0 for r in run.records)
    assert scheduled[0] > 0 and scheduled[-1] < 5  # 8 arrivals at 20/s: well under a second on average
    assert level["warmup"] == {"requests": 1, "failed": 0}
    # The client kept to its schedule (loosely: the server shares this process's GIL).
    assert level["schedule_lag_s"]["max"] < 1.0
    assert "bench 20 req/s" in capsys.readouterr().err  # the progress bar


def test_errors_are_counted_by_status(server, tmp_path):
    rc, rep = bench(server, tmp_path, "--model", "no-such-model", "--num-requests", "3", "--concurrency", "2")
    assert rc == 1  # nothing completed
    agg = rep["levels"][0]["aggregate"]
    assert agg["failed"] == 3 and agg["completed"] == 0 and agg["errors"] == {"404": 3}
    assert agg["goodput"]["good"] == 0 and agg["ttft_s"]["p50"] is None
    r = rep["levels"][0]["requests"][0]
    assert r["status"] == 404 and "does not exist" in r["error"]


def test_completions_without_tier_field_or_usage_counts_chunks(server, tmp_path, long_prompts):
    rc, rep = bench(
        server,
        tmp_path,
        "--endpoint",
        "completions",
        "--no-tier-field",
        "--no-usage",
        "--num-requests",
        "4",
        "--max-tokens",
        "6",
        "--prompts",
        long_prompts,
        "--tier-mix",
        "fast=1",
    )
    assert rc == 0 and rep["setup"]["url"].endswith("/v1/completions")
    lv = rep["levels"][0]
    assert lv["tiers"]["fast"]["served_tiers"] == {"default": 4}  # only a label: served as standard
    assert lv["aggregate"]["output_tokens_from_usage"] is False
    for r in lv["requests"]:
        assert not r["usage_tokens"] and r["prompt_tokens"] is None
        assert r["output_tokens"] == r["num_chunks"] and 1 <= r["output_tokens"] <= 6


def test_ignore_eos_runs_to_max_tokens(server, tmp_path):
    prompts = tmp_path / "short.txt"
    prompts.write_text(SHORT_PROMPT + "\n")
    args = ("--num-requests", "2", "--max-tokens", "5", "--prompts", str(prompts))
    rc, rep = bench(server, tmp_path, *args)
    assert rc == 0 and all(r["ok"] and r["output_tokens"] < 5 for r in rep["levels"][0]["requests"])  # EOS first
    rc, rep = bench(server, tmp_path, "--ignore-eos", *args)
    assert rc == 0 and rep["setup"]["ignore_eos"] is True
    assert all(
        r["ok"] and r["output_tokens"] == 5 and r["finish_reason"] == "length" for r in rep["levels"][0]["requests"]
    )


def test_closed_loop_bounded_by_time(server, long_prompts):
    cfg = EndpointConfig(server.url, server.model)
    wl = WorkloadConfig(prompts=long_prompts, output_len="3", tier_mix="flex=1")
    spec = LoadSpec("closed", 2, duration_s=0.4)

    async def go():
        async with BenchClient(cfg) as client:
            return await run_level(client, wl, spec)

    run = asyncio.run(go())
    assert len(run.records) >= 2 and all(r.ok and r.output_tokens == 3 for r in run.records)
    assert max(r.start_s for r in run.records) - run.t0 < 0.4  # nothing started after the deadline
    assert run.t_end == max(r.end_s for r in run.records)  # requests in flight at the deadline ran to their end


def test_timeouts_are_errors_and_the_server_frees_the_request(server, tmp_path, long_prompts):
    rc, rep = bench(
        server, tmp_path, "--timeout-s", "0.05", "--num-requests", "2", "--max-tokens", "300", "--prompts", long_prompts
    )
    assert rc == 1
    agg = rep["levels"][0]["aggregate"]
    assert agg["errors"] == {"timeout": 2} and agg["completed"] == 0
    assert server.wait_idle(), "the server kept running a request its client abandoned"
