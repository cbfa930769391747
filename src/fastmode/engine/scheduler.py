"""The scheduler: which sequences run this step, how many tokens each. No torch.

Contract (after vLLM v1): `schedule(now_s)` returns a `SchedulerOutput` whose
`num_scheduled_tokens` maps request id -> tokens to compute this step (a
prefill chunk, one decode token, or one token plus speculative drafts);
`update_from_output(output, sampled, now_s)` closes the loop with the tokens
the runner produced. The simulator drives this same class with a cost model.

The fast lane: while any fast request is resident or waiting, at most
`fast_lane_max_batch` sequences share a step. Fast sequences are served
first; the remaining slots rotate among lower-tier sequences (least recently
served first), the rest are *paused*: they keep their KV and lose only time.
When memory runs out, the lowest-priority, most recently arrived resident
sequence is *preempted*: its KV is freed and it returns to the waiting queue
at its original arrival time, to be recomputed later. See docs/fast-lane.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from fastmode.engine.block_manager import BlockManager
from fastmode.engine.errors import RequestError
from fastmode.engine.sequence import FinishReason, LengthLimit, Sequence, Status
from fastmode.engine.tiers import Tier
from fastmode.engine.waiting_queue import TieredQueue
from fastmode.engine.window_blocks import WindowedBlockManager


@dataclass(frozen=True)
class SchedulerSettings:
    """What a user chooses about scheduling (`EngineConfig.scheduling` holds one)."""

    block_size: int = 16  # tokens per KV-cache block
    max_num_seqs: int = 64  # resident sequences (holding KV) at once
    max_num_batched_tokens: int = 512  # per step: bounds prefill chunks, so decodes never stall long
    fast_lane_max_batch: int | None = 4  # sequences per step while fast work exists; None = no lane
    aging_s: float | None = 60.0  # waiting this long promotes a request one tier for admission
    enable_prefix_caching: bool = True  # share the KV of common prompt prefixes across requests

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.fast_lane_max_batch is not None and self.fast_lane_max_batch < 1:
            raise ValueError("fast_lane_max_batch must be >= 1 (or None to disable the lane)")
        if self.aging_s is not None and self.aging_s <= 0:
            raise ValueError("aging_s must be > 0 (or None to disable aging)")


@dataclass(frozen=True)
class SchedulerConfig(SchedulerSettings):
    """The settings plus what they are applied to, which the engine derives from the model and
    the KV-cache size (`EngineConfig.scheduler_config`); the simulator sets them directly."""

    num_blocks: int = 2048  # KV-cache blocks
    max_model_len: int = 8192  # the context limit, in tokens
    # Sliding-window layers' own pool (engine/window_blocks.py): their window, in positions, and its
    # size in blocks. 0 blocks: one pool, every layer keeps every position.
    sliding_window: int | None = None
    num_local_blocks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_local_blocks < 0:
            raise ValueError("num_local_blocks must be >= 0")
        if self.num_local_blocks and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError("a local-layer pool needs a positive sliding_window")


@dataclass(slots=True)  # one per scheduled sequence per step: slots make them cheap to build
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens whose KV this step computes
    num_draft_tokens: int = 0  # of which speculative drafts (appended after the real tokens)
    num_accepted_drafts: int = 0  # of the drafts, those verification kept (set by update_from_output)

    @property
    def emits_token(self) -> bool:
        """Whether this step ends at the sequence's frontier, so a next token is sampled."""
        seq = self.seq
        return seq.num_computed_tokens + self.num_tokens - self.num_draft_tokens == len(seq.token_ids)


_num_tokens = attrgetter("num_tokens")


@dataclass(slots=True)  # one per step
class SchedulerOutput:
    step: int
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    paused: list[Sequence] = field(default_factory=list)  # resident but skipped this step
    preempted: list[Sequence] = field(default_factory=list)
    lane_active: bool = False

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.seq.request_id: s.num_tokens for s in self.scheduled}

    @property
    def total_tokens(self) -> int:
        return sum(map(_num_tokens, self.scheduled))

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


