"""The bench's workload: seeded, exact tier counts, prompt sets (no server, no torch)."""

from __future__ import annotations

from collections import Counter

import pytest

from fastmode.bench.client import TIER_FIELD, EndpointConfig, normalize_base_url, request_body
from fastmode.bench.workload import WORDS, BenchRequest, Workload, WorkloadConfig, apportion, load_prompt_set
from fastmode.engine.tiers import Tier
from fastmode.sim.workload import parse_tier_mix


def test_apportion_is_exact_and_sums_to_n():
    mix = parse_tier_mix("fast=0.2,standard=0.8")
    assert apportion(mix, 20) == [4, 16]
    assert apportion(mix, 7) == [1, 6]  # 1.4 / 5.6: the larger remainder (.6) wins the spare request
    thirds = parse_tier_mix("fast=1,standard=1,flex=1")
    assert apportion(thirds, 10) == [4, 3, 3]  # ties go to the tier listed first
    assert all(sum(apportion(thirds, n)) == n for n in range(1, 50))


def test_tier_counts_match_the_mix_exactly_per_block():
    cfg = WorkloadConfig(tier_mix="fast=0.2,standard=0.7,flex=0.1", block_size=20, seed=3)
    reqs = Workload(cfg).take(60)
    assert [r.index for r in reqs] == list(range(60))
    for b in range(3):
        counts = Counter(r.tier for r in reqs[b * 20 : (b + 1) * 20])
        assert counts == {Tier.FAST: 4, Tier.STANDARD: 14, Tier.FLEX: 2}
    assert [r.tier for r in reqs[:20]] != [r.tier for r in reqs[20:40]]  # shuffled per block, not repeated


def test_seeded_runs_are_identical_and_seeds_differ():
    cfg = WorkloadConfig(
        prompts="synthetic",
        input_len="uniform:4:40",
        output_len="uniform:8:64",
        tier_mix="fast=0.5,standard=0.5",
        block_size=16,
        seed=7,
    )
    a, b = Workload(cfg).take(40), Workload(cfg).take(40)
    assert a == b
    other = Workload(WorkloadConfig(**{**cfg.__dict__, "seed": 8})).take(40)
    assert [r.prompt for r in other] != [r.prompt for r in a]
    warm = Workload(cfg, stream=1).take(40)  # warmup traffic is its own stream
    assert [r.prompt for r in warm] != [r.prompt for r in a]


def test_synthetic_prompts_have_the_requested_number_of_words():
    reqs = Workload(WorkloadConfig(prompts="synthetic", input_len="uniform:5:50", block_size=30)).take(30)
    for r in reqs:
        words = r.prompt.split(" ")
        assert len(words) == r.input_len and 5 <= r.input_len <= 50
        assert set(words) <= set(WORDS)


def test_project_and_file_prompt_sets(tmp_path):
    project = load_prompt_set("project")
    assert len(project) > 100 and not any(p.startswith("#") for p in project)
    reqs = Workload(WorkloadConfig(prompts="project", output_len="lognormal:64:0.5:100", block_size=50)).take(50)
    assert all(r.prompt in project and r.input_len is None for r in reqs)
    assert all(1 <= r.max_tokens <= 100 for r in reqs) and len({r.max_tokens for r in reqs}) > 5
    f = tmp_path / "p.txt"
    f.write_text("# a comment\nfirst prompt\n\nsecond prompt\n")
    assert load_prompt_set(str(f)) == ("first prompt", "second prompt")
    f.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompt_set(str(f))


def test_request_body_tiers_and_options():
    req = BenchRequest(0, Tier.FAST, "hi", 32)
    cfg = EndpointConfig("http://h:1/v1/", "m", ignore_eos=True, extra_body={"top_k": 1})
    assert cfg.url == "http://h:1/v1/chat/completions" and normalize_base_url("http://h:1/") == "http://h:1"
    body = request_body(cfg, req)
    assert body == {
        "model": "m",
        "stream": True,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "service_tier": "priority",
        "ignore_eos": True,
        "top_k": 1,
    }
    assert TIER_FIELD == {Tier.FAST: "priority", Tier.STANDARD: "default", Tier.FLEX: "flex"}
    plain = request_body(
        EndpointConfig("http://h:1", "m", "completions", tier_field=False, include_usage=False, temperature=None), req
    )
    assert plain == {"model": "m", "stream": True, "max_tokens": 32, "prompt": "hi"}


def test_the_bench_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, argparse, fastmode.bench.command as c, fastmode.bench.plots, fastmode.bench.stats, "
        "fastmode.server.config, fastmode.distill.answers; c.register(argparse.ArgumentParser().add_subparsers()); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
