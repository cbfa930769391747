"""How a chat completion's generated text becomes OpenAI's shapes: the message of each choice
(reasoning apart from the answer, tool calls parsed out), its streamed deltas, and the usage
(reasoning tokens counted on the token ids)."""

from __future__ import annotations

from fastmode.engine.llm_engine import RequestOutput
from fastmode.server.openai.logprobs import TokenText, chat_logprobs
from fastmode.server.reasoning import ReasoningParser, reasoning_token_count
from fastmode.server.served_model import ServedModel
from fastmode.server.tools.call_parser import ArgumentsDelta, CallStart, TextDelta, ToolCallParser


def usage(o: RequestOutput | list[RequestOutput], reasoning_tokens: int = 0) -> dict:
    """OpenAI's usage, plus what fastmode metered. With several choices the prompt counts
    once and the completion tokens, cost and machine time of every choice add up;
    `reasoning_tokens`: the completion tokens that wrote think blocks."""
    outs = o if isinstance(o, list) else [o]
    first = outs[0].metrics
    prompt, completion = len(outs[0].prompt_token_ids), sum(len(x.token_ids) for x in outs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens if first else 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "cost_usd": sum(x.metrics.cost_usd for x in outs if x.metrics),
        "machine_seconds": sum(x.metrics.machine_s for x in outs if x.metrics),
        "time_to_first_token_seconds": first.ttft_s if first else None,
    }


def finish_reason(o: RequestOutput, calls: bool) -> str | None:
    return "tool_calls" if calls and o.finish_reason == "stop" else o.finish_reason


class ChatOutput:
    """How the generated text of each choice becomes a message, or message deltas."""

    def __init__(self, model: ServedModel, with_tools: bool, logprobs: bool):
        self.with_tools = with_tools
        self.tokenizer = model.tokenizer
        self.tokens = TokenText(model.tokenizer) if logprobs else None
        # A thinking model's output: None = no think blocks; else whether the prompt opened one.
        self.reasoning_from_prompt: bool | None = None

    def parser(self) -> ToolCallParser | None:
        return ToolCallParser("call_") if self.with_tools else None

    def reasoning(self) -> ReasoningParser | None:
        return None if self.reasoning_from_prompt is None else ReasoningParser(self.reasoning_from_prompt)

    def usage(self, outs: list[RequestOutput]) -> dict:
        """The request's usage, with the tokens of every choice's think block as reasoning tokens."""
        counted = sum(reasoning_token_count(self.tokenizer, o.token_ids, self.reasoning_from_prompt) for o in outs)
        return usage(outs, counted)

    def logprobs(self, entries) -> dict | None:
        if self.tokens is None:
            return None
        return {"content": chat_logprobs(self.tokens, entries or []), "refusal": None}

    def choice(self, index: int, o: RequestOutput, logprobs: list) -> dict:
        text, reasoning = o.text, self.reasoning()
        message: dict = {"role": "assistant", "content": text, "refusal": None}
        if reasoning is not None:
            thought, text = reasoning.split(o.text)
            message.update(content=text, reasoning_content=thought or None)
        calls = []
        parser = self.parser()
        if parser is not None:
            parser.feed(text)
            parser.finish()
            calls = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in parser.calls
            ]
            message["content"] = parser.text or (None if calls else "")
            if calls:
                message["tool_calls"] = calls
        return {
            "index": index,
            "message": message,
            "logprobs": self.logprobs(logprobs),
            "finish_reason": finish_reason(o, bool(calls)),
        }


def deltas(parser: ToolCallParser | None, text: str, final: bool) -> list[dict]:
    """Chat deltas for a piece of generated text (and, when `final`, for what the parser held back)."""
    events = ([TextDelta(text)] if text else []) if parser is None else parser.feed(text)
    if final and parser is not None:
        events += parser.finish()
    out = []
    for e in events:
        if isinstance(e, TextDelta):
            out.append({"content": e.text})
        elif isinstance(e, CallStart):
            out.append(
                {
                    "tool_calls": [
                        {
                            "index": e.index,
                            "id": e.id,
                            "type": "function",
                            "function": {"name": e.name, "arguments": ""},
                        }
                    ]
                }
            )
        elif isinstance(e, ArgumentsDelta):
            out.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.fragment}}]})
    return out
