"""The waiting queue: FCFS within a tier, tiers in rank order, with aging. No torch."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from fastmode.engine.sequence import Sequence
from fastmode.engine.tiers import Tier


class TieredQueue:
    """One arrival-ordered list per tier.

    The next request is the head with the best *effective* rank: its tier's rank
    minus one for every `aging_s` seconds it has waited (None disables aging).
    So a flex request that waited 2*aging_s competes as a fast one for admission,
    and no tier starves forever. A preempted request re-enters at its original
    arrival time, ahead of everything that arrived after it.
    """

    def __init__(self, aging_s: float | None = None):
        self.aging_s = aging_s
        self._queues: dict[Tier, list[tuple[float, int, Sequence]]] = {t: [] for t in Tier}
        self._counter = 0  # tie-break for equal arrival times: insertion order

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return any(self._queues.values())

    def __iter__(self) -> Iterator[Sequence]:
        for q in self._queues.values():
            for _, _, seq in q:
                yield seq

    def num_waiting(self, tier: Tier) -> int:
        return len(self._queues[tier])

    def add(self, seq: Sequence) -> None:
        self._counter += 1
        bisect.insort(self._queues[seq.tier], (seq.arrival_time_s, self._counter, seq))

    def remove(self, seq: Sequence) -> bool:
        q = self._queues[seq.tier]
        for i, (_, _, s) in enumerate(q):
            if s is seq:
                del q[i]
                return True
        return False

    def effective_rank(self, seq: Sequence, now_s: float) -> float:
        if not self.aging_s:
            return seq.tier.rank
        return max(0, seq.tier.rank - int(max(0.0, now_s - seq.arrival_time_s) // self.aging_s))

    def iter_admission_order(self, now_s: float) -> Iterator[Sequence]:
        """Lazily yield waiting requests in admission order (cheap when only a few are taken)."""
        cursors = {t: 0 for t in Tier}
        while True:
            best, best_key = None, None
            for t, q in self._queues.items():
                i = cursors[t]
                if i < len(q):
                    seq = q[i][2]
                    key = (self.effective_rank(seq, now_s), seq.tier.rank, seq.arrival_time_s, q[i][1])
                    if best_key is None or key < best_key:
                        best, best_key = t, key
            if best is None:
                return
            cursors[best] += 1
            yield self._queues[best][cursors[best] - 1][2]
