"""Qwen3 and Gemma 3 against transformers on tiny random checkpoints (fp32), from a Hugging
Face directory and from a GGUF file, through the public `LLM` API.

The Gemma 3 checkpoint's sliding window is 8 positions and the prompts and continuations
run to 53 positions, so its local layers must attend only within their window to match.
"""

from __future__ import annotations

import pytest
import torch

from fastmode import LLM, SamplingParams
from fastmode.loader import load_model
from tests.builders import build_hf_model, write_gguf_from_hf
from tests.models.test_llama_vs_transformers import PROMPTS, hf_logits, our_batched_logits

NEW_TOKENS = 32


def hf_greedy(model, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            min_new_tokens=n,
        )
    return out[0, len(prompt) :].tolist()


def assert_greedy_matches(llm: LLM, hf_model) -> None:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)  # all prompts at once: batched prefill and decode
    for p, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(hf_model, p), f"prompt {p[:5]}..."
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.scheduler_config.num_blocks


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("qwen3", {}),
        ("qwen3", {"tie_word_embeddings": True}),
        ("gemma3", {}),
        ("gemma3", {"final_logit_softcapping": 3.0, "tie_word_embeddings": False}),
    ],
    ids=["qwen3", "qwen3-tied", "gemma3", "gemma3-softcap-untied"],
)
def test_logits_match_transformers(tmp_path, arch, overrides):
    """Every position's logits, all prompts packed in one ragged prefill (local layers masked)."""
    path = build_hf_model(tmp_path / arch, arch, **overrides)
    loaded = load_model(path, dtype="float32")
    if arch == "gemma3":
        assert loaded.config.sliding_layers == (0, 1, 2, 3, 4) and loaded.config.sliding_window == 8
    ours = our_batched_logits(loaded, PROMPTS)
    theirs, _ = hf_logits(path, PROMPTS)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_gemma3_dir"])
def test_greedy_from_hf_dir_matches_transformers(request, fixture):
    path = request.getfixturevalue(fixture)
    _, model = hf_logits(path, PROMPTS[:1])
    assert_greedy_matches(LLM(model=str(path), dtype="float32", kv_cache_gib=0.01), model)


def test_gemma3_window_spanning_several_blocks_matches_transformers(tiny_gemma3_dir):
    """Blocks of 4 tokens: a local layer's window of 8 straddles up to 3 blocks, and decode
    reads only those (the first blocks of a long sequence are skipped)."""
    _, model = hf_logits(tiny_gemma3_dir, PROMPTS[:1])
    llm = LLM(model=str(tiny_gemma3_dir), dtype="float32", kv_cache_gib=0.01, block_size=4)
    assert_greedy_matches(llm, model)


@pytest.mark.parametrize("fixture,arch", [("tiny_qwen3_dir", "qwen3"), ("tiny_gemma3_gguf_dir", "gemma3")])
def test_greedy_from_gguf_matches_transformers(request, tmp_path, fixture, arch):
    path = request.getfixturevalue(fixture)
    gguf = write_gguf_from_hf(path, tmp_path / f"{arch}.gguf", "F32", arch=arch)
    _, model = hf_logits(path, PROMPTS[:1])
    llm = LLM(model=str(gguf), dtype="float32", kv_cache_gib=0.01)
    assert llm.engine.loaded.config.architecture == arch
    assert_greedy_matches(llm, model)


@pytest.mark.parametrize("fixture,arch", [("tiny_qwen3_dir", "qwen3"), ("tiny_gemma3_gguf_dir", "gemma3")])
def test_native_q8_0_gguf_matches_its_dequantized_weights(request, tmp_path, fixture, arch):
    """A Q8_0 file run on fastmode's kernels (block matmuls, fused norms, paged decode
    attention for the global layers) generates what the same weights dequantized do."""
    from fastmode.kernels import ops

    if ops() is None:
        pytest.skip("fastmode's CPU kernels are not built on this machine")
    gguf = write_gguf_from_hf(request.getfixturevalue(fixture), tmp_path / f"{arch}-q8.gguf", "Q8_0", arch=arch)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    native = LLM(model=str(gguf), dtype="float32", kv_cache_gib=0.01)
    assert "Q8_0" in native.engine.loaded.weight_format
    plain = LLM(model=str(gguf), dtype="float32", kv_cache_gib=0.01, weights="dequantize")
    assert [o.token_ids for o in native.generate(PROMPTS, params)] == [
        o.token_ids for o in plain.generate(PROMPTS, params)
    ]
