"""Flags shared by commands that load a model."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    from fastmode.engine.config import DTYPES, WEIGHT_FORMATS

    p.add_argument("--model", default=None, help="Hugging Face directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: bf16 only where the CPU/GPU computes it natively")
    p.add_argument("--weights", default="native", choices=WEIGHT_FORMATS,
                   help="GGUF weights: native blocks with fp32 activations (default), native with int8 "
                        "activations (llama.cpp's arithmetic), or dequantized to --dtype")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--tier", default="standard", choices=["fast", "standard", "flex"])


def load_llm_and_params(args: argparse.Namespace):
    """(LLM, SamplingParams) from the shared flags, or None after printing why not."""
    import sys

    from fastmode import LLM
    from fastmode.loader import ModelLoadError

    try:
        params = sampling_from_args(args)
        return LLM(model=args.model, dtype=args.dtype, weights=args.weights), params
    except (ModelLoadError, ValueError) as e:
        print(f"fastmode: {e}", file=sys.stderr)
        return None


def sampling_from_args(args: argparse.Namespace):
    from fastmode.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
    )
