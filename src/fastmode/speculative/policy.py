"""When to speculate, and how far. No torch (the simulator can use it).

- Per request: `SamplingParams.speculative` ("off", "ngram", "draft") wins.
- Per tier: otherwise speculation is on for the tiers in `tiers` (by default
  the fast lane, where batches are small).
- Per step: off when more than `max_batch` sequences decode together: once the
  step is compute-bound, verifying k+1 tokens per sequence costs about k+1
  steps and speculation loses (the threshold comes from `fastmode calibrate`).
- Per sequence: k follows the measured acceptance (an exponential moving
  average): a long expected run of accepted drafts earns a long draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastmode.engine.sequence import Sequence


@dataclass(frozen=True)
class SpecConfig:
    method: str = "ngram"  # default method where speculation is on: "ngram" | "draft" | "off"
    tiers: tuple[str, ...] = ("fast",)  # tiers with speculation on by default
    max_draft_tokens: int = 6  # k upper bound
    max_batch: int = 4  # speculate only while at most this many sequences decode per step
    ema: float = 0.3  # weight of the newest acceptance observation

    def __post_init__(self) -> None:
        if self.method not in ("off", "ngram", "draft"):
            raise ValueError(f"speculative method must be off, ngram or draft; got {self.method!r}")
        if self.max_draft_tokens < 1 or self.max_batch < 1:
            raise ValueError("max_draft_tokens and max_batch must be >= 1")


@dataclass
class SpecState:
    """Per-sequence acceptance tracking."""

    acceptance: float = 0.7  # optimistic prior: a new sequence tries a long draft once
    proposed: int = 0
    accepted: int = 0


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

    def method_for(self, seq: Sequence) -> str:
        requested = seq.params.speculative
        if requested is not None:
            return requested
        return self.config.method if seq.tier.value in self.config.tiers else "off"

    def enabled_for_step(self, num_decoding: int) -> bool:
        return num_decoding <= self.config.max_batch

    def num_draft_tokens(self, seq: Sequence) -> int:
        """k for this sequence's next step: about the expected run of accepted drafts, plus one."""
        st = self.states.setdefault(seq.request_id, SpecState())
        a = min(st.acceptance, 0.95)
        k = round(a / (1.0 - a)) + 1
        remaining = seq.params.max_tokens - seq.num_output_tokens - 1  # the bonus token is free
        return max(0, min(k, self.config.max_draft_tokens, remaining))

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        st = self.states.setdefault(seq.request_id, SpecState())
        st.proposed += proposed
        st.accepted += accepted
        st.acceptance = (1 - self.config.ema) * st.acceptance + self.config.ema * (accepted / proposed)
        self.stats.record(seq.tier.value, proposed, accepted)

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
