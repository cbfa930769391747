"""Linear and embedding layers that run on a GGUF checkpoint's own quantized blocks.

The weight stays in the file's block format (Q4_0, Q4_1 or Q8_0: 32 weights
per block with an fp16 scale, and a minimum for Q4_1), one row of blocks per
output feature. `fastmode.kernels` multiplies activations against those
blocks directly, so a decode step streams ~4.5-8.5 bits per weight instead of
the 32 of a dequantized fp32 copy. See docs/kernels.md for the numerics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}  # ggml's type ids for the block formats the kernels read
BLOCK_BYTES = {2: 18, 3: 20, 8: 34}  # bytes per 32-weight block


@dataclass
class QuantTensor:
    """A 2-D weight kept in ggml blocks: `data` is (out_features, in_features/32 * block bytes) uint8."""

    data: torch.Tensor
    qtype: int  # a value of GGML_TYPES
    shape: tuple[int, int]  # (out_features, in_features)

    def __post_init__(self) -> None:
        n, k = self.shape
        if self.qtype not in BLOCK_BYTES:
            raise ValueError(f"unsupported ggml type id {self.qtype}")
        if k % 32 or tuple(self.data.shape) != (n, k // 32 * BLOCK_BYTES[self.qtype]) or self.data.dtype != torch.uint8:
            raise ValueError(
                f"block data {tuple(self.data.shape)} {self.data.dtype} does not hold a {self.shape} weight"
            )

    def dequantize(self) -> torch.Tensor:
        """The exact fp32 values the blocks encode, (out_features, in_features)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        w = dequantize(self.data.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(self.shape)

    @staticmethod
    def quantize(w: torch.Tensor, qtype: int) -> QuantTensor:
        """Encode an fp32 (out_features, in_features) weight as ggml blocks with gguf's reference quantizer."""
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        n, k = w.shape
        data = quantize(w.detach().float().contiguous().numpy(), GGMLQuantizationType(qtype))
        return QuantTensor(torch.from_numpy(np.ascontiguousarray(data)), qtype, (n, k))

    @staticmethod
    def cat_rows(parts: list[QuantTensor]) -> QuantTensor | None:
        """Stack weights along the output dimension (fused q/k/v, gate/up); None if their formats differ."""
        if len({(p.qtype, p.shape[1]) for p in parts}) != 1:
            return None
        rows = sum(p.shape[0] for p in parts)
        return QuantTensor(torch.cat([p.data for p in parts]), parts[0].qtype, (rows, parts[0].shape[1]))


def _ops():
    from fastmode.kernels import ops

    k = ops()
    if k is None:  # the loader only builds these layers when the kernels are available
        raise RuntimeError("fastmode's CPU kernels are not available")
    return k


class QuantLinear(nn.Module):
    """y = x W^T (+ b) with W in ggml blocks; x is fp32, y is fp32.

    The kernel dequantizes each weight block in registers and multiplies the
    fp32 activations; with `int8_activations` it instead quantizes each
    32-value block of x to int8 on the fly (llama.cpp's arithmetic).
    """

    def __init__(self, weight: QuantTensor, bias: torch.Tensor | None = None, int8_activations: bool = False):
        super().__init__()
        self.int8_activations = int8_activations
        self.out_features, self.in_features = weight.shape
        self.qtype = weight.qtype
        self.register_buffer("qweight", weight.data, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self._k = _ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = self._k.quant_matmul(
            x.reshape(-1, self.in_features).float(), self.qweight, self.qtype, self.int8_activations
        )
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        name = {v: k for k, v in GGML_TYPES.items()}[self.qtype]
        return f"in_features={self.in_features}, out_features={self.out_features}, format={name}, int8_activations={self.int8_activations}"


class QuantEmbedding(nn.Module):
    """Embedding lookup that dequantizes only the rows asked for."""

    def __init__(self, weight: QuantTensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.qtype = weight.qtype
        self.register_buffer("qweight", weight.data, persistent=False)
        self._k = _ops()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if flat.numel() == 0:  # the kernel reads an empty row list as "every row"
            return torch.empty(*ids.shape, self.embedding_dim)
        return self._k.quant_dequantize(self.qweight, self.qtype, self.embedding_dim, flat).reshape(
            *ids.shape, self.embedding_dim
        )

    def as_linear(self) -> QuantLinear:
        """The tied output head: the same blocks, no copy."""
        return QuantLinear(QuantTensor(self.qweight, self.qtype, (self.num_embeddings, self.embedding_dim)))


def quantize_layers(model: nn.Module, qtype: int = GGML_TYPES["Q8_0"], int8_activations: bool = False) -> None:
    """Re-encode every decoder layer's fp32 nn.Linear as ggml blocks (Q8_0: 8.5 bits per weight, error
    below half a step of each 32-value block's int8 grid), so the layers run on fastmode's kernels and
    the fused decode step. Used for Spark, whose layers are stored as int8 and would otherwise run as
    fp32 matmuls beside a natively quantized teacher."""
    for layer in getattr(model, "layers", []):
        for parent, name in (
            (layer.self_attn, "qkv_proj"),
            (layer.self_attn, "o_proj"),
            (layer.mlp, "gate_up_proj"),
            (layer.mlp, "down_proj"),
        ):
            lin = getattr(parent, name)
            if isinstance(lin, nn.Linear) and lin.in_features % 32 == 0:
                q = QuantLinear(QuantTensor.quantize(lin.weight, qtype), lin.bias, int8_activations)
                setattr(parent, name, q)
    if hasattr(model, "_decode_pack"):
        model._decode_pack = None


def set_int8_activations(model: nn.Module, on: bool) -> None:
    """Whether every QuantLinear in `model` quantizes its input to int8 (else fp32 activations)."""
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m.int8_activations = on
        if hasattr(m, "_decode_pack"):
            m._decode_pack = None  # a LlamaModel's fused-decode arguments carry the mode
