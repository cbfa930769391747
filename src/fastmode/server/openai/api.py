"""The OpenAI dialect: /v1/models, /v1/completions, /v1/chat/completions.

service_tier mapping (request -> engine tier -> response `service_tier`):
  default or absent -> standard -> "default"
  flex              -> flex     -> "flex"
  priority, fast    -> fast     -> "priority"   (429 when the fast lane is full)
  auto              -> fast if the lane has room and fast's rate limit allows,
                       else standard; `service_tier_fallback_reason` says why.
An absent service_tier is served as standard, not auto: if unmarked traffic
rode the fast lane, the lane would cap every batch and stop being fast.
`requested_service_tier` echoes what the client asked for; the header
`x-fastmode-tier` carries the served tier in the same words.

Tools, `response_format`, logprobs, `n` and the penalties are documented in
docs/server.md; tools go through server/tools/grammar.py and tools/call_parser.py (one grammar per turn, one
parser over the output), `n` runs one engine request per choice on the same
prompt ids, so the prefix cache shares the prompt's KV between them.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from fastmode.engine.llm_engine import RequestOutput
from fastmode.engine.tiers import Tier
from fastmode.sampling_params import SamplingParams, StructuredOutput
from fastmode.server.edge.admission import Admission, TierChoice
from fastmode.server.edge.errors import OPENAI, ApiError
from fastmode.server.edge.ratelimit import openai_headers
from fastmode.server.generation import (
    Job,
    SSEResponse,
    check_structured,
    client_gone,
    collect_all,
    interleave,
    resolve_max_tokens,
    sse_event,
)
from fastmode.server.openai.chat_output import ChatOutput, deltas, finish_reason, usage
from fastmode.server.openai.logprobs import TokenText, completion_logprobs
from fastmode.server.openai.models import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    chat_messages,
)
from fastmode.server.params import sampling_params
from fastmode.server.reasoning import (
    is_thinking_model,
    prompt_opens_thinking,
    with_thinking,
)
from fastmode.server.served_model import ServedModel
from fastmode.server.state import ServerState, get_state, require_api_key
from fastmode.server.tools.grammar import tool_grammar
from fastmode.server.tools.prompt import render_prompt
from fastmode.server.tools.specs import ToolError, check_tools

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


def response_headers(a: Admission, request_id: str) -> dict[str, str]:
    return {"x-request-id": request_id, "x-fastmode-tier": SERVED_TIER_NAME[a.tier], **openai_headers(a.rate_limits)}


def _admit(model: ServedModel, service_tier: str | None, prompt_len: int, max_tokens: int, n: int) -> list[Admission]:
    """One admission per choice, all on the tier the first one got: n choices are n rows in
    the batch. The prompt counts once against the rate limits, as it is prefilled once."""
    first = model.admission.admit(tier_choice(service_tier), prompt_len, max_tokens)
    admitted = [first]
    try:
        for _ in range(n - 1):
            admitted.append(model.admission.admit(TierChoice(first.tier, service_tier), 0, max_tokens))
    except ApiError:
        for a in admitted:
            a.settle(0)
        raise
    return admitted


async def _prepare(
    state: ServerState,
    model: ServedModel,
    body: SamplingFields,
    ids: list[int],
    max_tokens: int | None,
    param: str,
    *,
    structured: StructuredOutput | None = None,
    logprobs: int | None = None,
    structured_param: str = "",
    prompt_param: str = "messages",
) -> list[Job]:
    """Validate lengths, sampling, the request and the grammar, then admit: nothing after this can fail before the
    stream starts."""
    max_tokens = resolve_max_tokens(model.engine, len(ids), max_tokens, param)
    params = sampling_params(
        body.sampling(),
        max_tokens=max_tokens,
        vocab_size=model.tokenizer.vocab_size,
        structured=structured,
        logprobs=logprobs,
    )
    model.check_request(ids, params, prompt_param)
    await check_structured(model, structured, structured_param)
    n = body.n or 1
    admissions = _admit(model, body.service_tier, len(ids), max_tokens, n)
    return [Job(state, model, ids, _choice_params(params, i), a) for i, a in enumerate(admissions)]


def _choice_params(params: SamplingParams, i: int) -> SamplingParams:
    # A seeded request with n choices gives n different (and reproducible) samples.
    return params if i == 0 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)


def _card(state: ServerState, model: ServedModel) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": state.created_s,
        "owned_by": "fastmode",
        "max_model_len": model.max_model_len,
    }


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
    state.check_input(body)
    model = state.select(body.model)
    body.unsupported()
    if body.reasoning_effort is not None and not model.tokenizer.has_thinking_switch:
        raise ApiError(
            "invalid_request",
            f"reasoning_effort: {model.name}'s chat template has no thinking switch; remove it",
            param="reasoning_effort",
            code="unsupported_parameter",
        )
    messages = chat_messages(body.messages)
    tools, choice = body.tool_specs(), body.tool_choice_of()
    # tool_choice none: the tools are neither described to the model nor callable.
    offered = tools if choice.mode != "none" else []
    answer = body.structured()  # response_format: the form of a reply that calls no tool
    # A grammar that fixes the output from its first token (a JSON answer, forced calls) leaves
    # no room for a think block: thinking is switched off for such a turn.
    forced = answer is not None or (bool(offered) and choice.mode in ("required", "named"))
    tok = with_thinking(model.tokenizer, False if forced else body.thinking())
    await check_structured(model, answer, "response_format")
    try:
        check_tools(tools)
        structured = tool_grammar(offered, choice, answer)
    except ToolError as e:
        raise ApiError("invalid_request", str(e), param=e.param) from None
    structured_param = "response_format" if structured is answer else "tools"
    try:
        ids = await state.tokenizers.run(render_prompt, tok, messages, offered)
    except ValueError as e:  # no template, or the template refused the conversation
        raise ApiError("invalid_request", str(e), param="messages") from e
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    jobs = await _prepare(
        state,
        model,
        body,
        ids,
        body.output_limit(),
        param,
        structured=structured,
        logprobs=body.num_logprobs(),
        structured_param=structured_param,
    )
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    head = {
        "id": rid,
        "created": created,
        "model": model.name,
        "system_fingerprint": FINGERPRINT,
        **tier_fields(jobs[0].admission),
    }
    headers = response_headers(jobs[0].admission, rid)
    out = ChatOutput(model, with_tools=bool(offered), logprobs=body.num_logprobs() is not None)
    if is_thinking_model(tok):
        out.reasoning_from_prompt = not forced and prompt_opens_thinking(tok, ids)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_chat_events(jobs, head, include_usage, out), on_close=lambda: _close(jobs), headers=headers)
    outs = await collect_all(request, jobs)
    if outs is None:
        return client_gone()
    choices = [out.choice(i, o, j.logprobs) for i, (o, j) in enumerate(zip(outs, jobs))]
    return JSONResponse(
        {**head, "object": "chat.completion", "choices": choices, "usage": out.usage(outs)}, headers=headers
    )


def _close(jobs: list[Job]) -> None:
    for j in jobs:
        j.close()


async def _chat_events(jobs: list[Job], head: dict, include_usage: bool, out: ChatOutput) -> AsyncIterator[str]:
    head = {**head, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}
    parsers = [out.parser() for _ in jobs]
    thinking = [out.reasoning() for _ in jobs]
    pending: list[list] = [[] for _ in jobs]  # logprobs not yet sent with a chunk, per choice

    def chunk(i: int, delta: dict, finish: str | None = None) -> str:
        logprobs = None
        if out.tokens is not None and (pending[i] or finish):
            logprobs, pending[i] = out.logprobs(pending[i]), []
        choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return sse_event({**head, "choices": [choice], **extra})

    for i in range(len(jobs)):
        yield chunk(i, {"role": "assistant", "content": ""})
    try:
        async for i, o in interleave(jobs):
            pending[i] += getattr(o, "delta_logprobs", None) or []
            text = o.delta_text
            if thinking[i] is not None:
                thought, text = thinking[i].feed(text)
                if o.finished:
                    more = thinking[i].finish()
                    thought, text = thought + more[0], text + more[1]
                if thought:
                    yield chunk(i, {"reasoning_content": thought})
            for delta in deltas(parsers[i], text, o.finished):
                yield chunk(i, delta)
            if o.finished:
                calls = parsers[i] is not None and bool(parsers[i].calls)
                yield chunk(i, {}, finish_reason(o, calls))
    except ApiError as e:  # headers are gone: report in-band, as OpenAI does
        yield sse_event(e.body(OPENAI))
        return
    if include_usage:
        yield sse_event({**head, "choices": [], "usage": out.usage([j.last for j in jobs])})
    yield "data: [DONE]\n\n"


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state = get_state(request)
    state.check_input(body)
    model = state.select(body.model)
    body.unsupported()
    prompt = body.single_prompt()
    ids = await state.tokenizers.run(model.tokenizer.encode, prompt) if isinstance(prompt, str) else list(prompt)
    jobs = await _prepare(
        state, model, body, ids, body.max_tokens, "max_tokens", logprobs=body.logprobs, prompt_param="prompt"
    )
    rid = f"cmpl-{uuid.uuid4().hex}"
    head = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model.name,
        "system_fingerprint": FINGERPRINT,
        **tier_fields(jobs[0].admission),
    }
    headers = response_headers(jobs[0].admission, rid)
    tokens = TokenText(model.tokenizer) if body.logprobs is not None else None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(
            _completion_events(jobs, head, include_usage, tokens), on_close=lambda: _close(jobs), headers=headers
        )
    outs = await collect_all(request, jobs)
    if outs is None:
        return client_gone()
    choices = [
        {
            "index": i,
            "text": o.text,
            "finish_reason": o.finish_reason,
            "logprobs": completion_logprobs(tokens, j.logprobs, 0) if tokens else None,
        }
        for i, (o, j) in enumerate(zip(outs, jobs))
    ]
    return JSONResponse({**head, "choices": choices, "usage": usage(outs)}, headers=headers)


async def _completion_events(
    jobs: list[Job], head: dict, include_usage: bool, tokens: TokenText | None
) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    offsets = [0] * len(jobs)  # characters of text sent so far, per choice: the logprobs' text_offset

    def chunk(i: int, o: RequestOutput) -> str:
        logprobs = None
        if tokens is not None:
            logprobs = completion_logprobs(tokens, getattr(o, "delta_logprobs", None) or [], offsets[i])
        offsets[i] += len(o.delta_text)
        choice = {
            "index": i,
            "text": o.delta_text,
            "logprobs": logprobs,
            "finish_reason": o.finish_reason if o.finished else None,
        }
        return sse_event({**head, "choices": [choice], **extra})

    try:
        async for i, o in interleave(jobs):
            if o.delta_text or o.finished or (tokens is not None and getattr(o, "delta_logprobs", None)):
                yield chunk(i, o)
    except ApiError as e:
        yield sse_event(e.body(OPENAI))
        return
    if include_usage:
        yield sse_event({**head, "choices": [], "usage": usage([j.last for j in jobs])})
    yield "data: [DONE]\n\n"
