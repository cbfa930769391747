"""Engine configuration: one frozen dataclass; the CLI flags are generated from its fields."""

from __future__ import annotations

from dataclasses import dataclass, fields

from fastmode.engine.scheduler import SchedulerConfig
from fastmode.speculative.policy import SpecConfig

KV_CACHE_DTYPES = ("auto", "float16", "float32", "bfloat16", "fp16", "fp32", "bf16")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # None = the embedded default model
    dtype: str = "auto"  # bf16 on CUDA, fp32 on the CPU (see loader.load.resolve_dtype)
    weights: str = "native"  # native: a GGUF file's Q4_0/Q4_1/Q8_0 blocks run as stored (fp32 activations); native-int8: int8 activations; dequantize: expand to dtype
    kv_cache_gib: float = 1.0  # KV cache size; sets the number of blocks
    kv_cache_dtype: str = "auto"  # auto: float16 when the model computes in float32 (half the bytes attention reads), else the model's dtype; float16 | float32 | bfloat16
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    fast_lane_max_batch: int | None = 4
    aging_s: float | None = 60.0
    max_model_len: int | None = None  # None = the model's own context length
    enable_prefix_caching: bool = True
    usd_per_machine_hour: float = 1.0  # what one machine-hour of this engine costs
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    pack_weights: bool = True  # CPU fp32: pre-pack linear weights for oneDNN (see models/cpu_packing.py)
    speculative: str = "ngram"  # method where speculation is on by default: off | ngram | draft
    speculative_tiers: str = "fast"  # comma-separated tiers that speculate unless a request opts out
    num_speculative_tokens: int = 6  # upper bound on k; the policy adapts k to measured acceptance
    speculative_max_batch: int = 4  # no speculation when more sequences than this decode together (see fastmode calibrate)
    speculative_min_gain: float = 1.05  # a sequence speculates only when its expected speed-up is at least this (0 = always)
    draft_model: str | None = "auto"  # "auto" = the model's Spark if there is one; "spark", a path sharing the tokenizer, "layers:N" (the target's first N layers), None

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float32", "bf16", "fp32"):
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {self.dtype!r}")
        if self.weights not in ("native", "native-int8", "dequantize"):
            raise ValueError(f"weights must be native, native-int8 or dequantize, got {self.weights!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be > 0")
        if self.usd_per_machine_hour < 0:
            raise ValueError("usd_per_machine_hour must be >= 0")
        self.spec_config()  # validates the speculative fields

    def scheduler_config(self, kv_bytes_per_token: int, model_max_len: int) -> SchedulerConfig:
        num_blocks = int(self.kv_cache_gib * 2**30 // (kv_bytes_per_token * self.block_size))
        return SchedulerConfig(
            num_blocks=max(1, num_blocks),
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            fast_lane_max_batch=self.fast_lane_max_batch,
            aging_s=self.aging_s,
            max_model_len=min(self.max_model_len or model_max_len, model_max_len),
            enable_prefix_caching=self.enable_prefix_caching,
        )

    def spec_config(self) -> SpecConfig:
        tiers = tuple(t.strip() for t in self.speculative_tiers.split(",") if t.strip())
        return SpecConfig(
            method=self.speculative,
            tiers=tiers,
            max_draft_tokens=self.num_speculative_tokens,
            max_batch=self.speculative_max_batch,
            min_gain=self.speculative_min_gain,
        )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
