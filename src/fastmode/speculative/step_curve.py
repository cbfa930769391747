"""Measured step time against the number of rows (tokens) a step computes. No torch.

Speculation turns a decode step of B rows into a verify step of B(k+1) rows.
What that costs depends on the machine, the kernels and the batch: the native
kernels take one path up to 8 activation rows and another beyond, and the
machines this project runs on have put a 4-row step anywhere from 1.3x to 1.6x
a 1-row step (`benchmarks/kernels.py`). A fixed per-token verify cost cannot
describe that, so the policy asks this curve. The engine seeds it at start-up
(`step_timing.py` times steps of each row count the policy may ask for) and then
feeds it every step that computed no prompt chunk (only decodes and verifications).

The curve is a **scale** times a **shape**. The shape is each row count's cost relative to
the smallest measured count (whose shape is 1); the scale is that count's seconds, i.e. how
fast the machine runs right now. Every observed step moves the scale (what its seconds over
its row count's shape say); a step of a row count other than the smallest also moves that
count's shape, at half the rate. A shared machine's speed changes by whole factors within
minutes, and serving observes some row counts all the time (plain decodes) and others rarely
(long verifications): with a separate absolute average per row count, a rarely observed count
would keep the seconds of whatever the machine's speed was when it was last seen, and the
policy would price its verification from a busy minute long past. With the scale shared, a
change of speed seen at any row count carries over to all of them.

Between measured counts the shape is interpolated linearly and beyond them extrapolated
along the slope of the two largest, after making it non-decreasing in rows (noise can
put estimates out of order). One observation moves the scale or a shape value by at
most a factor of two before averaging: a step the OS preempted can take many times its
usual time, and one such step must not switch speculation off.
"""

from __future__ import annotations

import bisect


class StepCurve:
    def __init__(self, ema: float = 0.2):
        if not 0 < ema <= 1:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.ema = ema
        self._rows: list[int] = []  # sorted row counts with a measurement
        self._scale: float | None = None  # seconds per unit of shape, now (moving average)
        self._shape: dict[int, float] = {}  # row count -> cost in units of the scale (moving average)
        self._fit: dict[int, float] | None = None  # the shape made non-decreasing in rows (lazily)

    def observe(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds <= 0:
            return
        self._fit = None
        if self._scale is None:  # the first observation is the reference
            self._rows, self._shape, self._scale = [rows], {rows: 1.0}, seconds
            return
        shape = self._shape.get(rows)
        if shape is None:  # a new row count: its cost relative to the machine's speed now
            bisect.insort(self._rows, rows)
            self._shape[rows] = seconds / self._scale
            ref = self._rows[0]
            if ref == rows:  # a new smallest count becomes the reference (shape 1)
                unit = self._shape[ref]
                self._shape = {r: v / unit for r, v in self._shape.items()}
                self._scale *= unit
            return
        w, scale = self.ema, self._scale
        implied = min(max(seconds / shape, scale / 2), scale * 2)  # the machine's speed this step says
        self._scale = scale = (1 - w) * scale + w * implied
        if rows != self._rows[0]:
            relative = min(max(seconds / scale, shape / 2), shape * 2)
            self._shape[rows] = (1 - w / 2) * shape + w / 2 * relative

    def _fitted(self) -> dict[int, float]:
        """The shape made non-decreasing in rows (pool-adjacent-violators: a run of counts that
        noise put out of order gets its mean). More rows never make a step cheaper, and a
        start-up measurement on a busy machine can say otherwise."""
        if self._fit is None:
            blocks: list[list[float]] = []  # [sum, count] per pooled run, in row order
            for r in self._rows:
                blocks.append([self._shape[r], 1.0])
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
        """The current estimate (seconds) at every measured row count, before the monotone fit."""
        scale = self._scale or 0.0
        return {r: scale * s for r, s in self._shape.items()}

    def seconds(self, rows: int) -> float | None:
        """Estimated step time for `rows` rows; None with fewer than two measured counts
        (unless `rows` itself was measured)."""
        if self._scale is None:
            return None
        fit = self._fitted()
        if rows in fit:
            return self._scale * fit[rows]
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
        return self._scale * max(y0 + (y1 - y0) * (rows - lo) / (hi - lo), 1e-9)

    def relative(self, batch: int, extra_rows: int) -> float | None:
        """Time of a step with `batch + extra_rows` rows over one with `batch` rows."""
        base, longer = self.seconds(batch), self.seconds(batch + extra_rows)
        if base is None or longer is None:
            return None
        return max(longer / base, 1.0)  # more rows never make a step cheaper; noise can say otherwise
