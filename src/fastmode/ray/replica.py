"""One replica of a pool: a fastmode engine on its own thread, inside a Ray Serve replica.

The replica runs the same `AsyncEngine` as `fastmode serve`: requests join the
running batch at the next step, and a request whose caller goes away (the
ingress cancels it: the client left, or the request ended there) is aborted
and its KV blocks freed. It takes token ids, already checked and admitted by
the ingress, and streams `Chunk`s back.

Ray Serve calls `check_health` periodically: an engine thread that died (a
bug, never a bad request) makes the replica unhealthy, and Ray replaces it.
`record_routing_stats` gives the request router each replica's engine load.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

from fastmode.ray.wire import Chunk, EngineCard

log = logging.getLogger(__name__)


def build_engine(pool: str, engine_kwargs: Mapping[str, Any]):
    """The pool's engine. The spark pool serves the default model's Spark student: the
    teacher is loaded for the embeddings and head Spark shares, and no KV cache is made for it."""
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine

    config = EngineConfig(**engine_kwargs)
    if pool != "spark":
        return LLMEngine(config)
    from fastmode.distill.spark import find_spark, spark_as_loaded
    from fastmode.loader import load_model
    from fastmode.loader.default_model import DEFAULT_MODEL_NAME

    teacher = load_model(config.load.model, config.load.dtype, weights=config.load.weights)
    if teacher.name != DEFAULT_MODEL_NAME:
        raise ValueError(
            f"the spark pool serves {DEFAULT_MODEL_NAME}'s Spark; this deployment's model is {teacher.name}"
        )
    path = find_spark(DEFAULT_MODEL_NAME)
    if path is None:
        raise ValueError("the spark pool needs Spark's weights (fastmode distill); none are installed")
    config = dataclasses.replace(config, model=str(path), speculative_method="off", draft_model=None)
    return LLMEngine(config, loaded=spark_as_loaded(path, teacher))


class PoolReplica:
    """The class Ray Serve runs as each replica of a `fastmode-<pool>` deployment."""

    def __init__(self, pool: str, engine_kwargs: Mapping[str, Any]):
        from ray import serve

        from fastmode.engine.async_engine import AsyncEngine

        self.pool = pool
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id if hasattr(context, "replica_id") else context.replica_tag
        self.engine = build_engine(pool, engine_kwargs)
        self.async_engine = AsyncEngine(self.engine, f"{pool}:{self.replica}")
        log.info("%s replica %s serving %s", pool, self.replica, self.engine.model_name)

    def describe(self) -> EngineCard:
        return EngineCard.of(self.engine, self.pool, self.replica)

    async def generate(self, prompt_ids: list[int], params, tier: str) -> AsyncIterator[Chunk]:
        """Run one request; its outputs as they come, the last one with this engine's stats."""
        rid = self.async_engine.add_request(prompt_ids, params, tier)
        async with aclosing(self.async_engine.stream(rid)) as outputs:
            async for o in outputs:
                yield Chunk(o, self.replica, self.async_engine.stats() if o.finished else None)

    def check_health(self) -> None:
        if not self.async_engine.is_alive:
            raise RuntimeError(f"the {self.pool} engine thread of replica {self.replica} stopped")

    def record_routing_stats(self) -> dict[str, float]:
        """What the request router weighs besides queue length (router.py)."""
        s = self.async_engine.stats()
        return {
            "kv_usage": s.kv_usage,
            "num_running": float(sum(s.running.values())),
            "num_waiting": float(sum(s.waiting.values())),
        }

    def __del__(self) -> None:
        engine = getattr(self, "async_engine", None)
        if engine is not None:
            engine.shutdown(timeout_s=1.0)
