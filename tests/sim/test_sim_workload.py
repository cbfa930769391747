"""Workloads: distributions, arrival processes, tier mixes, JSONL round trip."""

from __future__ import annotations

import numpy as np
import pytest

from fastmode.engine.tiers import Tier
from fastmode.sim.distributions import ArrivalProcess, LengthDist
from fastmode.sim.workload import RequestSpec, WorkloadConfig, generate_workload, load_jsonl, parse_tier_mix, save_jsonl


def test_length_parse_and_str_round_trip():
    for text in ("256", "uniform:64:512", "lognormal:300:0.8", "lognormal:300:0.8:4096"):
        assert str(LengthDist.parse(text)) == text
    assert LengthDist.parse("fixed:7") == LengthDist("fixed", 7)
    for bad in ("x", "uniform:5", "uniform:9:3", "lognormal:100:0", "gauss:1:2", "0"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)


def test_length_samples_have_the_stated_shape():
    rng = np.random.default_rng(0)
    assert set(LengthDist.parse("33").sample(rng, 100)) == {33}
    u = LengthDist.parse("uniform:10:20").sample(rng, 5000)
    assert u.min() == 10 and u.max() == 20
    ln = LengthDist.parse("lognormal:400:0.7").sample(rng, 200_000)
    assert ln.mean() == pytest.approx(400, rel=0.02) and ln.min() >= 1
    assert LengthDist.parse("lognormal:400:1.5:1000").sample(rng, 10_000).max() == 1000


@pytest.mark.parametrize(
    "proc",
    [
        ArrivalProcess("poisson", 5.0),
        ArrivalProcess("gamma", 5.0, cv=3.0),
        ArrivalProcess("onoff", 5.0, on_s=2.0, off_s=6.0),
    ],
)
def test_arrival_processes_keep_the_mean_rate(proc):
    t = proc.sample(np.random.default_rng(1), 50_000)
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.05)


def test_bursty_arrivals_are_bursty():
    rng = np.random.default_rng(2)
    gaps = np.diff(ArrivalProcess("gamma", 5.0, cv=3.0).sample(rng, 50_000))
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)
    onoff = ArrivalProcess("onoff", 5.0, on_s=2.0, off_s=6.0).sample(rng, 10_000)
    assert np.all(np.mod(onoff, 8.0) <= 2.0)  # nothing arrives in the off windows


def test_tier_mix_parses_and_normalises():
    assert parse_tier_mix("fast=1,standard=3") == ((Tier.FAST, 0.25), (Tier.STANDARD, 0.75))
    for bad in ("", "turbo=1", "fast=-1,standard=2", "fast=0"):
        with pytest.raises(ValueError):
            parse_tier_mix(bad)
    reqs = generate_workload(WorkloadConfig(20_000, tier_mix="fast=0.1,standard=0.8,flex=0.1", seed=5))
    share = sum(r.tier is Tier.FAST for r in reqs) / len(reqs)
    assert share == pytest.approx(0.1, abs=0.01)


def test_generation_is_seeded():
    cfg = WorkloadConfig(
        500,
        ArrivalProcess("gamma", 3.0),
        LengthDist.parse("lognormal:200:1"),
        LengthDist.parse("uniform:5:50"),
        "fast=0.5,flex=0.5",
        seed=9,
    )
    assert generate_workload(cfg) == generate_workload(cfg)
    other = generate_workload(WorkloadConfig(500, cfg.arrival, cfg.prompt_len, cfg.output_len, cfg.tier_mix, seed=10))
    assert other != generate_workload(cfg)


def test_jsonl_round_trip(tmp_path):
    reqs = generate_workload(
        WorkloadConfig(
            300,
            ArrivalProcess("onoff", 4.0),
            LengthDist.parse("lognormal:100:0.5"),
            LengthDist.parse("uniform:1:9"),
            "fast=0.2,standard=0.5,flex=0.3",
            seed=1,
        )
    )
    reqs.append(RequestSpec("shared", reqs[-1].arrival_s + 1, 80, 4, Tier.FLEX, prefix_group=3, prefix_tokens=64))
    path = tmp_path / "w.jsonl"
    save_jsonl(reqs, path)
    assert load_jsonl(path) == reqs


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"id": "a", "arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n'
        '# a comment\n\n{"id": "b", "arrival_s": 1, "prompt_tokens": 5, "output_tokens": 2, "speed": 1}\n'
    )
    with pytest.raises(ValueError, match=r"bad.jsonl:4: unknown keys \['speed'\]"):
        load_jsonl(path)
    path.write_text('{"id": "a", "arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n' * 2)
    with pytest.raises(ValueError, match="unique"):
        load_jsonl(path)


def test_prompt_ids_share_exactly_the_group_prefix():
    a = RequestSpec("a", 0, 40, 1, prefix_group=2, prefix_tokens=32).prompt_token_ids(0)
    b = RequestSpec("b", 0, 40, 1, prefix_group=2, prefix_tokens=32).prompt_token_ids(1)
    c = RequestSpec("c", 0, 40, 1).prompt_token_ids(2)
    assert len(a) == len(b) == len(c) == 40
    assert a[:32] == b[:32] and a[32] != b[32] and c[0] != a[0]
