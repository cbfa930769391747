"""WebSocket mode of the Responses API: GET /v1/responses upgraded to a WebSocket.

The client sends `{"type": "response.create", ...}`; the server streams
response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta*,
response.output_text.done, response.content_part.done,
response.output_item.done and response.completed (response.incomplete when
max_output_tokens cut it; response.failed if the engine failed). Refusals
before a response starts are `{"type": "error", ...}` events; the connection
stays open. One response at a time per connection. `previous_response_id`
continues a stored conversation with its token prefix intact, so the prefix
cache serves it (see conversation.py). Closing the socket aborts the
response in flight and frees its KV.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from fastmode.server.conversation import Turn, build_prompt
from fastmode.server.errors import OPENAI, ApiError, validation_message
from fastmode.server.generation import Job, make_params, resolve_max_tokens, stop_details
from fastmode.server.openai_api import tier_choice, tier_fields
from fastmode.server.responses_models import ResponseCreate
from fastmode.server.state import ServerState, get_state

router = APIRouter()


@dataclass
class _Prepared:
    job: Job
    body: ResponseCreate
    response_id: str
    history: list[dict[str, str]]


def _usage(o) -> dict:
    m = o.metrics
    prompt, out = len(o.prompt_token_ids), len(o.token_ids)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": m.cached_tokens if m else 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + out,
        "cost_usd": m.cost_usd if m else 0.0,
        "machine_seconds": m.machine_s if m else 0.0,
        "time_to_first_token_seconds": m.ttft_s if m else None,
    }


class _Connection:
    def __init__(self, ws: WebSocket, state: ServerState):
        self.ws, self.state = ws, state
        self._seq = 0
        self._send_lock = asyncio.Lock()  # the reader and the responder both send

    async def send(self, event: dict) -> None:
        async with self._send_lock:
            event = {**event, "sequence_number": self._seq}
            self._seq += 1
            await self.ws.send_text(json.dumps(event, ensure_ascii=False))

    async def send_error(self, e: ApiError) -> None:
        err = e.body(OPENAI)["error"]
        event = {"type": "error", "status": e.status(OPENAI), "code": err["code"], "message": err["message"],
                 "param": err["param"], "error": err}
        if e.retry_after_s is not None:
            event["retry_after_seconds"] = e.retry_after_s
        await self.send(event)

    async def run(self) -> None:
        task: asyncio.Task | None = None
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                try:
                    event = json.loads(msg.get("text") or msg.get("bytes") or b"")
                    if not isinstance(event, dict) or event.get("type") != "response.create":
                        kind = event.get("type") if isinstance(event, dict) else None
                        raise ApiError("invalid_request", f"unknown event type {kind!r}; send response.create",
                                       param="type", code="unknown_event")
                    if task is not None and not task.done():
                        raise ApiError("invalid_request", "a response is already in progress on this connection; "
                                       "wait for it to finish or open another connection", code="response_in_progress")
                    prepared = self._prepare(event)
                except json.JSONDecodeError as e:
                    await self.send_error(ApiError("invalid_request", f"the message is not valid JSON: {e}", code="invalid_json"))
                    continue
                except ApiError as e:
                    await self.send_error(e)
                    continue
                task = asyncio.create_task(self._respond(prepared))
                # A send that fails because the client left ends the task; the reader sees the close.
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
        finally:  # the client left (or the server is stopping): abort what is in flight
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _prepare(self, event: dict) -> _Prepared:
        try:
            body = ResponseCreate.model_validate(event)
        except ValidationError as e:
            message, param = validation_message(list(e.errors()))
            raise ApiError("invalid_request", message, param=param) from None
        state = self.state
        model = state.select(body.model)
        body.unsupported()
        prev = None
        if body.previous_response_id is not None:
            prev = state.responses.get(body.previous_response_id)
            if prev is None:
                raise ApiError(
                    "invalid_request", f"Previous response with id '{body.previous_response_id}' not found.",
                    param="previous_response_id", code="previous_response_not_found",
                )
        try:
            ids, history, _ = build_prompt(model.tokenizer, prev, body.instructions, body.new_messages(), model.name)
        except ValueError as e:
            raise ApiError("invalid_request", str(e), param="input") from e
        max_tokens = resolve_max_tokens(model.engine, len(ids), body.max_output_tokens, "max_output_tokens")
        params = make_params(model, temperature=body.temperature, top_p=body.top_p, max_tokens=max_tokens,
                             speculative=body.speculative)
        admission = model.admission.admit(tier_choice(body.service_tier), len(ids), max_tokens)
        return _Prepared(Job(state, model, ids, params, admission), body, f"resp_{uuid.uuid4().hex}", history)

    async def _respond(self, p: _Prepared) -> None:
        job, body = p.job, p.body
        item_id = f"msg_{uuid.uuid4().hex}"
        response = {
            "id": p.response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": job.model.name, "output": [], "usage": None, "error": None, "incomplete_details": None,
            "instructions": body.instructions, "previous_response_id": body.previous_response_id,
            "max_output_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
            "metadata": body.metadata or {}, "tools": [], "tool_choice": "none", "parallel_tool_calls": False,
            "text": {"format": {"type": "text"}}, "truncation": "disabled", **tier_fields(job.admission),
        }
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        try:
            await self.send({"type": "response.created", "response": response})
            await self.send({"type": "response.in_progress", "response": response})
            await self.send({"type": "response.output_item.added", "output_index": 0, "item": item})
            await self.send({"type": "response.content_part.added", **where,
                             "part": {"type": "output_text", "text": "", "annotations": []}})
            try:
                async with aclosing(job.outputs()) as outs:
                    async for o in outs:
                        if o.delta_text:
                            await self.send({"type": "response.output_text.delta", **where, "delta": o.delta_text, "logprobs": []})
            except ApiError as e:
                err = e.body(OPENAI)["error"]
                failed = {**response, "status": "failed", "error": {"code": err["code"] or err["type"], "message": err["message"]}}
                await self.send({"type": "response.failed", "response": failed})
                return
            o = job.last
            part = {"type": "output_text", "text": o.text, "annotations": [], "logprobs": []}
            await self.send({"type": "response.output_text.done", **where, "text": o.text, "logprobs": []})
            await self.send({"type": "response.content_part.done", **where, "part": part})
            done_item = {**item, "status": "completed", "content": [part]}
            await self.send({"type": "response.output_item.done", "output_index": 0, "item": done_item})
            kind, _ = stop_details(o, job.params, job.model.tokenizer)
            self.state.responses.put(Turn(
                p.response_id, body.instructions, p.history + [{"role": "assistant", "content": o.text}],
                list(o.prompt_token_ids), list(o.token_ids), reusable=kind != "stop_string", model=job.model.name,
            ))
            final = {**response, "output": [done_item], "usage": _usage(o)}
            if kind == "length":
                final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
                await self.send({"type": "response.incomplete", "response": final})
            else:
                await self.send({"type": "response.completed", "response": {**final, "status": "completed"}})
        finally:
            job.close()


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
    try:
        await conn.run()
    except WebSocketDisconnect:  # an error event could not be sent: the client is gone
        pass
