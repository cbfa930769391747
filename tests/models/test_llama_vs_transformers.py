"""Our decoder against transformers on tiny random checkpoints (fp32)."""

from __future__ import annotations

import pytest
import torch

from fastmode import LLM, SamplingParams
from fastmode.loader import load_model
from fastmode.models.attention_batch import AttentionBatch, PrefillSpan
from tests.builders import build_hf_model

PROMPTS = [
    [5, 17, 42, 99, 3],
    [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27],
    [100],
    [250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260],
]


def our_batched_logits(loaded, prompts: list[list[int]], block_size: int = 4) -> list[torch.Tensor]:
    """Every position's logits, all prompts packed into ONE forward pass (ragged prefill)."""
    cfg = loaded.config
    per_seq_blocks = [-(-len(p) // block_size) for p in prompts]
    num_blocks = sum(per_seq_blocks)
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_layers)]
    ids, pos, slots, spans, first_block, start = [], [], [], [], 0, 0
    for p, nb in zip(prompts, per_seq_blocks):
        table = torch.arange(first_block, first_block + nb)
        ids += p
        pos += range(len(p))
        slots += [int(table[i // block_size]) * block_size + i % block_size for i in range(len(p))]
        spans.append(PrefillSpan(start, start + len(p), len(p), table, None))
        start += len(p)
        first_block += nb
    batch = AttentionBatch(torch.tensor(slots), spans, start)
    with torch.inference_mode():
        logits = loaded.model(torch.tensor(ids), torch.tensor(pos), batch, caches, torch.arange(start))
    return list(logits.split([len(p) for p in prompts]))


def hf_logits(path, prompts):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0] for p in prompts], model


@pytest.mark.parametrize(
    "arch,overrides",
    [
        ("llama", {}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
                "rope_theta": 500000.0,
            },
        ),
        ("qwen2", {"tie_word_embeddings": True}),
    ],
    ids=["llama", "llama-linear-rope", "llama3-rope", "qwen2-bias-tied"],
)
def test_logits_match_transformers(tmp_path, arch, overrides):
    path = build_hf_model(tmp_path / arch, arch, **overrides)
    loaded = load_model(path, dtype="float32")
    ours = our_batched_logits(loaded, PROMPTS)
    theirs, _ = hf_logits(path, PROMPTS)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_greedy_continuations_match_transformers(request, fixture):
    """32 greedy tokens for several prompts generated concurrently (batched decode)."""
    path = request.getfixturevalue(fixture)
    _, model = hf_logits(path, PROMPTS[:1])
    llm = LLM(model=str(path), dtype="float32", kv_cache_gib=0.01)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    for p, out in zip(PROMPTS, outs):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([p]),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                min_new_tokens=32,
            )[0, len(p) :].tolist()
        assert out.token_ids == ref
    assert llm.engine.scheduler.block_manager.num_free_blocks == llm.engine.scheduler_config.num_blocks
