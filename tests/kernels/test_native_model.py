"""The default model on its own Q4_1/Q8_0 blocks (what LLM() runs) against the dequantized fp32 reference."""

from __future__ import annotations

import pytest

from fastmode import LLM, SamplingParams
from fastmode.kernels import ops
from fastmode.models.quant_linear import QuantEmbedding, QuantLinear

pytestmark = pytest.mark.skipif(ops() is None, reason="kernels unavailable")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def native():
    return LLM(speculative="off", draft_model=None)


def test_default_engine_runs_the_checkpoint_blocks(native):
    loaded = native.engine.loaded
    assert loaded.weight_format == "Q4_1+Q8_0"
    layer = loaded.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and not layer.self_attn.qkv_proj.int8_activations
    assert isinstance(loaded.model.embed_tokens, QuantEmbedding)
    assert loaded.model.lm_head.qweight.data_ptr() == loaded.model.embed_tokens.qweight.data_ptr()  # tied, one copy


def test_native_greedy_answer_matches_the_dequantized_reference(native):
    ref = LLM(weights="dequantize", speculative="off", draft_model=None)
    prompt = native.tokenizer.apply_chat_template(QUESTION)
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    got, want = native.generate(prompt, sp)[0], ref.generate(prompt, sp)[0]
    assert got.text == want.text == "The capital of France is Paris."


def test_native_speculation_is_lossless(native):
    """Greedy n-gram speculation on the native path returns exactly the plain output."""
    spec = LLM(speculative="ngram", speculative_tiers="standard,fast", speculative_min_gain=0.0, draft_model=None)
    prompt = native.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat this list: apple, banana, cherry, apple, banana, cherry."}]
    )
    sp = SamplingParams(temperature=0.0, max_tokens=40)
    assert spec.generate(prompt, sp)[0].token_ids == native.generate(prompt, sp)[0].token_ids


def test_kv_cache_is_fp16_by_default_and_fp32_on_request(native):
    """fp16 K/V (llama.cpp's default too) hold twice the tokens in the same memory; fp32 stays
    selectable. Both answer the reference question the same way."""
    import torch

    fp32 = LLM(speculative="off", draft_model=None, kv_cache_dtype="float32")
    assert native.engine.kv_dtype == torch.float16 and native.engine.runner.kv_caches[0][0].dtype == torch.float16
    assert fp32.engine.runner.kv_caches[0][1].dtype == torch.float32
    assert native.engine.scheduler_config.num_blocks == 2 * fp32.engine.scheduler_config.num_blocks
    prompt = native.tokenizer.apply_chat_template(QUESTION)
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    assert fp32.generate(prompt, sp)[0].text == native.generate(prompt, sp)[0].text == "The capital of France is Paris."
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        LLM(kv_cache_dtype="int4")


def test_int8_activations_are_selectable():
    llm = LLM(weights="native-int8", speculative="off", draft_model=None)
    assert llm.engine.loaded.weight_format == "Q4_1+Q8_0+int8-activations"
    assert llm.engine.loaded.model.layers[0].mlp.down_proj.int8_activations
    out = llm.generate(llm.tokenizer.apply_chat_template(QUESTION), SamplingParams(temperature=0.0, max_tokens=8))
    assert len(out[0].token_ids) == 8


def test_fused_decode_step_matches_the_per_layer_path(native, monkeypatch):
    """Pure-decode steps run every layer in one kernel call; the per-layer path
    (used for mixed steps) is built from the same ops and must agree token for token."""
    prompts = [
        native.tokenizer.apply_chat_template([{"role": "user", "content": q}])
        for q in ("Name a prime number.", "Write a haiku about rain.", "What is 12 * 7?")
    ]
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    calls = []
    fused = type(native.engine.loaded.model)._fused_decode

    def counting(self, batch, kv_caches):
        run = fused(self, batch, kv_caches)
        calls.append(run is not None)
        return run

    monkeypatch.setattr(type(native.engine.loaded.model), "_fused_decode", counting)
    want = [o.token_ids for o in native.generate(prompts, sp)]
    assert any(calls)  # the fused path did run
    monkeypatch.setattr(type(native.engine.loaded.model), "_fused_decode", lambda self, batch, kv: None)
    assert [o.token_ids for o in native.generate(prompts, sp)] == want


def test_spark_runs_on_the_kernels_and_drafts_losslessly(native):
    """On a native teacher Spark's layers run on the kernels (a q4_1 file's as its own Q4_1 blocks,
    any other format's re-encoded as Q8_0), and greedy draft-model speculation with it (catch-up
    spans, then single-token decode rounds) is exact."""
    from fastmode.distill.export import read_spark
    from fastmode.distill.spark import find_spark, load_spark

    folder = find_spark()
    if folder is None:
        pytest.skip("no Spark shipped or distilled")
    spark = load_spark(folder, native.engine.loaded)
    qtype = 3 if read_spark(folder)[1]["format"] == "q4_1" else 8
    assert all(
        isinstance(layer.mlp.down_proj, QuantLinear) and layer.mlp.down_proj.qtype == qtype for layer in spark.layers
    )
    spec = LLM(speculative="draft", speculative_tiers="standard,fast", speculative_min_gain=0.0)
    assert spec.engine.drafter is not None
    prompts = [
        native.tokenizer.apply_chat_template([{"role": "user", "content": q}])
        for q in ("Name three colors.", "Count from one to ten.")
    ]
    sp = SamplingParams(temperature=0.0, max_tokens=32)
    got = [o.token_ids for o in spec.generate(prompts, sp)]
    assert got == [o.token_ids for o in native.generate(prompts, sp)]
    assert sum(spec.engine.spec.stats.draft_tokens.values()) > 0  # it did speculate


def test_auto_dtype_is_fp32_on_the_cpu_whatever_its_isa(monkeypatch):
    """The CPU default is the native fp32 kernels whatever the CPU lists (AVX-512 BF16 and AMX included)."""
    from fastmode.loader.load import resolve_dtype

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert resolve_dtype("auto") == "float32"
    assert resolve_dtype("bfloat16") == "bfloat16"
