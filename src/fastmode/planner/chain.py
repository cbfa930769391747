"""Reliability of n-step pipelines: expected time and cost to a *correct* result.

A pipeline of n steps, each right with probability p (independently), succeeds
in one go with probability p^n. How much a failure costs depends on what you can
see, so three retry strategies are modelled; each gives the expected number of
steps executed before a correct end-to-end result:

- "pipeline"  no verifier: a failure shows only at the end, the whole pipeline
              reruns. Attempts are geometric with success p^n:
              E[steps] = n / p^n.
- "restart"   a verifier catches a failed step at once, and the pipeline restarts
              from step 1 (state is lost). Expected trials until n successes in a
              row: E[steps] = (1 - p^n) / ((1 - p) * p^n).
- "step"      a verifier catches a failed step and only that step is retried:
              E[steps] = n / p.

Time per step = latency_s + tokens_per_step / tok_s; cost per step =
(tokens_per_step * usd_per_mtok + input_tokens_per_step * usd_per_mtok_in) / 1e6.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

STRATEGIES = ("pipeline", "restart", "step")
STRATEGY_TEXT = {
    "pipeline": "no verifier: retry the whole pipeline until it succeeds (geometric, 1/p^n attempts)",
    "restart": "verifier catches a failed step; restart the pipeline from step 1",
    "step": "verifier catches a failed step; retry only that step (n/p steps)",
}

# The two articles comparing Anthropic's and OpenAI's fast modes (the README's "Why a fast
# mode") compare the modes below. Their accuracy figures: Terminal-Bench 2.0, Codex-Spark 58.4% vs
# GPT-5.3-Codex 77.3%.
SPARK_BENCH, FULL_BENCH = 58.4, 77.3


@dataclass(frozen=True)
class Mode:
    """One way to run each step. Invariants: 0 < p_step <= 1, tok_s > 0, prices >= 0."""

    name: str
    p_step: float
    tok_s: float  # output tokens per second per user
    usd_per_mtok: float  # output price
    tokens_per_step: int = 1000  # output tokens per step
    latency_s: float = 0.0  # per step: TTFT plus round trip
    input_tokens_per_step: int = 0
    usd_per_mtok_in: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.p_step <= 1:
            raise ValueError(f"{self.name}: p_step must be in (0, 1]")
        if self.tok_s <= 0 or self.tokens_per_step < 1:
            raise ValueError(f"{self.name}: need tok_s > 0 and tokens_per_step >= 1")
        if min(self.usd_per_mtok, self.usd_per_mtok_in, self.latency_s, self.input_tokens_per_step) < 0:
            raise ValueError(f"{self.name}: prices, latency and input tokens must be >= 0")

    @property
    def step_time_s(self) -> float:
        return self.latency_s + self.tokens_per_step / self.tok_s

    @property
    def step_cost_usd(self) -> float:
        return (self.tokens_per_step * self.usd_per_mtok + self.input_tokens_per_step * self.usd_per_mtok_in) / 1e6


def success_probability(p_step: float, n_steps: int) -> float:
    """p^n: the chance an n-step pipeline is right end to end in one go."""
    return p_step**n_steps


def expected_steps(p_step: float, n_steps: int, strategy: str) -> float:
    """Expected steps executed until a correct n-step result (see module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}")
    if not 0 < p_step <= 1 or n_steps < 1:
        raise ValueError("need 0 < p_step <= 1 and n_steps >= 1")
    p, n = p_step, n_steps
    if strategy == "pipeline":
        return n / p**n
    if strategy == "step":
        return n / p
    if p == 1:
        return float(n)
    return (1 - p**n) / ((1 - p) * p**n)


@dataclass(frozen=True)
class ChainResult:
    mode: str
    strategy: str
    n_steps: int
    p_step: float
    p_success_once: float
    expected_steps: float
    expected_time_s: float
    expected_cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_chain(mode: Mode, n_steps: int, strategy: str = "pipeline") -> ChainResult:
    steps = expected_steps(mode.p_step, n_steps, strategy)
    return ChainResult(
        mode.name,
        strategy,
        n_steps,
        mode.p_step,
        success_probability(mode.p_step, n_steps),
        steps,
        steps * mode.step_time_s,
        steps * mode.step_cost_usd,
    )


