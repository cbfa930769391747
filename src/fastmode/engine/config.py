"""Engine configuration: one frozen dataclass per concern, composed by `EngineConfig`.

- `LoadConfig`: which model (and draft model) to load, and how its weights are held;
- `CacheConfig`: the KV cache's size and element type;
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
    )  # native: a GGUF file's Q4_0/Q4_1/Q8_0 blocks run as stored (fp32 activations); native-int8: int8 activations; dequantize: expand to dtype
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

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be > 0")

    def num_blocks(self, kv_bytes_per_token: int, block_size: int) -> int:
        """Blocks of `block_size` tokens that fit in `kv_cache_gib` (at least one)."""
        return max(1, int(self.kv_cache_gib * 2**30 // (kv_bytes_per_token * block_size)))


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

    def scheduler_config(self, kv_bytes_per_token: int, model_max_len: int) -> SchedulerConfig:
        """The scheduler's configuration for a model with this KV size per token and context."""
        settings = self.scheduling
        return SchedulerConfig(
            **{f.name: getattr(settings, f.name) for f in fields(SchedulerSettings)},
            num_blocks=self.cache.num_blocks(kv_bytes_per_token, settings.block_size),
            max_model_len=min(self.max_model_len or model_max_len, model_max_len),
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


def _flat_index() -> dict[str, FlatField]:
    """Flat name or alias -> the part field it sets (parts only)."""
    index = {}
    for flat in EngineConfig.flat_fields():
        if flat.part is not None:
            for name in (flat.name, *flat.aliases):
                index[name] = flat
    return index
