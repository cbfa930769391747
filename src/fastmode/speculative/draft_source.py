"""Where a draft model comes from: a checkpoint path, or the target's first N layers."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from fastmode.loader import LoadedModel, load_model
from fastmode.models.llama import LlamaModel


def truncated(target: LlamaModel, num_layers: int) -> LlamaModel:
    """A draft that shares the target's embeddings, first `num_layers` layers, norm and head (no copies)."""
    if not 1 <= num_layers < target.cfg.num_layers:
        raise ValueError(f"a truncated draft needs 1..{target.cfg.num_layers - 1} layers, got {num_layers}")
    draft = LlamaModel.__new__(LlamaModel)
    nn.Module.__init__(draft)
    draft.cfg = replace(target.cfg, num_layers=num_layers, name=f"{target.cfg.name}-first{num_layers}")
    draft.embed_tokens = target.embed_tokens
    draft.layers = nn.ModuleList(list(target.layers)[:num_layers])
    draft.norm = target.norm
    draft.lm_head = target.lm_head
    draft.rotary = target.rotary
    return draft


def load_draft(spec: str, target: LoadedModel) -> LlamaModel:
    """`spec`: "layers:N", "spark" (the distilled student in the default place), a Spark
    export directory, or any checkpoint path sharing the target's tokenizer."""
    if spec.startswith("layers:"):
        return truncated(target.model, int(spec.split(":", 1)[1]))
    from fastmode.distill import default_spark_dir, is_spark, load_spark

    if spec == "spark":
        path = default_spark_dir(target.name)
        if not path.exists():
            raise ValueError(f"no Spark model at {path}: build it with `fastmode distill`")
        return load_spark(path, target)
    if is_spark(spec):
        return load_spark(spec, target)
    draft = load_model(spec, dtype=str(target.dtype).removeprefix("torch."))
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft model {spec} has vocabulary {draft.config.vocab_size}, the target {target.config.vocab_size}: "
            "a draft must share the target's tokenizer"
        )
    return draft.model
