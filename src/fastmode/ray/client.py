"""The ingress's stand-in for an engine thread: requests go to a pool's replicas over Ray.

`PoolClient` offers what the server's `Job` uses of `AsyncEngine`
(`add_request`, `stream`, `abort`, `stats`, `is_alive`, `shutdown`), so the
routes, both dialects, SSE and the Responses WebSocket run unchanged in the
ingress. `add_request` picks the pool by the admitted tier; `stream` calls the
pool's deployment handle with streaming on, and Ray Serve's request router
picks the replica (the prefix-affinity router, router.py, where Ray has the
request-router API).

Faults: a replica that dies or becomes unreachable ends only the requests it
was running. A request that had produced nothing yet is sent again, to the
pool's other replicas as Ray's router sees the dead one gone (the client saw
nothing, so this is invisible to it); one that had streamed output ends with
a server error in the dialect's shape (an error event mid-stream, else a 500).
Ray Serve's controller restarts the dead replica meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.serve.handle import DeploymentHandle

from fastmode.engine.async_engine import EngineClosedError, EngineStats
from fastmode.engine.errors import RequestError
from fastmode.engine.llm_engine import RequestOutput
from fastmode.engine.tiers import Tier
from fastmode.ray.metrics import PoolMetrics
from fastmode.ray.wire import Chunk
from fastmode.sampling_params import SamplingParams
from fastmode.server.edge.errors import ApiError
from fastmode.speculative.policy import SpecStats

log = logging.getLogger(__name__)

# Tries on another replica for a request whose replica failed before it produced anything.
MAX_RESENDS = 2


def _serve_errors(*names: str) -> tuple[type[BaseException], ...]:
    """Ray Serve exception classes by name, those this Ray version has."""
    import ray.serve.exceptions as ex

    return tuple(getattr(ex, n) for n in names if hasattr(ex, n))


# Ray Serve's own refusals: a handle's queue is full, or no replica is up.
_REFUSALS = _serve_errors("BackPressureError", "DeploymentUnavailableError")
# A call cancelled from this side (PoolClient.shutdown or abort).
_CANCELLED = _serve_errors("RequestCancelledError")


@dataclass
class _Call:
    pool: str
    prompt_ids: list[int]
    params: SamplingParams
    tier: Tier
    response: object | None = None  # the DeploymentResponseGenerator while a replica runs it
    aborted: bool = field(default=False)


class PoolClient:
    def __init__(
        self,
        name: str,
        handles: Mapping[str, DeploymentHandle],
        tier_pools: Mapping[Tier, str],
        metrics: PoolMetrics,
    ):
        self.name = name
        self.handles = {p: h.options(stream=True) for p, h in handles.items()}
        self.tier_pools = dict(tier_pools)
        self.metrics = metrics
        self._calls: dict[str, _Call] = {}
        self._ids = itertools.count()
        self._closed = False

    # -- what Job uses of AsyncEngine ----------------------------------------
    @property
    def is_alive(self) -> bool:
        return not self._closed

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        tier: Tier | str = Tier.STANDARD,
        request_id: str | None = None,
    ) -> str:
        """Record a request for its pool; nothing is sent until `stream` (a response that never starts costs nothing)."""
        if self._closed:
            raise EngineClosedError("the ingress is shutting down")
        if isinstance(prompt, str):
            raise ValueError("the ingress sends token ids to the pools; tokenize first")
        tier = Tier.parse(tier)
        rid = request_id or f"{self.name}-{next(self._ids)}"
        if rid in self._calls:
            raise ValueError(f"duplicate request id {rid!r}")
        self._calls[rid] = _Call(self.tier_pools[tier], list(prompt), params, tier)
        return rid

    async def stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """The request's outputs from the replica that runs it. Leaving early cancels it there,
        which aborts it in that replica's engine and frees its KV blocks."""
        call = self._calls[request_id]
        pool, sent, resends, finished = call.pool, False, 0, False
        try:
            while True:
                call.response = self.handles[pool].generate.remote(call.prompt_ids, call.params, call.tier.value)
                try:
                    async for chunk in call.response:
                        sent = True
                        self._observe(pool, chunk)
                        finished = chunk.output.finished
                        yield chunk.output
                        if finished:
                            return
                    raise ApiError("overloaded", f"a {pool} replica stopped before this request finished; retry it")
                except _CANCELLED:
                    raise EngineClosedError("the ingress shut down before this request finished") from None
                except RayTaskError as e:
                    raise self._task_error(e, pool) from None
                except RayActorError as e:  # the replica died or cannot be reached
                    self.metrics.failed.labels(pool, call.tier.value).inc()
                    if sent or resends >= MAX_RESENDS or self._closed or call.aborted:
                        log.warning("a %s replica failed while running %s: %s", pool, request_id, e)
                        raise ApiError(
                            "server_error",
                            f"the {pool} replica running this request failed; the request did not complete "
                            "(the pool's other replicas serve a retry)",
                            code="replica_failed",
                        ) from None
                    resends += 1
                    self.metrics.retried.labels(pool, call.tier.value).inc()
                except _REFUSALS as e:
                    raise ApiError(
                        "overloaded", f"the {pool} pool cannot take this request now: {e}; retry later", retry_after_s=1
                    ) from None
                except RayError as e:
                    raise ApiError("server_error", f"the {pool} pool failed this request: {e}") from None
        finally:
            done = self._calls.pop(request_id, None)
            if not finished and done is not None and done.response is not None and not done.aborted:
                done.response.cancel()  # the client left: abort the request in its replica

    def abort(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is not None and call.response is not None:
            call.aborted = True
            call.response.cancel()

    def stats(self) -> EngineStats:
        """The pools' replicas added up, each as its latest finished request reported it."""
        mine = set(self.tier_pools.values())
        latest = [s for (pool, _), s in self.metrics.latest.items() if pool in mine]
        return sum_stats(latest)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Take no new requests and cancel those in flight (each ends with an error)."""
        self._closed = True
        for call in list(self._calls.values()):
            if call.response is not None:
                call.aborted = True
                call.response.cancel()

    # -- helpers ---------------------------------------------------------------
    def _observe(self, pool: str, chunk: Chunk) -> None:
        o = chunk.output
        if chunk.stats is not None:
            self.metrics.latest[(pool, chunk.replica)] = chunk.stats
        if o.finished and o.metrics is not None:
            self.metrics.observe_finished(pool, o.metrics)

    def _task_error(self, e: RayTaskError, pool: str) -> ApiError:
        """An exception the replica's code raised, as the single-machine server would answer it."""
        cause = getattr(e, "cause", None)
        if isinstance(cause, RequestError):
            return ApiError("invalid_request", str(cause), param=cause.param, code=cause.code)
        if isinstance(cause, EngineClosedError):
            return ApiError("overloaded", f"a {pool} replica is shutting down; retry the request", retry_after_s=1)
        if isinstance(cause, ValueError):
            return ApiError("invalid_request", str(cause))
        return ApiError("server_error", f"the {pool} replica failed this request: {cause or e}")


def sum_stats(stats: list[EngineStats]) -> EngineStats:
    """Several engines' stats as one: counts add up, KV usage is the mean."""
    running: dict[str, int] = {}
    waiting: dict[str, int] = {}
    spec = SpecStats({}, {}, {})
    for s in stats:
        for t, n in s.running.items():
            running[t] = running.get(t, 0) + n
        for t, n in s.waiting.items():
            waiting[t] = waiting.get(t, 0) + n
        for mine, theirs in (
            (spec.drafts, s.spec.drafts),
            (spec.draft_tokens, s.spec.draft_tokens),
            (spec.accepted_tokens, s.spec.accepted_tokens),
        ):
            for t, n in theirs.items():
                mine[t] = mine.get(t, 0) + n
    return EngineStats(
        running=running,
        waiting=waiting,
        kv_usage=sum(s.kv_usage for s in stats) / len(stats) if stats else 0.0,
        num_preemptions=sum(s.num_preemptions for s in stats),
        prefix_queries=sum(s.prefix_queries for s in stats),
        prefix_hits=sum(s.prefix_hits for s in stats),
        lane_active=any(s.lane_active for s in stats),
        spec=spec,
    )


async def describe(handle: DeploymentHandle, timeout_s: float = 600.0):
    """A pool's `EngineCard`, from whichever replica answers first (they are identical)."""
    return await asyncio.wait_for(handle.describe.remote(), timeout_s)
