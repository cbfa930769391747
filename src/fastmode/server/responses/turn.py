"""One turn of the Responses API, whatever carries it (HTTP or the WebSocket mode).

`prepare_turn` (prepare.py) checks a request and admits it: everything
that can be refused is refused there, before any event is sent. `ResponseRun.events()` then runs it
and yields the stream events with their sequence numbers, ending with
response.completed, response.incomplete (max_output_tokens or the context cut
it) or response.failed. A thinking model's think block becomes a `reasoning`
item before the answer (reasoning.py splits it out). The finished turn is handed to `keep` before the last
event goes out, so a client that reacts to response.completed at once can
already chain from it.

A warm-up (`generate: false`, WebSocket mode) prefills the conversation so
its KV blocks enter the prefix cache, generates nothing, and returns an id
the next turn chains from.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import replace

from fastmode.engine.llm_engine import RequestOutput
from fastmode.server.edge.errors import OPENAI, ApiError
from fastmode.server.generation import stop_details
from fastmode.server.openai.api import tier_fields
from fastmode.server.openai.logprobs import TokenText, chat_logprobs
from fastmode.server.reasoning import OutputSplit, reasoning_token_count
from fastmode.server.responses.conversation import Message, Turn
from fastmode.server.responses.events import OutputBuilder
from fastmode.server.responses.prepare import PreparedTurn
from fastmode.server.tools.call_parser import ArgumentsDelta, CallEnd, CallStart, TextDelta, ToolCallParser


def usage(o: RequestOutput | None, prompt_len: int, generated: bool = True, reasoning_tokens: int = 0) -> dict:
    """The Responses API's usage, plus what fastmode metered for this request; `reasoning_tokens`:
    the output tokens that wrote the think block."""
    m = o.metrics if o else None
    out = len(o.token_ids) if o and generated else 0
    cached = m.cached_tokens if m else 0
    return {
        "input_tokens": prompt_len,
        # Written: the prompt tokens computed (not served from the prefix cache) into KV blocks,
        # whose full blocks the prefix cache then keeps for later requests.
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": prompt_len - cached},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt_len + out,
        "cost_usd": m.cost_usd if m else 0.0,
        "machine_seconds": m.machine_s if m else 0.0,
        "time_to_first_token_seconds": m.ttft_s if m and generated else None,
    }


class ResponseRun:
    """Runs a prepared turn; `events()` yields the stream, `keep(turn)` receives the finished turn."""

    def __init__(self, p: PreparedTurn, keep: Callable[[Turn], None]):
        self.p = p
        self.keep = keep
        self.error: ApiError | None = None  # why the response failed, if it did
        self.final: dict | None = None  # the response object the last event carries
        self._seq = 0
        body, job = p.body, p.job
        self.response = {
            "id": p.response_id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": job.model.name,
            "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning_config(),
            "store": body.store is not False,
            "temperature": job.params.temperature,
            "text": body.text_config(),
            "tool_choice": body.tool_choice.model_dump()
            if hasattr(body.tool_choice, "model_dump")
            else body.tool_choice_mode(),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "top_logprobs": body.top_logprobs,
            "top_p": job.params.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": body.user,
            "metadata": body.metadata or {},
            **tier_fields(job.admission),
        }

    def _event(self, event: dict) -> dict:
        event = {**event, "sequence_number": self._seq}
        self._seq += 1
        return event

    async def events(self) -> AsyncIterator[dict]:
        job = self.p.job
        try:
            yield self._event({"type": "response.created", "response": self.response})
            yield self._event({"type": "response.in_progress", "response": self.response})
            stream = self._generate() if self.p.generate else self._warm_up()
            async with aclosing(stream) as events:
                async for event in events:
                    yield self._event(event)
        finally:
            job.close()

    async def _warm_up(self) -> AsyncIterator[dict]:
        job = self.p.job
        try:
            async with aclosing(job.outputs()) as outs:
                async for _ in outs:
                    pass
        except ApiError as e:
            yield self._failed(e, [])
            return
        final = {**self.response, "status": "completed", "usage": usage(job.last, len(job.prompt_ids), False)}
        self._finish(
            Turn(
                self.p.response_id,
                self.p.body.instructions,
                self.p.history,
                list(job.prompt_ids),
                [],
                True,
                job.model.name,
                self.p.tools_key,
                generated=False,
            ),
            final,
        )
        yield {"type": "response.completed", "response": final}

    async def _generate(self) -> AsyncIterator[dict]:
        job, tok = self.p.job, self.p.job.model.tokenizer
        out = OutputBuilder()
        # Where no call and no think block can come, the answer is one message, opened at once;
        # otherwise the parsers decide what is reasoning, text and a call, and items open as they say.
        parser = ToolCallParser("call_") if self.p.calls_possible else None
        opens = self.p.reasoning_from_prompt
        thinking = OutputSplit(tok, opens) if opens is not None else None
        token_text = TokenText(tok) if job.params.logprobs is not None else None
        if parser is None and thinking is None:
            for event in out.open_message():
                yield event
        try:
            async with aclosing(job.outputs()) as outs:
                async for o in outs:
                    text, entries, events = o.delta_text, o.delta_logprobs or (), []
                    if thinking is not None:  # the think block's tokens carry no logprobs to the answer
                        thought, text, entries = thinking.step(o)
                        events += out.reasoning(thought)
                    logprobs = chat_logprobs(token_text, entries) if token_text is not None else None
                    if parser is None:
                        events += out.text(text, logprobs)
                    else:
                        events += self._parsed(out, parser.feed(text), logprobs)
                        if o.finished:
                            events += self._parsed(out, parser.finish(), None)
                    for event in events:
                        yield event
        except ApiError as e:
            for event in out.finish("incomplete"):
                yield event
            yield self._failed(e, out.output)
            return
        o = job.last
        kind, _ = stop_details(o, job.params, tok)
        status = "incomplete" if kind == "length" else "completed"
        if not out.output or (out.output[-1]["type"] == "reasoning" and status == "completed"):
            # No answer was written (nothing at all, or only reasoning): the answer is an empty message.
            for event in out.open_message():
                yield event
        for event in out.finish(status):
            yield event
        counted = reasoning_token_count(tok, o.token_ids, opens)
        final = {
            **self.response,
            "status": status,
            "output": out.output,
            "usage": usage(o, len(o.prompt_token_ids), reasoning_tokens=counted),
        }
        if status == "incomplete":
            final["incomplete_details"] = {"reason": "max_output_tokens"}
        reply: Message = {"role": "assistant", "content": out.text_so_far}
        if out.reasoning_so_far:  # the template renders it, or drops it, in later turns
            reply["reasoning_content"] = out.reasoning_so_far
        calls = parser.calls if parser is not None else []
        if calls:
            reply["content"] = reply["content"] or None
            reply["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        self._finish(
            Turn(
                self.p.response_id,
                self.p.body.instructions,
                self.p.history + [reply],
                list(o.prompt_token_ids),
                list(o.token_ids),
                reusable=kind != "stop_string",
                model=job.model.name,
                tools=self.p.tools_key,
            ),
            final,
        )
        yield {"type": f"response.{status}", "response": final}

    @staticmethod
    def _parsed(out: OutputBuilder, parsed: list, logprobs: list[dict] | None) -> list[dict]:
        """Items and events for what the tool-call parser made of a step's text.
        The step's logprobs go with its text; tokens that wrote a call carry none."""
        events: list[dict] = []
        for p in parsed:
            if isinstance(p, TextDelta):
                events += out.text(p.text, logprobs)
                logprobs = None
            elif isinstance(p, CallStart):
                events += out.call_start(p.index, p.id, p.name)
                logprobs = None
            elif isinstance(p, ArgumentsDelta):
                events += out.call_arguments(p.index, p.fragment)
            elif isinstance(p, CallEnd):
                events += out.call_end(p.index, p.arguments_json)
        if logprobs:
            out.text("", logprobs)  # held until the text they wrote comes out
        return events

    def _finish(self, turn: Turn, final: dict) -> None:
        self.final = final
        self.keep(replace(turn, response=final))

    def _failed(self, e: ApiError, output: list[dict]) -> dict:
        self.error = e
        code = {"rate_limit": "rate_limit_exceeded", "invalid_request": "invalid_prompt"}.get(e.kind, "server_error")
        self.final = {
            **self.response,
            "status": "failed",
            "output": output,
            "error": {"code": code, "message": e.body(OPENAI)["error"]["message"]},
        }
        return {"type": "response.failed", "response": self.final}
