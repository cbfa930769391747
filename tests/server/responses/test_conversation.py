"""Conversations continued by previous_response_id: each turn extends the previous
turn's exact tokens (so the prefix cache serves them), tool calls and warm-ups included."""

from __future__ import annotations

import json

import pytest

from fastmode.server.responses.conversation import ResponseStore, Turn, build_prompt, with_system
from fastmode.server.tools.call_format import format_call
from fastmode.server.tools.prompt import render_text
from fastmode.server.tools.specs import ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TOOLS_KEY = json.dumps([WEATHER.as_hf()], sort_keys=True)


@pytest.fixture(scope="module")
def tok(tiny_loaded):
    return tiny_loaded.tokenizer


def test_build_prompt_extends_the_previous_tokens_exactly(tok):
    ids1, hist1, reused = build_prompt(tok, None, "sys", [{"role": "user", "content": "hello"}])
    assert not reused and ids1 == tok.encode_chat(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    )
    reply_ids = tok.encode("fine thanks", add_special_tokens=False) + [min(tok.eos_token_ids)]
    turn = Turn("r1", "sys", hist1 + [{"role": "assistant", "content": "fine thanks"}], ids1, reply_ids, True)
    ids2, hist2, reused = build_prompt(tok, turn, "sys", [{"role": "user", "content": "again"}])
    assert reused and ids2[: len(ids1) + len(reply_ids)] == ids1 + reply_ids
    full = tok.apply_chat_template([{"role": "system", "content": "sys"}] + hist2)
    assert tok.decode(ids2, skip_special_tokens=False) == full  # the same conversation, token-exact prefix
    _, _, reused = build_prompt(tok, turn, "other instructions", [{"role": "user", "content": "again"}])
    assert not reused  # changed instructions change the prefix: render afresh
    # A reply cut inside a UTF-8 character: the client saw less text than the tokens hold.
    partial = next(i for i in range(tok.vocab_size) if tok.decode([i]) == "\ufffd")
    cut = Turn(
        "r2",
        "sys",
        hist1 + [{"role": "assistant", "content": "fine"}],
        ids1,
        tok.encode("fine", add_special_tokens=False) + [partial],
        True,
    )
    ids3, _, reused = build_prompt(tok, cut, "sys", [{"role": "user", "content": "again"}])
    assert reused and ids3[: len(ids1) + len(cut.output_ids)] == ids1 + cut.output_ids


def _render(tok):
    return lambda messages, gen: render_text(tok, messages, [WEATHER], gen)


@pytest.mark.parametrize(
    "written",
    [
        format_call("get_weather", {"city": "Rome"}),
        "<tool_call>\n" + format_call("get_weather", {"city": "Rome"})[11:-12] + "\n</tool_call>",
    ],
)
def test_a_tool_loop_extends_the_call_tokens(tok, written):
    """The call as the model wrote it stays in the prompt, whether or not the template lays
    it out the same way (here: with newlines inside the tags, which the template omits)."""
    render = _render(tok)
    ids1, hist1, _ = build_prompt(
        tok, None, "sys", [{"role": "user", "content": "weather?"}], render=render, tools=TOOLS_KEY
    )
    assert ids1 == tok.encode(render(with_system("sys", hist1), True), add_special_tokens=False)
    out = tok.encode(written, add_special_tokens=False) + [min(tok.eos_token_ids)]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
    turn = Turn(
        "r1",
        "sys",
        hist1 + [{"role": "assistant", "content": None, "tool_calls": [call]}],
        ids1,
        out,
        True,
        tools=TOOLS_KEY,
    )
    result = [{"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}]
    ids2, hist2, reused = build_prompt(tok, turn, "sys", result, render=render, tools=TOOLS_KEY)
    assert reused and ids2[: len(ids1) + len(out)] == ids1 + out
    tail = tok.decode(ids2[len(ids1) + len(out) :], skip_special_tokens=False)
    full = render(with_system("sys", hist2), True)
    assert full.endswith(tail) and "<tool_response>\nsunny\n</tool_response>" in tail
    if written == format_call("get_weather", {"city": "Rome"}):  # the template's own layout: the same text
        assert tok.decode(ids2, skip_special_tokens=False) == full
    # Other tools change the system prompt: the conversation is rendered afresh.
    _, _, reused = build_prompt(tok, turn, "sys", result, render=render, tools="other")
    assert not reused


def test_a_warm_up_is_extended_by_the_next_turn(tok):
    render = _render(tok)
    warm_ids, hist, _ = build_prompt(
        tok,
        None,
        "sys",
        [{"role": "user", "content": "hello"}],
        render=render,
        tools=TOOLS_KEY,
        add_generation_prompt=False,
    )
    assert not tok.decode(warm_ids, skip_special_tokens=False).endswith("assistant\n")
    warm = Turn("w", "sys", hist, warm_ids, [], True, tools=TOOLS_KEY, generated=False)
    ids, hist2, reused = build_prompt(
        tok, warm, "sys", [{"role": "user", "content": "and then?"}], render=render, tools=TOOLS_KEY
    )
    assert reused and ids[: len(warm_ids)] == warm_ids
    assert tok.decode(ids, skip_special_tokens=False) == render(with_system("sys", hist2), True)


def test_store_is_bounded():
    store = ResponseStore(2)
    for i in range(3):
        store.put(Turn(f"r{i}", None, [], [], [], True))
    assert len(store) == 2 and store.get("r0") is None and store.get("r2") is not None
    assert store.pop("r2") is not None and store.get("r2") is None
