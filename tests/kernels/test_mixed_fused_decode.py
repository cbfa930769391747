"""A model whose linears mix block formats (a Q4_K_M file: q/k in one format beside v in another,
held as a StackedLinear) runs its pure-decode steps on the fused kernel call, part by part, and
generates token for token what the per-layer path and the dequantized fp32 reference generate."""

from __future__ import annotations

import pytest

from fastmode import LLM, SamplingParams
from fastmode.kernels import ops
from fastmode.models.llama import _decode_pack
from fastmode.models.quant_linear import GGML_TYPES, StackedLinear
from tests.loader.test_gguf_kquant import PROMPTS, kquant_llama_dir, q4_k_m, write_gguf  # noqa: F401

pytestmark = pytest.mark.skipif(ops() is None, reason="kernels unavailable")

COMMON = dict(dtype="float32", kv_cache_gib=0.01, speculative="off", draft_model=None)


def greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, sp)]


@pytest.fixture(scope="module")
def mixed(kquant_llama_dir, tmp_path_factory):  # noqa: F811
    path = write_gguf(kquant_llama_dir, tmp_path_factory.mktemp("mixed") / "tiny-Q4_K_M.gguf", q4_k_m)
    return LLM(model=str(path), **COMMON), LLM(model=str(path), weights="dequantize", **COMMON)


def test_stacked_linears_are_packed_part_by_part(mixed):
    model = mixed[0].engine.loaded.model
    assert isinstance(model.layers[0].self_attn.qkv_proj, StackedLinear)
    norms, weights, qtypes, parts, int8 = _decode_pack(model)
    assert parts == [3, 1, 1, 1, 3, 1, 1, 1]  # per layer: q/k/v in three parts, o, gate_up, down
    assert qtypes[:3] == [GGML_TYPES["Q4_K"], GGML_TYPES["Q4_K"], GGML_TYPES["Q6_K"]]
    assert qtypes[6:9] == [GGML_TYPES["Q4_K"], GGML_TYPES["Q4_K"], GGML_TYPES["Q5_0"]]
    assert len(weights) == len(qtypes) == sum(parts) and len(norms) == 4 and int8 is False


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_mixed_format_decode_matches_the_per_layer_path_and_the_reference(mixed, monkeypatch, batch):
    native, ref = mixed
    cls = type(native.engine.loaded.model)
    fused = cls._fused_decode
    calls = []

    def counting(self, b, kv_caches):
        run = fused(self, b, kv_caches)
        calls.append(run is not None)
        return run

    prompts = PROMPTS[:batch]
    monkeypatch.setattr(cls, "_fused_decode", counting)
    got = greedy(native, prompts)
    assert sum(calls) >= 20  # the decode steps ran fused
    monkeypatch.setattr(cls, "_fused_decode", lambda self, b, kv: None)
    assert greedy(native, prompts) == got
    assert greedy(ref, prompts) == got


def test_a_linear_part_not_in_blocks_keeps_the_per_layer_path(mixed):
    """A StackedLinear part the kernels cannot read (an fp32 nn.Linear) leaves the model unfused."""
    import torch
    from torch import nn

    model = mixed[0].engine.loaded.model
    qkv = model.layers[1].self_attn.qkv_proj
    saved = qkv.parts[2]
    try:
        qkv.parts[2] = nn.Linear(saved.in_features, saved.out_features, bias=False).to(torch.float32)
        assert _decode_pack(model) == ()
    finally:
        qkv.parts[2] = saved
        model._decode_pack = None
