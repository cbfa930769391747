"""One entry point: a path (or None for the embedded model) -> model + tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fastmode.config import ModelConfig
from fastmode.loader.default_model import DEFAULT_MODEL_NAME, default_model_path
from fastmode.loader.errors import ModelLoadError
from fastmode.loader.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_dir
from fastmode.loader.weights import build_model
from fastmode.models.llama import LlamaModel

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "bf16": torch.bfloat16, "fp32": torch.float32}
WEIGHT_MODES = ("native", "native-int8", "dequantize")


def resolve_dtype(dtype: str) -> str:
    """ "auto": bf16 on CUDA, fp32 on the CPU.

    On the CPU the native kernels (a GGUF file's blocks times fp32 activations)
    are the fast path, and they compute in fp32. PyTorch's bf16 CPU path is
    measurably slower even where the CPU has AVX-512 BF16 and AMX (compare
    `benchmarks/peers.py --fastmode-dtype bfloat16` with the default); on
    AVX2-only CPUs bf16 matmuls fall back to a slow path altogether.
    """
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() else "float32"


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    config: ModelConfig
    name: str
    path: Path
    dtype: torch.dtype
    weight_format: str = (
        "fp32"  # what the linear layers run on: "fp32", "bf16", or the GGUF block formats, e.g. "Q4_1+Q8_0"
    )


def resolve_model_path(model: str | Path | None) -> tuple[Path, str]:
    """(path, served name). None means the embedded default model."""
    if model is None:
        return default_model_path(), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist (give a Hugging Face directory or a .gguf file)")
    if path.is_file() and path.suffix != ".gguf":
        raise ModelLoadError(f"{path}: a model file must be .gguf; for safetensors give the directory")
    name = path.stem if path.is_file() else path.name
    return path, name


def _spark_source(model: str | Path | None) -> Path | None:
    """The Spark folder/file `model` names: "spark", "<default model>-spark", or a Spark export path."""
    if model is None:
        return None
    from fastmode.distill.export import is_spark
    from fastmode.distill.spark import find_spark, spark_name

    if str(model) in ("spark", spark_name(DEFAULT_MODEL_NAME)) and not Path(model).exists():
        found = find_spark(DEFAULT_MODEL_NAME)
        if found is None:
            raise ModelLoadError(f"no Spark weights for {DEFAULT_MODEL_NAME}: build them with `fastmode distill`")
        return found
    return Path(model) if is_spark(model) else None


def _native_kernels(weights: str, torch_dtype: torch.dtype) -> bool:
    """Whether to keep a GGUF file's quantized blocks: asked for, computing in fp32 on CPU, kernels built."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {list(WEIGHT_MODES)}, got {weights!r}")
    if weights == "dequantize" or torch_dtype != torch.float32:
        return False
    from fastmode.kernels import ops

    return ops() is not None  # without a compiler: dequantized fp32, with a warning from fastmode.kernels


def weight_format(model: torch.nn.Module) -> str:
    """ "fp32", "bf16", or the block formats the linear layers run on (e.g. "Q4_1+Q8_0")."""
    from fastmode.models.quant_linear import GGML_TYPES, QuantLinear

    names = {v: k for k, v in GGML_TYPES.items()}
    found = set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            found.add(names[m.qtype])
            if m.int8_activations:
                found.add("int8-activations")
        elif isinstance(m, torch.nn.Linear):
            found.add({torch.bfloat16: "bf16", torch.float16: "fp16"}.get(m.weight.dtype, "fp32"))
    return "+".join(sorted(found)) or "fp32"


def load_model(
    model: str | Path | None = None,
    dtype: str = "auto",
    max_positions: int | None = None,
    weights: str = "native",
) -> LoadedModel:
    """Load `model`: None (the embedded default), a GGUF file, a Hugging Face
    directory, or a Spark ("spark", "SmolLM2-135M-Instruct-spark", or a Spark
    export path), which is rebuilt on the default model it was distilled from.

    `weights="native"` runs a GGUF file's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights as stored,
    with fastmode's kernels (CPU; blocks dequantized in registers, fp32
    activations); other tensors and formats are dequantized at load.
    `"native-int8"` quantizes activations to int8 per 32 values, llama.cpp's
    arithmetic: less faithful. `"dequantize"` expands every
    weight to `dtype` (the reference path; what training uses)."""
    spark = _spark_source(model)
    if spark is not None:
        from fastmode.distill.spark import spark_as_loaded

        try:
            return spark_as_loaded(spark, load_model(None, dtype, max_positions, weights))
        except ValueError as e:
            raise ModelLoadError(str(e)) from e
    dtype = resolve_dtype(dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    torch_dtype = DTYPES[dtype]
    path, name = resolve_model_path(model)
    if path.is_file():
        from fastmode.loader.gguf_file import read_gguf

        cfg, tensors, meta = read_gguf(path, native=_native_kernels(weights, torch_dtype))
        tokenizer = tokenizer_from_gguf(meta)
    else:
        from fastmode.loader.hf_dir import read_hf_dir

        cfg, tensors, eos = read_hf_dir(path)
        tokenizer = tokenizer_from_hf_dir(path, eos)
    net = build_model(cfg, tensors, torch_dtype, str(path), max_positions=max_positions)
    from fastmode.models.quant_linear import QuantLinear

    if any(isinstance(m, QuantLinear) for m in net.modules()):  # native weights: fused ops for the rest too
        from fastmode.kernels import ops
        from fastmode.models.llama import use_kernels

        use_kernels(net, ops())
    if weights == "native-int8":
        from fastmode.models.quant_linear import set_int8_activations

        set_int8_activations(net, True)
    return LoadedModel(
        model=net,
        tokenizer=tokenizer,
        config=cfg,
        name=name,
        path=path,
        dtype=torch_dtype,
        weight_format=weight_format(net),
    )
