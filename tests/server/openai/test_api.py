"""The OpenAI dialect through the official `openai` SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import LONG_PROMPT, SHORT_PROMPT


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def ask(client, server, content=LONG_PROMPT, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": content}], **kw)


def test_models_lists_the_served_model(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [server.model]
    assert client.models.retrieve(server.model).id == server.model


@pytest.mark.parametrize(
    "requested, served",
    [
        (None, "default"),
        ("default", "default"),
        ("flex", "flex"),
        ("priority", "priority"),
        ("fast", "priority"),
        ("auto", "priority"),
    ],
)
def test_service_tier_mapping_and_metered_usage(client, server, requested, served):
    kw = {"service_tier": requested} if requested else {}
    raw = client.chat.completions.with_raw_response.create(
        model=server.model, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=6, temperature=0, **kw
    )
    r = raw.parse()
    assert r.service_tier == served
    assert r.model_extra["requested_service_tier"] == requested
    assert raw.headers["x-fastmode-tier"] == served  # the header says it in the body's words
    assert raw.headers["x-request-id"] == r.id
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert r.usage.model_extra["cost_usd"] > 0 and r.usage.model_extra["machine_seconds"] > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_same_prompt_twice_hits_the_prefix_cache(client, server):
    first = ask(client, server, content="The quick brown fox jumps over the lazy dog, twice over.")
    second = ask(client, server, content="The quick brown fox jumps over the lazy dog, twice over.")
    assert first.choices[0].message.content == second.choices[0].message.content  # greedy
    assert second.usage.prompt_tokens_details.cached_tokens >= 16


def test_system_and_assistant_messages_and_max_completion_tokens(client, server):
    r = client.chat.completions.create(
        model=server.model,
        max_completion_tokens=5,
        temperature=0,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "developer", "content": "again"},
            {"role": "user", "content": [{"type": "text", "text": "more"}]},
        ],
    )
    assert r.usage.completion_tokens <= 5


def test_eos_gives_stop_and_seed_is_reproducible(client, server):
    assert ask(client, server, content=SHORT_PROMPT).choices[0].finish_reason == "stop"
    a = ask(client, server, temperature=1.0, seed=7, max_tokens=12).choices[0].message.content
    b = ask(client, server, temperature=1.0, seed=7, max_tokens=12, top_p=0.9).choices[0].message.content
    c = ask(client, server, temperature=1.0, seed=7, max_tokens=12).choices[0].message.content
    assert a == c and isinstance(b, str)


def test_stop_string_cuts_the_text(client, server):
    full = ask(client, server, max_tokens=30).choices[0].message.content
    stop = full[10:13]
    r = ask(client, server, max_tokens=30, stop=[stop])
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_streaming_chunks_usage_and_done(client, server):
    chunks = list(
        ask(client, server, max_tokens=10, stream=True, stream_options={"include_usage": True}, service_tier="priority")
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.service_tier == "priority" for c in chunks)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ask(client, server, max_tokens=10).choices[0].message.content


def test_raw_sse_ends_with_done(server):
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_completions_text_and_token_prompt(client, server):
    r = client.completions.create(model=server.model, prompt="def add(a, b):", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 5 and r.service_tier == "default"
    ids = client.completions.create(model=server.model, prompt=[5, 17, 42], max_tokens=4, temperature=0)
    assert ids.usage.prompt_tokens == 3
    stream = list(
        client.completions.create(
            model=server.model,
            prompt="hello",
            max_tokens=4,
            temperature=0,
            stream=True,
            extra_body={"service_tier": "fast"},
        )
    )
    assert stream[-1].choices[0].finish_reason == "length" and stream[0].service_tier == "priority"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"store": True}, "store"),
        ({"service_tier": "scale"}, "service_tier"),
    ],
)
def test_unsupported_parameters_are_refused(client, server, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra
        )
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"


def test_tool_choice_without_tools_and_n_bounds_are_400s(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, server, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, server, n=100)
    assert e.value.body["param"] == "n"


def test_unknown_field_and_unknown_model(client, server):
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: frobnicate"):
        ask(client, server, extra_body={"frobnicate": 1})
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model, prompt=["a", "b"], max_tokens=2)