def seed_modes(tokens_per_step: int = 1000, latency_s: float = 0.0) -> list[Mode]:
    """The modes the two articles comparing Anthropic's and OpenAI's fast modes set side by side.
    Standard/fast: Anthropic's Opus 4.6 figures; Spark: OpenAI's Codex-Spark figures.

    Spark has no public per-token price, so it is given the standard price (an
    assumption stated in the note); its per-step accuracy is the articles' scaling.
    """
    spark_low = round(0.9 * SPARK_BENCH / FULL_BENCH, 2)  # 0.68
    common = {"tokens_per_step": tokens_per_step, "latency_s": latency_s}
    return [
        Mode("standard", 0.9, 65.0, 25.0, note="Opus 4.6 standard: ~65 tok/s, $25/Mtok out", **common),
        Mode("fast", 0.9, 170.0, 150.0, note="Opus 4.6 fast mode: ~170 tok/s (2.5x), 6x price", **common),
        Mode(
            "spark-0.68",
            spark_low,
            1000.0,
            25.0,
            note="Codex-Spark: 1000+ tok/s; p = 0.9 x 58.4/77.3; price assumed = standard",
            **common,
        ),
        Mode(
            "spark-0.75",
            0.75,
            1000.0,
            25.0,
            note="Codex-Spark with the articles' milder per-step guess 0.75; price assumed",
            **common,
        ),
    ]


def seed_table(n_steps: int = 10) -> list[dict[str, Any]]:
    """The fast-mode articles' p^n table, with where each p comes from."""
    rows = [
        (0.8, "articles: per-step 80%"),
        (0.9, "articles: per-step 90%"),
        (0.9 * SPARK_BENCH / FULL_BENCH, "0.9 x 58.4/77.3 (Spark scaled from 90%)"),
        (0.75, "articles: milder Spark guess"),
        (0.8 * SPARK_BENCH / FULL_BENCH, "0.8 x 58.4/77.3 (Spark scaled from 80%; not in the articles)"),
    ]
    return [
        {"p_step": p, "n_steps": n_steps, "p_success": success_probability(p, n_steps), "source": src}
        for p, src in rows
    ]


def modes_from_agent_eval(document: dict[str, Any]) -> tuple[list[Mode], list[str]]:
    """One mode per route measured by `fastmode eval --agent` (its `--json` document), and
    a note for each route that cannot be priced (no right step, so p = 0).

    Every figure is measured on the routes' agent runs: p is the per-step accuracy
    (after the verifier's retries, on its route), latency_s the mean time to first
    token per step, tok_s the output rate after it, tokens_per_step the mean output
    per step, and the price the metered cost of a step over its output tokens, prefill
    included (so the input price is 0: it is already in).
    """
    if document.get("kind") != "fastmode-agent-eval":
        raise ValueError("not a `fastmode eval --agent --json` document (its kind is not fastmode-agent-eval)")
    modes, notes = [], []
    for route in document.get("routes", []):
        figures = route["chain_inputs"]
        name = route["route"]
        if figures["p_step"] <= 0 or figures["tok_s"] <= 0:
            why = "no right step was measured (p = 0)" if figures["p_step"] <= 0 else "no output rate was measured"
            notes.append(f"{name}: {why}")
            continue
        p = route["p_step"]
        modes.append(
            Mode(
                name,
                min(1.0, figures["p_step"]),
                figures["tok_s"],
                figures["usd_per_mtok"],
                tokens_per_step=max(1, round(figures["tokens_per_step"])),
                latency_s=figures["latency_s"],
                note=f"measured: p {p['correct']}/{p['total']} steps, {route['num_tasks']} agent tasks",
            )
        )
    return modes, notes


def compare(modes: Iterable[Mode], n_steps: int, strategies: Iterable[str] = STRATEGIES) -> list[ChainResult]:
    return [evaluate_chain(m, n_steps, s) for s in strategies for m in modes]
