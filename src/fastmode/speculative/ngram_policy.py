"""When prompt-lookup drafts pay, per step and per request. No torch.

Each decoding sequence looks up its suffix (`NgramIndex`); the lookup says how far back
the match goes (`match_len`). The longer the match, the likelier the text is repeating
and the next tokens follow it. The policy keeps, across requests, the acceptance of a
draft token by the match length it was proposed at (`AcceptanceByMatch`), and per
request a ledger of what its drafts actually paid (`LookupState`).

- **Per step**, for the batch as a whole: draft token j of a sequence is worth
  p_j = a(m) a(m+1) ... a(m+j-1) expected tokens (all before it must be accepted; a
  draft accepted at match length m leaves a match of m+1). Adding n draft rows to a plain
  step of B decoding sequences, time T(B), makes it a verify step, time V(B+n), both from
  this machine's measured step curve (`StepCurve`; the two kinds run different kernels).
  The policy takes the draft tokens in order of p and keeps the n that maximises
  (B + sum of p) / V(B+n); it drafts only if that beats the plain step's B / T(B) by
  `min_gain`. So one sequence's drafts are priced with the time they
  cost every other sequence of the step, and a curve that steepens at some row count
  (where the matmul kernels change path) shows up as fewer draft rows.
- **Per request**: after each verify step the request is charged what its draft rows
  cost the step, in tokens (B (T(B+n) - T(B)) / T(B), its share by rows), and credited
  the drafts accepted. The running balance (recent steps weigh most) that is still
  negative after `judge_after` drafted steps switches drafting off for the request: its
  drafts do not pay, whatever the shared statistics say. While off it drafts again only
  for a lookup whose match is at least `probe_match` tokens long (the text has started
  to repeat); a probe that pays switches drafting back on, one that does not doubles the
  match length the next probe needs.
- **Checking the outcome**: per batch size, the engine's tokens per second in steps that
  carried drafts and in steps that did not (moving averages of what the steps produced and
  took). Where drafted steps have been the slower of the two, the gain a step's drafts must
  promise at that batch size rises 5% at a time (up to 2x), and eases back while they are
  the faster. The plan then keeps only drafts it is surer of: whatever misjudges the
  acceptance or the step curve, the measured outcome corrects it.
- **Exploring**: a match-length class whose estimate has dropped below paying is
  never drafted, so never measured again. Every `explore_every`-th step in which some
  request had a lookup but nothing was drafted, the best of them drafts one token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastmode.speculative.ngram import Lookup, NgramIndex

# Match-length classes: class i holds lengths in [EDGES[i], EDGES[i + 1]).
EDGES = (0, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Acceptance assumed before anything is measured, per class: chance matches of 2-3 tokens
# rarely continue; a match of dozens of tokens is text being copied.
PRIOR = (0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92)


def match_class(match_len: int) -> int:
    lo, hi = 0, len(EDGES) - 1
    while lo < hi:  # the last edge <= match_len
        mid = (lo + hi + 1) // 2
        if EDGES[mid] <= match_len:
            lo = mid
        else:
            hi = mid - 1
    return lo


class AcceptanceByMatch:
    """P(a draft token is accepted | the tokens before it in the draft were), by the match
    length it was proposed at: counts of continuations and stops per class, weighed against
    the prior as `prior_weight` observations, and capped at `horizon` so the estimate follows
    the traffic."""

    def __init__(self, prior_weight: float = 8.0, horizon: float = 400.0):
        self.prior_weight, self.horizon = prior_weight, horizon
        self.accepted = [0.0] * len(EDGES)
        self.rejected = [0.0] * len(EDGES)

    def rate(self, match_len: int) -> float:
        c = match_class(match_len)
        w = self.prior_weight
        return (self.accepted[c] + w * PRIOR[c]) / (self.accepted[c] + self.rejected[c] + w)

    def _add(self, c: int, accepted: bool) -> None:
        total = self.accepted[c] + self.rejected[c]
        if total >= self.horizon:
            scale = (self.horizon - 1) / total
            self.accepted[c] *= scale
            self.rejected[c] *= scale
        if accepted:
            self.accepted[c] += 1
        else:
            self.rejected[c] += 1

    def observe(self, match_len: int, drafted: int, accepted: int) -> None:
        """Draft token j was proposed at match length match_len + j; the first `accepted` were kept."""
        for j in range(min(accepted, drafted)):
            self._add(match_class(match_len + j), True)
        if accepted < drafted:
            self._add(match_class(match_len + accepted), False)


@dataclass
class LookupState:
    """One request's n-gram index and drafting ledger."""

    index: NgramIndex = field(default_factory=NgramIndex)
    balance: float = 0.0  # tokens gained minus tokens' worth of step time spent, recent steps weigh most
    judged: int = 0  # verify steps with drafts so far
    paused: bool = False  # drafting is off for this request until a probe pays
    probe_match: int = 0  # while paused: the match length a lookup needs to be drafted
    # The last planned step: (match length, tokens' worth of step time per draft row).
    pending: tuple[int, float] | None = None


