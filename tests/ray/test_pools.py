"""Pools specs, per-pool admission, the planner's pools spec and the --ray flags: none of it needs Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fastmode.engine.scheduler import SchedulerConfig
from fastmode.engine.tiers import Tier
from fastmode.planner.fleet import FleetPlan, TierPlan
from fastmode.ray.admission import PoolAdmission, PoolCapacity
from fastmode.ray.pools import POOL_DEFAULTS, deployment_name, parse_pools
from fastmode.server.config import ServerConfig
from fastmode.server.edge.admission import TierChoice
from fastmode.server.edge.errors import ApiError
from fastmode.server.edge.ratelimit import RateLimiter
from fastmode.server.metrics import ServerMetrics


def test_single_machine_server_and_the_ray_package_do_not_import_ray():
    code = (
        "import sys; import fastmode.server.app, fastmode.commands.serve, fastmode.cli, fastmode.ray, "
        "fastmode.ray.pools, fastmode.ray.admission, fastmode.ray.command; "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_short_form_gives_each_pool_its_defaults_and_routes_tiers():
    spec = parse_pools("standard=2,fast=1,spark=1")
    assert spec.names == ("standard", "fast", "spark")
    assert spec["standard"].replicas == 2 and dict(spec["fast"].engine) == POOL_DEFAULTS["fast"]
    assert spec["spark"].engine["speculative_method"] == "off"
    assert spec.pool_for(Tier.FAST) == "fast"
    assert spec.pool_for(Tier.STANDARD) == "standard"
    assert spec.pool_for(Tier.FLEX) == "standard"  # no flex pool: flex shares standard's replicas
    assert parse_pools("standard=1").pool_for(Tier.FAST) == "standard"
    assert deployment_name("fast") == "fastmode-fast"
    assert spec.short_form() == "standard=2,fast=1,spark=1"


@pytest.mark.parametrize(
    "text, words",
    [
        ("fast=1", "needs a standard pool"),
        ("standard=1,turbo=1", "unknown pool 'turbo'"),
        ("standard=0", "replicas must be an integer >= 1"),
        ("standard=two", "write POOL=REPLICAS"),
        ("standard=1,standard=2", "named twice"),
        ("", "empty"),
        ("/nonexistent/pools.json", "cannot read the pools spec"),
    ],
)
def test_bad_specs_say_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        parse_pools(text)


def test_spec_file_overrides_engine_settings_and_rejects_unknown_ones(tmp_path):
    path = tmp_path / "pools.json"
    path.write_text(json.dumps({"pools": {"standard": {"replicas": 3}, "fast": {"max_num_seqs": 2}}}))
    spec = parse_pools(str(path))
    assert spec["standard"].replicas == 3 and spec["fast"].replicas == 1
    assert spec["fast"].engine == {"max_num_seqs": 2, "fast_lane_max_batch": 4}  # the file over the pool's defaults
    assert spec["fast"].engine_kwargs({"max_num_seqs": 64, "num_threads": 2}) == {
        "max_num_seqs": 2,
        "num_threads": 2,
        "fast_lane_max_batch": 4,
    }
    path.write_text(json.dumps({"pools": {"standard": {"replicas": 1, "max_batch_size": 8}}}))
    with pytest.raises(ValueError, match="max_batch_size is not an engine setting"):
        parse_pools(str(path))


def _admission(server: ServerConfig, fast_replicas: int = 1, standard_replicas: int = 2) -> PoolAdmission:
    pools = {
        "fast": PoolCapacity("m", SchedulerConfig(max_num_seqs=2, fast_lane_max_batch=1), fast_replicas),
        "standard": PoolCapacity("m", SchedulerConfig(max_num_seqs=4, fast_lane_max_batch=4), standard_replicas),
    }
    tiers = {Tier.FAST: "fast", Tier.STANDARD: "standard", Tier.FLEX: "standard"}
    limiter = RateLimiter({t: server.tier_limits(t) for t in Tier})
    return PoolAdmission(server, pools, tiers, limiter, ServerMetrics(lambda: {}), "m")


def test_fast_lane_is_the_fast_pools_and_auto_falls_back_to_standard_saying_so():
    adm = _admission(ServerConfig(fast_lane_full_factor=1.0), fast_replicas=2)
    assert adm.fast_capacity == 2  # 2 replicas x a lane of 1
    held = [adm.admit(TierChoice(Tier.FAST, "priority"), 10, 10) for _ in range(2)]
    assert all(a.tier is Tier.FAST for a in held)
    auto = adm.admit(TierChoice(Tier.FAST, "auto", auto=True), 10, 10)
    assert auto.tier is Tier.STANDARD and auto.fallback_reason == "fast lane full"
    with pytest.raises(ApiError) as e:
        adm.admit(TierChoice(Tier.FAST, "priority"), 10, 10)
    assert e.value.kind == "rate_limit" and e.value.code == "fast_lane_full" and e.value.retry_after_s > 0
    held[0].settle(10)
    assert adm.admit(TierChoice(Tier.FAST, "auto", auto=True), 10, 10).tier is Tier.FAST
    assert adm.pool_in_flight("fast") == {Tier.FAST: 2, Tier.STANDARD: 0, Tier.FLEX: 0}
    assert adm.pool_in_flight("standard")[Tier.STANDARD] == 1


def test_each_pool_has_its_own_queue_bound():
    # Standard: 2 replicas x (4 running + 2 waiting) = 12, of which the last quarter of the
    # waiting room (1) is reserved for fast; fast runs on its own pool, so a full standard pool
    # still admits fast requests.
    adm = _admission(ServerConfig(max_waiting_requests=2, fast_reserved_fraction=0.25))
    standard = [adm.admit(TierChoice(Tier.STANDARD, None), 1, 1) for _ in range(11)]
    with pytest.raises(ApiError) as e:
        adm.admit(TierChoice(Tier.STANDARD, None), 1, 1)
    assert e.value.kind == "overloaded" and e.value.code == "server_overloaded"
    assert adm.admit(TierChoice(Tier.FAST, "priority"), 1, 1).tier is Tier.FAST
    standard[0].settle(1)
    assert adm.admit(TierChoice(Tier.STANDARD, None), 1, 1).tier is Tier.STANDARD


def test_rate_limits_are_shared_across_pools():
    adm = _admission(ServerConfig(fast_requests_per_min=1))
    adm.admit(TierChoice(Tier.FAST, "priority"), 1, 1)
    auto = adm.admit(TierChoice(Tier.FAST, "auto", auto=True), 1, 1)
    assert auto.tier is Tier.STANDARD and auto.fallback_reason == "fast rate limit reached"
    with pytest.raises(ApiError) as e:
        adm.admit(TierChoice(Tier.FAST, "priority"), 1, 1)
    assert e.value.code == "rate_limit_exceeded"


def test_planner_fleet_is_a_pools_spec_serve_accepts(tmp_path):
    plan = FleetPlan(
        (
            TierPlan("fast", True, replicas=2, batch_cap=4, speculative=True),
            TierPlan("standard", True, replicas=5, batch_cap=64),
            TierPlan("flex", False, reason="TTFT SLO not met"),
        ),
        0.9,
        0.85,
    )
    spec = parse_pools(plan.pools_spec())
    assert spec.short_form() == "fast=2,standard=5"
    assert dict(spec["fast"].engine) == {
        "max_num_seqs": 4,
        "fast_lane_max_batch": 4,
        "speculative_method": "ngram",
        "speculative_tiers": "fast",
    }
    assert spec["standard"].engine["speculative_method"] == "off"
    assert any("flex" in n for n in plan.pools_spec()["notes"])
    only_fast = FleetPlan((TierPlan("fast", True, replicas=1, batch_cap=2),), 0.9, 0.85)
    assert parse_pools(only_fast.pools_spec()).short_form() == "fast=1,standard=1"


def test_fastmode_plan_writes_a_pools_spec_and_serve_takes_it(tmp_path, capsys):
    from fastmode.cli import main

    out = tmp_path / "pools.json"
    argv = ["plan", "--model", "llama-3.1-8b", "--hardware", "h100", "--fast-rps", "1", "--fast-min-tok-s", "100"]
    assert main([*argv, "--standard-rps", "10", "--pools-out", str(out)]) == 0
    assert "wrote the pools spec" in capsys.readouterr().out
    spec = parse_pools(str(out))
    assert set(spec.names) == {"fast", "standard"}
    assert spec["fast"].engine["fast_lane_max_batch"] == spec["fast"].engine["max_num_seqs"]
    assert main(["plan", "--model", "llama-3.1-8b", "--pools-out", str(out)]) == 2


def test_serve_takes_the_ray_flags_and_refuses_pools_without_ray():
    import argparse

    from fastmode.commands import serve as command

    root = argparse.ArgumentParser()
    command.register(root.add_subparsers())
    args = root.parse_args(["serve", "--ray", "--pools", "standard=2,fast=1,spark=1", "--ray-address", "auto"])
    assert args.ray and args.pools == "standard=2,fast=1,spark=1" and args.ray_address == "auto"
    assert command.run(root.parse_args(["serve", "--pools", "standard=1"])) == 2


@pytest.mark.slow
def test_spark_pool_replicas_serve_the_default_models_spark_without_drafting(tiny_llama_dir):
    from fastmode.distill.spark import find_spark
    from fastmode.ray.replica import build_engine

    if find_spark() is None:
        pytest.skip("no Spark weights installed")
    settings = {**POOL_DEFAULTS["spark"], "kv_cache_gib": 0.05, "num_threads": 1}
    engine = build_engine("spark", settings)
    assert engine.model_name == "SmolLM2-135M-Instruct-spark"
    assert engine.drafter is None and engine.config.speculation.method == "off"
    with pytest.raises(ValueError, match="the spark pool serves SmolLM2-135M-Instruct's Spark"):
        build_engine("spark", {**settings, "model": str(tiny_llama_dir), "dtype": "float32"})
