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
        self._by_rank = [(t.rank, self._queues[t]) for t in Tier]  # the same lists, for iter_admission_order
        self._counter = 0  # tie-break for equal arrival times: insertion order
        self._size = 0  # requests in all queues: asked every step

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[Sequence]:
        for q in self._queues.values():
            for _, _, seq in q:
                yield seq

    def num_waiting(self, tier: Tier) -> int:
        return len(self._queues[tier])

    def add(self, seq: Sequence) -> None:
        self._counter += 1
        bisect.insort(self._queues[seq.tier], (seq.arrival_time_s, self._counter, seq))
        self._size += 1

    def remove(self, seq: Sequence) -> bool:
        q = self._queues[seq.tier]
        for i, (_, _, s) in enumerate(q):
            if s is seq:
                del q[i]
                self._size -= 1
                return True
        return False

    def effective_rank(self, seq: Sequence, now_s: float) -> float:
        # Inlined in iter_admission_order: keep the two the same.
        if not self.aging_s:
            return seq.tier.rank
        return max(0, seq.tier.rank - int(max(0.0, now_s - seq.arrival_time_s) // self.aging_s))

    def iter_admission_order(self, now_s: float) -> Iterator[Sequence]:
        """Lazily yield waiting requests in admission order (cheap when only a few are taken).

        Reads the live queues: a request preempted while this runs (it re-enters at its
        arrival time) shifts the queue under its cursor, exactly as an index would."""
        queues = self._by_rank
        cursors = [0] * len(queues)
        aging_s = self.aging_s
        while True:
            best, best_key = -1, None
            for k, (rank, q) in enumerate(queues):
                i = cursors[k]
                if i < len(q):
                    arrival, order, _ = q[i]
                    # effective_rank, inlined: every admission compares every tier's head
                    eff = max(0, rank - int(max(0.0, now_s - arrival) // aging_s)) if aging_s else rank
                    key = (eff, rank, arrival, order)
                    if best_key is None or key < best_key:
                        best, best_key = k, key
            if best < 0:
                return
            cursors[best] += 1
            yield queues[best][1][cursors[best] - 1][2]
