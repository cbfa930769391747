"""When to speculate, and how far. No torch (the simulator can use it).

- Per request: `SamplingParams.speculative` ("off", "ngram", "draft") wins.
- Per tier: otherwise speculation is on for the tiers in `tiers` (by default
  the fast lane, where batches are small).
- Per step: off when more than `max_batch` sequences decode together: once the
  step is compute-bound, verifying k+1 tokens per sequence costs about k+1
  steps and speculation loses (the threshold comes from `fastmode calibrate`).
- What a step costs: `step_seconds(rows, verify)`, from this machine's step curve
  (`StepCurve`), which the engine measures at start-up (`step_timing.py`) and
  keeps current with every decode/verify step it runs. A plain step of B decodes
  and a step verifying drafts beside them run different paths, so each is priced
  from its own kind of step.
- n-gram drafts (`ngram_policy.py`): planned for the whole step from each lookup's
  match length, with a per-request ledger that switches drafting off for a request
  whose drafts do not pay.
- Draft-model drafts, per sequence: k maximises the expected speed-up E[tokens](k) / (V(k) + k d)
  for the sequence's measured acceptance a (an exponential moving average).
  V(k) is what verifying k drafts per sequence costs relative to a plain step:
  the engine's measured verify step at B(k+1) rows over its plain step of B
  decodes, B the sequences decoding together (`step_seconds`). d is the draft model's measured
  cost per round relative to a step. If no k gains `min_gain`, the sequence does not
  speculate, except for a one-token probe every `probe_every` steps that keeps
  its acceptance estimate current (the interval doubles after every probe that
  does not restart speculation, up to 8x). A weak draft therefore switches itself off
  instead of slowing the request down. (Probes also refresh the step curve at the
  verify widths, so a noisy measurement there cannot switch speculation off for good.)
- Draft catch-up: before its first draft for a sequence, and after steps without
  drafting, the draft model must first run the tokens it has not seen (the prompt,
  at first). That costs C steps once (seconds per token measured by the engine,
  EMA). Over the R tokens the request may still produce, speculating at gain G
  costs R / G + C steps instead of R, so the draft method needs
  R / (R / G + C) >= `min_gain`. A probe that needs a catch-up is skipped where even
  95% acceptance could not repay it, and where the catch-up would cost more than
  (min_gain - 1) of the idle steps it follows: probing then stays within the
  policy's own margin (it rarely probes a draft model whose catch-up costs more
  than 5% of a step per token; such a draft, once it stops paying, stays off).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastmode.engine.sequence import Sequence
from fastmode.speculative.ngram_policy import LookupConfig, LookupPolicy
from fastmode.speculative.step_curve import StepCurve

if TYPE_CHECKING:
    from fastmode.engine.scheduler import SchedulerOutput


METHODS = ("off", "ngram", "draft")  # "off" included: a request may opt out


@dataclass(frozen=True)
class SpecConfig:
    method: str = field(default="ngram", metadata={"choices": METHODS})  # where speculation is on by default
    tiers: tuple[str, ...] = ("fast",)  # tiers that speculate unless a request opts out (a string: "standard,fast")
    max_draft_tokens: int = 6  # upper bound on k; the policy adapts k to measured acceptance
    max_batch: int = 4  # no speculation when more sequences than this decode together (see fastmode calibrate)
    ema: float = 0.3  # weight of the newest acceptance observation
    verify_cost: float = 0.15  # a row's cost as a fraction of a 1-row step, until step times are measured
    min_gain: float = 1.05  # speculate only when the expected speed-up is at least this (0 = always)
    probe_every: int = 16  # a sequence that stopped speculating retries one draft token every N steps
    measure_steps: bool = True  # time decode/verify steps of 1 to max_batch x (k+1) rows at start-up

    def __post_init__(self) -> None:
        if isinstance(self.tiers, str):  # "standard,fast", as the command line spells it
            object.__setattr__(self, "tiers", tuple(t.strip() for t in self.tiers.split(",") if t.strip()))
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be off, ngram or draft; got {self.method!r}")
        if self.max_draft_tokens < 1 or self.max_batch < 1 or self.probe_every < 1:
            raise ValueError("max_draft_tokens, max_batch and probe_every must be >= 1")
        if self.min_gain < 0 or self.verify_cost < 0:
            raise ValueError("min_gain and verify_cost must be >= 0")


@dataclass(frozen=True)
class DraftReport:
    """What proposing one step's drafts measured, for the policy to weigh against the step they fed
    (`SpecPolicy.update_from_output`). The default: nothing measured (no draft-model run)."""

    batch: int = 1  # sequences decoding together when the drafts were proposed
    round_s: float | None = None  # the draft model's seconds per drafting round; None: no round's cost measured
    catch_up: tuple[float, int] | None = None  # (seconds, tokens) of the draft model's catch-up, when it was long


@dataclass
class SpecState:
    """Per-sequence acceptance tracking."""

    acceptance: float = 0.7  # optimistic prior: a new sequence tries a long draft once
    proposed: int = 0
    accepted: int = 0
    idle_steps: int = 0  # steps without speculation since the last draft (for probing)
    probe_backoff: int = 1  # the probe interval's multiplier: doubles after each probe, up to 8


@dataclass
class SpecStats:
    """Counters per tier: verify steps with drafts, draft tokens, accepted tokens."""

    drafts: dict[str, int] = field(default_factory=dict)
    draft_tokens: dict[str, int] = field(default_factory=dict)
    accepted_tokens: dict[str, int] = field(default_factory=dict)

    def record(self, tier: str, proposed: int, accepted: int) -> None:
        self.drafts[tier] = self.drafts.get(tier, 0) + 1
        self.draft_tokens[tier] = self.draft_tokens.get(tier, 0) + proposed
        self.accepted_tokens[tier] = self.accepted_tokens.get(tier, 0) + accepted

    def acceptance_rate(self, tier: str) -> float | None:
        n = self.draft_tokens.get(tier, 0)
        return self.accepted_tokens.get(tier, 0) / n if n else None


class SpecPolicy:
    def __init__(self, config: SpecConfig):
        self.config = config
        self.states: dict[str, SpecState] = {}
        self.stats = SpecStats()
        # One draft-model round over one target step, measured by the engine (EMA);
        # the prior is about what a 10-of-30-layer Spark costs its teacher.
        self.draft_cost = 0.4
        # Recent acceptance per method across sequences: a new sequence starts from it
        # (0.7, optimistic, until the method has been observed), so a draft that has been
        # failing is not tried at length on every new request.
        self.method_acceptance: dict[str, float] = {}
        self.steps = StepCurve()  # step seconds by rows, fed by the engine (decode/verify steps only)
        self.lookup = LookupPolicy(
            LookupConfig(min_gain=config.min_gain, max_draft_tokens=config.max_draft_tokens), self.step_seconds
        )
        # The draft model's catch-up seconds per token over a plain step's seconds (EMA). The prior:
        # one token of a batched catch-up costs about a tenth of a drafting round.
        self.catch_up_cost: float | None = None

    def method_for(self, seq: Sequence) -> str:
        requested = seq.params.speculative
        if requested is not None:
            return requested
        return self.config.method if seq.tier.value in self.config.tiers else "off"

    def enabled_for_step(self, num_decoding: int) -> bool:
        return num_decoding <= self.config.max_batch

    def observe_step(self, rows: int, seconds: float, verify: bool = True) -> None:
        """A step that computed `rows` rows (no prompt chunk) took `seconds`: plain decodes
        (`verify` False) or with drafts verified among them."""
        self.steps.observe(rows, seconds, verify)

    def step_seconds(self, rows: int, verify: bool = True) -> float:
        """A step of `rows` rows, plain decodes or verifying drafts: measured seconds once the
        curve has two points; before that, the prior in units of a one-row step (only ratios
        are used)."""
        if self.steps.ready:
            return self.steps.seconds(rows, verify)  # type: ignore[return-value]
        return 1.0 + self.config.verify_cost * (max(rows, 1) - 1)

    def verify_cost(self, batch: int, k: int) -> float:
        """A step where `batch` sequences each verify k drafts, relative to their plain step."""
        return max(self.step_seconds(batch * (k + 1)) / self.step_seconds(batch, verify=False), 1.0)

    def draft_ngrams(self, seqs: list[Sequence], batch: int) -> list[list[int]]:
        """Prompt-lookup drafts for `seqs` at a step where `batch` sequences decode (see ngram_policy)."""
        # The token after the last draft is the verify step's own: drafts stop one short of max_tokens.
        requests = [(s.request_id, s.token_ids, s.params.max_tokens - s.num_output_tokens - 1) for s in seqs]
        return self.lookup.plan(requests, batch)

    def _best_k(self, a: float, kmax: int, batch: int, d: float) -> tuple[int, float]:
        """(k, E(k) / (V(k) + k d)) with the best expected speed-up at acceptance a."""
        best_k, best_gain, expected, a_pow = 0, 0.0, 1.0, 1.0
        for k in range(1, kmax + 1):
            a_pow *= a
            expected += a_pow
            gain = expected / (self.verify_cost(max(batch, 1), k) + k * d)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k, best_gain

    def catch_up_steps(self, tokens: int) -> float:
        """What the draft model's catch-up on `tokens` unseen tokens costs, in plain steps."""
        per_token = self.catch_up_cost if self.catch_up_cost is not None else self.draft_cost / 10
        return tokens * per_token

    def num_draft_tokens(self, seq: Sequence, method: str = "ngram", batch: int = 1, catch_up: int = 0) -> int:
        """k for this sequence's next step (0 = do not speculate) when `batch` sequences
        decode together: the k with the best expected speed-up E(k) / (V(k) + k d),
        E(k) = 1 + a + ... + a^k. `catch_up`: tokens the draft model has to run before
        it can draft for this sequence (draft method only)."""
        cfg = self.config
        st = self.states.get(seq.request_id)
        if st is None:
            st = self.states[seq.request_id] = SpecState(acceptance=self.method_acceptance.get(method, 0.7))
        remaining = seq.params.max_tokens - seq.num_output_tokens - 1  # the bonus token is free
        kmax = min(cfg.max_draft_tokens, remaining)
        if kmax <= 0:
            return 0
        d = self.draft_cost if method == "draft" else 0.0
        cost = self.catch_up_steps(catch_up) if method == "draft" and catch_up > 1 else 0.0

        def net(gain: float) -> float:  # the speed-up over the rest of the request, catch-up paid
            return remaining / (remaining / gain + cost) if gain > 0 else 0.0

        best_k, best_gain = self._best_k(min(st.acceptance, 0.95), kmax, batch, d)
        if net(best_gain) >= cfg.min_gain:
            st.idle_steps = 0
            st.probe_backoff = 1
            return best_k
        if cost > 0 and net(self._best_k(0.95, kmax, batch, d)[1]) < cfg.min_gain:
            return 0  # a probe would pay the catch-up, and no acceptance it could measure would repay it
        st.idle_steps += 1
        if cost > max(cfg.min_gain - 1, 0.0) * st.idle_steps:
            return 0  # a draft probe's catch-up would cost more than min_gain's share of the steps it follows
        if st.idle_steps >= cfg.probe_every * st.probe_backoff:  # re-measure: the text may have turned repetitive
            st.idle_steps = 0
            st.probe_backoff = min(2 * st.probe_backoff, 8)  # each probe that does not restart speculation waits longer
            return 1
        return 0

    def observe_catch_up(self, seconds: float, tokens: int, step_s: float) -> None:
        """The draft model ran `tokens` catch-up tokens in `seconds`; a plain step takes `step_s`."""
        if tokens > 0 and seconds >= 0 and step_s > 0:
            x = seconds / tokens / step_s
            w = self.config.ema
            self.catch_up_cost = x if self.catch_up_cost is None else (1 - w) * self.catch_up_cost + w * x

    def observe_draft_cost(self, draft_round_s: float, step_s: float) -> None:
        """One draft-model round took `draft_round_s`; the target step it fed took `step_s`."""
        if step_s > 0 and draft_round_s >= 0:
            self.draft_cost = (1 - self.config.ema) * self.draft_cost + self.config.ema * (draft_round_s / step_s)

    def update_from_output(self, out: SchedulerOutput, step_s: float, drafting: DraftReport) -> None:
        """Learn from a step that ran in `step_s` seconds: the draft model's cost against it, the
        step curve (from steps of decodes and verifications only), and each sequence's acceptance
        (after `Scheduler.update_from_output` recorded it)."""
        if drafting.round_s is not None:
            self.observe_draft_cost(drafting.round_s, step_s)
        if drafting.catch_up is not None:  # priced against a plain step at this batch where one was measured
            plain_s = self.steps.seconds(drafting.batch, verify=False) or step_s
            self.observe_catch_up(*drafting.catch_up, plain_s)
        if all(s.num_tokens - s.num_draft_tokens == 1 for s in out.scheduled):
            drafted = any(s.num_draft_tokens for s in out.scheduled)
            self.observe_step(sum(s.num_tokens for s in out.scheduled), step_s, drafted)
            emitted = sum(1 + s.num_accepted_drafts for s in out.scheduled)
            self.lookup.observe_step(len(out.scheduled), drafted, emitted, step_s)
        for s in out.scheduled:
            if s.num_draft_tokens:
                self.observe(s.seq, s.num_draft_tokens, s.num_accepted_drafts)
                self.lookup.observe(s.seq.request_id, s.num_draft_tokens, s.num_accepted_drafts)

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        st = self.states.setdefault(seq.request_id, SpecState())
        st.proposed += proposed
        st.accepted += accepted
        w, rate = self.config.ema, accepted / proposed
        st.acceptance = (1 - w) * st.acceptance + w * rate
        method = self.method_for(seq)
        self.method_acceptance[method] = (1 - w) * self.method_acceptance.get(method, 0.7) + w * rate
        self.stats.record(seq.tier.value, proposed, accepted)

    def seed_steps(self, seconds: dict[int, float] | dict[tuple[bool, int], float]) -> None:
        """Step times measured before serving (`step_timing.measure_step_curve`): by (verifies
        drafts, rows), plain decodes first; or by rows alone, every one taken as a verification."""
        shapes = {(k if isinstance(k, tuple) else (True, k)): t for k, t in seconds.items()}
        for (verify, rows), t in sorted(shapes.items()):
            self.steps.observe(rows, t, verify)

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        self.lookup.forget(request_id)
