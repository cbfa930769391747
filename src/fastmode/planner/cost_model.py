"""Time of one engine step from the bytes it moves and the FLOPs it does.

For a step that processes `tokens` tokens on `T` devices (tensor parallel):

    t_mem  = (weight bytes read + KV bytes read/written) / (T * eta_m * BW)
    t_comp = (2 * active params * tokens + attention FLOPs) / (T * eta_c * FLOP/s)
    t_step = max(t_mem, t_comp, t_floor) + t_comm + t_overhead

with t_overhead = overhead_s + per_token_s * tokens + per_seq_s * sequences
+ per_kv_token_s * cached tokens read (the last three fitted by `fastmode calibrate`).
Where the engine's kernels compute in row tiles (`Hardware.token_tile`), the
linear FLOPs and per_token_s count tokens rounded up to whole tiles.

with t_comm = 2 * layers all-reduces of the step's activations when T > 1, and
t_floor = layers * per-layer latency on SRAM machines (which also pay one hop
per pipeline-stage boundary). One formula covers decode, prefill and a mixed
chunked-prefill step, so a simulator can call `step_s` once per scheduler step.
Where a calibrated engine switches kernels with the step's token count, the
figures of the step's regime price it (`Hardware.at_step_tokens`).
Pure Python + numpy: this module must never import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fastmode.planner.hardware import Hardware
from fastmode.planner.model_spec import ModelSpec
from fastmode.planner.moe import expected_distinct_experts
from fastmode.planner.weight_format import WeightFormat, resolve_format

ACTIVATION_BYTES = 2  # bf16 activations in all-reduces


@dataclass(frozen=True)
class StepCost:
    """Breakdown of one step. Seconds unless named otherwise; `total_s` is what to charge."""

    mem_s: float
    comp_s: float
    floor_s: float  # SRAM per-layer latency floor (0 on GPUs)
    comm_s: float  # all-reduces (GPUs) or pipeline hops (SRAM)
    overhead_s: float
    bytes_moved: float  # per step, all devices together
    flops: float
    tokens: int

    @property
    def total_s(self) -> float:
        return max(self.mem_s, self.comp_s, self.floor_s) + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        """Which term sets the step time: 'memory', 'compute' or 'latency-floor'."""
        terms = {"memory": self.mem_s, "compute": self.comp_s, "latency-floor": self.floor_s}
        return max(terms, key=terms.__getitem__)


@dataclass(frozen=True)
class CostModel:
    """Step-time model for one model on one kind of device.

    `tp` is the number of devices the model is split over: tensor parallel on
    GPUs and CPUs; on SRAM machines the chips form a pipeline of
    min(tp, layers) stages (weights must live on-chip, so tp is a capacity
    figure there). `tp=None` picks the fewest devices that hold the weights.
    `dtype_bytes`, when given, stores every tensor at that width and overrides
    `weight_format`; `eta_m`/`eta_c`, when given, override the hardware's.
    """

    hardware: Hardware
    model: ModelSpec
    tp: int | None = None
    weight_format: str | WeightFormat | None = None
    dtype_bytes: float | None = None
    kv_dtype_bytes: float = 2.0
    eta_m: float | None = None
    eta_c: float | None = None
    fmt: WeightFormat = field(init=False)
    num_devices: int = field(init=False)

    def __post_init__(self) -> None:
        fmt = (
            WeightFormat.uniform(self.dtype_bytes)
            if self.dtype_bytes
            else resolve_format(self.weight_format or self.model.default_format)
        )
        object.__setattr__(self, "fmt", fmt)
        if self.kv_dtype_bytes <= 0:
            raise ValueError("kv_dtype_bytes must be > 0")
        for name in ("eta_m", "eta_c"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1]")
        devices = self.tp if self.tp is not None else self._auto_devices()
        if devices < 1:
            raise ValueError("tp must be >= 1")
        if devices > 1 and not self.hardware.is_sram and self.hardware.link_bw_bytes_per_s <= 0:
            raise ValueError(f"{self.hardware.name} has no device-to-device link: tp must be 1")
        object.__setattr__(self, "num_devices", int(devices))

    # ---- layout ---------------------------------------------------------------
    def _auto_devices(self) -> int:
        need = self.devices_needed()
        if self.hardware.is_sram:
            return need
        return 1 << (need - 1).bit_length()  # tensor parallel wants a power of two

    @property
    def pipeline_stages(self) -> int:
        """Sequential stages a token passes through (1 on GPUs)."""
        return min(self.num_devices, self.model.num_layers) if self.hardware.is_sram else 1

    @property
    def shard_width(self) -> float:
        """Devices sharing one stage's work (= tp on GPUs)."""
        return self.num_devices / self.pipeline_stages

    @property
    def microbatches_in_flight(self) -> int:
        """Batches that can be in the machine at once: one per pipeline stage."""
        return self.pipeline_stages

    # ---- bytes and capacity ---------------------------------------------------
    @cached_property
    def weight_bytes(self) -> float:
        """All weights as stored, across all devices."""
        return self.model.weight_bytes(self.fmt)

    @cached_property
    def _static_read_bytes(self) -> float:
        """Weights streamed by every step whatever the batch: all but routed experts
        and the input embedding table (a lookup reads only the rows it needs)."""
        m = self.model
        routed = m.num_moe_layers * m.num_experts * m.expert_bytes(self.fmt)
        input_table = 0.0 if m.tied_embeddings else m.vocab_size * m.hidden_size * self.fmt.embed_bytes_per_param
        return self.weight_bytes - routed - input_table

    def weight_bytes_read(self, tokens: float) -> float:
        """Weight bytes one step streams when it processes `tokens` tokens."""
        m = self.model
        if not m.is_moe:
            return self._static_read_bytes
        touched = expected_distinct_experts(m.num_experts, m.experts_per_token, tokens)
        return self._static_read_bytes + m.num_moe_layers * touched * m.expert_bytes(self.fmt)

    def memory_per_device_bytes(self, batch: int, context_len: int) -> float:
        """Weights plus the KV of `batch` sequences of `context_len` tokens per microbatch."""
        seqs = batch * self.microbatches_in_flight
        kv = seqs * self.model.kv_bytes(context_len, self.kv_dtype_bytes)
        return (self.weight_bytes + kv) / self.num_devices

    def fits(self, batch: int, context_len: int) -> bool:
        """Do weights and KV for this load fit in the devices' usable memory?"""
        return self.memory_per_device_bytes(batch, context_len) <= self.hardware.usable_mem_bytes

    def devices_needed(self, batch: int = 1, context_len: int = 0) -> int:
        """Fewest devices whose usable memory holds the weights plus this KV load."""
        hw, m = self.hardware, self.model
        kv_seq = m.kv_bytes(context_len, self.kv_dtype_bytes)
        d = max(1, math.ceil((self.weight_bytes + batch * kv_seq) / hw.usable_mem_bytes))
        for _ in range(1_000_000):
            stages = min(d, m.num_layers) if hw.is_sram else 1
            if self.weight_bytes + batch * stages * kv_seq <= d * hw.usable_mem_bytes:
                return d
            d += 1
        raise ValueError("the KV load grows faster than the devices added: it never fits")

    # ---- step time ------------------------------------------------------------
    def step_cost(
        self,
        prefill_chunks: Sequence[tuple[int, int]] = (),
        decode_context_lens: Sequence[int] = (),
        tokens_per_decode_seq: int = 1,
    ) -> StepCost:
        """Cost of one step.

        prefill_chunks: (num_tokens, context_before) per prefilling sequence.
        decode_context_lens: tokens already in each decoding sequence's KV cache.
        tokens_per_decode_seq: 1 for plain decode, k+1 for a speculative verify.
        """
        m = self.model
        ctx = np.asarray(decode_context_lens, dtype=np.float64)
        q = int(tokens_per_decode_seq)
        if q < 1:
            raise ValueError("tokens_per_decode_seq must be >= 1")
        chunks = [(int(n), int(c)) for n, c in prefill_chunks if n > 0]
        if any(c < 0 for _, c in chunks) or (ctx < 0).any():
            raise ValueError("context lengths must be >= 0")
        tokens = sum(n for n, _ in chunks) + q * len(ctx)
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
        hw = self.hardware.at_step_tokens(tokens)
        rows = hw.tiled_tokens(tokens)  # what the linears compute: whole row tiles where the engine tiles

        # Bytes: weights once per step; each sequence reads its old KV and writes its new KV.
        kv_tok = m.kv_bytes_per_token(self.kv_dtype_bytes)
        kv_held = sum(m.kv_tokens_held(c + n) for n, c in chunks) + float(np.sum(self._kv_held_np(ctx + q)))
        bytes_moved = self.weight_bytes_read(tokens) + kv_held * kv_tok

        # FLOPs: 2 per active parameter per token (prefill needs logits only for its
        # last token), plus attention: QK^T and SV, 2 FLOPs each per head-dim per key.
        lm_head = m.vocab_size * m.hidden_size
        linear = 2.0 * m.matmul_params_per_token * q * len(ctx)
        linear += sum(2.0 * ((m.matmul_params_per_token - lm_head) * n + lm_head) for n, _ in chunks)
        key_layers = sum(self._keys_attended(c, n) for n, c in chunks)
        key_layers += float(np.sum(self._keys_attended(ctx, q)))
        flops = linear * rows / tokens + 4.0 * m.num_heads * m.head_dim * key_layers

        width = self.shard_width
        mem_s = bytes_moved / (width * (self.eta_m or hw.eta_m) * hw.mem_bw_bytes_per_s)
        comp_s = flops / (width * (self.eta_c or hw.eta_c) * hw.peak_flops(self.fmt.compute_dtype))
        floor_s = m.num_layers * hw.layer_floor_s
        overhead_s = (
            hw.overhead_s
            + hw.per_token_s * rows
            + hw.per_seq_s * (len(chunks) + len(ctx))
            + hw.per_kv_token_s * kv_held
        )  # the last two are 0 unless calibrated (fastmode calibrate)
        return StepCost(mem_s, comp_s, floor_s, self._comm_s(tokens), overhead_s, bytes_moved, flops, tokens)

    def step_s(
        self,
        num_prefill_tokens: int = 0,
        decode_context_lens: Sequence[int] = (),
        prefill_context_before: int = 0,
        tokens_per_decode_seq: int = 1,
    ) -> float:
        """Seconds for a mixed step: one prefill chunk plus a decode batch."""
        chunks = [(num_prefill_tokens, prefill_context_before)] if num_prefill_tokens else []
        return self.step_cost(chunks, decode_context_lens, tokens_per_decode_seq).total_s

    def decode_step_s(self, context_lens: Sequence[int]) -> float:
        """Seconds for one decode step of a batch (one entry per sequence)."""
        return self.step_cost((), context_lens).total_s

    def prefill_step_s(self, num_tokens: int, context_before: int = 0) -> float:
        """Seconds to prefill `num_tokens` of one sequence after `context_before` cached tokens."""
        return self.step_cost([(num_tokens, context_before)]).total_s

    def prefill_time_s(self, prompt_tokens: int, chunk_tokens: int = 8192) -> float:
        """Seconds to prefill a whole prompt alone, in chunks of `chunk_tokens`."""
        total, done = 0.0, 0
        while done < prompt_tokens:
            n = min(chunk_tokens, prompt_tokens - done)
            total += self.prefill_step_s(n, done)
            done += n
        return total

    def crossover_batch(self, context_len: int) -> int | None:
        """Smallest decode batch whose step is compute-bound, or None up to 2^20.

        Long contexts can keep decode memory-bound at any batch: each sequence's KV
        read then costs more time than its FLOPs.
        """

        def compute_bound(b: int) -> bool:
            return self.step_cost((), np.full(b, context_len)).bound == "compute"

        lo, hi = 1, 1
        while not compute_bound(hi):
            if hi >= 1 << 20:
                return None
            lo, hi = hi, hi * 2
        if compute_bound(lo):
            return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
        return hi

    # ---- helpers --------------------------------------------------------------
    def _kv_held_np(self, tokens: np.ndarray) -> np.ndarray:
        m = self.model
        full = m.num_layers - m.num_sliding_layers
        sliding = m.num_sliding_layers * np.minimum(tokens, m.sliding_window_tokens)
        return (full * tokens + sliding) / m.num_layers

    def _keys_attended(self, context_before, n: int):
        """Sum over the n new tokens and all layers of the keys each attends to (causal).

        Works elementwise on a numpy array of `context_before` values too.
        """
        m, c = self.model, context_before
        full = (m.num_layers - m.num_sliding_layers) * (n * c + n * (n + 1) / 2)
        if not m.num_sliding_layers:
            return full
        w = m.sliding_window_tokens
        k = np.clip(w - c, 0, n)  # new tokens whose position is still inside the window
        return full + m.num_sliding_layers * (k * c + k * (k + 1) / 2 + (n - k) * w)

    def _comm_s(self, tokens: int) -> float:
        hw = self.hardware
        if hw.is_sram:
            return (self.pipeline_stages - 1) * hw.hop_latency_s
        t = self.num_devices
        if t == 1:
            return 0.0
        # Ring all-reduce of the step's activations, twice per layer (after attention
        # and after the FFN). Beyond the scale-up domain the slower network sets the pace.
        inside = t <= hw.scaleup_domain
        bw = hw.link_bw_bytes_per_s if inside else (hw.scaleout_bw_bytes_per_s or hw.link_bw_bytes_per_s)
        lat = hw.allreduce_latency_s if inside else max(hw.scaleout_latency_s, hw.allreduce_latency_s)
        msg_bytes = tokens * self.model.hidden_size * ACTIVATION_BYTES
        one = lat + 2 * (t - 1) / t * msg_bytes / bw
        return 2 * self.model.num_layers * one
