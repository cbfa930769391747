"""The synchronous engine: add requests, call `step()`, read outputs.

One step = schedule -> execute on the model -> update the scheduler ->
detokenize -> meter. Everything async (the server) wraps this loop.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from dataclasses import dataclass, field

import torch

from fastmode.engine.config import EngineConfig
from fastmode.engine.detokenizer import IncrementalDetokenizer
from fastmode.engine.drafting import Drafting
from fastmode.engine.errors import RequestError
from fastmode.engine.fault_isolation import SamplingCheckpoint, isolate
from fastmode.engine.metering import RequestMetrics, attribute_step, request_metrics
from fastmode.engine.model_runner import ModelRunner
from fastmode.engine.sampler import TokenLogprob
from fastmode.engine.scheduler import Scheduler
from fastmode.engine.sequence import FinishReason, Sequence
from fastmode.engine.structured import compile_structured
from fastmode.engine.tiers import Tier
from fastmode.loader import LoadedModel, load_model
from fastmode.sampling_params import SamplingParams
from fastmode.speculative.policy import DraftReport, SpecPolicy

log = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    """A request's state after a step. `delta_*` is what this step added.

    A finished request says what ended it: `stop_reason` is the EOS or stop token id, or the
    stop string, of a "stop" finish; `length_limit` is "max_tokens" or "context" for a
    "length" finish (the context is reported when both are reached by the same token)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    tier: str
    metrics: RequestMetrics | None = None
    stop_reason: int | str | None = None
    length_limit: str | None = None  # "max_tokens" | "context"
    # One per token of delta_token_ids when params.logprobs is not None (see engine/sampler.py).
    delta_logprobs: list[TokenLogprob] | None = None


@dataclass
class _Tracked:
    seq: Sequence
    detok: IncrementalDetokenizer
    num_sent_tokens: int = 0
    pending: list[int] = field(default_factory=list)


_frozen = False


def _freeze_startup_objects() -> None:
    """Move everything allocated so far (the model, the tokenizer, imported modules) out of the
    garbage collector's generations, once per process: it lives as long as the process, and the
    collections that per-step allocations trigger then scan only young objects, instead of the
    whole model and tokenizer at every full collection, in the middle of a step. Later engines
    in the same process (tests) are not frozen, so they are collected normally."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type. "auto" stores fp16 under fp32 compute, as llama.cpp does by
    default: K and V are rounded once when written (about 3 significant decimal digits kept), and
    attention, which at 16 sequences streams more KV bytes per step than weight bytes, reads half
    as much. Under bf16 compute the cache stays bf16."""
    if name == "auto":
        return torch.float16 if model_dtype == torch.float32 else model_dtype
    return {
        "float16": torch.float16,
        "fp16": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }[name]


