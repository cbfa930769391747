"""One calibration run on an already loaded model: measure, fit, build the calibrated cost model."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

from fastmode.calibrate.calibration_file import calibration_dict
from fastmode.calibrate.fit import MIN_POINTS, FitResult, fit_step_times, split_sizes
from fastmode.calibrate.measure import Progress, SweepConfig, measure_sweep
from fastmode.calibrate.points import StepPoint
from fastmode.loader import LoadedModel
from fastmode.planner.catalog import load_hardware
from fastmode.planner.cost_model import CostModel
from fastmode.planner.model_spec import ModelSpec
from fastmode.planner.weight_format import WeightFormat


@dataclass(frozen=True)
class CalibrationRun:
    points: list[StepPoint]
    fit: FitResult
    spec: ModelSpec  # the engine's model as the cost model sees it
    weight_format: str  # how the engine holds the weights: "bf16", "fp32", or a GGUF "*-native" format
    calibration: dict[str, Any]  # the JSON to write
    cost_model: CostModel  # calibrated, tp = 1


# Natively run GGUF combinations the planner names (planner/weight_format.py), by the loader's
# weight_format: their figures are the block sizes native_format measures.
NAMED_NATIVE = {"Q4_1+Q8_0": "q4_1-native", "Q8_0": "q8_0-native"}


def native_format(model) -> WeightFormat | None:
    """The bytes per parameter a model's linears read per step, by weight class, measured on the
    loaded layers themselves: blocks as stored for each GGUF block type the kernels run natively
    (Q4_0 18 B per 32 weights, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34; Q4_K 144 B per 256, Q5_K 176,
    Q6_K 210), the dtype's width for any dequantized layer. A file mixes types (Q4_K_M keeps some
    attn_v and ffn_down in Q6_K), so each class's figure is its layers' bytes over their weights.
    None when no layer runs on blocks."""
    import torch

    from fastmode.models.quant_linear import GGML_TYPES, QuantLinear

    names = {v: k for k, v in GGML_TYPES.items()}
    sums = {"embed": [0, 0], "attn": [0, 0], "ffn": [0, 0]}  # class -> [bytes, weights]
    types = set()
    for name, m in model.named_modules():
        if isinstance(m, QuantLinear):
            nbytes, weights = m.qweight.numel(), m.in_features * m.out_features
            types.add(names[m.qtype])
        elif isinstance(m, torch.nn.Linear):
            nbytes, weights = m.weight.numel() * m.weight.element_size(), m.weight.numel()
        else:
            continue
        kind = "attn" if ".self_attn." in f".{name}." else "ffn" if ".mlp." in f".{name}." else "embed"
        sums[kind][0] += nbytes
        sums[kind][1] += weights
    if not types:
        return None
    per = {k: (b / w if w else 4.0) for k, (b, w) in sums.items()}
    return WeightFormat(
        "+".join(sorted(types)).lower() + "-native",
        per["embed"],
        per["attn"],
        per["ffn"],
        "fp32",
        "fastmode's CPU kernels on GGUF blocks as stored, measured on the loaded layers; fp32 arithmetic",
    )


def engine_model_spec(loaded: LoadedModel) -> tuple[ModelSpec, str | WeightFormat]:
    """(ModelSpec, planner weight format) of a loaded engine model: the bytes its linears read per
    step. GGUF blocks run natively: the planner's *-native format where it names the combination,
    else the figures measured on the layers (`native_format`); dequantized weights: fp32/bf16."""
    fmt: str | WeightFormat | None = NAMED_NATIVE.get(loaded.weight_format.replace("+int8-activations", ""))
    if fmt is None:
        fmt = native_format(loaded.model)
    if fmt is None:
        fmt = "fp32" if str(loaded.dtype).endswith("float32") else "bf16"
    return ModelSpec.from_config(loaded.name, loaded.config, default_format=fmt), fmt


def format_name(fmt: str | WeightFormat) -> str:
    return fmt if isinstance(fmt, str) else fmt.name


def kernel_regimes(fmt: str | WeightFormat) -> tuple[int, int]:
    """(split, tile) of the engine's matmuls for weight format `fmt`. split: the step tokens up to
    which they run their small-row kernel (0: one kernel for every step size); tile: the rows the
    larger steps' kernel computes per pass (16 on AMX tiles; 0: no tiles). Native GGUF blocks go
    through fastmode's kernels, which read blocks directly up to `direct_max_rows()` rows."""
    if not format_name(fmt).endswith("-native"):
        return 0, 0
    from fastmode import kernels

    ops = kernels.ops()
    return (int(ops.direct_max_rows()), int(ops.amx_tile_rows())) if ops is not None else (0, 0)


