"""GET /metrics: Prometheus text with per-model, per-tier latency, cost, engine gauges and speculation."""

from __future__ import annotations

from fastmode.server.config import ServerConfig
from tests.server.conftest import serve

# A prompt whose greedy continuation on the tiny model repeats n-grams of itself:
# the fast tier's n-gram drafting proposes drafts for it (and some are accepted).
REPETITIVE = "for i in range(10):\n    print(i * i)\n" * 3


def value(text: str, name: str, **labels) -> float:
    """The first sample of `name` whose labels include `labels`."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not found")


def has(text: str, name: str, **labels) -> bool:
    try:
        value(text, name, **labels)
    except AssertionError:
        return False
    return True


def test_metrics_after_requests_in_two_tiers(server, http):
    for tier in ("priority", "default"):
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "service_tier": tier,
            "temperature": 0,
        }
        assert http.post(server.url + "/v1/chat/completions", json=body).status_code == 200
    r = http.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    model = server.model
    for tier in ("fast", "standard"):
        assert value(text, "fastmode:time_to_first_token_seconds_count", model=model, tier=tier) >= 1
        assert value(text, "fastmode:e2e_request_latency_seconds_count", tier=tier) >= 1
        assert value(text, "fastmode:request_queue_time_seconds_count", tier=tier) >= 1
        assert value(text, "fastmode:inter_token_latency_seconds_count", tier=tier) >= 4
        assert value(text, "fastmode:request_cost_usd_total", tier=tier) > 0
        assert value(text, "fastmode:generation_tokens_total", tier=tier) >= 5
        assert value(text, "fastmode:prompt_tokens_total", tier=tier) > 0
    for tier in ("fast", "standard", "flex"):
        assert value(text, "fastmode:num_requests_running", model=model, tier=tier) == 0
        assert value(text, "fastmode:num_requests_waiting", model=model, tier=tier) == 0
    assert value(text, "fastmode:kv_cache_usage_perc", model=model) == 0
    assert value(text, "fastmode:fast_lane_active", model=model) == 0
    assert value(text, "fastmode:num_preemptions_total", model=model) >= 0
    assert value(text, "fastmode:prefix_cache_queries_total") >= value(text, "fastmode:prefix_cache_hits_total")
    assert value(text, "fastmode:request_success_total", model=model, tier="fast", finish_reason="length") >= 1


def test_speculation_counters_per_tier(tiny_loaded, http):
    # Its own server: the counters must start at zero, and nothing else may speculate in standard.
    with serve(tiny_loaded) as s:
        for tier in ("priority", "default"):  # n-gram drafting is on in the fast tier only, by default
            body = {
                "model": s.model,
                "messages": [{"role": "user", "content": REPETITIVE}],
                "max_tokens": 40,
                "service_tier": tier,
                "temperature": 0,
            }
            assert http.post(s.url + "/v1/chat/completions", json=body).status_code == 200
        text = http.get(s.url + "/metrics").text
    drafts = value(text, "fastmode:spec_decode_num_drafts_total", model=s.model, tier="fast")
    proposed = value(text, "fastmode:spec_decode_num_draft_tokens_total", model=s.model, tier="fast")
    accepted = value(text, "fastmode:spec_decode_num_accepted_tokens_total", model=s.model, tier="fast")
    assert drafts > 0 and proposed >= drafts and 0 <= accepted <= proposed
    assert value(text, "fastmode:spec_decode_acceptance_rate", model=s.model, tier="fast") == accepted / proposed
    for name in (
        "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "spec_decode_acceptance_rate",
    ):
        assert not has(text, f"fastmode:{name}", tier="standard")


def test_each_app_has_its_own_registry(tiny_loaded):
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.server.app import create_app

    engine = LLMEngine(
        EngineConfig(model=str(tiny_loaded.path), dtype="float32", kv_cache_gib=0.01), loaded=tiny_loaded
    )
    a, b = create_app(engine, ServerConfig()), create_app(engine, ServerConfig())
    assert a.state.fastmode.metrics.registry is not b.state.fastmode.metrics.registry
