"""Tiny checkpoints built by the tests themselves (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# A Qwen3-style thinking template: ChatML; the generation prompt opens a think block (as
# Qwen3-2507 Thinking's template does), and with enable_thinking=False it writes an empty block
# instead (as Qwen3's template does to switch thinking off).
QWEN3_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}"
    "{% else %}{{ '<think>\n' }}{% endif %}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "Speculative decoding proposes tokens with a draft and verifies them in one step.",
    "A fast lane keeps the batch small so every step is short.",
    "for i in range(10):\n    print(i * i)\n",
] * 20


def build_tokenizer(path: Path, vocab_size: int = 384, thinking: bool = False) -> None:
    """Train a small byte-level BPE with the `tokenizers` library and save it HF-style.
    With `thinking`, `<think>`/`</think>` are added tokens and the template is QWEN3_CHATML."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    if thinking:  # ids vocab_size, vocab_size + 1: past the trained vocabulary, as Qwen3 adds them
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "pad_token": "<|endoftext|>",
                "chat_template": QWEN3_CHATML if thinking else CHATML,
            }
        )
    )


def build_hf_model(path: Path, arch: str = "llama", **overrides) -> Path:
    """Save a tiny random Llama / Qwen2 / Qwen3 / Gemma 3 (text) causal LM with a tokenizer.

    Qwen3: head_dim 32 (not hidden / heads, as in Qwen3-0.6B) and `<think>` tokens.
    Gemma 3: 6 layers laid out as in the real models (5 local, then 1 global), a sliding
    window of 8 positions, RoPE bases 1e4 (local) and 1e6 (global), and
    query_pre_attn_scalar 24 (not head_dim) unless overridden."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(path, vocab_size=382 if arch == "qwen3" else 384, thinking=arch == "qwen3")
    common = dict(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=None,
        pad_token_id=0,
    )
    common.update(overrides)
    torch.manual_seed(0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # make the q/k/v biases matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**{"head_dim": 32, **common})
        model = transformers.Qwen3ForCausalLM(cfg)
    elif arch == "gemma3":
        gemma = dict(
            num_hidden_layers=6,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=8,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            },
            tie_word_embeddings=True,
        )
        cfg = transformers.Gemma3TextConfig(**{**common, **gemma, **overrides})
        model = transformers.Gemma3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # larger weights than the init so logits are far from uniform
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
            elif arch in ("qwen3", "gemma3") and "norm" in name:  # norms that are not all ones (or zeros)
                p.normal_(0, 0.3).add_(1.0 if arch == "qwen3" else 0.0)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _permute_for_gguf(w, n_heads: int):
    """llama.cpp's converter permutation of q/k rows (what a real GGUF file holds)."""
    shape = w.shape
    return w.reshape(n_heads, 2, shape[0] // n_heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def write_gguf_from_hf(hf_dir: Path, out: Path, qtype: str = "F32", arch: str = "llama") -> Path:
    """Convert a tiny HF checkpoint to GGUF the way llama.cpp's converter lays it out
    (Gemma 3: norm weights stored as 1 + w, and the layer layout, local RoPE base and
    attention scale left to the reader, as llama.cpp leaves them)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tensors = load_file(str(hf_dir / "model.safetensors"))
    w = GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(float(cfg.get("rope_theta") or rope.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch == "gemma3":
        w.add_sliding_window(cfg["sliding_window"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab = sorted({**tok["model"]["vocab"], **added}.items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    special = {t["content"] for t in tok["added_tokens"] if t["special"]}
    # Control tokens 3, user-defined added tokens (<think>) 4, as llama.cpp's converter types them.
    w.add_token_types([3 if t in special else 4 if t in added else 1 for t, _ in vocab])
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(added["<|im_end|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(json.loads((hf_dir / "tokenizer_config.json").read_text())["chat_template"])

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
    }
    if arch == "gemma3":
        layer.update(
            post_attention_layernorm="post_attention_norm",
            pre_feedforward_layernorm="ffn_norm",
            post_feedforward_layernorm="post_ffw_norm",
        )
    q = GGMLQuantizationType[qtype]
    for name, t in tensors.items():
        if name in names:
            gname = names[name]
        else:
            parts = name.split(".")  # model.layers.{i}.{module...}.{weight|bias}
            gname = f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        t = t.astype(np.float32)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            t = t + 1.0  # llama.cpp's converter stores Gemma's norms as the multiplier 1 + w
        if arch == "llama" and gname.endswith("attn_q.weight"):
            t = _permute_for_gguf(t, cfg["num_attention_heads"])
        if arch == "llama" and gname.endswith("attn_k.weight"):
            t = _permute_for_gguf(t, cfg["num_key_value_heads"])
        if t.ndim == 2 and q != GGMLQuantizationType.F32:
            w.add_tensor(gname, quantize(t, q), raw_dtype=q)
        else:
            w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
