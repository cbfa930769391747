"""The in-process API: `LLM(...).generate(prompts, sampling_params)`.

Every prompt becomes a request on one engine, so a list of prompts is served
with continuous batching, exactly as the server would serve them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine, RequestOutput
from fastmode.engine.metering import RequestMetrics
from fastmode.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, Any]


@dataclass
class CompletionOutput:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str | None
    tier: str
    metrics: RequestMetrics | None

    @classmethod
    def from_request(cls, o: RequestOutput) -> CompletionOutput:
        return cls(o.text, o.token_ids, o.prompt_token_ids, o.finish_reason, o.tier, o.metrics)


class LLM:
    """Load a model (None = the embedded SmolLM2-135M-Instruct) and generate.

    Extra keyword arguments are `EngineConfig` fields (kv_cache_gib,
    max_num_seqs, fast_lane_max_batch, ...).
    """

    def __init__(self, model: str | None = None, dtype: str = "auto", **engine_kwargs: Any):
        self.engine = LLMEngine(EngineConfig(model=model, dtype=dtype, **engine_kwargs))
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        service_tier: str | Sequence[str] = "standard",
        use_tqdm: bool = False,
    ) -> list[CompletionOutput]:
        """One output per prompt, in order. Prompts are strings or token id lists."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # a single prompt
        prompts = list(prompts)
        params = self._per_prompt(sampling_params or SamplingParams(), len(prompts), "sampling_params")
        tiers = self._per_prompt(service_tier, len(prompts), "service_tier")
        ids = [self.engine.add_request(p, sp, tier) for p, sp, tier in zip(prompts, params, tiers)]
        results: dict[str, CompletionOutput] = {}
        try:
            bar = None
            if use_tqdm:
                from tqdm import tqdm

                bar = tqdm(total=len(ids), desc="generate")
            while len(results) < len(ids):
                for o in self.engine.step():
                    if o.finished:
                        if o.finish_reason == "error":
                            raise RuntimeError(f"request {o.request_id} failed: {self.engine.last_error!r}")
                        results[o.request_id] = CompletionOutput.from_request(o)
                        if bar:
                            bar.update(1)
            if bar:
                bar.close()
        finally:  # interrupted: leave nothing running
            for rid in ids:
                if rid not in results:
                    self.engine.abort(rid)
        return [results[rid] for rid in ids]

    def chat(
        self,
        messages: Sequence[Message],
        sampling_params: SamplingParams | None = None,
        service_tier: str = "standard",
    ) -> CompletionOutput:
        """Answer one conversation (a list of {"role", "content"} dicts)."""
        ids = self.tokenizer.encode_chat(messages, add_generation_prompt=True)
        return self.generate([ids], sampling_params, service_tier)[0]

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None, service_tier: str = "standard"
    ) -> Iterator[RequestOutput]:
        """Yield this request's outputs step by step (delta_text / delta_token_ids)."""
        rid = self.engine.add_request(prompt, sampling_params or SamplingParams(), service_tier)
        done = False
        try:
            while not done:
                for o in self.engine.step():
                    if o.request_id == rid:
                        done = o.finished
                        yield o
        finally:
            if not done:
                self.engine.abort(rid)

    def score(self, token_ids: list[int]) -> list[float]:
        """Log-probabilities of token_ids[1:] given their prefixes (for perplexity), with K/V
        stored as the engine stores them (`kv_cache_dtype`)."""
        from fastmode.engine.scoring import score_tokens

        return score_tokens(self.engine.loaded, token_ids, kv_dtype=self.engine.kv_dtype)

    @staticmethod
    def _per_prompt(value: Any, n: int, name: str) -> list[Any]:
        if isinstance(value, (list, tuple)):
            if len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
            return list(value)
        return [value] * n
