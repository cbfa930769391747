"""Load Spark: the teacher's embeddings and head + the stored student layers.

    teacher = load_model(None)                       # SmolLM2-135M-Instruct
    draft = load_spark(default_spark_dir(), teacher)  # a LlamaModel: a speculative draft
    served = spark_as_loaded(default_spark_dir(), teacher)  # a LoadedModel: serve it as its own model

The student shares the teacher's `embed_tokens`, `lm_head` and RoPE table
(no copies), so Spark adds only its layers to memory (about 35 M parameters
for 10 SmolLM2 layers).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from fastmode.distill.export import decode, is_spark, read_spark, teacher_identity
from fastmode.distill.student import SPARK_SUFFIX, assemble
from fastmode.env import cache_dir
from fastmode.loader import LoadedModel
from fastmode.loader.default_model import DEFAULT_MODEL_NAME
from fastmode.loader.load import weight_format
from fastmode.models.llama import DecoderLayer, LlamaModel, RMSNorm, use_kernels


def spark_name(teacher_name: str = DEFAULT_MODEL_NAME) -> str:
    """The served name of a teacher's Spark, e.g. "SmolLM2-135M-Instruct-spark"."""
    return teacher_name + SPARK_SUFFIX


def default_spark_dir(teacher_name: str = DEFAULT_MODEL_NAME) -> Path:
    """Where `fastmode distill` writes by default: <cache>/spark/<teacher>-spark (./<name> with the cache off)."""
    root = cache_dir()
    return (root / "spark" if root is not None else Path(".")) / spark_name(teacher_name)


def packaged_spark_dir(teacher_name: str = DEFAULT_MODEL_NAME) -> Path:
    """The Spark shipped inside the package (fastmode/data/spark/<teacher>-spark); it may not exist."""
    return Path(str(resources.files("fastmode").joinpath("data", "spark", spark_name(teacher_name))))


def find_spark(teacher_name: str = DEFAULT_MODEL_NAME) -> Path | None:
    """The Spark folder to use for `teacher_name`: the user's own `fastmode distill`
    output if there is one, else the copy shipped with the package, else None."""
    for folder in (default_spark_dir(teacher_name), packaged_spark_dir(teacher_name)):
        if is_spark(folder):
            return folder
    return None


def load_spark(path: str | Path, teacher: LoadedModel, check_teacher: bool = True) -> LlamaModel:
    """Rebuild the student stored at `path` (a spark.safetensors file or its folder) on `teacher`.

    The result is an eval-mode `LlamaModel` in the teacher's dtype, usable by
    the engine directly or as a draft. With `check_teacher`, the teacher's
    checkpoint must be the one Spark was distilled from (same sha256): a
    student on another model's embeddings produces noise.
    """
    tensors, info = read_spark(path)
    if check_teacher:
        have, want = teacher_identity(teacher.path), info["teacher"]
        if have["sha256"] != want["sha256"]:
            raise ValueError(
                f"{path} was distilled from {want['name']} (sha256 {want['sha256'][:12]}...), "
                f"not from {teacher.path} (sha256 {have['sha256'][:12]}...)"
            )
    num_layers = len(info["layer_indices"])
    cfg = replace(teacher.config, num_layers=num_layers)
    state = decode(tensors, teacher.dtype)
    with torch.device("meta"):  # no default init: every weight comes from the file (assign=True below)
        layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(num_layers))
        norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    layer_state = {k.removeprefix("layers."): v for k, v in state.items() if k.startswith("layers.")}
    layers.load_state_dict(layer_state, assign=True)
    norm.load_state_dict({"weight": state["norm.weight"]}, assign=True)
    model = assemble(teacher.model, layers, norm, spark_name(teacher.name))
    kernels = getattr(teacher.model.norm, "kernels", None)
    if kernels is not None:  # a teacher on fastmode's kernels: the student's layers run on them too
        from fastmode.models.quant_linear import GGML_TYPES, QuantLinear, quantize_layers

        int8 = any(m.int8_activations for m in teacher.model.modules() if isinstance(m, QuantLinear))
        # Stored Q4_1 blocks re-encode to the same blocks; any other format runs as Q8_0.
        qtype = GGML_TYPES["Q4_1" if info.get("format") == "q4_1" else "Q8_0"]
        quantize_layers(model, qtype=qtype, int8_activations=int8)
        use_kernels(model, kernels)
    return model.eval().requires_grad_(False)


def spark_as_loaded(path: str | Path, teacher: LoadedModel, check_teacher: bool = True) -> LoadedModel:
    """Spark wrapped as a `LoadedModel` (teacher's tokenizer) so an engine can serve it by name."""
    model = load_spark(path, teacher, check_teacher)
    return LoadedModel(
        model=model,
        tokenizer=teacher.tokenizer,
        config=model.cfg,
        name=model.cfg.name,
        path=Path(path),
        dtype=teacher.dtype,
        weight_format=weight_format(model),
    )
