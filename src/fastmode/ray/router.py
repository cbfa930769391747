"""Prefix affinity within a pool: a conversation's turns go to the replica that holds its KV.

Each replica's engine caches the KV of the prompts it ran (block by block,
engine/block_manager.py). The next turn of a conversation repeats the previous
turns as its prompt's prefix, so on the replica that ran them its prefill is
mostly cache hits; on another replica it starts from nothing. Ray Serve's
default router balances queue lengths and knows nothing of prefixes. This one
(Ray Serve's request-router API, `RequestRouter`) remembers, for chained hashes
of each prompt's leading blocks of token ids, the replica it sent them to, and
sends a request to the replica that ran its longest remembered prefix, unless
that replica is busier than the least busy candidate by more than
`max_imbalance` requests: then load wins, by Ray's power of two choices.

The router runs in the caller's process (the ingress), one per pool.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

try:
    from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

    HAVE_ROUTER_API = True
except ImportError:  # Ray Serve before its request-router API (2.46)
    HAVE_ROUTER_API = False
    RequestRouter = object  # type: ignore[assignment,misc]


def prefix_keys(token_ids: Sequence[int], block_tokens: int) -> list[int]:
    """One key per full block of `block_tokens` leading token ids; key i covers tokens [0, (i+1) * block_tokens)."""
    keys, h = [], 0
    for end in range(block_tokens, len(token_ids) + 1, block_tokens):
        h = hash((h, tuple(token_ids[end - block_tokens : end])))
        keys.append(h)
    return keys


class PrefixAffinityRouter(RequestRouter):  # type: ignore[misc,valid-type]
    def initialize_state(self, block_tokens: int = 32, max_keys: int = 100_000, max_imbalance: int = 4, **_: Any):
        self.block_tokens = block_tokens
        self.max_keys = max_keys  # remembered prefixes, least recently routed dropped first
        self.max_imbalance = max_imbalance
        self.owners: OrderedDict[int, ReplicaID] = OrderedDict()

    @staticmethod
    def _prompt(pending_request: PendingRequest | None) -> Sequence[int] | None:
        """The token ids of a `PoolReplica.generate(prompt_ids, params, tier)` call, else None."""
        if pending_request is None or not pending_request.args:
            return None
        ids = pending_request.args[0]
        return ids if isinstance(ids, list) else None

    def _load(self, replica: RunningReplica) -> float:
        """Requests on a replica: Ray's queue-length cache when it has an entry, else what the
        replica last reported (`PoolReplica.record_routing_stats`)."""
        cache = getattr(self, "replica_queue_len_cache", None)
        cached = cache.get(replica.replica_id) if cache is not None else None
        if cached is not None:
            return float(cached)
        stats = getattr(replica, "routing_stats", None) or {}
        return float(stats.get("num_running", 0.0) + stats.get("num_waiting", 0.0))

    def owner_of(self, token_ids: Sequence[int], candidates: dict) -> Any:
        """The candidate that ran this prompt's longest remembered prefix, or None."""
        for key in reversed(prefix_keys(token_ids, self.block_tokens)):
            owner = self.owners.get(key)
            if owner in candidates:
                return candidates[owner]
        return None

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        ids = self._prompt(pending_request)
        by_id = {r.replica_id: r for r in candidate_replicas}
        owner = self.owner_of(ids, by_id) if ids else None
        if owner is not None:
            least = min(self._load(r) for r in candidate_replicas)
            if self._load(owner) - least <= self.max_imbalance:
                return [[owner], [r for r in candidate_replicas if r is not owner]]
        # No remembered prefix, or its replica is too busy: two random candidates, and Ray
        # takes the one with the shorter queue.
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        ids = self._prompt(pending_request)
        if not ids:
            return
        for key in prefix_keys(ids, self.block_tokens):
            self.owners[key] = replica_id
            self.owners.move_to_end(key)
        while len(self.owners) > self.max_keys:
            self.owners.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for key in [k for k, r in self.owners.items() if r == replica_id]:
            del self.owners[key]


def router_config(block_tokens: int) -> dict[str, Any]:
    """Deployment options that install the prefix-affinity router, or none where Ray lacks the API."""
    if not HAVE_ROUTER_API:
        return {}
    from ray.serve.config import RequestRouterConfig

    # Affinity on blocks twice the engine's: a prefix shorter than that is not worth a detour.
    kwargs = {"block_tokens": 2 * block_tokens}
    return {
        "request_router_config": RequestRouterConfig(
            request_router_class=PrefixAffinityRouter, request_router_kwargs=kwargs
        )
    }
