"""Flags shared by commands that load a model, generated from LoadConfig and SamplingParams."""

from __future__ import annotations

import argparse
import sys

from fastmode.engine.config import LoadConfig
from fastmode.engine.tiers import Tier
from fastmode.flags import add_dataclass_args, pick
from fastmode.sampling_params import SamplingParams


def add_model_args(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, LoadConfig, only=("model", "dtype", "weights"), title="model")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    # Greedy and short by default on the command line.
    add_dataclass_args(
        p,
        SamplingParams,
        only=("max_tokens", "temperature", "top_p", "top_k", "seed", "stop"),
        defaults={"max_tokens": 128, "temperature": 0.0},
        repeatable=("stop",),
        title="sampling",
        description="temperature 0 is greedy; top-k 0 and top-p 1 turn those filters off; a seed "
        "makes sampling reproducible; --stop ends the output at a string",
    )
    p.add_argument(
        "--tier", default="standard", choices=[t.value for t in Tier], help="service tier (default: standard)"
    )


def load_llm_and_params(args: argparse.Namespace):
    """(LLM, SamplingParams) from the shared flags, or None after printing why not."""
    from fastmode import LLM  # imports torch: only when a command runs
    from fastmode.loader import ModelLoadError

    try:
        params = sampling_from_args(args)
        return LLM(**pick(LoadConfig, args)), params
    except (ModelLoadError, ValueError) as e:
        print(f"fastmode: {e}", file=sys.stderr)
        return None


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(**pick(SamplingParams, args))
