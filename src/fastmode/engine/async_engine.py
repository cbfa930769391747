"""The engine on a background thread, for asyncio servers.

One thread owns the engine and runs `step()` whenever there is work. Request
coroutines never wait for it: `add_request` checks the request on the caller's
thread (bad input raises there, before anything is queued) and appends it to
an inbox; aborts go to the same inbox. The engine thread drains the inbox
before every step, so a request joins the batch at the next step boundary, and
an abort frees its KV blocks there. Outputs come back through per-request
asyncio queues; `stats()` returns a snapshot the engine thread publishes after
every step. (Taking a lock that the engine thread holds for whole steps would
stall the event loop for up to a step at every arrival, and under many
streaming clients the event loop would spend much of its time waiting so.)

A client that stops iterating (disconnect) aborts its request. Starting an
AsyncEngine frees the starting thread's OpenMP workers (engine/openmp.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastmode.engine.llm_engine import LLMEngine, RequestOutput
from fastmode.engine.openmp import release_thread_pool
from fastmode.engine.sequence import Sequence
from fastmode.engine.tiers import Tier
from fastmode.sampling_params import SamplingParams
from fastmode.speculative.policy import SpecStats

log = logging.getLogger(__name__)


class EngineClosedError(RuntimeError):
    """The engine is shutting down and takes no new requests."""


@dataclass(frozen=True)
class EngineStats:
    running: dict[str, int]
    waiting: dict[str, int]
    kv_usage: float
    num_preemptions: int
    prefix_queries: int
    prefix_hits: int
    lane_active: bool
    spec: SpecStats = field(default_factory=SpecStats)  # a copy of the engine's speculation counters, per tier


class AsyncEngine:
    def __init__(self, engine: LLMEngine, name: str | None = None):
        self.engine = engine
        self._inbox: deque[Sequence | str] = deque()  # a Sequence to add, or the id of a request to abort
        self._wake = threading.Event()
        self._step_lock = threading.Lock()  # held by the engine thread while it uses the engine; shutdown takes it
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._closed = False
        self._ids = itertools.count()
        self._stats = self._snapshot()
        # The model was loaded (and warmed up) on this thread; from now on the engine thread
        # computes. Free this thread's OpenMP workers so the engine thread's pool is the only one
        # and its workers keep spinning between parallel regions (see engine/openmp.py).
        release_thread_pool()
        self._thread = threading.Thread(
            target=self._loop, name=f"fastmode-engine:{name or engine.model_name}", daemon=True
        )
        self._thread.start()

    # -- engine thread -----------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            try:
                with self._step_lock:
                    self._drain()
                    busy = self.engine.has_unfinished()
                    outputs = self.engine.step() if busy else []
                    self._stats = self._snapshot()
            except Exception as e:  # a bug outside the model step: fail what is in flight, keep serving
                log.exception("engine step failed; aborting in-flight requests")
                with self._step_lock:
                    rids = list(self._queues)
                    for rid in rids:
                        self.engine.abort(rid)
                for rid in rids:
                    self._deliver(e, rid)
                continue
            for o in outputs:
                self._deliver(o)
            if not busy and not self._inbox:
                self._wake.wait(0.05)
                self._wake.clear()

    def _drain(self) -> None:
        """Apply the adds and aborts that arrived since the last step, in their order."""
        while self._inbox:
            item = self._inbox.popleft()
            if isinstance(item, str):
                self.engine.abort(item)
                continue
            try:
                self.engine.add_sequence(item)
            except ValueError as e:  # checked on arrival; only a duplicate id can fail here
                self._deliver(e, item.request_id)

    def _snapshot(self) -> EngineStats:
        s = self.engine.scheduler
        bm = s.block_manager
        spec = self.engine.spec.stats
        return EngineStats(
            running={t.value: s.num_running(t) for t in Tier},
            waiting={t.value: s.waiting.num_waiting(t) for t in Tier},
            kv_usage=bm.usage,
            num_preemptions=s.num_preemptions,
            prefix_queries=bm.num_prefix_queries,
            prefix_hits=bm.num_prefix_hits,
            lane_active=s.lane_active(),
            spec=SpecStats(dict(spec.drafts), dict(spec.draft_tokens), dict(spec.accepted_tokens)),
        )

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _deliver(self, o: RequestOutput | BaseException, request_id: str | None = None) -> None:
        rid = request_id or o.request_id  # type: ignore[union-attr]
        entry = self._queues.get(rid)
        if entry is None:
            return
        loop, q = entry
        try:
            loop.call_soon_threadsafe(q.put_nowait, o)
        except RuntimeError:  # the caller's loop is gone: nobody is listening
            self.abort(rid)

    # -- request API -------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        tier: Tier | str = Tier.STANDARD,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; raises ValueError for bad input (nothing is left behind). Never waits for a step."""
        if self._closed:
            raise EngineClosedError("the engine is shutting down")
        loop = asyncio.get_running_loop()
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._queues:
            raise ValueError(f"duplicate request id {rid!r}")
        seq = self.engine.make_sequence(prompt, params, tier, rid)  # raises ValueError
        self._queues[rid] = (loop, asyncio.Queue())
        self._inbox.append(seq)
        if self._closed:  # shutdown began since the check above and may have cleared the inbox already
            self._queues.pop(rid, None)
            raise EngineClosedError("the engine is shutting down")
        self._wake.set()
        return rid

    async def stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Outputs of an added request until it finishes. Leaving early aborts it."""
        _, q = self._queues[request_id]
        finished = False
        try:
            while True:
                o = await q.get()
                if isinstance(o, BaseException):
                    raise o
                finished = o.finished
                yield o
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        tier: Tier | str = Tier.STANDARD,
        request_id: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        rid = self.add_request(prompt, params, tier, request_id)
        async for o in self.stream(rid):
            yield o

    def abort(self, request_id: str) -> None:
        """Abort a request; the engine thread frees its KV blocks before its next step."""
        self._inbox.append(request_id)
        self._wake.set()

    def stats(self) -> EngineStats:
        """The engine's state after its latest step (never waits for one)."""
        return self._stats

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop taking requests, abort what is in flight, stop the thread."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        with self._step_lock:
            self._inbox.clear()
            for rid in list(self._queues):
                self.engine.abort(rid)
                self._deliver(EngineClosedError("the engine shut down before this request finished"), rid)
