"""Measured step time against the number of rows (tokens) a step computes. No torch.

Speculation turns a decode step of B rows into a verify step of B(k+1) rows.
What that costs depends on the machine, the kernels and the batch: the native
kernels take one path up to 8 activation rows and another beyond, and the
machines this project runs on have put a 4-row step anywhere from 1.3x to 1.6x
a 1-row step (`benchmarks/kernels.py`). A fixed per-token verify cost cannot
describe that, so the policy asks this curve. The engine seeds it at start-up
(`step_timing.py` times steps of each row count the policy may ask for) and then
feeds it every step that computed no prompt chunk (only decodes and verifications), as one of
two kinds: plain decode steps and steps that verify drafts.

The curve is a **scale** times a **shape**. The shape is each (kind, row count)'s cost
relative to the first one observed (normally a plain 1-row step, shape 1); the scale is that
one's seconds, i.e. how fast the machine runs right now. Every observed step moves the scale
(what its seconds over its shape say); a step of any other (kind, row count) also moves its own
shape, at half the rate. A shared machine's speed changes by whole factors within minutes, and
serving observes some row counts all the time (plain decodes) and others rarely (long
verifications): with a separate absolute average per row count, a rarely observed count would
keep the seconds of whatever the machine's speed was when it was last seen, and the policy
would price its verification from a busy minute long past. With the scale shared, a change of
speed seen at any row count carries over to all of them.

Between measured counts the shape is interpolated linearly and beyond them extrapolated
along the slope of the two largest, after making it non-decreasing in rows (noise can
put estimates out of order). One observation moves the scale or a shape value by at
most a factor of two before averaging: a step the OS preempted can take many times its
usual time, and one such step must not switch speculation off.
"""

from __future__ import annotations

import bisect


class StepCurve:
    """Step seconds by row count, for two kinds of step: plain decodes (`verify=False`: one row
    per sequence, the fused decode path) and steps that verify drafts (`verify=True`: the
    per-layer path with a causal span per sequence). The same row count costs more as a
    verification, so a plain step of B decodes is priced from plain steps and B decodes plus
    n drafts from verifications. A kind with too few measurements is priced from the other."""

    def __init__(self, ema: float = 0.2):
        if not 0 < ema <= 1:
            raise ValueError(f"ema must be in (0, 1], got {ema}")
        self.ema = ema
        self._rows: dict[bool, list[int]] = {False: [], True: []}  # sorted row counts measured, per kind
        self._scale: float | None = None  # seconds per unit of shape, now (moving average)
        self._ref: tuple[bool, int] | None = None  # the (kind, rows) of shape 1: the first one observed
        self._shape: dict[tuple[bool, int], float] = {}  # (kind, rows) -> cost in units of the scale
        self._fit: dict[bool, dict[int, float]] = {}  # per kind, the shape made non-decreasing (lazily)

    def observe(self, rows: int, seconds: float, verify: bool = True) -> None:
        if rows < 1 or seconds <= 0:
            return
        self._fit = {}
        key = (verify, rows)
        if self._scale is None:  # the first observation is the reference
            self._scale, self._ref = seconds, key
        shape = self._shape.get(key)
        if shape is None:  # a new row count: its cost relative to the machine's speed now
            bisect.insort(self._rows[verify], rows)
            self._shape[key] = seconds / self._scale
            return
        w, scale = self.ema, self._scale
        implied = min(max(seconds / shape, scale / 2), scale * 2)  # the machine's speed this step says
        self._scale = scale = (1 - w) * scale + w * implied
        if key != self._ref:
            relative = min(max(seconds / scale, shape / 2), shape * 2)
            self._shape[key] = (1 - w / 2) * shape + w / 2 * relative

    def _fitted(self, verify: bool) -> dict[int, float]:
        """The kind's shape made non-decreasing in rows (pool-adjacent-violators: a run of counts
        that noise put out of order gets its mean). More rows never make a step cheaper, and a
        start-up measurement on a busy machine can say otherwise."""
        fit = self._fit.get(verify)
        if fit is None:
            blocks: list[list[float]] = []  # [sum, count] per pooled run, in row order
            for r in self._rows[verify]:
                blocks.append([self._shape[(verify, r)], 1.0])
                while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                    total, n = blocks.pop()
                    blocks[-1][0] += total
                    blocks[-1][1] += n
            values = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
            fit = self._fit[verify] = dict(zip(self._rows[verify], values))
        return fit

    @property
    def ready(self) -> bool:
        """Whether any row count has an estimate (two measured counts give the slope)."""
        return len(self._shape) >= 2

    def measured(self, verify: bool | None = None) -> dict[int, float]:
        """The current estimate (seconds) at every measured row count of a kind (None: both; a row
        count measured as both kinds then reports its verification), before the monotone fit."""
        scale = self._scale or 0.0
        kinds = (False, True) if verify is None else (verify,)
        return {r: scale * self._shape[(v, r)] for v in kinds for r in self._rows[v]}

    def seconds(self, rows: int, verify: bool = True) -> float | None:
        """Estimated time of a step of `rows` rows of this kind; from the other kind where this
        one has neither the count nor two counts to interpolate; None with nothing to go on."""
        own = self._estimate(rows, verify)
        return own if own is not None else self._estimate(rows, not verify)

    def _estimate(self, rows: int, verify: bool) -> float | None:
        if self._scale is None:
            return None
        fit = self._fitted(verify)
        if rows in fit:
            return self._scale * fit[rows]
        xs = self._rows[verify]
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
        """Time of a step verifying `extra_rows` drafts beside `batch` decodes over the plain step."""
        base, longer = self.seconds(batch, verify=False), self.seconds(batch + extra_rows)
        if base is None or longer is None:
            return None
        return max(longer / base, 1.0)  # more rows never make a step cheaper; noise can say otherwise
