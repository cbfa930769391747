"""Time the engine's decode/verify steps at start-up, so the speculation policy prices
verification from this machine from the first request on.

Measuring takes seconds (tens on a loaded machine), so a measured curve is kept in the
fastmode cache directory, keyed by what sets a step's time: the model file and its shape,
the weight and KV formats, the thread count, the kernel path and the CPU. An engine started
again on the same machine reads it (`cached_step_curve`) and the policy's running average of
real steps keeps it current from there; a curve older than `MAX_AGE_S` is measured again.

Two kinds of step are timed, because the same row count costs differently on each path: a
plain decode step of B sequences (one row each: the fused decode path), and a verify step of r
rows (one sequence's token plus its drafts, or several sequences' at once: the per-layer path).
Both run through the model runner exactly as serving runs them: sequences with a cached
context, each carrying up to `ROWS_PER_SEQ` rows. Their KV blocks come from the scheduler's
pool and go back to it; what the steps write there is overwritten before any request reads it
(nothing of it is registered in the prefix cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from pathlib import Path

from fastmode.engine.block_manager import BlockManager
from fastmode.engine.scheduler import ScheduledSeq, SchedulerOutput
from fastmode.engine.sequence import Sequence
from fastmode.sampling_params import SamplingParams

log = logging.getLogger(__name__)

CONTEXT_TOKENS = 96  # cached context per sequence: a short prompt's worth
ROWS_PER_SEQ = 7  # one token and 6 drafts: the default draft length


Shape = tuple[bool, int]  # (verifies drafts, rows)


def step_shapes(max_batch: int, max_draft_tokens: int) -> list[Shape]:
    """The steps the policy may ask about: plain decodes of 1 to max_batch sequences, and
    verifications of every row count up to 8 (the kernels' small-batch path), then a few up to
    max_batch sequences each verifying max_draft_tokens drafts."""
    top = max(1, max_batch) * (max_draft_tokens + 1)
    counts = set(range(2, min(top, 8) + 1))
    r = 8
    while r < top:
        r = min(top, r * 3 // 2)
        counts.add(r)
    return [(False, b) for b in range(1, max(1, max_batch) + 1)] + [(True, r) for r in sorted(counts)]


def measure_step_curve(
    runner, blocks: BlockManager, shapes: list[Shape], repeats: int = 3, token_id: int = 1
) -> tuple[dict[Shape, float], float]:
    """Median seconds of a step of each shape (`runner`: a ModelRunner), and how steady the
    machine was meanwhile (`spread`). The shapes take turns, `repeats` rounds after one warm-up
    round, so drift on a shared machine hits every shape alike. Returns ({}, inf) if the KV
    pool cannot hold the sequences."""
    params = SamplingParams(temperature=0, max_tokens=1)
    num_seqs = max(max(-(-rows // ROWS_PER_SEQ) if verify else rows for verify, rows in shapes), 1)
    seqs = [Sequence(f"step-timing-{i}", [token_id] * CONTEXT_TOKENS, params) for i in range(num_seqs)]
    try:
        for seq in seqs:
            if not blocks.allocate(seq, CONTEXT_TOKENS + ROWS_PER_SEQ):
                return {}, math.inf
            seq.num_computed_tokens = CONTEXT_TOKENS - 1
            seq.draft_token_ids = [token_id] * (ROWS_PER_SEQ - 1)
        steps = {shape: _step(seqs, *shape) for shape in shapes}
        times: dict[Shape, list[float]] = {shape: [] for shape in shapes}
        for rnd in range(repeats + 1):
            for shape in shapes:
                t0 = time.perf_counter()
                runner.execute(steps[shape])
                if rnd:  # round 0 warms every shape up
                    times[shape].append(time.perf_counter() - t0)
        return {shape: statistics.median(v) for shape, v in times.items()}, spread(times)
    finally:
        for seq in seqs:
            blocks.free(seq)
            runner.release(seq.request_id)


def spread(times: dict) -> float:
    """The median over shapes of the slowest repeat over the fastest: about 1 on a quiet
    machine, well above on a busy one."""
    return statistics.median(max(v) / min(v) for v in times.values() if v and min(v) > 0)


def _step(seqs: list[Sequence], verify: bool, rows: int) -> SchedulerOutput:
    """A plain decode step of `rows` sequences, or a verify step of `rows` rows: sequences of up
    to ROWS_PER_SEQ rows each, each at its frontier (its last token plus the first of its
    drafts), as the scheduler builds a verify step."""
    if not verify:
        return SchedulerOutput(step=0, scheduled=[ScheduledSeq(seq, 1, 0) for seq in seqs[:rows]])
    scheduled = []
    for seq in seqs:
        n = min(rows, ROWS_PER_SEQ)
        if n <= 0:
            break
        rows -= n
        scheduled.append(ScheduledSeq(seq, n, n - 1))
    return SchedulerOutput(step=0, scheduled=scheduled)


MAX_AGE_S = 7 * 24 * 3600.0
# A measurement whose repeats spread more than this is used for the engine that made it but not
# saved: a curve timed while other work shared the cores would be read by every engine after it.
MAX_SPREAD = 1.3


# Part of every key: raised whenever what a saved curve guarantees changes, so files saved under
# weaker rules are not read (2: saved only from a steady measurement).
CURVE_FORMAT = 2


def curve_key(parts: dict) -> str:
    """A file name for the curve of an engine described by `parts` (JSON-serialisable)."""
    blob = json.dumps({"curve_format": CURVE_FORMAT, **parts}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def cached_step_curve(
    cache: Path | None, parts: dict, shapes: list[Shape], measure, now_s: float | None = None
) -> tuple[dict[Shape, float], bool]:
    """Step seconds for `shapes`: from `cache` (a directory; None: no cache) when a fresh curve
    for `parts` holds every shape, else `measure(shapes)` -> (curve, spread), saved there when
    the machine was steady (spread <= MAX_SPREAD). Returns the curve and whether it came from the
    cache. A cache that cannot be read or written is measured around, never an error."""
    now_s = time.time() if now_s is None else now_s
    shapes = [(bool(v), int(r)) for v, r in shapes]
    path = None if cache is None else cache / "step_curves" / f"{curve_key({**parts, 'shapes': shapes})}.json"
    if path is not None:
        try:
            saved = json.loads(path.read_text())
            curve = {(bool(v), int(r)): float(t) for v, r, t in saved["seconds"]}
            if now_s - float(saved["measured_at"]) <= MAX_AGE_S and set(shapes) <= set(curve):
                return {shape: curve[shape] for shape in shapes}, True
        except (OSError, ValueError, KeyError, TypeError):
            pass
    curve, steadiness = measure(shapes)
    if steadiness > MAX_SPREAD:
        log.info("step times spread %.2fx between repeats: used, not saved", steadiness)
    elif path is not None and curve:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            seconds = [[v, r, t] for (v, r), t in sorted(curve.items())]
            tmp.write_text(json.dumps({"parts": parts, "measured_at": now_s, "seconds": seconds}, default=str))
            tmp.replace(path)
        except OSError as e:
            log.warning("could not save the step curve to %s: %s", path, e)
    return curve, False
