"""The Responses API over HTTP: POST /v1/responses, GET and DELETE /v1/responses/{id}.

`stream: true` sends the turn's events as server-sent events (`event: <type>`
and the event as data, each with its sequence_number), the same events the
WebSocket mode sends; otherwise the finished response object comes back.
Responses are stored (bounded, in memory) unless `store: false`, for GET and
for `previous_response_id`. Errors before the stream starts are 4xx in
OpenAI's format; a failure once it has started is a `response.failed` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from fastmode.server.edge.errors import ApiError, clip
from fastmode.server.generation import SSEResponse, client_gone, sse_event
from fastmode.server.openai.api import response_headers
from fastmode.server.responses.conversation import Turn
from fastmode.server.responses.models import ResponseRequest
from fastmode.server.responses.prepare import prepare_turn
from fastmode.server.responses.turn import ResponseRun
from fastmode.server.state import get_state, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        "not_found",
        f"Response with id '{clip(response_id)}' not found.",
        param="response_id",
        code="response_not_found",
    )


@router.post("/v1/responses")
async def create_response(body: ResponseRequest, request: Request):
    state = get_state(request)
    p = await prepare_turn(state, body, state.responses.get)

    def keep(turn: Turn) -> None:
        if body.store is not False:
            state.responses.put(turn)

    run = ResponseRun(p, keep)
    headers = response_headers(p.job.admission, p.response_id)
    if body.stream:
        return SSEResponse(_sse(run), on_close=p.job.close, headers=headers)
    if not await _run_unless_gone(request, run):
        return client_gone()
    if run.error is not None:
        raise run.error
    return JSONResponse(run.final, headers=headers)


async def _sse(run: ResponseRun) -> AsyncIterator[str]:
    async with aclosing(run.events()) as events:
        async for event in events:
            yield sse_event(event, event["type"])


async def _run_unless_gone(request: Request, run: ResponseRun) -> bool:
    """Run the turn to its end; False if the client left first (the request is aborted, its KV freed)."""

    async def consume() -> None:
        async with aclosing(run.events()) as events:
            async for _ in events:
                pass

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(consume()), asyncio.ensure_future(watch())
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, gone):
            t.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)
        run.p.job.close()
    if work.done() and not work.cancelled():
        work.result()  # an unexpected error surfaces as such
        return True
    return False


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> JSONResponse:
    turn = get_state(request).responses.get(response_id)
    if turn is None or turn.response is None:
        raise _not_found(response_id)
    return JSONResponse(turn.response, headers={"x-request-id": response_id})


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    if get_state(request).responses.pop(response_id) is None:
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
