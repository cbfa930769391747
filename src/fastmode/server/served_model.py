"""One model the server answers for: its name, its engine, its admission and its engine thread.

A server may serve several models side by side (the main one and, for the
default model, its Spark student). Each has its own engine, KV cache, queue
bound and fast lane, so each gets its own admission controller and engine
thread; clients pick one with the request's `model` field.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastmode.engine.async_engine import AsyncEngine, EngineStats
from fastmode.engine.errors import RequestError
from fastmode.engine.llm_engine import LLMEngine
from fastmode.sampling_params import SamplingParams
from fastmode.server.edge.admission import AdmissionController
from fastmode.server.edge.errors import ApiError


@dataclass
class ServedModel:
    name: str  # what clients send as `model`, and what responses say ran
    engine: LLMEngine
    admission: AdmissionController
    async_engine: AsyncEngine | None = None  # runs while the app's lifespan does

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def live_engine(self) -> AsyncEngine:
        """The engine thread serving requests; 503 while the server starts or stops."""
        if self.async_engine is None:
            raise ApiError("overloaded", "the engine is not running (server starting or shutting down)")
        return self.async_engine

    @property
    def is_alive(self) -> bool:
        return self.async_engine is not None and self.async_engine.is_alive

    def start(self) -> None:
        self.async_engine = AsyncEngine(self.engine, self.name)

    def stop(self) -> None:
        """Abort what is in flight (each request receives an error) and stop the thread."""
        running, self.async_engine = self.async_engine, None
        if running is not None:
            running.shutdown()

    def stats(self) -> EngineStats | None:
        a = self.async_engine
        return a.stats() if a is not None else None

    def check_request(self, prompt_ids: list[int], params: SamplingParams, prompt_param: str = "prompt") -> None:
        """The engine's validation of a request (`LLMEngine.check_request`), answered as a 400.

        Call it before admission: the engine would refuse the request too, but only once
        it reaches it, which for a streaming response is after the 200 has been sent.
        `prompt_param` names the prompt's field in the client's dialect ("messages", "input").
        """
        try:
            self.engine.check_request(prompt_ids, params)
        except RequestError as e:
            raise api_error(e, prompt_param) from None


def api_error(e: RequestError, prompt_param: str = "prompt") -> ApiError:
    """A request the engine refused, as an invalid-request error (400) in any dialect."""
    return ApiError("invalid_request", str(e), param=prompt_param if e.param == "prompt" else e.param, code=e.code)
