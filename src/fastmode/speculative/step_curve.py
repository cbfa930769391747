"""Measured step time against the number of rows (tokens) a step computes. No torch.

Speculation turns a decode step of B rows into a verify step of B(k+1) rows.
What that costs depends on the machine, the kernels and the batch: the native
kernels take one path up to 8 activation rows and another beyond, and the
machines this project runs on have put a 4-row step anywhere from 1.3x to 1.6x
a 1-row step (`benchmarks/kernels.py`). A fixed per-token verify cost cannot
describe that, so the policy asks this curve. The engine seeds it at start-up
(`step_timing.py` times steps of each row count the policy may ask for) and then
feeds it every step that computed no prompt chunk (only decodes and
verifications): an exponential moving average of the seconds per distinct row
count, interpolated linearly in between and extrapolated along the slope of
the two largest measured counts, after making the estimates non-decreasing in
rows (noise can put them out of order). One observation moves an estimate by at most
a factor of two before averaging: on a shared machine a step the OS preempted
can take many times its usual time, and one such step must not switch
speculation off.
"""

from __future__ import annotations

import bisect


class StepCurve:
    def __init__(self, ema: float = 0.2):
        if not 0 < ema <= 1:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.ema = ema
        self._rows: list[int] = []  # sorted row counts with a measurement
        self._seconds: dict[int, float] = {}  # the moving average per row count
        self._fit: dict[int, float] | None = None  # the same, made non-decreasing in rows (lazily)

    def observe(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds <= 0:
            return
        self._fit = None
        old = self._seconds.get(rows)
        if old is None:
            bisect.insort(self._rows, rows)
            self._seconds[rows] = seconds
        else:
            seconds = min(max(seconds, old / 2), old * 2)
            self._seconds[rows] = (1 - self.ema) * old + self.ema * seconds

    def _fitted(self) -> dict[int, float]:
        """The estimates made non-decreasing in rows (pool-adjacent-violators: a run of counts
        that noise put out of order gets its mean). More rows never make a step cheaper, and
        a start-up measurement on a busy machine can say otherwise."""
        if self._fit is None:
            blocks: list[list[float]] = []  # [sum, count] per pooled run, in row order
            for r in self._rows:
                blocks.append([self._seconds[r], 1.0])
                while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                    total, n = blocks.pop()
                    blocks[-1][0] += total
                    blocks[-1][1] += n
            values = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
            self._fit = dict(zip(self._rows, values))
        return self._fit

    @property
    def ready(self) -> bool:
        """Whether any row count has an estimate (two measured counts give the slope)."""
        return len(self._rows) >= 2

    def measured(self) -> dict[int, float]:
        """The current estimate at every measured row count."""
        return dict(self._seconds)

    def seconds(self, rows: int) -> float | None:
        """Estimated step time for `rows` rows; None with fewer than two measured counts
        (unless `rows` itself was measured)."""
        fit = self._fitted()
        if rows in fit:
            return fit[rows]
        xs = self._rows
        if len(xs) < 2:
            return None
        i = bisect.bisect_left(xs, rows)
        if i == 0:
            lo, hi = xs[0], xs[1]
        elif i == len(xs):
            lo, hi = xs[-2], xs[-1]
        else:
            lo, hi = xs[i - 1], xs[i]
        y0, y1 = fit[lo], fit[hi]
        return max(y0 + (y1 - y0) * (rows - lo) / (hi - lo), 1e-9)

    def relative(self, batch: int, extra_rows: int) -> float | None:
        """Time of a step with `batch + extra_rows` rows over one with `batch` rows."""
        base, longer = self.seconds(batch), self.seconds(batch + extra_rows)
        if base is None or longer is None:
            return None
        return max(longer / base, 1.0)  # more rows never make a step cheaper; noise can say otherwise
