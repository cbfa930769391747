"""Sampling fields as every dialect's request models declare them: finite, in range and
representable by the code that uses them.

A value the sampler cannot handle must be refused where the request enters (a 400 naming
the field), never reach the engine, where it would fail a step and with it every other
request in the batch. Where a value means the same as one that works, it is served as that:

- temperature: fp32 logits divided by a subnormal temperature overflow to inf, and their
  softmax is NaN. Below MIN_TEMPERATURE a draw is the most likely token anyway, so such a
  temperature is served as 0, greedy (vLLM draws the same line).
- top_p: the sampler compares fp32 cumulative probabilities with it; a subnormal top_p
  rounds to 0 there and drops every token. Below MIN_TOP_P only the most likely token is
  kept anyway, so a smaller top_p is served as MIN_TOP_P.
- seed: the generator takes 64-bit seeds, and n choices use seed + i, so a seed is an int64.
- NaN and infinities are refused everywhere.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

MIN_TEMPERATURE = 1e-5  # below it sampling is greedy
MIN_TOP_P = 1e-6  # below it top_p keeps the most likely token only, as MIN_TOP_P does
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
TOP_K_MAX = 2**31 - 1


def _greedy_below_min(t: float) -> float:
    return 0.0 if t < MIN_TEMPERATURE else t


def _top_p_floor(p: float) -> float:
    return max(p, MIN_TOP_P)


def temperature(max_value: float):
    """A temperature field in [0, max_value]; tiny values are greedy."""
    return Annotated[float, Field(ge=0, le=max_value, allow_inf_nan=False), AfterValidator(_greedy_below_min)]


TopP = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), AfterValidator(_top_p_floor)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]


TopK = Annotated[int, Field(ge=-1, le=TOP_K_MAX)]  # -1 and 0: no top-k filter
Temperature = temperature(2)  # OpenAI's range
Temperature1 = temperature(1)  # Anthropic's range
