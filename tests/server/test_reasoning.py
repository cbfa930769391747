"""Reasoning content: the think-block parser, streamed in pieces of every size, and a tiny
Qwen3 served over both dialects with its thinking switched on and off."""

from __future__ import annotations

import anthropic
import openai
import pytest

from fastmode.loader import load_model
from fastmode.server.reasoning import ReasoningParser
from tests.server.conftest import serve

CASES = [
    # (output, prompt opened the block, reasoning, content)
    ("<think>\nLet me add.\n2+2=4\n</think>\n\nIt is 4.", False, "Let me add.\n2+2=4", "It is 4."),
    ("  <think>x</think>y", False, "x", "y"),
    ("No thinking here.", False, "", "No thinking here."),
    ("<thinking> is a word", False, "", "<thinking> is a word"),
    ("<think>\ncut off by the length lim", False, "cut off by the length lim", ""),
    ("Let me see.\n</think>\n\nDone.", True, "Let me see.", "Done."),
    ("still thinking </thi", True, "still thinking </thi", ""),
    ("</think>answer", True, "", "answer"),
    ("a < b\n</think>\n", True, "a < b", ""),
    ("", False, "", ""),
    ("<thi", False, "", "<thi"),
]


@pytest.mark.parametrize("text,opened,reasoning,content", CASES)
def test_whole_output_splits(text, opened, reasoning, content):
    assert ReasoningParser(opened).split(text) == (reasoning, content)


@pytest.mark.parametrize("text,opened,reasoning,content", CASES)
def test_any_streaming_split_gives_the_same_result(text, opened, reasoning, content):
    """Character by character, and cut at every pair of points: tags split across pieces."""
    splits = [list(text)] + [
        [text[:i], text[i:j], text[j:]] for i in range(len(text) + 1) for j in range(i, len(text) + 1)
    ]
    for pieces in splits:
        p = ReasoningParser(opened)
        got = [p.feed(piece) for piece in pieces] + [p.finish()]
        assert ("".join(r for r, _ in got), "".join(c for _, c in got)) == (reasoning, content), pieces


def test_template_switch_is_per_request(tiny_qwen3_dir):
    tok = load_model(str(tiny_qwen3_dir), "float32").tokenizer
    messages = [{"role": "user", "content": "hi"}]
    assert tok.has_thinking_switch
    off = tok.with_template_variables(enable_thinking=False)
    assert off.apply_chat_template(messages).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(messages).endswith("<|im_start|>assistant\n<think>\n")  # the original is unchanged


@pytest.fixture(scope="module")
def qwen3_server(tiny_qwen3_dir):
    with serve(load_model(str(tiny_qwen3_dir), "float32")) as s:
        yield s


ASK = [{"role": "user", "content": "def add(a, b):"}]


def test_openai_reports_the_think_block_as_reasoning_content(qwen3_server):
    """The template opens the think block and the tiny model never closes it in 12 tokens:
    everything it writes is reasoning. Switched off, the same output is the answer."""
    with openai.OpenAI(base_url=qwen3_server.url + "/v1", api_key="unused", max_retries=0) as c:
        kw = dict(model=qwen3_server.model, messages=ASK, max_tokens=12, temperature=0)
        on = c.chat.completions.create(**kw)
        msg = on.choices[0].message
        assert msg.model_extra["reasoning_content"] and msg.content == ""
        assert "<think>" not in msg.model_extra["reasoning_content"]
        stream = list(c.chat.completions.create(**kw, stream=True))
        streamed = "".join(
            ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in stream if ch.choices
        )
        assert streamed == msg.model_extra["reasoning_content"]
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == ""

        off = c.chat.completions.create(**kw, reasoning_effort="none")
        assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the template wrote the empty block
        assert off.choices[0].message.content and off.choices[0].message.model_extra["reasoning_content"] is None
    assert qwen3_server.wait_idle()


def test_a_forced_json_answer_switches_thinking_off(qwen3_server):
    with openai.OpenAI(base_url=qwen3_server.url + "/v1", api_key="unused", max_retries=0) as c:
        r = c.chat.completions.create(
            model=qwen3_server.model,
            messages=ASK,
            max_tokens=12,
            temperature=0,
            response_format={"type": "json_object"},
            reasoning_effort="high",
        )
        msg = r.choices[0].message
        assert msg.content.startswith("{") and msg.model_extra["reasoning_content"] is None
    with anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0) as c:
        with pytest.raises(anthropic.BadRequestError, match="tool_choice forces tool use"):
            c.messages.create(
                model=qwen3_server.model,
                messages=ASK,
                max_tokens=12,
                tools=[{"name": "f", "description": "f", "input_schema": {"type": "object"}}],
                tool_choice={"type": "any"},
                thinking={"type": "enabled", "budget_tokens": 1024},
            )


def test_anthropic_reports_thinking_blocks(qwen3_server):
    with anthropic.Anthropic(base_url=qwen3_server.url, api_key="unused", max_retries=0) as c:
        kw = dict(model=qwen3_server.model, messages=ASK, max_tokens=12, extra_body={"temperature": 0})
        on = c.messages.create(**kw, thinking={"type": "enabled", "budget_tokens": 1024})
        assert on.content[0].type == "thinking" and on.content[0].thinking
        with c.messages.stream(**kw, thinking={"type": "enabled", "budget_tokens": 1024}) as s:
            events = list(s)
            final = s.get_final_message()
        assert [b.type for b in final.content] == [b.type for b in on.content if b.type != "text" or b.text]
        assert any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in events)
        assert final.content[0].thinking == on.content[0].thinking

        off = c.messages.create(**kw)  # no `thinking`: off, as with Claude
        assert [b.type for b in off.content] == ["text"] and off.content[0].text
        # The earlier reasoning goes back in the history as a thinking block.
        again = c.messages.create(
            **{
                **kw,
                "messages": ASK + [{"role": "assistant", "content": on.content}, {"role": "user", "content": "ok"}],
            }
        )
        assert again.content
    assert qwen3_server.wait_idle()


def test_thinking_is_refused_for_a_model_without_the_switch(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=server.model, messages=ASK, max_tokens=2, reasoning_effort="high")
        assert e.value.body["param"] == "reasoning_effort"
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        with pytest.raises(anthropic.BadRequestError, match="thinking"):
            c.messages.create(
                model=server.model, messages=ASK, max_tokens=2, thinking={"type": "enabled", "budget_tokens": 1024}
            )
