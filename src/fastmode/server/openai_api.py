"""The OpenAI dialect: /v1/models, /v1/completions, /v1/chat/completions.

service_tier mapping (request -> engine tier -> response `service_tier`):
  default or absent -> standard -> "default"
  flex              -> flex     -> "flex"
  priority, fast    -> fast     -> "priority"   (429 when the fast lane is full)
  auto              -> fast if the lane has room and fast's rate limit allows,
                       else standard; `service_tier_fallback_reason` says why.
An absent service_tier is served as standard, not auto: if unmarked traffic
rode the fast lane, the lane would cap every batch and stop being fast.
`requested_service_tier` echoes what the client asked for.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from fastmode.engine.llm_engine import RequestOutput
from fastmode.engine.tiers import Tier
from fastmode.server.admission import Admission, TierChoice
from fastmode.server.errors import OPENAI, ApiError
from fastmode.server.generation import Job, SSEResponse, client_gone, collect, make_params, resolve_max_tokens, sse_event
from fastmode.server.openai_models import ChatCompletionRequest, CompletionRequest, SamplingFields
from fastmode.server.ratelimit import openai_headers
from fastmode.server.served_model import ServedModel
from fastmode.server.state import ServerState, get_state, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])

SERVED_TIER_NAME = {Tier.FAST: "priority", Tier.STANDARD: "default", Tier.FLEX: "flex"}
FINGERPRINT = "fastmode"


def tier_choice(service_tier: str | None) -> TierChoice:
    if service_tier in (None, "default"):
        return TierChoice(Tier.STANDARD, service_tier)
    if service_tier == "flex":
        return TierChoice(Tier.FLEX, service_tier)
    if service_tier in ("priority", "fast"):
        return TierChoice(Tier.FAST, service_tier)
    if service_tier == "auto":
        return TierChoice(Tier.FAST, service_tier, auto=True)
    raise ApiError("invalid_request", f"service_tier {service_tier!r} is not offered", param="service_tier")


def tier_fields(a: Admission) -> dict:
    return {
        "service_tier": SERVED_TIER_NAME[a.tier],
        "requested_service_tier": a.requested,
        "service_tier_fallback_reason": a.fallback_reason,
    }


def usage(o: RequestOutput) -> dict:
    """OpenAI's usage, plus what fastmode metered for this request."""
    m = o.metrics
    prompt, completion = len(o.prompt_token_ids), len(o.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": m.cached_tokens if m else 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
        "cost_usd": m.cost_usd if m else 0.0,
        "machine_seconds": m.machine_s if m else 0.0,
        "time_to_first_token_seconds": m.ttft_s if m else None,
    }


def response_headers(a: Admission) -> dict[str, str]:
    return {"x-fastmode-tier": a.tier.value, **openai_headers(a.rate_limits)}


def _prepare(
    state: ServerState, model: ServedModel, body: SamplingFields, ids: list[int], max_tokens: int | None, param: str
) -> Job:
    """Validate lengths and sampling, then admit: nothing after this can fail before the stream starts."""
    max_tokens = resolve_max_tokens(model.engine, len(ids), max_tokens, param)
    params = make_params(
        model, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
        max_tokens=max_tokens, stop=body.stop_list(), ignore_eos=body.ignore_eos, speculative=body.speculative,
    )
    admission = model.admission.admit(tier_choice(body.service_tier), len(ids), max_tokens)
    return Job(state, model, ids, params, admission)


def _card(state: ServerState, model: ServedModel) -> dict:
    return {"id": model.name, "object": "model", "created": state.created_s, "owned_by": "fastmode",
            "max_model_len": model.max_model_len}


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    state = get_state(request)
    return {"object": "list", "data": [_card(state, m) for m in state.models.values()]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict:
    state = get_state(request)
    return _card(state, state.select(model_id))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = get_state(request)
    model = state.select(body.model)
    body.unsupported()
    # "developer" is the newer name of "system"; chat templates know only the latter.
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    try:
        ids = model.tokenizer.encode_chat(messages)
    except ValueError as e:  # no template, or the template refused the conversation
        raise ApiError("invalid_request", str(e), param="messages") from e
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    job = _prepare(state, model, body, ids, body.output_limit(), param)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": rid, "created": created, "model": model.name, "system_fingerprint": FINGERPRINT,
            **tier_fields(job.admission)}
    headers = response_headers(job.admission)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_chat_events(job, head, include_usage), on_close=job.close, headers=headers)
    o = await collect(request, job)
    if o is None:
        return client_gone()
    choice = {"index": 0, "message": {"role": "assistant", "content": o.text, "refusal": None},
              "logprobs": None, "finish_reason": o.finish_reason}
    return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage(o)}, headers=headers)


async def _chat_events(job: Job, head: dict, include_usage: bool) -> AsyncIterator[str]:
    head = {**head, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish: str | None = None) -> str:
        return sse_event({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async with aclosing(job.outputs()) as outs:
            async for o in outs:
                if o.delta_text:
                    yield chunk({"content": o.delta_text})
    except ApiError as e:  # headers are gone: report in-band, as OpenAI does
        yield sse_event(e.body(OPENAI))
        return
    last = job.last
    yield chunk({}, last.finish_reason)
    if include_usage:
        yield sse_event({**head, "choices": [], "usage": usage(last)})
    yield "data: [DONE]\n\n"


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = get_state(request)
    model = state.select(body.model)
    body.unsupported()
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        ids = model.tokenizer.encode(prompt)
    else:
        vocab = model.engine.loaded.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ApiError("invalid_request", f"prompt token ids must be in [0, {vocab})", param="prompt")
        ids = list(prompt)
    job = _prepare(state, model, body, ids, body.max_tokens, "max_tokens")
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model.name, "system_fingerprint": FINGERPRINT, **tier_fields(job.admission)}
    headers = response_headers(job.admission)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_completion_events(job, head, include_usage), on_close=job.close, headers=headers)
    o = await collect(request, job)
    if o is None:
        return client_gone()
    choice = {"index": 0, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason}
    return JSONResponse({**head, "choices": [choice], "usage": usage(o)}, headers=headers)


async def _completion_events(job: Job, head: dict, include_usage: bool) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}

    def chunk(text: str, finish: str | None = None) -> str:
        return sse_event({**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra})

    try:
        async with aclosing(job.outputs()) as outs:
            async for o in outs:
                if o.delta_text or o.finished:
                    yield chunk(o.delta_text, o.finish_reason if o.finished else None)
    except ApiError as e:
        yield sse_event(e.body(OPENAI))
        return
    if include_usage:
        yield sse_event({**head, "choices": [], "usage": usage(job.last)})
    yield "data: [DONE]\n\n"
