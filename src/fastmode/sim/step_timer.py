"""Price a SchedulerOutput with the planner's CostModel, cheaply.

`CostModel.step_cost` costs ~60 us a call (numpy on tiny arrays), as much as
the scheduler itself at small batches. But for a fixed set of prefill chunks
and a fixed number B of decoding sequences, the cost model's memory, compute
and overhead terms are each *affine in the sum of the decode contexts* S (each
decoding sequence adds its KV bytes, attention FLOPs and calibrated per-KV-token
cost, all linear in its context), and the floor and communication terms do not
depend on S at all. So for each (chunks, B) seen twice we probe `step_cost` at
S = 0 and S = B*K and evaluate

    t(S) = max(mem0 + dmem*S, comp0 + dcomp*S, floor) + fixed0 + dfixed*S

which equals `step_cost(chunks, contexts).total_s` to rounding. The planner
stays the only place the formula lives: the probes call it, a periodic
cross-check calls it, and models where the assumption fails (sliding-window
attention: KV held is min(context, window)) always call it directly.
"""

from __future__ import annotations

from fastmode.engine.scheduler import SchedulerOutput
from fastmode.planner.cost_model import CostModel

_PROBE_CONTEXT = 4096  # tokens per sequence at the second probe: a long lever arm keeps slopes exact
_MAX_KEYS = 200_000  # bound on cached (chunks, B) shapes; the cache is dropped when full


class StepTimer:
    """Callable: SchedulerOutput -> step seconds, as `CostModel.step_cost(...).total_s`.

    A scheduled sequence computing one token is a decode whose context is the KV
    it already holds; more tokens make a prefill chunk (a prompt, part of one,
    or a recompute after preemption) at its current context.
    `check_every` > 0 recomputes every n-th cached answer the slow way and raises
    if they disagree, so a cost-model change that breaks linearity cannot go unseen.
    """

    def __init__(self, cost_model: CostModel, check_every: int = 1000, rel_tol: float = 1e-9):
        self.cost_model = cost_model
        self.affine_ok = cost_model.model.num_sliding_layers == 0
        self.check_every = check_every
        self.rel_tol = rel_tol
        self._coef: dict[tuple, tuple[float, ...]] = {}
        self._seen_once: set[tuple] = set()
        self.num_calls = 0
        self.num_direct = 0  # answered by a direct step_cost call

    def __call__(self, out: SchedulerOutput) -> float:
        chunks: list[tuple[int, int]] = []
        contexts: list[int] = []
        for s in out.scheduled:
            if s.num_tokens > 1:
                chunks.append((s.num_tokens, s.seq.num_computed_tokens))
            else:
                contexts.append(s.seq.num_computed_tokens)
        return self.step_s(chunks, contexts)

    def step_s(self, chunks: list[tuple[int, int]], contexts: list[int]) -> float:
        """Seconds for a step with these prefill chunks and decode contexts."""
        self.num_calls += 1
        if not self.affine_ok:
            return self._direct(chunks, contexts)
        key = (tuple(chunks), len(contexts))
        coef = self._coef.get(key)
        if coef is None:
            if key not in self._seen_once:  # one-off shapes (varied prompt chunks) are not worth probing
                self._seen_once.add(key)
                if len(self._seen_once) > _MAX_KEYS:
                    self._seen_once.clear()
                return self._direct(chunks, contexts)
            coef = self._coef[key] = self._probe(chunks, len(contexts))
            if len(self._coef) > _MAX_KEYS:
                self._coef.clear()
        mem0, dmem, comp0, dcomp, floor, fixed0, dfixed = coef
        ctx_sum = sum(contexts)
        t = max(mem0 + dmem * ctx_sum, comp0 + dcomp * ctx_sum, floor) + fixed0 + dfixed * ctx_sum
        if self.check_every and self.num_calls % self.check_every == 0:
            ref = self._direct(chunks, contexts)
            if abs(t - ref) > self.rel_tol * ref:
                raise RuntimeError(
                    f"step timer drifted from CostModel.step_cost: {t!r} vs {ref!r} "
                    f"for chunks={chunks}, {len(contexts)} decodes; the affine shortcut no longer holds"
                )
        return t

    def _direct(self, chunks, contexts) -> float:
        self.num_direct += 1
        return self.cost_model.step_cost(chunks, contexts).total_s

    def _probe(self, chunks, num_decodes: int) -> tuple[float, ...]:
        cm = self.cost_model
        p0 = cm.step_cost(chunks, [0] * num_decodes)
        fixed0 = p0.comm_s + p0.overhead_s
        if num_decodes == 0:
            return p0.mem_s, 0.0, p0.comp_s, 0.0, p0.floor_s, fixed0, 0.0
        p1 = cm.step_cost(chunks, [_PROBE_CONTEXT] * num_decodes)
        lever = float(_PROBE_CONTEXT * num_decodes)
        return (
            p0.mem_s,
            (p1.mem_s - p0.mem_s) / lever,
            p0.comp_s,
            (p1.comp_s - p0.comp_s) / lever,
            p0.floor_s,
            fixed0,
            (p1.comm_s + p1.overhead_s - fixed0) / lever,
        )
