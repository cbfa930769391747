"""Running one request for any dialect: length checks, the engine stream,
metrics, and cleanup when the client goes away.

A `Job` adds its request to the engine on first iteration, not before, so a
response that never starts (the client left first) leaves nothing in the
engine; `Job.close()` settles its admission whatever happened. Streaming
responses close their generator when the connection ends (`SSEResponse`),
non-streaming ones race the work against the client's disconnect (`collect`),
and in both cases closing the generator aborts the engine request and frees
its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from fastmode.engine.async_engine import EngineClosedError
from fastmode.engine.errors import RequestError
from fastmode.engine.llm_engine import LLMEngine, RequestOutput
from fastmode.sampling_params import SamplingParams, StructuredOutput
from fastmode.server.edge.admission import Admission
from fastmode.server.edge.errors import ApiError
from fastmode.server.served_model import ServedModel, api_error
from fastmode.server.state import ServerState


def resolve_max_tokens(engine: LLMEngine, prompt_len: int, max_tokens: int | None, param: str = "max_tokens") -> int:
    """The output budget: `max_tokens`, or None, cut to what is left of the context. A budget
    past the context is accepted (clients send their own defaults, often larger than the
    model's context): generation then ends at the context limit, and the final output says
    so (`length_limit == "context"`). 400 when the prompt alone leaves no room, or can never
    fit in the KV cache (the engine's own rule)."""
    try:
        engine.scheduler.check_prompt_len(prompt_len)
    except RequestError as e:
        raise api_error(e, "messages") from None
    room = engine.max_model_len - prompt_len
    return room if max_tokens is None else min(max_tokens, room)


async def check_structured(model: ServedModel, structured: StructuredOutput | None, param: str) -> None:
    """Compile a request's grammar now, on a worker thread, so a bad schema is a 400 naming
    `param` before any stream starts (the engine reuses the cached result when the request is added)."""
    if structured is None:
        return
    from fastmode.engine.structured import StructuredOutputError, compile_structured

    try:
        await anyio.to_thread.run_sync(compile_structured, structured, model.tokenizer)
    except StructuredOutputError as e:
        raise ApiError("invalid_request", f"{param}: {e}", param=param, code="invalid_schema") from None


def stop_details(o: RequestOutput, params: SamplingParams, tokenizer) -> tuple[str, str | None]:
    """Why a finished request stopped: ("eos" | "stop_string" | "length", the stop string matched).

    Read from what the engine recorded when it stopped (`o.stop_reason`, a token id or the stop
    string); `params` and `tokenizer` are not needed for that."""
    if o.finish_reason == "length":
        return "length", None
    if isinstance(o.stop_reason, str):
        return "stop_string", o.stop_reason
    return "eos", None


class Job:
    """One engine request as the server runs it, on the served model the client named."""

    def __init__(
        self,
        state: ServerState,
        model: ServedModel,
        prompt_ids: list[int],
        params: SamplingParams,
        admission: Admission,
    ):
        self.state = state
        self.model = model
        self.prompt_ids = prompt_ids
        self.params = params
        self.admission = admission
        self.last: RequestOutput | None = None
        self.logprobs: list = []  # every output token's TokenLogprob so far, when params.logprobs is set
        self.finished = False

    @property
    def tier(self) -> str:
        return self.admission.tier.value

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        metrics, name, num_out = self.state.metrics, self.model.name, 0
        try:
            engine = self.model.live_engine()
            try:
                rid = engine.add_request(self.prompt_ids, self.params, self.admission.tier)
            except EngineClosedError as e:
                raise ApiError("overloaded", "the server is shutting down and takes no new requests") from e
            except RequestError as e:
                raise api_error(e) from e
            except ValueError as e:
                raise ApiError("invalid_request", str(e)) from e
            prev_s = None
            async with aclosing(engine.stream(rid)) as stream:
                async for o in stream:
                    now = time.perf_counter()
                    n = len(o.delta_token_ids)
                    metrics.observe_tokens(name, self.tier, n, None if prev_s is None else now - prev_s)
                    prev_s = now if n else prev_s
                    num_out, self.last = len(o.token_ids), o
                    self.logprobs += getattr(o, "delta_logprobs", None) or []
                    if o.finished:
                        self.finished = True
                        if o.metrics is not None:
                            metrics.observe_finished(name, o.metrics, o.finish_reason or "unknown")
                        if o.finish_reason == "error":
                            raise ApiError(
                                "server_error", "the engine failed while running this request; it did not complete"
                            )
                    yield o
        except EngineClosedError as e:
            raise ApiError("overloaded", "the server shut down before this request finished") from e
        finally:
            if not self.finished:
                metrics.aborted.labels(name, self.tier).inc()
            self.admission.settle(num_out)

    def close(self) -> None:
        self.admission.settle(self.last and len(self.last.token_ids) or 0)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(request: Request, job: Job) -> RequestOutput | None:
    """Run a non-streaming request to its end; None if the client left (the request is aborted)."""

    async def consume() -> RequestOutput | None:
        async with aclosing(job.outputs()) as outs:
            async for _ in outs:
                pass
        return job.last

    work = asyncio.ensure_future(consume())
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, watch):
            t.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
        job.close()
    if work.done() and not work.cancelled():
        return work.result()  # raises the job's ApiError, if any
    return None


async def collect_all(request: Request, jobs: list[Job]) -> list[RequestOutput] | None:
    """`collect` for several jobs at once (the choices of one request); None if the client left."""
    if len(jobs) == 1:
        o = await collect(request, jobs[0])
        return None if o is None else [o]

    async def consume(job: Job) -> RequestOutput | None:
        async with aclosing(job.outputs()) as outs:
            async for _ in outs:
                pass
        return job.last

    work = asyncio.ensure_future(asyncio.gather(*(consume(j) for j in jobs)))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, watch):
            t.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
        for j in jobs:
            j.close()
    if work.done() and not work.cancelled():
        return work.result()  # raises the first job's ApiError, if any
    return None


async def interleave(jobs: list[Job]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The outputs of several jobs as they come, tagged with the job's index. Closing this
    generator closes every job's stream (aborting what is still running); a job's error is
    raised here once the outputs before it are out."""
    if len(jobs) == 1:
        async with aclosing(jobs[0].outputs()) as outs:
            async for o in outs:
                yield 0, o
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, job: Job) -> None:
        try:
            async with aclosing(job.outputs()) as outs:
                async for o in outs:
                    await queue.put((i, o))
        except ApiError as e:
            await queue.put((i, e))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, j)) for i, j in enumerate(jobs)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, ApiError):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def client_gone() -> Response:
    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


def sse_event(data: dict | str, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


class SSEResponse(StreamingResponse):
    """Server-sent events whose generator is always closed when the connection ends.

    Starlette cancels the sending task on disconnect; if that happens while the
    generator is suspended at a `yield`, nothing would close it and the engine
    request would run on. Closing it here aborts the request at once.
    """

    def __init__(
        self, content: AsyncIterator[str], on_close: Callable[[], None], headers: dict[str, str] | None = None
    ):
        h = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}
        super().__init__(content, media_type="text/event-stream", headers=h)
        self._on_close = on_close

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self._on_close()
