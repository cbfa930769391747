"""GET /metrics: Prometheus text with per-tier latency, cost and engine gauges."""

from __future__ import annotations

import re

from fastmode.server.config import ServerConfig


def value(text: str, name: str, **labels) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not found")


def test_metrics_after_requests_in_two_tiers(server, http):
    for tier in ("priority", "default"):
        body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                "service_tier": tier, "temperature": 0}
        assert http.post(server.url + "/v1/chat/completions", json=body).status_code == 200
    r = http.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for tier in ("fast", "standard"):
        assert value(text, "fastmode:time_to_first_token_seconds_count", tier=tier) >= 1
        assert value(text, "fastmode:e2e_request_latency_seconds_count", tier=tier) >= 1
        assert value(text, "fastmode:request_queue_time_seconds_count", tier=tier) >= 1
        assert value(text, "fastmode:inter_token_latency_seconds_count", tier=tier) >= 4
        assert value(text, "fastmode:request_cost_usd_total", tier=tier) > 0
        assert value(text, "fastmode:generation_tokens_total", tier=tier) >= 5
        assert value(text, "fastmode:prompt_tokens_total", tier=tier) > 0
    for tier in ("fast", "standard", "flex"):
        assert value(text, "fastmode:num_requests_running", tier=tier) == 0
        assert value(text, "fastmode:num_requests_waiting", tier=tier) == 0
    assert value(text, "fastmode:kv_cache_usage_perc") == 0
    assert value(text, "fastmode:num_preemptions_total") >= 0
    assert value(text, "fastmode:prefix_cache_queries_total") >= value(text, "fastmode:prefix_cache_hits_total")
    assert re.search(r'fastmode:request_success_total\{finish_reason="length",tier="fast"\}', text)


def test_each_app_has_its_own_registry(tiny_loaded):
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.server.app import create_app

    engine = LLMEngine(EngineConfig(model=str(tiny_loaded.path), dtype="float32", kv_cache_gib=0.01), loaded=tiny_loaded)
    a, b = create_app(engine, ServerConfig()), create_app(engine, ServerConfig())
    assert a.state.fastmode.metrics.registry is not b.state.fastmode.metrics.registry
