"""vLLM's waiting queue, ordered by tier: fast requests are admitted first.

A `RequestQueue` (vLLM's own ABC) kept sorted by `importance_key`: tier, then priority when the
operator chose vLLM's priority policy, then arrival. A preempted request goes back at its
original arrival time, so it keeps its place in line (vLLM's FCFS queue puts it at the front of
every tier; its priority queue keeps the place too, but knows no tiers).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request

from fastmode.engine.tiers import Tier
from fastmode.vllm.lane import importance_key


class TierRequestQueue(RequestQueue):
    """Waiting requests in admission order. `tier_of` gives a queued request's tier; it must not
    change while the request is queued."""

    def __init__(self, tier_of: Callable[[Request], Tier], by_priority: bool) -> None:
        self._tier_of = tier_of
        self._by_priority = by_priority
        self._entries: list[tuple[tuple, Request]] = []  # sorted by key
        self._count = itertools.count()  # tie-break: equal keys keep insertion order
        self._num_fast = 0  # asked every step

    def _key(self, request: Request) -> tuple:
        key = importance_key(self._tier_of(request), request.priority, request.arrival_time, self._by_priority)
        return (*key, next(self._count))

    def num_fast(self) -> int:
        return self._num_fast

    def iter_fast(self) -> Iterator[Request]:
        """The fast requests, in admission order (they come first)."""
        for _, request in itertools.islice(self._entries, self._num_fast):
            yield request

    def add_request(self, request: Request) -> None:
        key = self._key(request)
        bisect.insort(self._entries, (key, request), key=lambda e: e[0])
        self._num_fast += key[0] == Tier.FAST.rank

    def pop_request(self) -> Request:
        if not self._entries:
            raise IndexError("pop from an empty queue")
        key, request = self._entries.pop(0)
        self._num_fast -= key[0] == Tier.FAST.rank
        return request

    def peek_request(self) -> Request:
        if not self._entries:
            raise IndexError("peek from an empty queue")
        return self._entries[0][1]

    # vLLM prepends requests it took out and puts back (a preempted one, or those an admission pass
    # skipped); by key they return to their own place, which for them is the front of their tier.
    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        kept = [e for e in self._entries if id(e[1]) not in drop]
        self._num_fast -= sum(e[0][0] == Tier.FAST.rank for e in self._entries if id(e[1]) in drop)
        self._entries = kept

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        return (request for _, request in list(self._entries))