# Sort keys as attrgetters: they build the tuple in C, and `schedule` sorts every resident every step.
# Victim order: larger = less important, i.e. lower tier, then later arrival.
_priority_key = attrgetter("tier_rank", "arrival_time_s")
# Service order: by tier, then least recently served (rotation), then arrival.
_service_key = attrgetter("tier_rank", "last_scheduled_step", "arrival_time_s")


def make_block_manager(config: SchedulerConfig) -> BlockManager:
    """One pool, or a second one for the sliding-window layers when the config sizes it."""
    if config.num_local_blocks:
        return WindowedBlockManager(
            config.num_blocks,
            config.block_size,
            config.sliding_window,  # type: ignore[arg-type]  # checked by SchedulerConfig
            config.num_local_blocks,
            config.max_num_batched_tokens,
            config.enable_prefix_caching,
        )
    return BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching)


class Scheduler:
    def __init__(self, config: SchedulerConfig, eos_token_ids: frozenset[int] = frozenset()):
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = make_block_manager(config)
        # With a local-layer pool, each step's sequences give back the blocks behind their window.
        bm = self.block_manager
        self._release_behind_window = bm.release_behind_window if isinstance(bm, WindowedBlockManager) else None
        self.waiting = TieredQueue(config.aging_s)
        self.running: list[Sequence] = []  # resident: hold KV blocks; change it only via _start/_stop_running
        self._num_running = dict.fromkeys(Tier, 0)  # per tier, kept with `running`: read every step
        self.step_count = 0
        self.num_preemptions = 0
        self._by_id: dict[str, Sequence] = {}

    # -- requests ----------------------------------------------------------
    def check_prompt_len(self, num_prompt_tokens: int) -> None:
        """Raise RequestError if a prompt this long could never run here: it leaves no room in the
        context for a token, or it and its first output token can never fit in the KV cache.
        Reads only the configuration, so another thread may call it while the engine thread steps."""
        limit = self.config.max_model_len
        if num_prompt_tokens >= limit:
            raise RequestError(
                f"the prompt has {num_prompt_tokens} tokens; this model's context limit is {limit} tokens",
                param="prompt",
                code="context_length_exceeded",
            )
        if not self.block_manager.fits_alone(num_prompt_tokens + 1):
            raise RequestError(f"a prompt of {num_prompt_tokens} tokens can never fit in the KV cache", param="prompt")

    def add(self, seq: Sequence) -> None:
        """Queue `seq`. Its prompt length is checked again (LLMEngine.check_request checked the whole
        request), so that a caller driving the scheduler directly, the simulator, cannot queue a
        request that would wait forever."""
        if seq.request_id in self._by_id:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self.check_prompt_len(len(seq))
        self._by_id[seq.request_id] = seq
        self.waiting.add(seq)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def finish(self, seq: Sequence, reason: FinishReason, now_s: float) -> None:
        """End a request wherever it is (stop string, abort, error); frees its KV."""
        if seq.is_finished:
            return
        if seq.status is Status.RUNNING:
            self._stop_running(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status, seq.finish_reason, seq.finished_s = Status.FINISHED, reason, now_s
        seq.draft_token_ids = []
        self._by_id.pop(seq.request_id, None)

    def abort(self, request_id: str, now_s: float) -> bool:
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        self.finish(seq, FinishReason.ABORT, now_s)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def num_running(self, tier: Tier) -> int:
        return self._num_running[tier]

    def _start_running(self, seq: Sequence) -> None:
        self.running.append(seq)
        self._num_running[seq.tier] += 1

    def _stop_running(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._num_running[seq.tier] -= 1

    def lane_active(self) -> bool:
        return self.config.fast_lane_max_batch is not None and (
            self._num_running[Tier.FAST] > 0 or self.waiting.num_waiting(Tier.FAST) > 0
        )

    def max_batch(self, lane_active: bool) -> int:
        """Sequences a step may hold: the fast lane's cap while the lane is active."""
        lane = self.config.fast_lane_max_batch
        return lane if lane_active and lane is not None else self.config.max_num_seqs

    # -- scheduling --------------------------------------------------------
    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self._stop_running(seq)
        self.block_manager.free(seq)
        seq.status = Status.WAITING
        seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add(seq)
        out.preempted.append(seq)

    def _victim(self, out: SchedulerOutput, below: Sequence) -> Sequence | None:
        """The least important resident sequence, not more important than `below`, that is
        neither `below` nor already scheduled this step."""
        protect = {id(s.seq) for s in out.scheduled}
        protect.add(id(below))
        key = _priority_key(below)
        candidates = [s for s in self.running if id(s) not in protect and _priority_key(s) >= key]
        return max(candidates, key=_priority_key, default=None)

    def _tokens_for(self, seq: Sequence, budget: int) -> tuple[int, int]:
        """(tokens, drafts) to schedule for a resident sequence within `budget`."""
        if seq.is_prefilling:
            return min(seq.num_uncomputed_tokens, budget), 0
        drafts = min(len(seq.draft_token_ids), max(0, budget - 1))
        drafts = min(drafts, self.config.max_model_len - len(seq) - 1)
        return (1 + max(0, drafts), max(0, drafts)) if budget >= 1 else (0, 0)

    def schedule(self, now_s: float) -> SchedulerOutput:
        cfg = self.config
        self.step_count += 1
        step = self.step_count
        out = SchedulerOutput(step=step, lane_active=self.lane_active())
        scheduled, paused = out.scheduled, out.paused
        cap = self.max_batch(out.lane_active)
        budget = cfg.max_num_batched_tokens

        reserve = 0  # slots the lane keeps for fast requests still waiting for admission
        if out.lane_active:
            reserve = min(self.waiting.num_waiting(Tier.FAST), max(0, cap - self._num_running[Tier.FAST]))
        limit_fast, limit_other = cap, cap - reserve

        # 1. Resident sequences: by tier, then least recently served (rotation), then arrival.
        # This loop runs for every resident every step, hence the local names.
        allocate, running, fast = self.block_manager.allocate, Status.RUNNING, Tier.FAST
        for seq in sorted(self.running, key=_service_key):
            if seq.status is not running:  # preempted earlier in this loop
                continue
            if len(scheduled) >= (limit_fast if seq.tier is fast else limit_other):
                paused.append(seq)  # checked first: a lane step skips most residents cheaply
                continue
            n, drafts = self._tokens_for(seq, budget)
            if n == 0:
                paused.append(seq)
                continue
            if not allocate(seq, n) and not self._preempt_to_grow(seq, n, out):
                continue  # `seq` itself had to give up its KV
            scheduled.append(ScheduledSeq(seq, n, drafts))
            seq.last_scheduled_step = step  # not read again this step: the order above is fixed
            budget -= n

        # 2. Admit waiting requests in priority order while slots, budget and memory allow.
        if self.waiting and len(scheduled) < cap and budget > 0:
            self._admit(now_s, cap, budget, out)
        return out

    def _preempt_to_grow(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Make room for `num_tokens` more tokens of the resident `seq`: preempt less important
        residents (a lower tier, or the same tier and a later arrival) until they fit; if nothing
        less important is left, preempt `seq` itself and return False."""
        while True:
            victim = self._victim(out, below=seq)
            if victim is None:  # nothing less important to evict: give up this one's KV
                self._preempt(seq, out)
                return False
            self._preempt(victim, out)
            if self.block_manager.allocate(seq, num_tokens):
                return True

    def _admit(self, now_s: float, cap: int, budget: int, out: SchedulerOutput) -> None:
        admitted: list[Sequence] = []
        order = self.waiting.iter_admission_order(now_s)
        # Fast requests come first in this order, so the lane's reserve is used up by now.
        while len(out.scheduled) < cap and budget > 0:  # checked before asking for the next in line
            seq = next(order, None)
            if seq is None:
                break
            if not self._preempt_lower_tiers_to_admit(seq, budget, out):
                break  # strict priority: do not let later requests overtake one that does not fit
            cached = self.block_manager.admit(seq)
            if seq.first_scheduled_s is None:
                seq.num_cached_tokens = cached
            n = min(seq.num_uncomputed_tokens, budget)
            ok = self.block_manager.allocate(seq, n)
            assert ok, "admission was checked"
            admitted.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n, 0))
            seq.last_scheduled_step = self.step_count
            budget -= n
        for seq in admitted:
            self.waiting.remove(seq)
            seq.status = Status.RUNNING
            self._start_running(seq)
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s

    def _preempt_lower_tiers_to_admit(self, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
        """Make room to admit the waiting `seq`: preempt residents of a strictly lower tier (not
        scheduled this step) until it fits; False when no such resident is left and it still
        does not fit. Equals never preempt each other to be admitted: they wait their turn."""
        while True:
            fits, _ = self.block_manager.can_admit(seq, budget)
            if fits and len(self.running) < self.config.max_num_seqs:
                return True
            victim = self._victim(out, below=seq)
            if victim is None or victim.tier.rank <= seq.tier.rank:
                # Only a more urgent tier may take a resident's place; equals wait their turn.
                return False
            self._preempt(victim, out)

    # -- feedback ----------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, list[int]], now_s: float) -> list[Sequence]:
        """Apply the runner's tokens. `sampled[rid]` holds the accepted drafts plus
        one new token (or nothing for a mid-prompt chunk). Returns sequences that
        got new tokens or finished this step."""
        touched = []
        running = Status.RUNNING  # a local: this loop is hot
        # commit is a no-op without the prefix cache: skip the call then.
        commit = self.block_manager.commit if self.block_manager.enable_prefix_caching else None
        release_behind_window = self._release_behind_window
        for s in out.scheduled:
            seq = s.seq
            if seq.status is not running:
                continue  # aborted (finished) or preempted while the step ran
            new = sampled.get(seq.request_id)
            if s.num_draft_tokens:  # only accepted drafts keep their KV
                s.num_accepted_drafts = accepted = max(0, len(new) - 1) if new else 0
                seq.num_computed_tokens += s.num_tokens - (s.num_draft_tokens - accepted)
                self.block_manager.truncate(seq, seq.num_computed_tokens)
            else:
                seq.num_computed_tokens += s.num_tokens
            if seq.draft_token_ids:
                seq.draft_token_ids = []
            # Register full blocks before a possible finish frees them: a finished
            # conversation stays in the prefix cache for its next turn.
            if commit is not None:
                commit(seq)
            if release_behind_window is not None:
                release_behind_window(seq)
            if new:
                self._append(seq, new, now_s)
                touched.append(seq)
        return touched

    def _append(self, seq: Sequence, new: list[int], now_s: float) -> None:
        p = seq.params
        token_ids = seq.token_ids
        if seq.first_token_s is None:
            seq.first_token_s = now_s
        seq.last_token_s = now_s
        for tok in new:
            token_ids.append(tok)
            reason = None
            if (not p.ignore_eos and tok in self.eos_token_ids) or tok in p.stop_token_ids:
                reason, seq.stop_reason = FinishReason.STOP, tok
            elif len(token_ids) >= self.config.max_model_len:
                reason, seq.length_limit = FinishReason.LENGTH, LengthLimit.CONTEXT
            elif len(token_ids) - seq.num_prompt_tokens >= p.max_tokens:
                reason, seq.length_limit = FinishReason.LENGTH, LengthLimit.MAX_TOKENS
            if reason is not None:
                # KV of tokens past a stop is discarded with the rest of the sequence.
                seq.num_computed_tokens = min(seq.num_computed_tokens, len(seq) - 1)
                # Drafts accepted this step may have completed a block that update_from_output could not
                # hash yet (their tokens were not appended): register it before finish frees the blocks.
                self.block_manager.commit(seq)
                self.finish(seq, reason, now_s)
                return
