"""The Anthropic dialect: POST /v1/messages, with fast mode.

`"speed": "fast"` asks for the fast tier, with or without the
`anthropic-beta: fast-mode-2026-02-01` header; `usage.speed` reports the
speed served. Fast mode has its own rate limits (anthropic-fast-* headers)
and answers 429 with retry-after when they, or the fast lane, are full; as
with Anthropic, the client's fallback is to retry without `speed`.
A final assistant message is a prefill: generation continues its text.
Tools go through server/tools/grammar.py and server/tools/call_parser.py: one grammar per turn, and one parser that
turns the output into text and tool_use blocks as it streams. Responses carry
`request-id` and `x-request-id` headers equal to the message id.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from fastmode.engine.llm_engine import RequestOutput
from fastmode.engine.tiers import Tier
from fastmode.server.anthropic.models import MessagesRequest, chat_messages
from fastmode.server.edge.admission import TierChoice
from fastmode.server.edge.errors import ANTHROPIC, ApiError, validation_message
from fastmode.server.edge.ratelimit import anthropic_headers
from fastmode.server.generation import (
    Job,
    SSEResponse,
    check_structured,
    client_gone,
    collect,
    resolve_max_tokens,
    sse_event,
    stop_details,
)
from fastmode.server.params import sampling_params
from fastmode.server.reasoning import ReasoningParser, is_thinking_model, prompt_opens_thinking, with_thinking
from fastmode.server.served_model import ServedModel
from fastmode.server.state import get_state, require_api_key
from fastmode.server.tools.call_parser import ArgumentsDelta, CallEnd, CallStart, Event, TextDelta, ToolCallParser
from fastmode.server.tools.grammar import tool_grammar
from fastmode.server.tools.prompt import render_prompt
from fastmode.server.tools.specs import ToolChoice, ToolError, ToolSpec

router = APIRouter(dependencies=[Depends(require_api_key)])

FAST_MODE_BETA = "fast-mode-2026-02-01"
_STOP_REASON = {"eos": "end_turn", "stop_string": "stop_sequence", "length": "max_tokens"}


def _tokenizer(model: ServedModel, body: MessagesRequest):
    """The model's tokenizer with the request's thinking switch; 400 for thinking the model cannot do."""
    if body.thinking_enabled() and not model.tokenizer.has_thinking_switch:
        raise ApiError(
            "invalid_request",
            f"thinking: {model.name}'s chat template has no thinking switch; remove it",
            param="thinking",
        )
    return with_thinking(model.tokenizer, body.thinking_enabled())


def _prompt_ids(model: ServedModel, body: MessagesRequest, tools: list[ToolSpec]) -> list[int]:
    messages = chat_messages(body.messages)
    system = body.system_text()
    if system:
        messages.insert(0, {"role": "system", "content": system})
    last = messages[-1]
    prefill = messages.pop()["content"] if last["role"] == "assistant" and not last.get("tool_calls") else None
    tok = _tokenizer(model, body)
    try:
        ids = render_prompt(tok, messages, tools)
    except ValueError as e:
        raise ApiError("invalid_request", str(e)) from e
    if prefill:
        ids += tok.encode(prefill, add_special_tokens=False)
    return ids


def _usage(o: RequestOutput, speed: str) -> dict:
    """Anthropic counts cache reads apart from input_tokens; fastmode adds its metered cost."""
    m = o.metrics
    cached = m.cached_tokens if m else 0
    return {
        "input_tokens": len(o.prompt_token_ids) - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": len(o.token_ids),
        "service_tier": "standard",
        "speed": speed,
        "cost_usd": m.cost_usd if m else 0.0,
        "machine_seconds": m.machine_s if m else 0.0,
    }


def _stop_reason(o: RequestOutput, job: Job, called: bool) -> tuple[str, str | None]:
    kind, stop_seq = stop_details(o, job.params, job.model.tokenizer)
    if kind == "length" and getattr(o, "length_limit", None) == "context":
        return "model_context_window_exceeded", None
    if called and kind == "eos":
        return "tool_use", None
    return _STOP_REASON[kind], stop_seq


def _tools(body: MessagesRequest) -> tuple[list[ToolSpec], ToolChoice]:
    try:
        tools, choice = body.tool_specs(), body.tool_choice_of()
        return tools, choice
    except ToolError as e:
        raise ApiError("invalid_request", str(e), param=e.param) from None


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> dict:
    """Prompt tokens a /v1/messages body would use (agents call this to budget context)."""
    try:
        data = await request.json()
    except ValueError as e:
        raise ApiError("invalid_request", f"the request body is not valid JSON: {e}") from e
    except RecursionError:
        raise ApiError("invalid_request", "the request body nests too deeply") from None
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    try:
        body = MessagesRequest.model_validate({"max_tokens": 1, **data})
    except ValidationError as e:
        raise ApiError("invalid_request", validation_message(list(e.errors()))[0]) from None
    state = get_state(request)
    state.check_input(body)
    model = state.select(body.model)
    tools, _ = _tools(body)
    return {"input_tokens": len(await state.tokenizers.run(_prompt_ids, model, body, tools))}


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, request: Request):
    state = get_state(request)
    state.check_input(body)
    model = state.select(body.model)
    body.unsupported()
    tools, choice = _tools(body)
    if body.thinking_enabled() and choice.mode in ("required", "named"):  # as Anthropic refuses it
        raise ApiError(
            "invalid_request", "thinking may not be enabled when tool_choice forces tool use", param="thinking"
        )
    try:
        grammar = tool_grammar(tools, choice)  # choice none: tools described, no calls
    except ToolError as e:
        raise ApiError("invalid_request", str(e), param=e.param) from None
    ids = await state.tokenizers.run(_prompt_ids, model, body, tools)
    max_tokens = resolve_max_tokens(model.engine, len(ids), body.max_tokens)
    params = sampling_params(
        body.sampling(), max_tokens=max_tokens, vocab_size=model.tokenizer.vocab_size, structured=grammar
    )
    await check_structured(model, grammar, "tools")
    model.check_request(ids, params, "messages")  # a 400 before admission, as in the other dialects
    # The beta header is accepted but not required: `speed` alone selects fast mode.
    want = TierChoice(Tier.FAST, "fast") if body.speed == "fast" else TierChoice(Tier.STANDARD, body.speed)
    admission = model.admission.admit(want, len(ids), max_tokens)
    job = Job(state, model, ids, params, admission)
    speed = "fast" if admission.tier is Tier.FAST else "standard"
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    headers = {
        "request-id": msg_id,
        "x-request-id": msg_id,
        "x-fastmode-tier": speed,
        **anthropic_headers(admission.tier, admission.rate_limits),
    }
    calls_possible = bool(tools) and choice.mode != "none"
    tok = model.tokenizer
    # A thinking model's output is split into thinking and text; None: no think blocks.
    opens = prompt_opens_thinking(tok, ids) if is_thinking_model(tok) else None
    if body.stream:
        return SSEResponse(_events(job, msg_id, speed, calls_possible, opens), on_close=job.close, headers=headers)
    o = await collect(request, job)
    if o is None:
        return client_gone()
    thought, text = ReasoningParser(opens).split(o.text) if opens is not None else ("", o.text)
    thinking = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
    content: list[dict] = thinking + [{"type": "text", "text": text}]
    called = False
    if calls_possible:
        parser = ToolCallParser("toolu_")
        parser.feed(text)
        parser.finish()
        called = bool(parser.calls)
        content = (
            thinking
            + ([{"type": "text", "text": parser.text}] if parser.text or not called else [])
            + [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in parser.calls]
        )
    stop_reason, stop_seq = _stop_reason(o, job, called)
    message = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model.name,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_seq,
        "usage": _usage(o, speed),
    }
    return JSONResponse(message, headers=headers)


class _Blocks:
    """Content blocks as they stream: a text block opens at the first text and closes when a
    tool_use block starts; block indexes count every block opened."""

    def __init__(self):
        self.count = 0
        self.open: str | None = None  # "text" | "tool_use"
        self.called = False

    def start(self, block: dict) -> str:
        self.open = block["type"]
        self.count += 1
        return sse_event(
            {"type": "content_block_start", "index": self.count - 1, "content_block": block}, "content_block_start"
        )

    def stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [sse_event({"type": "content_block_stop", "index": self.count - 1}, "content_block_stop")]

    def delta(self, delta: dict) -> str:
        return sse_event(
            {"type": "content_block_delta", "index": self.count - 1, "delta": delta}, "content_block_delta"
        )

    def thinking(self, text: str) -> list[str]:
        """A thinking_delta, in a thinking block opened for it (it comes before any other block)."""
        out = []
        if self.open != "thinking":
            out += self.stop()
            out.append(self.start({"type": "thinking", "thinking": "", "signature": ""}))
        out.append(self.delta({"type": "thinking_delta", "thinking": text}))
        return out

    def events(self, events: list[Event]) -> list[str]:
        out = []
        for e in events:
            if isinstance(e, TextDelta):
                if self.open != "text":
                    out += self.stop()
                    out.append(self.start({"type": "text", "text": ""}))
                out.append(self.delta({"type": "text_delta", "text": e.text}))
            elif isinstance(e, CallStart):
                out += self.stop()
                self.called = True
                out.append(self.start({"type": "tool_use", "id": e.id, "name": e.name, "input": {}}))
            elif isinstance(e, ArgumentsDelta):
                out.append(self.delta({"type": "input_json_delta", "partial_json": e.fragment}))
            elif isinstance(e, CallEnd):
                out += self.stop()
        return out


async def _events(
    job: Job, msg_id: str, speed: str, calls_possible: bool, opens_thinking: bool | None = None
) -> AsyncIterator[str]:
    """message_start, content blocks (start, deltas, stop), message_delta (stop_reason, usage),
    message_stop: the sequence Anthropic's SDKs parse. Without tools or thinking the text block
    opens at once; a thinking model's reasoning streams first, as a thinking block."""
    start_usage = {
        "input_tokens": len(job.prompt_ids),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
        "service_tier": "standard",
        "speed": speed,
    }
    message = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": job.model.name,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    yield sse_event({"type": "message_start", "message": message}, "message_start")
    blocks = _Blocks()
    parser = ToolCallParser("toolu_") if calls_possible else None
    reasoning = ReasoningParser(opens_thinking) if opens_thinking is not None else None
    if parser is None and reasoning is None:
        yield blocks.start({"type": "text", "text": ""})
    yield sse_event({"type": "ping"}, "ping")
    try:
        async with aclosing(job.outputs()) as outs:
            async for o in outs:
                text = o.delta_text
                if reasoning is not None:
                    thought, text = reasoning.feed(text)
                    if o.finished:
                        more = reasoning.finish()
                        thought, text = thought + more[0], text + more[1]
                    for event in blocks.thinking(thought) if thought else []:
                        yield event
                events = parser.feed(text) if parser else [TextDelta(text)] if text else []
                for event in blocks.events(events + (parser.finish() if parser and o.finished else [])):
                    yield event
    except ApiError as e:
        yield sse_event(e.body(ANTHROPIC), "error")
        return
    if blocks.count == 0:  # nothing generated: an empty text block, as for any empty answer
        yield blocks.start({"type": "text", "text": ""})
    for event in blocks.stop():
        yield event
    o = job.last
    stop_reason, stop_seq = _stop_reason(o, job, blocks.called and not (parser and parser.open_call))
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_seq},
        "usage": _usage(o, speed),
    }
    yield sse_event(delta, "message_delta")
    yield sse_event({"type": "message_stop"}, "message_stop")
