"""Several models in one server: the tiny model and its Spark, each by name."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from websockets.sync.client import connect

from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.server.app import create_app
from fastmode.server.config import ServerConfig
from tests.server.conftest import LONG_PROMPT, serve
from tests.server.test_metrics import value


@pytest.fixture(scope="module")
def pair(tiny_loaded, tiny_spark):
    with serve(tiny_loaded, extra=[tiny_spark]) as s:
        yield s


@pytest.fixture(scope="module")
def names(pair, tiny_spark):
    assert tiny_spark.name == pair.model + "-spark"
    return [pair.model, tiny_spark.name]


def test_models_lists_both_main_first(pair, names):
    with openai.OpenAI(base_url=pair.url + "/v1", api_key="x", max_retries=0) as oa:
        assert [m.id for m in oa.models.list().data] == names
        for name in names:
            assert oa.models.retrieve(name).id == name


def test_each_name_runs_its_own_model(pair, names, tiny_spark):
    spark_engine = pair.extra_engines[0]
    assert spark_engine.loaded is tiny_spark and spark_engine.drafter is None
    steps = {name: e.num_steps for name, e in zip(names, [pair.engine, spark_engine])}
    texts = {}
    with openai.OpenAI(base_url=pair.url + "/v1", api_key="x", max_retries=0) as oa:
        for name in names:
            r = oa.chat.completions.create(
                model=name, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=8, temperature=0
            )
            assert r.model == name and r.usage.completion_tokens == 8
            texts[name] = r.choices[0].message.content
            chunks = list(oa.completions.create(model=name, prompt="hello", max_tokens=3, stream=True))
            assert {c.model for c in chunks} == {name}
    assert texts[names[0]] != texts[names[1]]  # two layers of three: a different model
    assert pair.engine.num_steps > steps[names[0]] and spark_engine.num_steps > steps[names[1]]
    with anthropic.Anthropic(base_url=pair.url, api_key="x", max_retries=0) as ant:
        for name in names:
            m = ant.messages.create(model=name, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            assert m.model == name
            assert ant.messages.count_tokens(model=name, messages=[{"role": "user", "content": "hi"}]).input_tokens > 0


def test_websocket_continues_on_either_model(pair, names):
    with connect(pair.ws_url) as ws:

        def create(model, **extra):
            ws.send(
                json.dumps({"type": "response.create", "model": model, "input": "hi", "max_output_tokens": 4, **extra})
            )
            while True:
                event = json.loads(ws.recv())
                if event["type"] in ("response.completed", "response.incomplete", "error"):
                    return event

        first = create(names[1])
        assert first["response"]["model"] == names[1]
        # Continued on the other model: rendered afresh from the text, as its cache holds none of those tokens.
        second = create(names[0], previous_response_id=first["response"]["id"])
        assert second["response"]["model"] == names[0] and second["type"] != "error"


def test_unknown_model_is_a_404_naming_both(pair, names, http):
    r = http.post(
        pair.url + "/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
    )
    err = r.json()["error"]
    assert r.status_code == 404 and err["code"] == "model_not_found"
    assert all(f"`{n}`" in err["message"] for n in names)
    r = http.post(
        pair.url + "/v1/messages",
        json={"model": "claude-9", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert http.get(pair.url + "/v1/models/gpt-9").status_code == 404


def test_metrics_and_health_per_model(pair, names, http):
    with openai.OpenAI(base_url=pair.url + "/v1", api_key="x", max_retries=0) as oa:
        oa.chat.completions.create(
            model=names[1], messages=[{"role": "user", "content": "hi"}], max_tokens=3, service_tier="priority"
        )
    text = http.get(pair.url + "/metrics").text
    for name in names:
        assert value(text, "fastmode:kv_cache_usage_perc", model=name) == 0
        assert value(text, "fastmode:fast_lane_active", model=name) == 0
        assert value(text, "fastmode:prefix_cache_queries_total", model=name) >= 0
        for tier in ("fast", "standard", "flex"):
            assert value(text, "fastmode:num_requests_running", model=name, tier=tier) == 0
    assert value(text, "fastmode:generation_tokens_total", model=names[1], tier="fast") >= 3
    assert http.get(pair.url + "/health").json() == {"status": "ok"}


def test_shutdown_stops_every_engine_thread(tiny_loaded, tiny_spark, http):
    with serve(tiny_loaded, extra=[tiny_spark]) as s:
        running = [m.async_engine for m in s.state.models.values()]
        assert len(running) == 2 and all(a.is_alive for a in running)
    assert not any(a.is_alive for a in running)
    assert all(m.async_engine is None for m in s.state.models.values())


def test_extra_engines_by_name_and_duplicate_names(tiny_loaded):
    engine = LLMEngine(
        EngineConfig(model=str(tiny_loaded.path), dtype="float32", kv_cache_gib=0.01), loaded=tiny_loaded
    )
    app = create_app(engine, ServerConfig(served_model_name="main"), {"other": engine})
    assert list(app.state.fastmode.models) == ["main", "other"]
    assert create_app(engine).state.fastmode.main.name == engine.model_name  # the one-engine form still works
    with pytest.raises(ValueError, match="two served models"):
        create_app(engine, ServerConfig(), [engine])
