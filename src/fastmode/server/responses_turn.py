"""One turn of the Responses API, whatever carries it (HTTP or the WebSocket mode).

`prepare_turn` checks a request and admits it: everything that can be refused
is refused there, before any event is sent (a bad schema, an unknown
previous_response_id, a full fast lane). `ResponseRun.events()` then runs it
and yields the stream events with their sequence numbers, ending with
response.completed, response.incomplete (max_output_tokens or the context cut
it) or response.failed. The finished turn is handed to `keep` before the last
event goes out, so a client that reacts to response.completed at once can
already chain from it.

A warm-up (`generate: false`, WebSocket mode) prefills the conversation so
its KV blocks enter the prefix cache, generates nothing, and returns an id
the next turn chains from.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace

from fastmode.engine.llm_engine import RequestOutput
from fastmode.sampling_params import StructuredOutput
from fastmode.server.conversation import Message, Turn, build_prompt
from fastmode.server.errors import OPENAI, ApiError, clip
from fastmode.server.generation import (
    Job,
    check_structured,
    make_params,
    resolve_max_tokens,
    stop_details,
)
from fastmode.server.logprobs import TokenText, chat_logprobs
from fastmode.server.openai_api import tier_choice, tier_fields
from fastmode.server.responses_events import OutputBuilder, new_id
from fastmode.server.responses_models import ResponseRequest
from fastmode.server.state import ServerState
from fastmode.server.tools import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    TextDelta,
    ToolCallParser,
    ToolChoice,
    ToolError,
    ToolSpec,
    render_text,
    tool_grammar,
)

Lookup = Callable[[str], "Turn | None"]


@dataclass
class PreparedTurn:
    job: Job
    body: ResponseRequest
    response_id: str
    history: list[Message]  # the conversation so far, without the system message
    generate: bool
    tools_key: str
    calls_possible: bool  # tools are offered and tool_choice is not none: the output is parsed for calls


def _previous(body: ResponseRequest, lookup: Lookup) -> Turn | None:
    if body.previous_response_id is None:
        return None
    prev = lookup(body.previous_response_id)
    if prev is None:
        raise ApiError(
            "invalid_request",
            f"Previous response with id '{clip(body.previous_response_id)}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return prev


def _grammar(tools: list[ToolSpec], choice: ToolChoice, answer: StructuredOutput | None) -> StructuredOutput | None:
    """The turn's grammar: calls as `tool_choice` allows, and a reply without calls under `text.format`."""
    try:
        return tool_grammar(tools, choice, answer)
    except ToolError as e:
        param = "text.format" if e.param == "response_format" else e.param
        raise ApiError("invalid_request", str(e).replace("response_format", "text.format"), param=param) from e


async def prepare_turn(
    state: ServerState, body: ResponseRequest, lookup: Lookup, generate: bool = True
) -> PreparedTurn:
    """Validate, build the prompt and admit; raises ApiError (nothing is left behind)."""
    state.check_input(body)
    model = state.select(body.model)
    body.unsupported()
    tok = model.tokenizer
    tools = body.tool_specs()
    choice = body.choice()
    prev = _previous(body, lookup)
    history = prev.messages if prev else []
    new = body.new_messages(history)
    answer = body.structured()
    structured = _grammar(tools, choice, answer)
    if generate:  # the format alone first, so that a bad schema is named as such
        await check_structured(model, answer, "text.format")
        await check_structured(model, structured, "text.format" if structured is answer else "tools")
    # Tools are part of the prompt: a turn offering other tools cannot extend the previous one's tokens.
    tools_key = json.dumps([t.as_hf() for t in tools], sort_keys=True) if tools else ""

    def render(messages: list[Message], add_generation_prompt: bool) -> str:
        return render_text(tok, messages, tools, add_generation_prompt)

    try:
        ids, history, _ = await state.tokenizers.run(
            functools.partial(
                build_prompt,
                tok,
                prev,
                body.instructions,
                new,
                model.name,
                render=render,
                tools=tools_key,
                add_generation_prompt=generate,
            )
        )
    except ValueError as e:  # no template, or the template refused the conversation
        raise ApiError("invalid_request", str(e), param="input") from e
    try:
        # A warm-up prefills the prompt; the one token sampled with it is dropped.
        max_tokens = resolve_max_tokens(
            model.engine, len(ids), body.max_output_tokens if generate else 1, "max_output_tokens"
        )
    except ApiError as e:
        e.param = "input" if e.param == "messages" else e.param  # the prompt's field in this API
        raise
    params = make_params(
        model,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        max_tokens=max_tokens,
        speculative=body.speculative,
        structured=structured if generate else None,
        logprobs=body.logprobs if generate else None,
    )
    model.check_request(ids, params, "input")
    admission = model.admission.admit(tier_choice(body.service_tier), len(ids), max_tokens)
    job = Job(state, model, ids, params, admission)
    calls_possible = bool(tools) and choice.mode != "none"
    return PreparedTurn(job, body, new_id("resp"), history, generate, tools_key, calls_possible)


def usage(o: RequestOutput | None, prompt_len: int, generated: bool = True) -> dict:
    """The Responses API's usage, plus what fastmode metered for this request."""
    m = o.metrics if o else None
    out = len(o.token_ids) if o and generated else 0
    return {
        "input_tokens": prompt_len,
        "input_tokens_details": {"cached_tokens": m.cached_tokens if m else 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
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
            "reasoning": {"effort": None, "summary": None},
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
        # Where no call can come, the answer is one message, opened at once; otherwise the
        # parser decides what is text and what is a call, and items open as it says.
        parser = ToolCallParser("call_") if self.p.calls_possible else None
        token_text = TokenText(tok) if job.params.logprobs is not None else None
        if parser is None:
            for event in out.open_message():
                yield event
        try:
            async with aclosing(job.outputs()) as outs:
                async for o in outs:
                    logprobs = chat_logprobs(token_text, o.delta_logprobs or ()) if token_text is not None else None
                    if parser is None:
                        events = out.text(o.delta_text, logprobs)
                    else:
                        events = self._parsed(out, parser.feed(o.delta_text), logprobs)
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
        if not out.output:  # nothing at all was written: the answer is an empty message
            for event in out.open_message():
                yield event
        for event in out.finish(status):
            yield event
        final = {**self.response, "status": status, "output": out.output, "usage": usage(o, len(o.prompt_token_ids))}
        if status == "incomplete":
            final["incomplete_details"] = {"reason": "max_output_tokens"}
        reply: Message = {"role": "assistant", "content": out.text_so_far}
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
