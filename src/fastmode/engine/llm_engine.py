"""The synchronous engine: add requests, call `step()`, read outputs.

One step = schedule -> execute on the model -> update the scheduler ->
detokenize -> meter. Everything async (the server) wraps this loop.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from fastmode.engine.config import EngineConfig
from fastmode.engine.detokenizer import IncrementalDetokenizer
from fastmode.engine.errors import RequestError
from fastmode.engine.metering import RequestMetrics, attribute_step, request_metrics
from fastmode.engine.model_runner import ModelRunner
from fastmode.engine.sampler import TokenLogprob
from fastmode.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
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


def _subset(out: SchedulerOutput, scheduled: list[ScheduledSeq]) -> SchedulerOutput:
    """`out` with only `scheduled` run: the same step, fewer requests."""
    return SchedulerOutput(out.step, list(scheduled), out.paused, out.preempted, out.lane_active)


@dataclass
class _SamplingCheckpoint:
    """The runner's per-request sampling state before a step, so that a rerun of the step
    (`LLMEngine._isolate`) draws what the first run would have drawn.

    A run may have consumed some requests' random numbers, appended to their logprobs and fed
    their grammar matchers before it raised. Only seeded generators are saved: an unseeded one
    promises no particular draw, and saving costs a copy of its state every step. Grammar
    matchers are not copied: they are dropped, and the runner rebuilds one from the request's
    output tokens on its next use."""

    generators: dict[str, torch.Tensor | None]  # request id -> state before the step (None: none yet)
    num_logprobs: dict[str, int]  # request id -> logprobs held before the step
    grammar_ids: list[str]

    @classmethod
    def take(cls, runner: ModelRunner, out: SchedulerOutput) -> _SamplingCheckpoint:
        generators, num_logprobs, grammar_ids = {}, {}, []
        for s in out.scheduled:
            seq, p = s.seq, s.seq.params
            rid = seq.request_id
            if p.seed is not None and not p.greedy:
                gen = runner.generators.get(rid)
                generators[rid] = None if gen is None else gen.get_state()
            if p.logprobs is not None:
                num_logprobs[rid] = len(runner.logprobs.get(rid, ()))
            if seq.grammar is not None:
                grammar_ids.append(rid)
        return cls(generators, num_logprobs, grammar_ids)

    def restore(self, runner: ModelRunner) -> None:
        for rid, state in self.generators.items():
            if state is None:
                runner.generators.pop(rid, None)  # recreated from the seed on first use
            elif rid in runner.generators:
                runner.generators[rid].set_state(state)
        for rid, n in self.num_logprobs.items():
            if rid in runner.logprobs:
                del runner.logprobs[rid][n:]
        for rid in self.grammar_ids:
            runner.grammars.pop(rid, None)


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
        self.spec = SpecPolicy(config.speculation)
        self.drafter = self._load_drafter(config.load.draft_model) if config.load.draft_model else None
        if config.speculation.measure_steps and config.speculation.method != "off" and config.speculation.tiers:
            self._measure_steps()
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
        self.spec.forget(request_id)
        if self.drafter is not None:
            self.drafter.release(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def _load_drafter(self, draft_model: str):
        from fastmode.speculative.draft_model import DraftModelProposer
        from fastmode.speculative.draft_source import auto_draft, load_draft

        draft = auto_draft(self.loaded) if draft_model == "auto" else load_draft(draft_model, self.loaded)
        if draft is None:
            return None
        return DraftModelProposer(
            draft, self.scheduler_config.num_blocks, self.scheduler_config.block_size, self.kv_dtype
        )

    def _measure_steps(self) -> None:
        """Seed the speculation policy's step curve with this machine's step times."""
        from fastmode.env import cache_dir
        from fastmode.kernels import cpu_flags, select_isa
        from fastmode.speculative.step_timing import cached_step_curve, measure_step_curve, step_shapes

        cfg = self.config.speculation
        shapes = step_shapes(min(cfg.max_batch, self.scheduler_config.max_num_seqs), cfg.max_draft_tokens)
        loaded = self.loaded
        try:
            stat = loaded.path.stat()
            file_id = [str(loaded.path.resolve()), stat.st_size, stat.st_mtime_ns]
        except OSError:
            file_id = [str(loaded.path)]
        parts = {
            "model": file_id,
            "shape": [loaded.config.num_layers, loaded.config.hidden_size, loaded.config.vocab_size],
            "weights": loaded.weight_format,
            "dtype": str(loaded.dtype),
            "kv_dtype": str(self.kv_dtype),
            "block_size": self.scheduler_config.block_size,
            "threads": torch.get_num_threads(),
            "isa": select_isa() if getattr(loaded.model, "kernels", None) is not None else "torch",
            "cpu": [os.cpu_count(), sorted(cpu_flags())],
        }
        t0 = time.perf_counter()
        measured, cached = cached_step_curve(
            cache_dir(), parts, shapes, lambda s: measure_step_curve(self.runner, self.scheduler.block_manager, s)
        )
        self.spec.seed_steps(measured)
        how = "read from the cache" if cached else f"measured in {time.perf_counter() - t0:.2f} s"
        log.info("times of %d decode and verify step shapes %s", len(measured), how)

    def _propose_drafts(self) -> DraftReport:
        """Give decoding sequences draft tokens where the policy says speculation pays; report
        what a draft-model run cost, for the policy to weigh against the step."""
        running = self.scheduler.running
        for seq in running:
            seq.draft_token_ids = []
        cap = self.scheduler.max_batch(self.scheduler.lane_active())
        if not self.spec.enabled_for_step(min(len(running), cap)):
            return DraftReport()
        decoding = [seq for seq in running if not seq.is_prefilling]
        batch = min(len(decoding), cap)
        by_model: list[tuple[Sequence, int]] = []
        by_lookup: list[Sequence] = []
        for seq in decoding:
            method = self.spec.method_for(seq)
            if method == "ngram":
                by_lookup.append(seq)
            elif method == "draft" and self.drafter is not None:
                k = self.spec.num_draft_tokens(seq, method, batch, self.drafter.catch_up_tokens(seq))
                if k:
                    by_model.append((seq, k))
        # Prompt-lookup drafts are planned for the step as a whole (their rows slow every sequence).
        for seq, drafts in zip(by_lookup, self.spec.draft_ngrams(by_lookup, batch)):
            seq.draft_token_ids = drafts
        if not by_model:
            return DraftReport(batch)
        # One batched draft run for every sequence that uses the draft model.
        run = self.drafter.propose([s for s, _ in by_model], [k for _, k in by_model])
        for (seq, _), d in zip(by_model, run.drafts):
            seq.draft_token_ids = d
        return DraftReport(batch, run.round_s, run.catch_up)

    def step(self) -> list[RequestOutput]:
        """Draft, schedule, execute, update: one step of every scheduled sequence.

        A request whose part of the step raises (in the model or in sampling) is ended with
        finish_reason "error" and its KV freed; the step is run again without it, so the rest
        of the batch goes on with exactly the tokens it would have had (`_isolate`)."""
        try:
            drafting = self._propose_drafts()
        except Exception:  # drafts are only proposals: a step without them gives the same tokens
            log.exception("drafting failed; this step runs without drafts")
            for seq in self.scheduler.running:
                seq.draft_token_ids = []
            drafting = DraftReport()
        out = self.scheduler.schedule(self.clock())
        if out.is_empty:
            return []
        t0 = time.perf_counter()
        checkpoint = _SamplingCheckpoint.take(self.runner, out)
        failed: list[Sequence] = []
        try:
            sampled = self.runner.execute(out)
            step_s = time.perf_counter() - t0
        except Exception as e:
            out, sampled, failed = self._isolate(out, e, checkpoint)
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

    def _isolate(
        self, out: SchedulerOutput, error: Exception, checkpoint: _SamplingCheckpoint
    ) -> tuple[SchedulerOutput, dict[str, list[int]], list[Sequence]]:
        """Find the requests that make a step raise and run the step without them.

        The step's requests are bisected: a group that raises is split and each half rerun,
        down to the single requests that raise on their own. Those are finished with an error
        (their KV freed); the rest then run as one step again. Before every run the runner's
        per-request sampling state is put back (`_SamplingCheckpoint`), and each run rewrites
        the KV of exactly the positions it computes, so the retried step gives each remaining
        request the tokens the failed one would have. A failure no single request causes
        (one that needs the whole batch, or comes and goes) can leave nobody to blame: then
        the step is retried once as it was, and if that fails too, its requests all fail.
        Returns the step as run (the requests left), their tokens, and the failed sequences."""
        log.warning("step %d raised %r; isolating its failing request(s)", out.step, error)
        self.last_error = error

        def run(group: list[ScheduledSeq]) -> tuple[dict[str, list[int]] | None, Exception | None]:
            checkpoint.restore(self.runner)
            try:
                return self.runner.execute(_subset(out, group)), None
            except Exception as e:
                return None, e

        culprits: list[tuple[ScheduledSeq, Exception]] = []
        scheduled = out.scheduled
        groups = (
            [scheduled[: len(scheduled) // 2], scheduled[len(scheduled) // 2 :]] if len(scheduled) > 1 else [scheduled]
        )
        while groups:
            group = groups.pop()
            if not group:
                continue
            _, e = run(group)
            if e is None:
                continue
            if len(group) == 1:
                culprits.append((group[0], e))
            else:
                groups += [group[: len(group) // 2], group[len(group) // 2 :]]
        blamed = {id(s) for s, _ in culprits}
        rest = [s for s in scheduled if id(s) not in blamed]
        sampled: dict[str, list[int]] = {}
        if rest:
            result, e = run(rest)
            if result is None:  # not reproducible request by request: the whole remainder fails
                culprits += [(s, e) for s in rest]
                rest = []
            else:
                sampled = result
        now = self.clock()
        for s, e in culprits:
            log.error(
                "request %s failed in step %d and was ended with an error",
                s.seq.request_id,
                out.step,
                exc_info=(type(e), e, e.__traceback__),
            )
            self.last_error = e
            self.scheduler.finish(s.seq, FinishReason.ERROR, now)
        return _subset(out, rest), sampled, [s.seq for s, _ in culprits]

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
