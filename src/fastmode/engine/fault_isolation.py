"""Fault isolation: when a step raises, find the requests that make it raise, end them with
an error, and run the step again without them, so the rest of the batch goes on with exactly
the tokens it would have had."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fastmode.engine.model_runner import ModelRunner
from fastmode.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from fastmode.engine.sequence import FinishReason, Sequence

log = logging.getLogger(__name__)


def subset(out: SchedulerOutput, scheduled: list[ScheduledSeq]) -> SchedulerOutput:
    """`out` with only `scheduled` run: the same step, fewer requests."""
    return SchedulerOutput(out.step, list(scheduled), out.paused, out.preempted, out.lane_active)


@dataclass
class SamplingCheckpoint:
    """The runner's per-request sampling state before a step, so that a rerun of the step
    (`isolate`) draws what the first run would have drawn.

    A run may have consumed some requests' random numbers, appended to their logprobs and fed
    their grammar matchers before it raised. Only seeded generators are saved: an unseeded one
    promises no particular draw, and saving costs a copy of its state every step. Grammar
    matchers are not copied: they are dropped, and the runner rebuilds one from the request's
    output tokens on its next use."""

    generators: dict[str, torch.Tensor | None]  # request id -> state before the step (None: none yet)
    num_logprobs: dict[str, int]  # request id -> logprobs held before the step
    grammar_ids: list[str]

    @classmethod
    def take(cls, runner: ModelRunner, out: SchedulerOutput) -> SamplingCheckpoint:
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


@dataclass
class Isolated:
    """The step as run (the requests left), their tokens, the failed sequences, and the error
    to report as the engine's last one."""

    out: SchedulerOutput
    sampled: dict[str, list[int]]
    failed: list[Sequence]
    last_error: Exception


def isolate(
    runner: ModelRunner,
    scheduler: Scheduler,
    out: SchedulerOutput,
    error: Exception,
    checkpoint: SamplingCheckpoint,
    clock: Callable[[], float],
) -> Isolated:
    """Find the requests that make a step raise and run the step without them.

    The step's requests are bisected: a group that raises is split and each half rerun,
    down to the single requests that raise on their own. Those are finished with an error
    (their KV freed); the rest then run as one step again. Before every run the runner's
    per-request sampling state is put back (`SamplingCheckpoint`), and each run rewrites
    the KV of exactly the positions it computes, so the retried step gives each remaining
    request the tokens the failed one would have. A failure no single request causes
    (one that needs the whole batch, or comes and goes) can leave nobody to blame: then
    the step is retried once as it was, and if that fails too, its requests all fail."""
    log.warning("step %d raised %r; isolating its failing request(s)", out.step, error)
    last_error = error

    def run(group: list[ScheduledSeq]) -> tuple[dict[str, list[int]] | None, Exception | None]:
        checkpoint.restore(runner)
        try:
            return runner.execute(subset(out, group)), None
        except Exception as e:
            return None, e

    culprits: list[tuple[ScheduledSeq, Exception]] = []
    scheduled = out.scheduled
    groups = [scheduled[: len(scheduled) // 2], scheduled[len(scheduled) // 2 :]] if len(scheduled) > 1 else [scheduled]
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
    now = clock()
    for s, e in culprits:
        log.error(
            "request %s failed in step %d and was ended with an error",
            s.seq.request_id,
            out.step,
            exc_info=(type(e), e, e.__traceback__),
        )
        last_error = e
        scheduler.finish(s.seq, FinishReason.ERROR, now)
    return Isolated(subset(out, rest), sampled, [s.seq for s, _ in culprits], last_error)
