"""A tiny Llama whose GGUF weights are stored as Q5_0, Q5_1 and the K-quants loads natively (the
layers keep the file's blocks; no fp32 copy) and generates exactly what the same weights
dequantized to fp32 generate; a file with a block type fastmode does not read is one clear error,
raised before any tensor is read."""

from __future__ import annotations

import re
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from fastmode import LLM, SamplingParams
from fastmode.kernels import ops
from fastmode.loader import ModelLoadError, load_model
from fastmode.models.quant_linear import GGML_TYPES, QuantEmbedding, QuantLinear, StackedLinear
from tests.builders import build_hf_model, write_gguf_from_hf
from tests.kernels.kquants import quantize_any

pytestmark = pytest.mark.skipif(ops() is None, reason="kernels unavailable")

PROMPTS = ["The quick brown fox", "def add(a, b):", "Paris is the capital of"]


@pytest.fixture(scope="module")
def kquant_llama_dir(tmp_path_factory) -> Path:
    """Every linear's input width a multiple of 256, as K-quant blocks need."""
    return build_hf_model(
        tmp_path_factory.mktemp("kquant-llama"), "llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2
    )


def write_gguf(hf_dir: Path, out: Path, choose) -> Path:
    """The checkpoint as a GGUF file (tests/builders.py's layout) whose 2-D weights are stored in
    the type `choose(gguf tensor name)` names: gguf's quantizer where it has one, else the tests'
    K-quant encoder (gguf cannot quantize K-quants)."""
    import gguf
    import gguf.quants

    add_tensor = gguf.GGUFWriter.add_tensor

    def add(self, name, tensor, raw_shape=None, raw_dtype=None, **kw):
        if raw_dtype is not None and tensor.dtype == np.float32 and tensor.ndim == 2:  # a weight to quantize
            qtype = choose(name)
            return add_tensor(self, name, quantize_any(tensor, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
        return add_tensor(self, name, tensor, raw_shape=raw_shape, raw_dtype=raw_dtype, **kw)

    with (
        mock.patch.object(gguf.quants, "quantize", lambda t, q: np.asarray(t, dtype=np.float32)),
        mock.patch.object(gguf.GGUFWriter, "add_tensor", add),
    ):
        return write_gguf_from_hf(hf_dir, out, "Q8_0")


def weight_bytes(model) -> int:
    """Bytes of the model's linear and embedding weights, checking that every one is in blocks."""
    from torch import nn

    from fastmode.models.cpu_packing import PackedLinear

    assert not any(isinstance(m, (nn.Linear, nn.Embedding, PackedLinear)) for m in model.modules())
    return sum(m.qweight.numel() for m in model.modules() if isinstance(m, (QuantLinear, QuantEmbedding)))


def greedy(llm: LLM) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, sp)]


def engines(path: Path) -> tuple[LLM, LLM]:
    common = dict(dtype="float32", kv_cache_gib=0.01, speculative="off", draft_model=None)
    return LLM(model=str(path), **common), LLM(model=str(path), weights="dequantize", **common)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"])
def test_a_file_of_one_type_runs_on_its_blocks_and_generates_as_dequantized(kquant_llama_dir, tmp_path, qtype):
    path = write_gguf(kquant_llama_dir, tmp_path / f"tiny-{qtype}.gguf", lambda name: qtype)
    native, ref = engines(path)
    loaded = native.engine.loaded
    assert loaded.weight_format == qtype
    layer = loaded.model.layers[1]
    for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(lin, QuantLinear) and lin.qtype == GGML_TYPES[qtype]
    assert (
        isinstance(loaded.model.embed_tokens, QuantEmbedding) and loaded.model.embed_tokens.qtype == GGML_TYPES[qtype]
    )
    # the weights held are the file's blocks: no fp32 copy, no more bytes than the file (which also
    # holds the norms and the vocabulary)
    assert weight_bytes(loaded.model) <= path.stat().st_size
    assert greedy(native) == greedy(ref)


