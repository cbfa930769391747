"""Engine configuration: one frozen dataclass per concern, composed by `EngineConfig`.

- `LoadConfig`: which model (and draft model) to load, and how its weights are held;
- `CacheConfig`: the KV cache's size, element type, and the sliding-window layers' own pool;
- `SchedulerSettings` (engine/scheduler.py): batching, the fast lane, prefix caching;
- `SpecConfig` (speculative/policy.py): when and how far to speculate;
- plus the few settings of the engine itself (context cap, threads, price).

Each field is declared once, in its concern's class. Every field also has a flat
name, which is its name, or `speculative_<name>` for `SpecConfig`'s: the
keyword `EngineConfig(...)` and `LLM(...)` accept, and the `fastmode serve`
flag (--kebab-case), which the CLI generates from `EngineConfig.flat_fields()`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any

from fastmode.config import ModelConfig
from fastmode.engine.scheduler import SchedulerConfig, SchedulerSettings
from fastmode.speculative.policy import SpecConfig

# The one list of each choice (the CLI, the loader's callers and validation read these).
DTYPES = ("auto", "bfloat16", "float32", "bf16", "fp32")
WEIGHT_FORMATS = ("native", "native-int8", "dequantize")
KV_CACHE_DTYPES = ("auto", "float16", "float32", "bfloat16", "fp16", "fp32", "bf16")


@dataclass(frozen=True)
class LoadConfig:
    """What to load, and how its weights are held."""

    model: str | None = None  # a Hugging Face directory or .gguf file; None = the embedded default model
    dtype: str = field(
        default="auto", metadata={"choices": DTYPES}
    )  # auto: bf16 on CUDA, fp32 on the CPU (see loader.load.resolve_dtype)
    weights: str = field(
        default="native", metadata={"choices": WEIGHT_FORMATS}
    )  # native: a GGUF file's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K blocks run as stored (fp32 activations); native-int8: int8 activations; dequantize: expand to dtype
    pack_weights: bool = True  # CPU fp32: pre-pack linear weights for oneDNN (see models/cpu_packing.py)
    draft_model: str | None = (
        "auto"  # "auto" = the model's Spark if there is one; "spark", a path sharing the tokenizer, "layers:N" (the target's first N layers), None
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")


@dataclass(frozen=True)
class CacheConfig:
    """The KV cache: its size sets the number of blocks."""

    kv_cache_gib: float = 1.0  # KV cache size; sets the number of blocks
    kv_cache_dtype: str = field(
        default="auto", metadata={"choices": KV_CACHE_DTYPES}
    )  # auto: float16 when the model computes in float32 (half the bytes attention reads), else the model's dtype; float16 | float32 | bfloat16
    local_kv_pool: bool = True  # sliding-window layers (Gemma 3) keep only their window's KV, in a pool of their own

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be > 0")

    def num_blocks(self, kv_bytes_per_token: int, block_size: int) -> int:
        """Blocks of `block_size` tokens that fit in `kv_cache_gib` (at least one)."""
        return max(1, int(self.kv_cache_gib * 2**30 // (kv_bytes_per_token * block_size)))

    def split_blocks(
        self, kv_bytes_per_token: int, num_layers: int, num_local_layers: int, block_size: int, local_blocks_wanted: int
    ) -> tuple[int, int]:
        """(global blocks, local blocks) when `num_local_layers` of `num_layers` layers keep their
        KV in a pool of their own: the local pool gets `local_blocks_wanted` blocks, or as many as
        one pool would have (no sequence holds more local blocks than global ones), and the global
        layers get the rest of `kv_cache_gib`. With every layer local, the global pool has no
        tensors: it only counts positions, sized by the same budget as one pool."""
        one_pool = self.num_blocks(kv_bytes_per_token, block_size)
        num_local = min(local_blocks_wanted, one_pool)
        num_global_layers = num_layers - num_local_layers
        if num_global_layers <= 0:
            return one_pool, one_pool
        layer_block = kv_bytes_per_token // num_layers * block_size  # one block of one layer
        rest = int(self.kv_cache_gib * 2**30) - num_local * num_local_layers * layer_block
        return max(one_pool, rest // (num_global_layers * layer_block)), num_local


@dataclass(frozen=True)
class FlatField:
    """A setting of EngineConfig (a field of one of its parts, or its own) under its flat name:
    the keyword EngineConfig(...) takes and the CLI flag."""

    name: str
    part: str | None  # the EngineConfig field holding it; None: a field of EngineConfig itself
    owner: type  # the dataclass that declares it (its type hint and comment describe it)
    field: dataclasses.Field
    aliases: tuple[str, ...] = ()  # other flat names accepted for it


# Each part of EngineConfig, and the prefix its fields take as flat names.
_PART_PREFIX = {"load": "", "cache": "", "scheduling": "", "speculation": "speculative_"}
# Short forms of two speculation flags: `--speculative ngram`, `--num-speculative-tokens 4`.
_ALIASES = {"speculative_method": ("speculative",), "speculative_max_draft_tokens": ("num_speculative_tokens",)}


@dataclass(frozen=True, init=False)
class EngineConfig:
    """How the engine runs: its parts, plus the settings that belong to the engine itself.

    `EngineConfig(load=LoadConfig(...), ...)` sets whole parts; `EngineConfig(model=...,
    max_num_seqs=8, speculative="off")` sets fields of the parts by their flat names, over
    the parts given (so `dataclasses.replace(config, model=...)` works too).
    """

    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduling: SchedulerSettings = field(default_factory=SchedulerSettings)
    speculation: SpecConfig = field(default_factory=SpecConfig)
    max_model_len: int | None = None  # None = the model's own context length
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    usd_per_machine_hour: float = 1.0  # what one machine-hour of this engine costs

    def __init__(self, **kwargs: Any) -> None:
        values = {
            f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in fields(self)
        }
        by_name = _flat_index()
        changes: dict[str, dict[str, Any]] = {}
        for key, value in kwargs.items():
            if key in values:
                values[key] = value
            elif key in by_name:
                flat = by_name[key]
                changes.setdefault(flat.part, {})[flat.field.name] = value  # type: ignore[index]
            else:
                raise TypeError(f"EngineConfig got an unexpected keyword argument {key!r}")
        for part, part_changes in changes.items():
            values[part] = replace(values[part], **part_changes)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.usd_per_machine_hour < 0:
            raise ValueError("usd_per_machine_hour must be >= 0")

    def scheduler_config(
        self, kv_bytes_per_token: int, model_max_len: int, model: ModelConfig | None = None
    ) -> SchedulerConfig:
        """The scheduler's configuration for a model with this KV size per token and context.
        Given the `model`'s config, sliding-window layers get a pool of their own (see
        `local_blocks_wanted`) unless `local_kv_pool` is off."""
        settings = self.scheduling
        bs = settings.block_size
        num_blocks = self.cache.num_blocks(kv_bytes_per_token, bs)
        window, num_local = None, 0
        if model is not None and model.sliding_layers and model.sliding_window and self.cache.local_kv_pool:
            window = model.sliding_window
            wanted = local_blocks_wanted(window, bs, settings.max_num_seqs, settings.max_num_batched_tokens)
            num_blocks, num_local = self.cache.split_blocks(
                kv_bytes_per_token, model.num_layers, len(model.sliding_layers), bs, wanted
            )
        return SchedulerConfig(
            **{f.name: getattr(settings, f.name) for f in fields(SchedulerSettings)},
            num_blocks=num_blocks,
            max_model_len=min(self.max_model_len or model_max_len, model_max_len),
            sliding_window=window,
            num_local_blocks=num_local,
        )

    @classmethod
    def flat_fields(cls) -> list[FlatField]:
        """Every setting under its flat name, parts first, in declaration order."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in fields(cls):
            if f.name in _PART_PREFIX:
                owner = hints[f.name]
                for g in fields(owner):
                    name = _PART_PREFIX[f.name] + g.name
                    out.append(FlatField(name, f.name, owner, g, _ALIASES.get(name, ())))
            else:
                out.append(FlatField(f.name, None, cls, f))
        return out

    @classmethod
    def field_names(cls) -> list[str]:
        """The flat names (aliases aside)."""
        return [f.name for f in cls.flat_fields()]


def local_blocks_wanted(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Local blocks for `max_num_seqs` resident sequences at once. Between steps a sequence
    holds the blocks of the window before its next token: at most ceil((window - 1) / block_size)
    + 1. A step adds blocks for its tokens: at most max_num_batched_tokens / block_size in all,
    plus one per sequence where a chunk straddles a block boundary."""
    per_seq = -(-(window - 1) // block_size) + 2
    return max_num_seqs * per_seq + -(-max_num_batched_tokens // block_size)


def _flat_index() -> dict[str, FlatField]:
    """Flat name or alias -> the part field it sets (parts only)."""
    index = {}
    for flat in EngineConfig.flat_fields():
        if flat.part is not None:
            for name in (flat.name, *flat.aliases):
                index[name] = flat
    return index
