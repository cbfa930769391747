"""Speculation's inputs for the engine: the speculation policy, the draft model, the
step-time curve measured at start-up, and the draft tokens proposed for each step.

The engine owns one `Drafting`; at the start of every step `propose` gives decoding
sequences their draft tokens and reports what a draft-model run cost (`DraftReport`),
for the policy to weigh against the step.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from fastmode.engine.config import EngineConfig
from fastmode.engine.model_runner import ModelRunner
from fastmode.engine.scheduler import Scheduler, SchedulerConfig
from fastmode.engine.sequence import Sequence
from fastmode.loader import LoadedModel
from fastmode.speculative.policy import DraftReport, SpecPolicy

log = logging.getLogger(__name__)


class Drafting:
    """The speculation policy (`spec`) and the draft model (`drafter`, None without one)."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel,
        scheduler_config: SchedulerConfig,
        kv_dtype: torch.dtype,
        runner: ModelRunner,
        scheduler: Scheduler,
    ):
        self.config = config
        self.loaded = loaded
        self.scheduler_config = scheduler_config
        self.kv_dtype = kv_dtype
        self.runner = runner
        self.scheduler = scheduler
        self.spec = SpecPolicy(config.speculation)
        self.drafter = self._load_drafter(config.load.draft_model) if config.load.draft_model else None
        if config.speculation.measure_steps and config.speculation.method != "off" and config.speculation.tiers:
            self.measure_steps()

    def forget(self, request_id: str) -> None:
        """Drop a request's spec stats and draft KV."""
        self.spec.forget(request_id)
        if self.drafter is not None:
            self.drafter.release(request_id)

    def _load_drafter(self, draft_model: str):
        from fastmode.speculative.draft_model import DraftModelProposer
        from fastmode.speculative.draft_source import auto_draft, load_draft

        draft = auto_draft(self.loaded) if draft_model == "auto" else load_draft(draft_model, self.loaded)
        if draft is None:
            return None
        return DraftModelProposer(
            draft, self.scheduler_config.num_blocks, self.scheduler_config.block_size, self.kv_dtype
        )

    def measure_steps(self) -> None:
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

    def propose(self) -> DraftReport:
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
