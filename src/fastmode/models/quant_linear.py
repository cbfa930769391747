"""Linear and embedding layers that run on a GGUF checkpoint's own quantized blocks.

The weight stays in the file's block format, one row of blocks per output feature:
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 weights per block with an fp16 scale, and a
minimum for Q4_1/Q5_1) or the K-quants Q4_K, Q5_K, Q6_K (256 weights per block in
eight groups of 32, each with its own 6- or 8-bit scale; the types inside Q4_K_M,
Q5_K_M and Q6_K files). `fastmode.kernels` multiplies activations against those
blocks directly, so a decode step streams ~4.5-8.5 bits per weight instead of
the 32 of a dequantized fp32 copy. See docs/kernels.md for the numerics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

# ggml's type ids for the block formats the kernels read
GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# (weights, bytes) of one stored block, per type id: ggml's own sizes (gguf.GGML_QUANT_SIZES)
BLOCKS = {
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
}


@dataclass
class QuantTensor:
    """A 2-D weight kept in ggml blocks: `data` is (out_features, in_features / block weights * block bytes) uint8."""

    data: torch.Tensor
    qtype: int  # a value of GGML_TYPES
    shape: tuple[int, int]  # (out_features, in_features)

    def __post_init__(self) -> None:
        n, k = self.shape
        if self.qtype not in BLOCKS:
            raise ValueError(f"unsupported ggml type id {self.qtype}")
        per, size = BLOCKS[self.qtype]
        if k % per or tuple(self.data.shape) != (n, k // per * size) or self.data.dtype != torch.uint8:
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
        """Encode an fp32 (out_features, in_features) weight as ggml blocks with gguf's reference quantizer
        (the types it can quantize: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; not the K-quants)."""
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


# Types whose int8-activation matmul runs on a repacked layout (eight output rows interleaved per
# block, `pack_weight` in kernels/csrc/packed_int8.cpp), and the offset that marks a type id as
# "packed" for the kernels.
PACKABLE = (2, 3, 8)
PACKED = 100


def _ops():
    from fastmode.kernels import ops

    k = ops()
    if k is None:  # the loader only builds these layers when the kernels are available
        raise RuntimeError("fastmode's CPU kernels are not available")
    return k


class QuantLinear(nn.Module):
    """y = x W^T (+ b) with W in ggml blocks; x is fp32, y is fp32.

    With fp32 activations the kernel dequantizes each weight block in registers and multiplies
    the activations exactly. With `int8_activations` it quantizes each 32-value block of x to
    int8 and takes integer dot products; Q4_0, Q4_1 and Q8_0 weights (with a multiple of 8
    rows) are then kept repacked eight rows at a time (`qweight` holds that layout and
    `kernel_qtype` says so), the same bytes in another order; `weight()` gives the file's blocks.
    """

    def __init__(self, weight: QuantTensor, bias: torch.Tensor | None = None, int8_activations: bool = False):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.qtype = weight.qtype
        self.register_buffer("qweight", weight.data, persistent=False)
        self.packed = False
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self._k = _ops()
        self._int8 = False
        self.int8_activations = int8_activations

    @property
    def int8_activations(self) -> bool:
        return self._int8

    @int8_activations.setter
    def int8_activations(self, on: bool) -> None:
        self._int8 = bool(on)
        pack = self._int8 and self.qtype in PACKABLE and self.out_features % 8 == 0
        if pack and not self.packed:
            self.qweight = self._k.pack_weight(self.qweight, self.qtype, self.in_features)
        elif self.packed and not pack:
            self.qweight = self._k.unpack_weight(self.qweight, self.qtype, self.in_features)
        self.packed = pack
        tied = self.__dict__.get("_tied_embedding")
        if tied is not None:  # the tied input embedding reads the same (re)packed table: one copy
            tied.qweight, tied.packed = self.qweight, self.packed

    @property
    def kernel_qtype(self) -> int:
        """The type id the kernels are given for `qweight`: the ggml type, plus PACKED when repacked."""
        return self.qtype + PACKED if self.packed else self.qtype

    def weight(self) -> QuantTensor:
        """The weight in the file's block layout (a copy when `qweight` is repacked)."""
        data = self._k.unpack_weight(self.qweight, self.qtype, self.in_features) if self.packed else self.qweight
        return QuantTensor(data, self.qtype, (self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = self._k.quant_matmul(
            x.reshape(-1, self.in_features).float(), self.qweight, self.kernel_qtype, self.int8_activations
        )
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        name = {v: k for k, v in GGML_TYPES.items()}[self.qtype]
        return f"in_features={self.in_features}, out_features={self.out_features}, format={name}, int8_activations={self.int8_activations}"


class StackedLinear(nn.Module):
    """y = x W^T (+ b) where W's output rows come in parts stored in different formats: a Q4_K_M
    file keeps some layers' attn_v in Q6_K beside Q4_K q and k, so fused q/k/v cannot be one block
    matrix. Each part runs on its own blocks (a `QuantLinear`) or, for a format the kernels do not
    read, as an fp32 nn.Linear; the outputs are concatenated in order."""

    def __init__(self, parts: list[QuantTensor | torch.Tensor], bias: torch.Tensor | None = None):
        super().__init__()
        mods: list[nn.Module] = []
        for p in parts:
            if isinstance(p, QuantTensor):
                mods.append(QuantLinear(p))
            else:
                lin = nn.Linear(p.shape[1], p.shape[0], bias=False)
                lin.weight = nn.Parameter(p.float(), requires_grad=False)
                mods.append(lin)
        self.parts = nn.ModuleList(mods)
        self.in_features = mods[0].in_features
        self.out_features = sum(m.out_features for m in mods)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([m(x) for m in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias


class QuantEmbedding(nn.Module):
    """Embedding lookup that dequantizes only the rows asked for."""

    def __init__(self, weight: QuantTensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.qtype = weight.qtype
        self.register_buffer("qweight", weight.data, persistent=False)
        self.packed = False  # set by the tied head (as_linear) when it repacks the table
        self._k = _ops()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if flat.numel() == 0:  # the kernel reads an empty row list as "every row"
            return torch.empty(*ids.shape, self.embedding_dim)
        lookup = self._k.packed_dequantize if self.packed else self._k.quant_dequantize
        return lookup(self.qweight, self.qtype, self.embedding_dim, flat).reshape(*ids.shape, self.embedding_dim)

    def as_linear(self) -> QuantLinear:
        """The tied output head: the same blocks, no copy (if the head repacks them, this
        embedding looks rows up in the packed table)."""
        head = QuantLinear(QuantTensor(self.qweight, self.qtype, (self.num_embeddings, self.embedding_dim)))
        object.__setattr__(head, "_tied_embedding", self)  # not a submodule: the embedding is the model's
        return head


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