class LLMEngine:
    def __init__(self, config: EngineConfig = EngineConfig(), loaded: LoadedModel | None = None):
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.loaded = loaded or load_model(config.load.model, config.load.dtype, weights=config.load.weights)
        self.tokenizer = self.loaded.tokenizer
        mcfg = self.loaded.config
        self.kv_dtype = resolve_kv_dtype(config.cache.kv_cache_dtype, self.loaded.dtype)
        dtype_bytes = torch.finfo(self.kv_dtype).bits // 8
        self.scheduler_config = config.scheduler_config(
            mcfg.kv_bytes_per_token(dtype_bytes), mcfg.max_position_embeddings, model=mcfg
        )
        self.scheduler = Scheduler(self.scheduler_config, self.tokenizer.eos_token_ids)
        self.runner = ModelRunner(
            self.loaded.model,
            self.scheduler_config.num_blocks,
            self.scheduler_config.block_size,
            self.kv_dtype,
            pack_weights=config.load.pack_weights,
            num_local_blocks=self.scheduler_config.num_local_blocks,
        )
        self.drafting = Drafting(config, self.loaded, self.scheduler_config, self.kv_dtype, self.runner, self.scheduler)
        self._tracked: dict[str, _Tracked] = {}
        self._ids = itertools.count()
        self.clock = time.monotonic
        self.num_steps = 0
        self.busy_s = 0.0  # wall time spent in steps
        self.last_error: Exception | None = None
        _freeze_startup_objects()

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    @property
    def spec(self) -> SpecPolicy:
        """The speculation policy: when drafts pay, and the acceptance statistics."""
        return self.drafting.spec

    @property
    def drafter(self):
        """The draft model's proposer, or None when the engine runs without one."""
        return self.drafting.drafter

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        tier: Tier | str = Tier.STANDARD,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; raises ValueError for bad input (nothing is left behind)."""
        return self.add_sequence(self.make_sequence(prompt, params, tier, request_id))

    def make_sequence(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        tier: Tier | str = Tier.STANDARD,
        request_id: str | None = None,
    ) -> Sequence:
        """Check a request and build its Sequence without touching the scheduler's state,
        so a thread other than the one stepping the engine may call it (AsyncEngine does)."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self.check_request(ids, params)
        rid = request_id or f"req-{next(self._ids)}"
        seq = Sequence(rid, ids, params, Tier.parse(tier), arrival_time_s=self.clock())
        if params.structured is not None:  # compiled here, off the engine thread; cached per spec
            seq.grammar = compile_structured(params.structured, self.tokenizer)  # raises StructuredOutputError
        return seq

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestError if this engine can never run the request; the one validation of a
        request. `make_sequence` runs it, and the server runs it before it admits a request, so
        bad input is a 400 before any stream starts. Reads only the configuration: any thread
        may call it."""
        if not prompt_token_ids:
            raise RequestError("prompt is empty", param="prompt")
        vocab = self.loaded.config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_token_ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        self.scheduler.check_prompt_len(len(prompt_token_ids))  # the context and the KV cache
        if params.logit_bias and (top := max(t for t, _ in params.logit_bias)) >= vocab:
            raise RequestError(f"logit_bias token ids must be in [0, {vocab}), got {top}", param="logit_bias")
        if params.speculative == "draft" and self.drafter is None:
            raise RequestError(
                "speculative: 'draft' needs a draft model, and this engine runs without one (start it with "
                "draft_model=..., or `fastmode serve --draft-model`); use 'ngram' or 'off', or leave it unset",
                param="speculative",
                code="unsupported_parameter",
            )

    def add_sequence(self, seq: Sequence) -> str:
        """Queue a sequence from `make_sequence` (on the thread that steps the engine)."""
        self.scheduler.add(seq)  # raises ValueError for a duplicate id
        params = seq.params
        self._tracked[seq.request_id] = _Tracked(
            seq, IncrementalDetokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output)
        )
        return seq.request_id

    def abort(self, request_id: str) -> bool:
        ok = self.scheduler.abort(request_id, self.clock())
        if request_id in self._tracked:
            self._tracked.pop(request_id)
            self._forget(request_id)
        return ok

    def _forget(self, request_id: str) -> None:
        """Drop per-request state outside the scheduler (generators, spec stats, draft KV)."""
        self.runner.release(request_id)
        self.drafting.forget(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[RequestOutput]:
        """Draft, schedule, execute, update: one step of every scheduled sequence.

        A request whose part of the step raises (in the model or in sampling) is ended with
        finish_reason "error" and its KV freed; the step is run again without it, so the rest
        of the batch goes on with exactly the tokens it would have had (engine/fault_isolation.py)."""
        try:
            drafting = self.drafting.propose()
        except Exception:  # drafts are only proposals: a step without them gives the same tokens
            log.exception("drafting failed; this step runs without drafts")
            for seq in self.scheduler.running:
                seq.draft_token_ids = []
            drafting = DraftReport()
        out = self.scheduler.schedule(self.clock())
        if out.is_empty:
            return []
        t0 = time.perf_counter()
        checkpoint = SamplingCheckpoint.take(self.runner, out)
        failed: list[Sequence] = []
        try:
            sampled = self.runner.execute(out)
            step_s = time.perf_counter() - t0
        except Exception as e:
            self.last_error = e
            isolated = isolate(self.runner, self.scheduler, out, e, checkpoint, self.clock)
            out, sampled, failed, self.last_error = isolated.out, isolated.sampled, isolated.failed, isolated.last_error
            step_s = None  # the retries' cost is not a step's: the speculation policy does not learn from it
        busy_s = time.perf_counter() - t0
        self.num_steps += 1
        self.busy_s += busy_s
        attribute_step(out, busy_s)
        touched = self.scheduler.update_from_output(out, sampled, self.clock()) if out.scheduled else []
        if step_s is not None:
            self.spec.update_from_output(out, step_s, drafting)
        outputs = [self._output_or_error(seq) for seq in failed + touched]
        return [o for o in outputs if o is not None]

    def _output_or_error(self, seq: Sequence) -> RequestOutput | None:
        """`_output`, or, if building it raises (the detokenizer, a stop string), the request's
        end with an error: that request fails and the others of the step are unaffected."""
        try:
            return self._output(seq)
        except Exception as e:
            log.exception("request %s: output failed; ending it with an error", seq.request_id)
            self.last_error = e
            self.scheduler.finish(seq, FinishReason.ERROR, self.clock())
            tr = self._tracked.pop(seq.request_id, None)
            self._forget(seq.request_id)
            if tr is None:
                return None
            return RequestOutput(
                request_id=seq.request_id,
                prompt_token_ids=seq.prompt_token_ids,
                token_ids=list(seq.output_token_ids[: tr.num_sent_tokens]),
                text=tr.detok.text,
                delta_text="",
                delta_token_ids=[],
                finished=True,
                finish_reason=FinishReason.ERROR.value,
                tier=seq.tier.value,
                metrics=request_metrics(seq, self.config.usd_per_machine_hour),
            )

    def _output(self, seq: Sequence) -> RequestOutput | None:
        tr = self._tracked.get(seq.request_id)
        if tr is None:
            return None
        out_ids = seq.output_token_ids
        tr.detok.add(out_ids)
        if tr.detok.stopped and not seq.is_finished:
            seq.stop_reason = tr.detok.stop_str
            self.scheduler.finish(seq, FinishReason.STOP, self.clock())
        finished = seq.is_finished
        delta_text = tr.detok.take_delta(finished)
        delta_ids = out_ids[tr.num_sent_tokens :]
        delta_logprobs = None
        if seq.params.logprobs is not None:  # the runner may have sampled past a stop the scheduler cut
            delta_logprobs = self.runner.take_logprobs(seq.request_id)[: len(delta_ids)]
        tr.num_sent_tokens = len(out_ids)
        metrics = None
        if finished:
            self._tracked.pop(seq.request_id, None)
            self._forget(seq.request_id)
            metrics = request_metrics(seq, self.config.usd_per_machine_hour)
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(out_ids),
            text=tr.detok.text,
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            finished=finished,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None,
            tier=seq.tier.value,
            metrics=metrics,
            stop_reason=seq.stop_reason,
            length_limit=seq.length_limit.value if seq.length_limit else None,
            delta_logprobs=delta_logprobs,
        )
