"""Steady-state decode at a fixed batch: the numbers a price sheet is made of.

Every sequence in the batch is assumed to sit at the same context length (the
average over its decode), which is what the fast-mode articles' bus picture needs (a bus
that leaves at once is faster per rider and dearer):

    per-user tok/s  = tokens per step per sequence / t_step
    aggregate tok/s = batch * microbatches in flight * per-user tok/s
    $/Mtok          = usd_per_hour * devices / (3600 * aggregate) * 1e6

Prices count output (decode) tokens only: prefill is charged separately by the
engine's metering and ignored here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fastmode.planner.cost_model import CostModel
from fastmode.planner.speculative import SpecConfig, spec_cycle


@dataclass(frozen=True)
class OperatingPoint:
    """One (model, hardware, layout, batch, context) point. Units in the names."""

    model: str
    hardware: str
    weight_format: str
    devices: int
    batch: int  # sequences per microbatch
    microbatches: int  # > 1 only on pipelined SRAM machines
    context_tokens: int
    step_time_s: float  # one plain step, or one draft+verify cycle with speculation
    per_user_tok_s: float
    aggregate_tok_s: float
    usd_per_hour: float | None  # all devices together
    usd_per_mtok: float | None
    price_is_estimate: bool
    fits: bool
    memory_per_device_bytes: float
    bound: str
    mem_s: float
    comp_s: float
    comm_s: float
    overhead_s: float
    speculative: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(
    cm: CostModel,
    batch: int,
    context_tokens: int,
    spec: SpecConfig | None = None,
    draft: CostModel | None = None,
    usd_per_hour_per_device: float | None = None,
) -> OperatingPoint:
    """Decode speed and price for `batch` sequences at `context_tokens` each.

    `usd_per_hour_per_device` overrides the catalog price (needed where none is public).
    """
    if batch < 1 or context_tokens < 0:
        raise ValueError("batch must be >= 1 and context_tokens >= 0")
    ctx = np.full(batch, context_tokens)
    cost = cm.step_cost((), ctx)
    spec_info = None
    if spec is None:
        step_s, tokens_per_seq = cost.total_s, 1.0
    else:
        cycle = spec_cycle(cm, ctx, spec, draft)
        step_s, tokens_per_seq = cycle.cycle_s, cycle.tokens_per_seq
        spec_info = {
            "acceptance": spec.acceptance,
            "draft_len": spec.draft_len,
            "draft_cost_ratio": spec.draft_cost_ratio,
            "expected_tokens": cycle.tokens_per_seq,
            "speedup": cycle.speedup,
            "closed_form_speedup": spec.closed_form_speedup,
            "verify_s": cycle.verify_s,
            "draft_s": cycle.draft_s,
        }
    per_user = tokens_per_seq / step_s
    aggregate = per_user * batch * cm.microbatches_in_flight
    hw = cm.hardware
    price = usd_per_hour_per_device if usd_per_hour_per_device is not None else hw.usd_per_hour
    total_price = None if price is None else price * cm.num_devices
    usd_per_mtok = None if total_price is None else total_price / (3600.0 * aggregate) * 1e6
    return OperatingPoint(
        model=cm.model.name,
        hardware=hw.name,
        weight_format=cm.fmt.name,
        devices=cm.num_devices,
        batch=batch,
        microbatches=cm.microbatches_in_flight,
        context_tokens=context_tokens,
        step_time_s=step_s,
        per_user_tok_s=per_user,
        aggregate_tok_s=aggregate,
        usd_per_hour=total_price,
        usd_per_mtok=usd_per_mtok,
        price_is_estimate=hw.price_is_estimate and usd_per_hour_per_device is None,
        fits=cm.fits(batch, context_tokens),
        memory_per_device_bytes=cm.memory_per_device_bytes(batch, context_tokens),
        bound=cost.bound,
        mem_s=cost.mem_s,
        comp_s=cost.comp_s,
        comm_s=cost.comm_s,
        overhead_s=cost.overhead_s,
        speculative=spec_info,
    )


def bus_curve(
    cm: CostModel,
    batches: Iterable[int],
    context_tokens: int,
    spec: SpecConfig | None = None,
    usd_per_hour_per_device: float | None = None,
    only_fitting: bool = True,
) -> list[OperatingPoint]:
    """`evaluate` over a batch sweep; drops batches whose KV does not fit unless told not to."""
    points = [evaluate(cm, b, context_tokens, spec, usd_per_hour_per_device=usd_per_hour_per_device) for b in batches]
    return [p for p in points if p.fits or not only_fitting]


def power_of_two_batches(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to and including max_batch (which need not be a power of two)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def layout_for_load(
    hardware, model, batch: int, context_tokens: int, tp: int | None = None, **cost_kwargs
) -> CostModel:
    """A CostModel on the fewest devices that hold weights plus this batch's KV.

    GPUs round up to a power of two (tensor parallel must divide the heads);
    SRAM machines take the exact chip count; a CPU (no device links) stays at 1.
    An explicit `tp` is used as given.
    """
    if tp is not None:
        return CostModel(hardware, model, tp=tp, **cost_kwargs)
    probe = CostModel(hardware, model, tp=1, **cost_kwargs)
    if hardware.kind == "cpu":
        return probe
    need = probe.devices_needed(batch, context_tokens)
    devices = need if hardware.is_sram else 1 << (need - 1).bit_length()
    return CostModel(hardware, model, tp=devices, **cost_kwargs)


def frontier(
    hardware,
    model,
    batches: Iterable[int],
    context_tokens: int,
    spec: SpecConfig | None = None,
    usd_per_hour_per_device: float | None = None,
    max_devices: int = 4096,
    **cost_kwargs,
) -> list[OperatingPoint]:
    """The speed/price menu one kind of hardware can offer: Pareto-optimal points.

    Candidates are every batch in `batches` on every layout from the fewest devices
    that hold it up to a full scale-up domain (GPUs: powers of two; SRAM machines:
    exactly the chips needed; CPUs: one). A point is kept unless another is both
    faster per user and no more expensive per token. Sorted fastest first.
    Layouts above `max_devices` are left out (on SRAM machines the KV of every
    in-flight microbatch must fit on-chip, which explodes at long contexts).
    """
    candidates = []
    for b in batches:
        smallest = layout_for_load(hardware, model, b, context_tokens, **cost_kwargs)
        layouts = [smallest.num_devices]
        if hardware.kind == "hbm":
            while layouts[-1] * 2 <= max(hardware.scaleup_domain, smallest.num_devices):
                layouts.append(layouts[-1] * 2)
        for devices in layouts:
            if devices > max_devices:
                break
            cm = layout_for_load(hardware, model, b, context_tokens, tp=devices, **cost_kwargs)
            p = evaluate(cm, b, context_tokens, spec, usd_per_hour_per_device=usd_per_hour_per_device)
            if p.fits:
                candidates.append(p)
    return pareto(candidates)


def pareto(points: Iterable[OperatingPoint]) -> list[OperatingPoint]:
    """Points not dominated in (higher per-user tok/s, lower $/Mtok), fastest first.

    Without prices, cost per token is compared as devices / aggregate tok/s.
    """

    def cost(p: OperatingPoint) -> float:
        return p.usd_per_mtok if p.usd_per_mtok is not None else p.devices / p.aggregate_tok_s

    kept, best_cost = [], float("inf")
    for p in sorted(points, key=lambda p: (-p.per_user_tok_s, cost(p))):
        if cost(p) < best_cost:
            kept.append(p)
            best_cost = cost(p)
    return kept