@dataclass(frozen=True)
class LookupConfig:
    min_gain: float = 1.05  # draft only where the expected batch throughput gains at least this
    max_draft_tokens: int = 6
    judge_after: int = 4  # drafted steps before a request's balance can switch its drafting off
    decay: float = 0.7  # weight of the balance so far against the newest step's gain
    probe_match: int = 6  # while off, draft again only for a match at least this long ...
    max_probe_match: int = 48  # ... doubling after each probe that does not pay, up to this
    explore_every: int = 64
    outcome_ema: float = 0.1  # weight of the newest step in the tokens-per-second averages
    outcome_min_steps: int = 8  # steps of each kind at a batch size before the averages are compared


class LookupPolicy:
    """Plans each step's n-gram drafts (`plan`) and learns from their verification (`observe`)."""

    def __init__(self, config: LookupConfig, step_s: Callable[..., float]):
        self.config = config
        # Estimated seconds of a step of so many rows: step_s(rows, verify=False) for plain
        # decodes, step_s(rows) for a step that verifies drafts.
        self.step_s = step_s
        self.acceptance = AcceptanceByMatch()
        self.states: dict[str, LookupState] = {}
        self._unexplored = 0  # steps since the last draft with a lookup available
        # Per batch size: tokens per second of steps with drafts (True) and without (False), and
        # their counts; and the factor on min_gain those outcomes set (see the module docstring).
        self._rate: dict[tuple[int, bool], float] = {}
        self._count: dict[tuple[int, bool], int] = {}
        self.margin: dict[int, float] = {}

    def state(self, request_id: str) -> LookupState:
        st = self.states.get(request_id)
        if st is None:
            st = self.states[request_id] = LookupState()
        return st

    def plan(self, requests: list[tuple[str, list[int], int]], batch: int) -> list[list[int]]:
        """Drafts for each (request id, tokens, most drafts it may take) at a step where `batch`
        sequences decode together (those included)."""
        cfg = self.config
        lookups: list[Lookup | None] = []
        items: list[tuple[float, int]] = []  # (expected tokens of one draft row, request index)
        for i, (rid, tokens, kmax) in enumerate(requests):
            st = self.state(rid)
            st.pending = None
            kmax = min(kmax, cfg.max_draft_tokens)
            lk = st.index.lookup(tokens, kmax) if kmax > 0 else None
            lookups.append(lk)
            if lk is None or (st.paused and lk.match_len < st.probe_match):
                continue
            p = 1.0
            for j in range(len(lk.tokens)):
                p *= self.acceptance.rate(lk.match_len + j)
                items.append((p, i))
        ks = [0] * len(requests)
        if items:
            items.sort(key=lambda it: -it[0])
            base = max(batch, 1)
            t_base = self.step_s(base, verify=False)
            best_n, best_rate = 0, cfg.min_gain * self.margin.get(base, 1.0) * base / t_base
            tokens = float(base)
            for n, (p, _) in enumerate(items, 1):
                tokens += p
                rate = tokens / self.step_s(base + n)
                if rate > best_rate:
                    best_n, best_rate = n, rate
            if best_n == 0:
                self._unexplored += 1
                if self._unexplored >= cfg.explore_every:
                    best_n = 1  # one token on the likeliest draft keeps every class measured
            if best_n:
                self._unexplored = 0
                for _, i in items[:best_n]:
                    ks[i] += 1
                # What each draft row costs the step, in tokens of the whole batch.
                per_row = base * max(self.step_s(base + best_n) / t_base - 1.0, 0.0) / best_n
                for i, k in enumerate(ks):
                    if k:
                        self.state(requests[i][0]).pending = (lookups[i].match_len, per_row)  # type: ignore[union-attr]
        return [lk.tokens[:k] if lk is not None and k else [] for lk, k in zip(lookups, ks)]

    def observe_step(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A decode/verify step of `batch` sequences produced `tokens` tokens in `seconds`."""
        if batch < 1 or tokens < 1 or seconds <= 0:
            return
        cfg, key = self.config, (batch, drafted)
        old = self._rate.get(key)
        x = tokens / seconds
        self._rate[key] = x if old is None else (1 - cfg.outcome_ema) * old + cfg.outcome_ema * x
        self._count[key] = self._count.get(key, 0) + 1
        if not drafted or min(self._count.get((batch, d), 0) for d in (True, False)) < cfg.outcome_min_steps:
            return
        margin = self.margin.get(batch, 1.0)
        if self._rate[(batch, True)] < self._rate[(batch, False)]:
            self.margin[batch] = min(margin * 1.05, 2.0)
        else:
            self.margin[batch] = max(margin / 1.05, 1.0)

    def observe(self, request_id: str, drafted: int, accepted: int) -> None:
        """Verification kept `accepted` of the `drafted` tokens planned for this request."""
        st = self.states.get(request_id)
        if st is None or st.pending is None or drafted == 0:
            return
        match_len, per_row = st.pending
        st.pending = None
        self.acceptance.observe(match_len, drafted, accepted)
        cfg = self.config
        gain = accepted - per_row * drafted
        if st.paused:
            if gain > 0:  # the probe paid: the text repeats again
                st.paused, st.balance, st.judged = False, gain, 1
            else:
                st.probe_match = min(2 * st.probe_match, cfg.max_probe_match)
            return
        st.balance = cfg.decay * st.balance + gain
        st.judged += 1
        if st.judged >= cfg.judge_after and st.balance < 0:
            st.paused, st.probe_match = True, cfg.probe_match

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
