"""How far speculation could go at batch 1, priced at the engine's own measured step times.

Used by `speculative_engine.py`: the n-gram ceiling (an oracle that drafts exactly the lookup
tokens the model will accept) and the i.i.d. bound for a draft model at its measured
acceptance and cost. Both are speed-ups of the decode steps alone (prefill excluded).
"""

from __future__ import annotations

import statistics
import time


class StepLog:
    """Seconds and rows of every step that computed no prompt chunk (decodes and
    verifications), recorded around the engine's model runner."""

    def __init__(self, engine):
        self.start_block()
        self.decode_s = 0.0  # running total; callers take differences
        runner, execute = engine.runner, engine.runner.execute

        def timed(out):
            t0 = time.perf_counter()
            result = execute(out)
            dt = time.perf_counter() - t0
            if all(s.num_tokens - s.num_draft_tokens == 1 for s in out.scheduled):
                self.decode_s += dt
                self.samples.setdefault(sum(s.num_tokens for s in out.scheduled), []).append(dt)
            return result

        runner.execute = timed

    def start_block(self) -> None:
        self.samples: dict[int, list[float]] = {}  # rows -> seconds of each step since start_block()

    def step_line(self) -> tuple[float, float] | None:
        """(seconds at 0 rows, seconds per row): a least-squares line through the median step
        time of each row count measured since start_block(), each weighted by its number of
        steps; None with fewer than two counts. A step at batch 1 grows about linearly with
        its rows here (each row adds its share of FMAs over the weights the step streams
        anyway); medians keep single slow steps out."""
        pts = [(r, statistics.median(v), len(v)) for r, v in self.samples.items()]
        if len(pts) < 2:
            return None
        n = sum(w for *_, w in pts)
        mx, my = sum(r * w for r, _, w in pts) / n, sum(t * w for _, t, w in pts) / n
        slope = sum(w * (r - mx) * (t - my) for r, t, w in pts) / sum(w * (r - mx) ** 2 for r, _, w in pts)
        return my - slope * mx, slope


def lookup_ceiling(prompts, outs, line: tuple[float, float], kmax: int) -> float:
    """Decode-step speed-up at batch 1 of an oracle prompt-lookup policy: at each step it
    drafts exactly the lookup tokens that will be accepted, a step of r rows costing
    a + b r (`line`, measured), a plain step a + b."""
    from fastmode.speculative.ngram import propose_ngram

    a, b = line
    plain = spec = 0.0
    for p_ids, o in zip(prompts, outs):
        toks = list(p_ids) + list(o.token_ids)
        i = len(p_ids)
        plain += (len(toks) - i) * (a + b)
        while i < len(toks):
            drafts = propose_ngram(toks[:i], kmax)
            accepted = 0
            while accepted < len(drafts) and i + accepted < len(toks) and toks[i + accepted] == drafts[accepted]:
                accepted += 1
            spec += a + b * (1 + accepted)
            i += accepted + 1
    return plain / spec


def iid_bound(acceptance: float, draft_cost: float, line: tuple[float, float], kmax: int) -> float:
    """The best expected decode-step speed-up over k <= kmax for i.i.d. drafts accepted at
    `acceptance` (the planner's E(k), Leviathan et al.), a drafting round of k tokens
    costing k * `draft_cost` plain steps and a verification of k drafts (1 + k rows)
    priced by the measured `line`."""
    from fastmode.planner.speculative import expected_tokens_per_verify

    a, b = line
    return max(
        expected_tokens_per_verify(acceptance, k) / ((a + b * (1 + k)) / (a + b) + k * draft_cost)
        for k in range(1, kmax + 1)
    )


def report_batch1(llm, steps: StepLog, prompts, outs, rows: list[dict]) -> dict:
    """Print and return the n-gram ceiling for this workload's batch-1 block (`outs`: its plain
    outputs) and, where the draft model drafted, its i.i.d. bound; `rows`: the workload's results."""
    line = steps.step_line()
    kmax = llm.engine.spec.config.max_draft_tokens
    medians = {r: round(1000 * statistics.median(v), 1) for r, v in sorted(steps.samples.items())}
    counts = {r: len(v) for r, v in sorted(steps.samples.items())}
    ceiling = None if line is None else lookup_ceiling(prompts, outs, line, kmax)
    result = {
        "decode_speedup": ceiling,
        "step_ms_median_by_rows": medians,
        "steps_by_rows": counts,
        "step_line_ms": None if line is None else [1000 * line[0], 1000 * line[1]],
    }
    draft = next((r for r in rows if r["batch"] == 1 and r["method"] == "draft"), None)
    if line is not None and draft is not None and draft["acceptance"]:
        c = llm.engine.spec.draft_cost
        bound, free = iid_bound(draft["acceptance"], c, line, kmax), iid_bound(draft["acceptance"], 0.0, line, kmax)
        result["draft_bound"] = {
            "acceptance": draft["acceptance"],
            "draft_cost": c,
            "decode_speedup": bound,
            "free_draft_decode_speedup": free,
        }
        print(
            f"{'':>10} draft bound at batch 1: {bound:.2f}x of the decode steps at its acceptance "
            f"{draft['acceptance']:.2f} and measured round cost {c:.2f} steps per token ({free:.2f}x "
            f"were drafting free)",
            flush=True,
        )
    print(
        f"{'':>10} n-gram ceiling at batch 1: "
        + (
            "-"
            if line is None
            else f"{ceiling:.2f}x of the decode steps (oracle k; a step of r rows "
            f"{1000 * line[0]:.1f} + {1000 * line[1]:.2f} r ms, fitted to the median ms by rows {medians} over "
            f"{counts} steps)"
        ),
        flush=True,
    )
    return result