def choose_split(points: list[StepPoint], kernel_split: int, split_tokens: int | None, progress: Progress) -> int:
    """The split to fit with: `split_tokens` as given, or (None) the engine's kernel switch
    `kernel_split` where the points hold enough on each side of it."""
    if split_tokens is not None:
        return split_tokens
    sizes = split_sizes(points, kernel_split) if kernel_split else ()
    if sizes and min(sizes) < MIN_POINTS:
        progress(
            f"warning: the engine switches kernels above {kernel_split} tokens a step, but the points hold "
            f"{sizes} on either side (< {MIN_POINTS}): fitting one set of figures"
        )
        return 0
    return kernel_split


def measure_interleaved(
    loaded: LoadedModel, sweep: SweepConfig, progress: Progress = lambda s: None
) -> list[StepPoint]:
    """The whole sweep (decode and prefill points interleaved: measure.measure_sweep), `sweep.rounds`
    times, merged (merge_rounds)."""
    return merge_rounds(measure_rounds(loaded, sweep, progress))


def measure_rounds(
    loaded: LoadedModel, sweep: SweepConfig, progress: Progress = lambda s: None
) -> list[list[StepPoint]]:
    """Each round's points, unmerged (the same points in the same order every round)."""
    per_round: list[list[StepPoint]] = []
    for rnd in range(sweep.rounds):
        if sweep.rounds > 1:
            progress(f"round {rnd + 1} of {sweep.rounds}")
        per_round.append(measure_sweep(loaded, sweep, progress))
    return per_round


def merge_rounds(per_round: list[list[StepPoint]]) -> list[StepPoint]:
    """One point per measured point: the mean of all its rounds' timed steps (each round's mean
    weighted by its sample count), the median of the rounds' medians, their mean context and
    sample count summed; spread becomes the rounds' own (max - min) / mean where it is larger.

    The mean, not a median over rounds: a round that fell in a slow spell of the machine is part
    of the time the calibration spans, as it is of a load measured in the same span.
    """
    if len(per_round) == 1:
        return per_round[0]
    merged = []
    for same in zip(*per_round, strict=True):  # every round measures the same points in the same order
        key = {(p.kind, p.num_decodes, p.prefill_tokens, p.prefill_context) for p in same}
        if len(key) != 1:
            raise ValueError(f"rounds measured different points: {sorted(key)}")
        n = sum(p.num_samples for p in same)
        step_s = sum(p.step_s * p.num_samples for p in same) / n
        between = (max(p.step_s for p in same) - min(p.step_s for p in same)) / step_s
        median_s = statistics.median(p.median_s for p in same) if all(p.median_s > 0 for p in same) else 0.0
        merged.append(
            dataclasses.replace(
                same[0],
                step_s=step_s,
                median_s=median_s,
                decode_context=statistics.fmean(p.decode_context for p in same),
                num_samples=n,
                spread=max(between, max(p.spread for p in same)),
            )
        )
    return merged


def calibrate_loaded(
    loaded: LoadedModel,
    sweep: SweepConfig,
    hardware: str = "local",
    usd_per_hour: float | None = None,
    progress: Progress = lambda s: None,
    points: list[StepPoint] | None = None,
    fitted_from: str = "",
    split_tokens: int | None = None,
) -> CalibrationRun:
    """Measure `loaded` with `sweep` (or re-fit given `points`) and fit the cost model.
    `split_tokens`: fit steps of at most this many tokens apart (0: never; None: at the engine's
    kernel switch, when the points allow)."""
    import torch

    if sweep.num_threads:
        torch.set_num_threads(sweep.num_threads)
    spec, fmt = engine_model_spec(loaded)
    if points is None:
        points = measure_interleaved(loaded, sweep, progress)
        fitted_from = (
            f"fastmode calibrate: {loaded.name} {format_name(fmt)}, batches {min(sweep.batches)}-{max(sweep.batches)}, "
            f"contexts {','.join(map(str, sweep.contexts))}, chunks {','.join(map(str, sweep.chunk_sizes))}, "
            f"{torch.get_num_threads()} threads, {sweep.clock} clock"
            + (f", {sweep.rounds} rounds" if sweep.rounds > 1 else "")
        )
    base = load_hardware(hardware)
    from fastmode.engine.llm_engine import resolve_kv_dtype

    kv_bytes = torch.finfo(resolve_kv_dtype("auto", loaded.dtype)).bits // 8  # what the measured engines stored
    kernel_split, kernel_tile = kernel_regimes(fmt)
    split = choose_split(points, kernel_split, split_tokens, progress)
    tile = kernel_tile if split else 0  # tiles price the larger steps only
    fit = fit_step_times(
        points, base, spec, weight_format=fmt, kv_dtype_bytes=kv_bytes, split_tokens=split, token_tile=tile
    )
    usd = usd_per_hour if usd_per_hour is not None else base.usd_per_hour
    cal = calibration_dict(fit, points, hardware, loaded.name, fmt, fitted_from, usd)
    cm = CostModel(fit.apply(base), spec, tp=1, weight_format=fmt, kv_dtype_bytes=kv_bytes)
    return CalibrationRun(points, fit, spec, format_name(fmt), cal, cm)