def q4_k_m(name: str) -> str:
    """The mix llama-quantize's Q4_K_M makes: Q4_K, with attn_v and ffn_down in Q6_K in some
    layers (here layer 0), the embedding and the output head in Q6_K; one Q5_0 v for a third format."""
    if name.startswith(("token_embd", "output")):
        return "Q6_K"
    if name in ("blk.0.attn_v.weight", "blk.0.ffn_down.weight"):
        return "Q6_K"
    if name == "blk.1.attn_v.weight":
        return "Q5_0"
    return "Q4_K"


def test_a_q4_k_m_mix_keeps_every_part_in_its_blocks(kquant_llama_dir, tmp_path):
    path = write_gguf(kquant_llama_dir, tmp_path / "tiny-Q4_K_M.gguf", q4_k_m)
    native, ref = engines(path)
    loaded = native.engine.loaded
    assert loaded.weight_format == "Q4_K+Q5_0+Q6_K"
    for i, v_type in ((0, "Q6_K"), (1, "Q5_0")):  # q and k in Q4_K beside v in another format: three parts
        qkv = loaded.model.layers[i].self_attn.qkv_proj
        assert isinstance(qkv, StackedLinear)
        assert [p.qtype for p in qkv.parts] == [GGML_TYPES["Q4_K"], GGML_TYPES["Q4_K"], GGML_TYPES[v_type]]
    assert loaded.model.layers[0].mlp.down_proj.qtype == GGML_TYPES["Q6_K"]
    assert loaded.model.layers[1].mlp.gate_up_proj.qtype == GGML_TYPES["Q4_K"]  # same format: fused in blocks
    assert weight_bytes(loaded.model) <= path.stat().st_size
    assert greedy(native) == greedy(ref)


def test_an_unsupported_block_type_is_one_error_before_any_tensor_is_read(kquant_llama_dir, tmp_path):
    """IQ4_NL and MXFP4 tensors (what llama-quantize's IQ4 and MXFP4 files hold): the error names both
    types with a tensor of each and lists what is supported. It comes from the tensor table: no
    tensor is dequantized (gguf's dequantize fails the test if called) or read first."""
    import gguf

    bad = {"blk.1.attn_q.weight": "IQ4_NL", "blk.1.attn_k.weight": "IQ4_NL", "blk.1.ffn_up.weight": "MXFP4"}
    add_tensor = gguf.GGUFWriter.add_tensor

    def add(self, name, tensor, raw_shape=None, raw_dtype=None, **kw):
        if name in bad:  # bytes of the right size: their values are never read
            qtype = gguf.GGMLQuantizationType[bad[name]]
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            data = np.zeros((tensor.shape[0], tensor.shape[1] // block * size), dtype=np.uint8)
            return add_tensor(self, name, data, raw_dtype=qtype)
        return add_tensor(self, name, tensor, raw_shape=raw_shape, raw_dtype=raw_dtype, **kw)

    with mock.patch.object(gguf.GGUFWriter, "add_tensor", add):
        path = write_gguf_from_hf(kquant_llama_dir, tmp_path / "tiny-iq4.gguf", "F32")

    def no_reads(*args, **kwargs):
        raise AssertionError("a tensor was dequantized before the block types were checked")

    for weights in ("native", "dequantize"):
        with mock.patch("gguf.quants.dequantize", no_reads), pytest.raises(ModelLoadError) as err:
            load_model(path, dtype="float32", weights=weights)
        msg = str(err.value)
        assert re.search(r"unsupported GGUF block types IQ4_NL \(2 tensors, e\.g\. blk\.1\.attn_[qk]\.weight\); ", msg)
        assert "MXFP4 (1 tensor, e.g. blk.1.ffn_up.weight)" in msg
        assert "fastmode runs Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K as stored" in msg
        assert "dequantizes BF16, F16, F32, Q2_K, Q3_K at load" in msg
