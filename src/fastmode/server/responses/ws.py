"""WebSocket mode of the Responses API: GET /v1/responses upgraded to a WebSocket.

The client sends `{"type": "response.create", ...}` (the Responses body
without `stream`); the server answers with the same events, in the same
order, as `POST /v1/responses` streams (turn.py runs both).
`generate: false` is a warm-up: the input is prefilled into the prefix cache,
nothing is generated, and the response's id can be chained from.
Refusals before a response starts are `{"type": "error", ...}` events; the
connection stays open. One response at a time per connection. The connection
keeps its latest response even with `store: false`, so the next turn can
chain from it with `previous_response_id`, as OpenAI's WebSocket mode does;
stored responses can be chained from any connection. Closing the socket
aborts the response in flight and frees its KV.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from fastmode.server.edge.errors import OPENAI, ApiError, clip, validation_message
from fastmode.server.responses.conversation import Turn
from fastmode.server.responses.models import ResponseCreateEvent
from fastmode.server.responses.prepare import prepare_turn
from fastmode.server.responses.turn import ResponseRun
from fastmode.server.state import ServerState, get_state

router = APIRouter()


class _Connection:
    def __init__(self, ws: WebSocket, state: ServerState):
        self.ws, self.state = ws, state
        self.latest: Turn | None = None  # the connection's latest response, stored or not
        self._send_lock = asyncio.Lock()  # the reader and the responder both send

    async def send(self, event: dict) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(event, ensure_ascii=False))

    async def send_error(self, e: ApiError) -> None:
        """An error outside any response: an event stream of its own, so its sequence_number is 0."""
        err = e.body(OPENAI)["error"]
        event = {
            "type": "error",
            "status": e.status(OPENAI),
            "code": err["code"],
            "message": err["message"],
            "param": err["param"],
            "error": err,
            "sequence_number": 0,
        }
        if e.retry_after_s is not None:
            event["retry_after_seconds"] = e.retry_after_s
        await self.send(event)

    def lookup(self, response_id: str) -> Turn | None:
        if self.latest is not None and self.latest.response_id == response_id:
            return self.latest
        return self.state.responses.get(response_id)

    def keep(self, store: bool):
        def keep(turn: Turn) -> None:
            self.latest = turn
            if store:
                self.state.responses.put(turn)

        return keep

    async def run(self) -> None:
        task: asyncio.Task | None = None
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(self.ws.receive(), self.state.config.ws_idle_timeout_s)
                except TimeoutError:
                    if task is not None and not task.done():
                        continue  # a response is running: the connection is not idle
                    await self.ws.close(
                        code=1000, reason=f"idle timeout: no message for {self.state.config.ws_idle_timeout_s:g} s"
                    )
                    return
                if msg["type"] == "websocket.disconnect":
                    return
                text = msg.get("text")
                if text is None:  # a binary frame: events are JSON text
                    await self.ws.close(
                        code=1003, reason="binary frames are not accepted; send each event as JSON in a text frame"
                    )
                    return
                if len(text) > self.state.config.max_body_bytes:
                    await self.ws.close(
                        code=1009, reason=f"message too big: the limit is {self.state.config.max_body_mib:g} MiB"
                    )
                    return
                try:
                    try:
                        event = json.loads(text)
                    except RecursionError:
                        raise ApiError("invalid_request", "the message nests too deeply", code="invalid_json") from None
                    if not isinstance(event, dict) or event.get("type") != "response.create":
                        kind = event.get("type") if isinstance(event, dict) else None
                        raise ApiError(
                            "invalid_request",
                            f"unknown event type {clip(repr(kind))}; send response.create",
                            param="type",
                            code="unknown_event",
                        )
                    if task is not None and not task.done():
                        raise ApiError(
                            "invalid_request",
                            "a response is already in progress on this connection; "
                            "wait for it to finish or open another connection",
                            code="response_already_in_flight",
                        )
                    run = await self._prepare(event)
                except json.JSONDecodeError as e:
                    await self.send_error(
                        ApiError("invalid_request", f"the message is not valid JSON: {e}", code="invalid_json")
                    )
                    continue
                except ApiError as e:
                    await self.send_error(e)
                    continue
                task = asyncio.create_task(self._respond(run))
                # A send that fails because the client left ends the task; the reader sees the close.
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
        finally:  # the client left (or the server is stopping): abort what is in flight
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _prepare(self, event: dict) -> ResponseRun:
        try:
            body = ResponseCreateEvent.model_validate(event)
        except ValidationError as e:
            message, param = validation_message(list(e.errors()))
            raise ApiError("invalid_request", message, param=param) from None
        p = await prepare_turn(self.state, body, self.lookup, generate=body.generate is not False)
        return ResponseRun(p, self.keep(body.store is not False))

    async def _respond(self, run: ResponseRun) -> None:
        try:
            async with aclosing(run.events()) as events:
                async for event in events:
                    await self.send(event)
        finally:  # settles the admission even if the task was cancelled before the run began
            run.p.job.close()


@router.websocket("/v1/responses")
async def responses_socket(ws: WebSocket) -> None:
    state = get_state(ws)
    await ws.accept()
    conn = _Connection(ws, state)
    try:
        state.check_api_key(ws.headers)
    except ApiError as e:
        await conn.send_error(e)
        await ws.close(code=1008)  # policy violation
        return
    state.websockets.add(ws)  # closed with 1001 if the server shuts down
    try:
        await conn.run()
    except WebSocketDisconnect:  # an error event could not be sent: the client is gone
        pass
    finally:
        state.websockets.discard(ws)
