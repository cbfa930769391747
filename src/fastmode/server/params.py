"""Sampling fields as every dialect's request models declare them, and the one mapping from
them to `SamplingParams`.

Each dialect's body gives its sampling fields under the server's names as an `ApiSampling`
(`sampling()`: Anthropic's `stop_sequences` is `stop`, a field a dialect lacks is None), and
`sampling_params` turns that, with the turn's output budget, grammar and logprobs, into the
engine's `SamplingParams`. A field a client left out takes `SamplingParams`' default.

The fields are declared finite, in range and representable by the code that uses them.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from fastmode.sampling_params import SamplingParams, StructuredOutput
from fastmode.server.edge.errors import ApiError, clip

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
# An extension in every dialect: how to speculate for this request; None = the tier's default.
Speculative = Literal["off", "ngram", "draft"]


@dataclass(frozen=True)
class ApiSampling:
    """A request's sampling fields under the server's names, already checked by the body's field
    types; None (and the empty `stop`) = SamplingParams' default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    speculative: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Mapping[str, float] | None = None  # as OpenAI sends it: token id (a string) -> bias


def sampling_params(
    fields: ApiSampling,
    *,
    max_tokens: int,
    vocab_size: int,
    structured: StructuredOutput | None = None,
    logprobs: int | None = None,
) -> SamplingParams:
    """The engine's SamplingParams for a request, in every dialect: `fields` from its body,
    `max_tokens` its resolved output budget, `structured` its grammar, `logprobs` None (off) or
    how many alternatives per token. 400 for a logit_bias key that is no token id of a
    `vocab_size` vocabulary or a value SamplingParams refuses. What the served model cannot
    honour (a draft model it lacks) is its engine's to say: `ServedModel.check_request`."""
    values = {
        "temperature": fields.temperature,
        "top_p": fields.top_p,
        "top_k": fields.top_k,
        "seed": fields.seed,
        "max_tokens": max_tokens,
        "stop": fields.stop,
        "ignore_eos": fields.ignore_eos,
        "speculative": fields.speculative,
        "structured": structured,
        "logprobs": logprobs,
        "presence_penalty": fields.presence_penalty,
        "frequency_penalty": fields.frequency_penalty,
        "logit_bias": logit_bias_pairs(fields.logit_bias, vocab_size) or None,
    }
    try:
        return SamplingParams(**{k: v for k, v in values.items() if v is not None})
    except ValueError as e:
        raise ApiError("invalid_request", str(e)) from e


def logit_bias_pairs(logit_bias: Mapping[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """logit_bias as (token id, bias) pairs; 400 for a key that is no token id or a bias out of range."""
    pairs = []
    for key, bias in (logit_bias or {}).items():
        if not key.strip().isdigit() or not 0 <= int(key) < vocab_size:
            raise ApiError(
                "invalid_request",
                f"logit_bias: {clip(repr(key))} is not a token id of this model "
                f"(the keys are token ids in [0, {vocab_size}), as strings)",
                param="logit_bias",
            )
        if not -100 <= bias <= 100:
            raise ApiError(
                "invalid_request",
                f"logit_bias: the bias of token {key} is {bias}; biases are in [-100, 100]",
                param="logit_bias",
            )
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))
