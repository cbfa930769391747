"""What pool replicas and the ingress send each other (pickled by Ray).

A replica describes its engine once (`EngineCard`), then streams each request's
outputs as `Chunk`s; the last chunk of a request also carries the replica's
engine stats after that step, which is how the ingress learns each replica's
load and KV use for its metrics without polling every replica.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fastmode.engine.async_engine import EngineStats
from fastmode.engine.llm_engine import LLMEngine, RequestOutput
from fastmode.engine.scheduler import SchedulerConfig
from fastmode.loader.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineCard:
    """One replica's engine, described for the ingress (sent once, pickled by Ray)."""

    model_name: str
    tokenizer: Tokenizer
    vocab_size: int
    scheduler_config: SchedulerConfig
    has_drafter: bool
    pool: str
    replica: str  # Ray Serve's replica id
    pid: int  # the replica's process

    @classmethod
    def of(cls, engine: LLMEngine, pool: str, replica: str) -> EngineCard:
        return cls(
            engine.model_name,
            engine.tokenizer,
            engine.loaded.config.vocab_size,
            engine.scheduler_config,
            engine.drafter is not None,
            pool,
            replica,
            os.getpid(),
        )


@dataclass(frozen=True)
class Chunk:
    """One engine output of a request, as the replica that runs it sends it."""

    output: RequestOutput
    replica: str
    stats: EngineStats | None = None  # on a request's last chunk: the replica's engine after that step
