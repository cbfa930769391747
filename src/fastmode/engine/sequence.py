"""A request's state as the scheduler sees it. No torch: the simulator runs this too."""

from __future__ import annotations

from enum import Enum, auto

from fastmode.engine.tiers import Tier
from fastmode.sampling_params import SamplingParams


class Status(Enum):
    WAITING = auto()  # queued; holds no KV blocks (new, or preempted)
    RUNNING = auto()  # resident: holds KV blocks; may be paused in a given step
    FINISHED = auto()


class FinishReason(str, Enum):
    STOP = "stop"  # EOS, stop token or stop string: `Sequence.stop_reason` says which
    LENGTH = "length"  # max_tokens or the context limit: `Sequence.length_limit` says which
    ABORT = "abort"
    ERROR = "error"


class LengthLimit(str, Enum):
    MAX_TOKENS = "max_tokens"  # the request's own output budget
    CONTEXT = "context"  # the model's context (max_model_len): checked first, so a full context says so


class Sequence:
    """Tokens, KV blocks and timings of one request.

    Invariant: `num_computed_tokens <= len(token_ids)`; the KV of tokens
    [0, num_computed_tokens) lives in `block_table`. With a local-layer pool
    (engine/window_blocks.py) the sliding-window layers' KV lives in
    `local_block_table` instead, which holds only the blocks a future query can
    still read: logical blocks `local_block_start` onwards.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tier: Tier = Tier.STANDARD,
        arrival_time_s: float = 0.0,
    ):
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.tier = tier
        self.tier_rank = tier.rank  # the scheduler sorts by it every step (a request keeps its tier)
        self.arrival_time_s = arrival_time_s
        self.status = Status.WAITING
        self.finish_reason: FinishReason | None = None
        # What ended it, recorded where it was seen: the EOS or stop token id (scheduler) or the
        # stop string (detokenizer) of a STOP finish; the limit of a LENGTH finish.
        self.stop_reason: int | str | None = None
        self.length_limit: LengthLimit | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of the full blocks registered so far
        self.local_block_table: list[int] = []  # local-layer blocks of logical blocks local_block_start...
        self.local_block_start = 0  # logical blocks before it fell out of every future query's window
        self.draft_token_ids: list[int] = []  # speculative proposals for the next step
        # The compiled structured-output grammar (engine/structured.CompiledGrammar) when
        # params.structured is set; the model runner masks this request's logits with it.
        self.grammar: object | None = None
        # Timings (seconds on the scheduler's clock) and metering.
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.finished_s: float | None = None
        self.last_scheduled_step = -1
        self.num_preemptions = 0
        self.machine_s = 0.0  # this request's share of measured step time

    # -- token views -------------------------------------------------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def is_prefilling(self) -> bool:
        """More than one token's KV is missing: a prompt (or a recompute after preemption)."""
        return self.num_uncomputed_tokens > 1

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.tier.value}, {self.status.name}, "
            f"computed={self.num_computed_tokens}/{len(self)}, blocks={len(self.block_table)})"
        )
