"""A thinking model over the Responses API: the think block as a `reasoning` item before the
answer (non-streaming, SSE, WebSocket), its events, `reasoning.effort` on the template's switch,
reasoning items sent back in later turns, and reasoning token counts in both OpenAI dialects.

The model is the tiny random Qwen3 with two rows of its LM head edited, so that it really
writes a closed think block and then an answer: `</think>`'s row is a 1.2x copy of the row of
a token the model writes early in its reasoning (so it closes the block where it would have
written that token), and the end-of-turn token's the same for a token of its answer. Greedy
decoding then writes reasoning, `</think>`, an answer and end-of-turn. The references are
Hugging Face's greedy generation on the same checkpoint.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from safetensors.torch import load_file, save_file
from websockets.sync.client import connect

from fastmode.loader import load_model
from fastmode.server.reasoning import reasoning_token_count
from fastmode.server.responses.models import ResponseRequest
from tests.server.conftest import RunningServer, serve
from tests.server.responses.test_ws import run_turn

THINK, CLOSE, EOT = 382, 383, 2  # <think>, </think>, <|im_end|> in the tiny Qwen3 tokenizer
CLOSES_LIKE, ENDS_LIKE = 104, 217  # tokens whose LM-head rows the edited rows copy
ASK = "def add(a, b):"
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def thinker_dir(tiny_qwen3_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen3-thinker")
    for f in tiny_qwen3_dir.iterdir():
        shutil.copy(f, folder / f.name)
    weights = load_file(folder / "model.safetensors")
    head = weights["lm_head.weight"]
    head[CLOSE] = head[CLOSES_LIKE] * 1.2
    head[EOT] = head[ENDS_LIKE] * 1.2
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def reference(thinker_dir) -> dict:
    """Hugging Face's greedy output for ASK with thinking on: its ids, think block and answer."""
    import transformers

    tok = load_model(str(thinker_dir), "float32").tokenizer
    model = transformers.AutoModelForCausalLM.from_pretrained(thinker_dir, dtype=torch.float32)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": ASK}]), add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :].tolist()
    # The edit did what it is for: a think block closed, then an answer, then end of turn.
    assert CLOSE in out and out[-1] == EOT and out.index(CLOSE) >= 2 and len(out) - out.index(CLOSE) >= 3, out
    close = out.index(CLOSE)
    return {
        "ids": out,
        "reasoning": tok.decode(out[:close]),
        "answer": tok.decode(out[close + 1 :]),
        "reasoning_tokens": close + 1,
        "prompt_tokens": len(prompt),
    }


@pytest.fixture(scope="module")
def thinker(thinker_dir) -> Iterator[RunningServer]:
    with serve(load_model(str(thinker_dir), "float32")) as s:
        yield s


@pytest.fixture(scope="module")
def client(thinker) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=thinker.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def body(server: RunningServer, **extra) -> dict:
    return {"model": server.model, "input": ASK, "max_output_tokens": 40, "temperature": 0, **extra}


def without_ids(x):
    """A response's or event's content, without the ids, times and metering that differ run to run
    (check_final checks the usage)."""
    if isinstance(x, dict):
        return {k: without_ids(v) for k, v in x.items() if k not in ("id", "item_id", "created_at", "usage")}
    if isinstance(x, list):
        return [without_ids(v) for v in x]
    return x


def check_final(r: dict, reference: dict) -> None:
    resp = Response.model_validate(r)
    assert [o.type for o in resp.output] == ["reasoning", "message"] and resp.status == "completed"
    thought = resp.output[0]
    assert thought.summary == [] and [c.type for c in thought.content] == ["reasoning_text"]
    assert thought.content[0].text == reference["reasoning"] and thought.status == "completed"
    assert thought.id.startswith("rs_") and thought.id != resp.output[1].id
    assert resp.output_text == reference["answer"]
    assert resp.usage.output_tokens == len(reference["ids"])
    assert resp.usage.output_tokens_details.reasoning_tokens == reference["reasoning_tokens"]
    assert resp.usage.input_tokens == reference["prompt_tokens"]
    assert resp.reasoning.effort == "high"


