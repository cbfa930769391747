"""The Anthropic dialect: POST /v1/messages, with fast mode.

`"speed": "fast"` asks for the fast tier, with or without the
`anthropic-beta: fast-mode-2026-02-01` header; `usage.speed` reports the
speed served. Fast mode has its own rate limits (anthropic-fast-* headers)
and answers 429 with retry-after when they, or the fast lane, are full; as
with Anthropic, the client's fallback is to retry without `speed`.
A final assistant message is a prefill: generation continues its text.
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
from fastmode.server.admission import TierChoice
from fastmode.server.anthropic_models import MessagesRequest
from fastmode.server.errors import ANTHROPIC, ApiError, validation_message
from fastmode.server.generation import Job, SSEResponse, client_gone, collect, make_params, resolve_max_tokens, sse_event, stop_details
from fastmode.server.ratelimit import anthropic_headers
from fastmode.server.served_model import ServedModel
from fastmode.server.state import get_state, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])

FAST_MODE_BETA = "fast-mode-2026-02-01"
_STOP_REASON = {"eos": "end_turn", "stop_string": "stop_sequence", "length": "max_tokens"}


def _prompt_ids(model: ServedModel, body: MessagesRequest) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    system = body.system_text()
    if system:
        messages.insert(0, {"role": "system", "content": system})
    prefill = messages.pop()["content"] if messages[-1]["role"] == "assistant" else None
    tok = model.tokenizer
    try:
        ids = tok.encode_chat(messages)
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


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> dict:
    """Prompt tokens a /v1/messages body would use (agents call this to budget context)."""
    try:
        data = await request.json()
    except ValueError as e:
        raise ApiError("invalid_request", f"the request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "the request body must be a JSON object")
    try:
        body = MessagesRequest.model_validate({"max_tokens": 1, **data})
    except ValidationError as e:
        raise ApiError("invalid_request", validation_message(list(e.errors()))[0]) from None
    return {"input_tokens": len(_prompt_ids(get_state(request).select(body.model), body))}


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, request: Request):
    state = get_state(request)
    model = state.select(body.model)
    body.unsupported()
    ids = _prompt_ids(model, body)
    max_tokens = resolve_max_tokens(model.engine, len(ids), body.max_tokens)
    params = make_params(
        model, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, max_tokens=max_tokens,
        stop=tuple(body.stop_sequences or ()), speculative=body.speculative,
    )
    # The beta header is accepted but not required: `speed` alone selects fast mode.
    want = TierChoice(Tier.FAST, "fast") if body.speed == "fast" else TierChoice(Tier.STANDARD, body.speed)
    admission = model.admission.admit(want, len(ids), max_tokens)
    job = Job(state, model, ids, params, admission)
    speed = "fast" if admission.tier is Tier.FAST else "standard"
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    headers = {"x-fastmode-tier": admission.tier.value, **anthropic_headers(admission.tier, admission.rate_limits)}
    if body.stream:
        return SSEResponse(_events(job, msg_id, speed), on_close=job.close, headers=headers)
    o = await collect(request, job)
    if o is None:
        return client_gone()
    kind, stop_seq = stop_details(o, params, model.tokenizer)
    message = {
        "id": msg_id, "type": "message", "role": "assistant", "model": model.name,
        "content": [{"type": "text", "text": o.text}],
        "stop_reason": _STOP_REASON[kind], "stop_sequence": stop_seq, "usage": _usage(o, speed),
    }
    return JSONResponse(message, headers=headers)


async def _events(job: Job, msg_id: str, speed: str) -> AsyncIterator[str]:
    """message_start, content_block_start, ping, content_block_delta*, content_block_stop,
    message_delta (stop_reason, usage), message_stop: the sequence Anthropic's SDKs parse."""
    start_usage = {"input_tokens": len(job.prompt_ids), "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 0, "output_tokens": 0, "service_tier": "standard", "speed": speed}
    message = {"id": msg_id, "type": "message", "role": "assistant", "model": job.model.name, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": start_usage}
    yield sse_event({"type": "message_start", "message": message}, "message_start")
    yield sse_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    "content_block_start")
    yield sse_event({"type": "ping"}, "ping")
    try:
        async with aclosing(job.outputs()) as outs:
            async for o in outs:
                if o.delta_text:
                    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": o.delta_text}}
                    yield sse_event(delta, "content_block_delta")
    except ApiError as e:
        yield sse_event(e.body(ANTHROPIC), "error")
        return
    o = job.last
    kind, stop_seq = stop_details(o, job.params, job.model.tokenizer)
    yield sse_event({"type": "content_block_stop", "index": 0}, "content_block_stop")
    delta = {"type": "message_delta", "delta": {"stop_reason": _STOP_REASON[kind], "stop_sequence": stop_seq},
             "usage": _usage(o, speed)}
    yield sse_event(delta, "message_delta")
    yield sse_event({"type": "message_stop"}, "message_stop")
