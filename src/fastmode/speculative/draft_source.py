"""Where a draft model comes from: a checkpoint path, or the target's first N layers."""

from __future__ import annotations

import logging
from dataclasses import replace

from torch import nn

from fastmode.loader import LoadedModel, load_model
from fastmode.models.llama import LlamaModel

log = logging.getLogger(__name__)


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


def auto_draft(target: LoadedModel) -> LlamaModel | None:
    """The default draft: the target's Spark student when one exists for it (see
    `find_spark`), else None (n-gram drafting still works without a draft model).

    A Spark distilled from a different checkpoint of the same name is skipped
    with a warning rather than failing the engine: the default must never
    stop a model from loading.
    """
    from fastmode.distill import find_spark, load_spark

    path = find_spark(target.name)
    if path is None:
        return None
    try:
        return load_spark(path, target)
    except ValueError as e:
        log.warning("not using %s as the default draft: %s", path, e)
        return None


def load_draft(spec: str, target: LoadedModel) -> LlamaModel:
    """`spec`: "layers:N", "spark" (the target's Spark: the user's `fastmode distill`
    output, else the copy shipped with the package), a Spark export directory,
    or any checkpoint path sharing the target's tokenizer."""
    if spec.startswith("layers:"):
        return truncated(target.model, int(spec.split(":", 1)[1]))
    from fastmode.distill import find_spark, is_spark, load_spark

    if spec == "spark":
        path = find_spark(target.name)
        if path is None:
            raise ValueError(f"no Spark model for {target.name}: build it with `fastmode distill`")
        return load_spark(path, target)
    if is_spark(spec):
        return load_spark(spec, target)
    weights = "dequantize" if target.weight_format in ("fp32", "bf16") else "native"
    draft = load_model(spec, dtype=str(target.dtype).removeprefix("torch."), weights=weights)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft model {spec} has vocabulary {draft.config.vocab_size}, the target {target.config.vocab_size}: "
            "a draft must share the target's tokenizer"
        )
    return draft.model