def check_events(events: list[dict], reference: dict) -> None:
    for e in events:
        EVENTS.validate_python(e)  # each one in the SDK's own shape
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    deltas = types.count("response.reasoning_text.delta")
    texts = types.count("response.output_text.delta")
    assert deltas >= 1 and texts >= 1
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * deltas,
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * texts,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    thought = [e for e in events if e.get("output_index") == 0]
    answer = [e for e in events if e.get("output_index") == 1]
    assert len(thought) + len(answer) == len(events) - 3  # created, in_progress, completed
    assert thought[0]["item"]["type"] == "reasoning" and answer[0]["item"]["type"] == "message"
    assert {e.get("item_id") for e in thought[1:-1]} == {thought[0]["item"]["id"]} == {thought[-1]["item"]["id"]}
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert streamed == reference["reasoning"] == events[types.index("response.reasoning_text.done")]["text"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == reference["answer"]
    final = events[-1]["response"]
    assert final["output"] == [thought[-1]["item"], answer[-1]["item"]]
    check_final(final, reference)


def sse_events(server: RunningServer, payload: dict) -> list[dict]:
    with httpx.stream("POST", server.url + "/v1/responses", json={**payload, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_reasoning_item_comes_before_the_answer(thinker, client, reference):
    raw = client.responses.with_raw_response.create(**body(thinker, reasoning={"effort": "high"}))
    check_final(raw.http_response.json(), reference)
    r = raw.parse()
    assert client.responses.retrieve(r.id).output[0].content[0].text == reference["reasoning"]  # as stored
    assert thinker.wait_idle()


def test_sse_and_websocket_stream_the_reasoning_item(thinker, reference):
    sse = sse_events(thinker, body(thinker, reasoning={"effort": "high"}))
    check_events(sse, reference)
    with connect(thinker.ws_url) as ws:
        ws_events = run_turn(ws, **body(thinker, reasoning={"effort": "high"}))
    check_events(ws_events, reference)
    assert without_ids(ws_events) == without_ids(sse)
    assert thinker.wait_idle()


def test_sdk_stream_helper_accumulates_the_reasoning_item(thinker, client, reference):
    with client.responses.stream(**body(thinker, reasoning={"effort": "high"})) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_text.delta" in kinds
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == reference["reasoning"] and final.output_text == reference["answer"]


def test_effort_none_switches_thinking_off(thinker, client, reference):
    r = client.responses.create(**body(thinker, reasoning={"effort": "none"}, max_output_tokens=6))
    assert [o.type for o in r.output] == ["message"] and r.output_text
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens > reference["prompt_tokens"]  # the template wrote the empty block
    assert r.reasoning.effort == "none"
    # A forced JSON answer leaves no room for a think block: thinking is off, as in chat.
    r = client.responses.create(
        **body(thinker, reasoning={"effort": "high"}, max_output_tokens=8, text={"format": {"type": "json_object"}})
    )
    assert [o.type for o in r.output] == ["message"] and r.output_text.startswith("{")
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_reasoning_cut_by_the_output_limit_is_incomplete(thinker, client, reference):
    r = client.responses.create(**body(thinker, max_output_tokens=2))  # no effort: the template's default, on
    assert r.status == "incomplete" and [o.type for o in r.output] == ["reasoning"]
    assert r.output[0].status == "incomplete" and reference["reasoning"].startswith(r.output[0].content[0].text)
    assert r.usage.output_tokens == r.usage.output_tokens_details.reasoning_tokens == 2


def test_reasoning_items_sent_back_follow_the_template(thinker, client, reference):
    """The tiny template, like Qwen3's for earlier turns, renders an assistant message without its
    reasoning: the item is accepted and left out of the prompt, whether it comes back as an input
    item or through previous_response_id."""
    first = client.responses.create(**body(thinker, reasoning={"effort": "high"}))
    items = [{"role": "user", "content": ASK}] + [o.model_dump(exclude_none=True) for o in first.output]
    again = [*items, {"role": "user", "content": "and sub?"}]
    by_items = client.responses.create(**body(thinker, input=again, max_output_tokens=4))
    without_reasoning = client.responses.create(
        **body(thinker, input=[again[0], *again[2:]], max_output_tokens=4)  # the reasoning item dropped
    )
    chained = client.responses.create(
        **body(thinker, input="and sub?", previous_response_id=first.id, max_output_tokens=4)
    )
    assert by_items.usage.input_tokens == without_reasoning.usage.input_tokens == chained.usage.input_tokens
    assert by_items.output[0].model_dump(exclude={"id"}) == chained.output[0].model_dump(exclude={"id"})
    with openai.OpenAI(base_url=thinker.url + "/v1", api_key="unused", max_retries=0) as c:
        chat = c.chat.completions.create(
            model=thinker.model,
            messages=[
                {"role": "user", "content": ASK},
                {"role": "assistant", "content": reference["answer"], "reasoning_content": reference["reasoning"]},
                {"role": "user", "content": "and sub?"},
            ],
            max_tokens=1,
        )
    assert chat.usage.prompt_tokens == by_items.usage.input_tokens  # the same prompt in both dialects
    assert thinker.wait_idle()


# A Qwen3-style template that renders the reasoning of assistant messages after the last user
# message (a tool loop's turns), as Qwen3's own template does, and drops it before.
RENDERS_REASONING = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last and m.get('reasoning_content') %}"
    "{{ '<think>\n' + m['reasoning_content'] + '\n</think>\n\n' }}{% endif %}"
    "{{ (m['content'] or '') + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}"
)


def test_reasoning_items_become_reasoning_content_of_the_answer_they_precede(tiny_qwen3_dir):
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    req = ResponseRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "q1"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "old"}]},
                {"role": "assistant", "content": "a1"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},  # no text: nothing
                {"role": "user", "content": "q2"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "t"}],
                },
                call,
                {"type": "function_call_output", "call_id": "c1", "output": "1"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "dangling"}]},
            ],
        }
    )
    messages = req.new_messages([])
    assert [m.get("reasoning_content") for m in messages] == [None, "old", None, "t", None]
    assert messages[3]["tool_calls"][0]["id"] == "c1"
    tok = copy.copy(load_model(str(tiny_qwen3_dir), "float32").tokenizer)
    tok.chat_template = RENDERS_REASONING
    text = tok.apply_chat_template([{**m, "content": m["content"] or ""} for m in messages])
    assert "<think>\nt\n</think>" in text and "old" not in text and "dangling" not in text


@pytest.mark.parametrize(
    "reasoning, param",
    [
        ({"effort": "extreme"}, "reasoning.effort"),
        ({"effort": "high", "summary": "verbose"}, "reasoning.summary"),
        ({"budget": 10}, "reasoning.budget"),
    ],
)
def test_bad_reasoning_is_a_400_in_the_responses_error_shape(thinker, reasoning, param):
    r = httpx.post(thinker.url + "/v1/responses", json=body(thinker, reasoning=reasoning), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    with connect(thinker.ws_url) as ws:
        (event,) = run_turn(ws, **body(thinker, reasoning=reasoning))
    assert event["type"] == "error" and event["status"] == 400 and event["param"] == param


def test_bad_reasoning_item_is_a_400(thinker):
    bad = [{"role": "user", "content": "x"}, {"type": "reasoning", "summary": [], "content": [{"type": "text"}]}]
    r = httpx.post(thinker.url + "/v1/responses", json=body(thinker, input=bad), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("input[1]"), r.text


def test_chat_usage_counts_reasoning_tokens(thinker, reference):
    with openai.OpenAI(base_url=thinker.url + "/v1", api_key="unused", max_retries=0) as c:
        kw = dict(
            model=thinker.model,
            messages=[{"role": "user", "content": ASK}],
            max_tokens=40,
            temperature=0,
            reasoning_effort="high",
        )
        r = c.chat.completions.create(**kw)
        assert r.choices[0].message.model_extra["reasoning_content"] == reference["reasoning"]
        assert r.choices[0].message.content == reference["answer"]
        assert r.usage.completion_tokens == len(reference["ids"])
        assert r.usage.completion_tokens_details.reasoning_tokens == reference["reasoning_tokens"]
        chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == reference["reasoning_tokens"]
        two = c.chat.completions.create(**kw, n=2)  # every choice's block counts
        assert two.usage.completion_tokens_details.reasoning_tokens == 2 * reference["reasoning_tokens"]
        off = c.chat.completions.create(**{**kw, "reasoning_effort": "none", "max_tokens": 4})
        assert off.usage.completion_tokens_details.reasoning_tokens == 0
    assert thinker.wait_idle()


def test_reasoning_token_count_on_ids(tiny_llama_dir, tiny_qwen3_dir):
    """One-token tags (Qwen3) are found by id; tags spelled over several tokens count every token
    up to the one that completes `</think>`; output that opens no block counts none."""
    qwen = load_model(str(tiny_qwen3_dir), "float32").tokenizer
    assert reasoning_token_count(qwen, [5, 6, CLOSE, 7, EOT], True) == 3
    assert reasoning_token_count(qwen, [THINK, 5, CLOSE, 7], False) == 3
    assert reasoning_token_count(qwen, [5, 6, 7], True) == 3  # never closed: all of it
    assert reasoning_token_count(qwen, [5, CLOSE, 7], False) == 0  # the output opened no block
    assert reasoning_token_count(qwen, [5, CLOSE], None) == 0  # not a thinking model
    llama = load_model(str(tiny_llama_dir), "float32").tokenizer
    thought = llama.encode("<think>\nabc\n</think>", add_special_tokens=False)
    ids = thought + llama.encode("\n\nfine", add_special_tokens=False)
    assert len(llama.encode("</think>", add_special_tokens=False)) > 1
    assert reasoning_token_count(llama, ids, False) == len(thought)
    assert reasoning_token_count(llama, thought[:-1], False) == len(thought) - 1  # cut before it closed
    opened = llama.encode("abc\n</think>\n\nok", add_special_tokens=False)
    n = reasoning_token_count(llama, opened, True)
    assert "</think>" in llama.decode(opened[:n]) and "</think>" not in llama.decode(opened[: n - 1])


def test_answer_logprobs_cover_the_answer_tokens_only(thinker, thinker_dir, client, reference):
    """The message's logprobs are its tokens' (end of turn included, as without thinking), none
    of the think block's, streamed or not."""
    from fastmode.server.openai.logprobs import TokenText

    tt = TokenText(load_model(str(thinker_dir), "float32").tokenizer)
    answer_ids = reference["ids"][reference["reasoning_tokens"] :]
    want = [list(tt.bytes_of(t)) for t in answer_ids]
    kw = body(thinker, reasoning={"effort": "high"}, include=["message.output_text.logprobs"], top_logprobs=2)
    r = client.responses.create(**kw)
    assert [lp.bytes for lp in r.output[1].content[0].logprobs] == want
    assert all(len(lp.top_logprobs) == 2 for lp in r.output[1].content[0].logprobs)
    events = sse_events(thinker, kw)
    streamed = [lp["bytes"] for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    # End of turn writes no text, so no delta carries it: the done event's list holds every token.
    assert streamed == want[:-1] and [lp["bytes"] for lp in done["logprobs"]] == want


def test_output_split_assigns_each_token_s_logprobs_in_steps_of_any_size(tiny_qwen3_dir):
    """Steps of several tokens (speculation) that close the block mid-step: the entries of the
    tokens after `</think>` go to the answer, the rest are dropped, whatever the step sizes."""
    from types import SimpleNamespace

    from fastmode.server.reasoning import OutputSplit

    tok = load_model(str(tiny_qwen3_dir), "float32").tokenizer
    ids = tok.encode("abc", add_special_tokens=False) + [CLOSE] + tok.encode("\n\nxyz", add_special_tokens=False)
    close = ids.index(CLOSE)
    for sizes in ([1] * len(ids), [len(ids)], [close, len(ids) - close], [close + 2, len(ids) - close - 2]):
        split, at, got, thought, text = OutputSplit(tok, True), 0, [], "", ""
        for n in sizes:
            step = ids[at : at + n]
            o = SimpleNamespace(
                delta_text=tok.decode(ids[: at + n])[len(tok.decode(ids[:at])) :],
                delta_logprobs=[("lp", t) for t in step],
                token_ids=ids[: at + n],
                finished=at + n == len(ids),
            )
            r, c, entries = split.step(o)
            thought, text, got = thought + r, text + c, got + entries
            at += n
        assert (thought, text) == (tok.decode(ids[:close]), "xyz"), sizes
        assert got == [("lp", t) for t in ids[close + 1 :]] and split.reasoning_tokens == close + 1, sizes
