"""Export / load round trips, the int8 codec, the size limit and the teacher check."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fastmode.config import ModelConfig
from fastmode.distill.export import (
    MAX_BYTES,
    choose_format,
    dequantize_int8,
    dequantize_q4_1,
    encoded_bytes,
    is_spark,
    quantize_int8,
    quantize_q4_1,
    read_info,
    save_spark,
    teacher_identity,
)
from fastmode.distill.spark import load_spark, spark_as_loaded
from fastmode.distill.student import build_student, own_state
from fastmode.engine.scoring import full_logits
from fastmode.models.llama import LlamaModel

TOKENS = [5, 17, 99, 3, 250, 42, 7, 7, 300, 12]
SMOLLM2 = ModelConfig(
    architecture="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
)


def _perturbed_student(teacher):
    student = build_student(teacher.model, [0, 2])
    with torch.no_grad():  # stand-in for training: the student must differ from its initial copy
        for p in student.layers.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return student


def _logits(teacher, model):
    return full_logits(replace(teacher, model=model, config=model.cfg), TOKENS)


def _save(tmp_path, teacher, student, fmt):
    info = {"teacher": teacher_identity(teacher.path), "layer_indices": [0, 2], "summary": {"steps": 0}}
    return save_spark(tmp_path, own_state(student), info, fmt)


def test_fp32_round_trip_is_exact(tiny_teacher, tmp_path):
    student = _perturbed_student(tiny_teacher)
    path = _save(tmp_path, tiny_teacher, student, "auto")  # the tiny student fits in fp32
    assert read_info(path)["format"] == "fp32" and is_spark(tmp_path) and not is_spark(tiny_teacher.path)
    loaded = load_spark(tmp_path, tiny_teacher)
    assert isinstance(loaded, LlamaModel) and loaded.cfg.num_layers == 2
    assert loaded.embed_tokens is tiny_teacher.model.embed_tokens and loaded.lm_head is tiny_teacher.model.lm_head
    a, b = own_state(student), own_state(loaded)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(_logits(tiny_teacher, loaded), _logits(tiny_teacher, student))


@pytest.mark.parametrize("fmt,tol", [("int8", 0.05), ("bf16", 0.05)])
def test_quantized_round_trip_is_within_tolerance(tiny_teacher, tmp_path, fmt, tol):
    student = _perturbed_student(tiny_teacher)
    _save(tmp_path, tiny_teacher, student, fmt)
    loaded = load_spark(tmp_path, tiny_teacher)
    ref, got = _logits(tiny_teacher, student), _logits(tiny_teacher, loaded)
    assert not torch.equal(ref, got)
    assert (got - ref).abs().max() <= tol * ref.abs().max()


def test_int8_codec_error_is_at_most_half_a_step_per_row():
    w = torch.randn(64, 48) * torch.linspace(0.01, 3.0, 64)[:, None]  # rows of very different scale
    w[5] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    err = (dequantize_int8(q, scale) - w).abs()
    assert torch.all(err <= scale[:, None] / 2 + 1e-7)
    assert torch.all(dequantize_int8(q, scale)[5] == 0)


def test_q4_1_codec_is_ggml_blocks_within_half_a_step_and_re_encodes_to_itself():
    w = torch.randn(16, 96) * torch.linspace(0.01, 3.0, 16)[:, None]
    blocks = quantize_q4_1(w)
    assert blocks.dtype == torch.uint8 and blocks.shape == (16, 96 // 32 * 20)  # 20 bytes per 32 weights
    back = dequantize_q4_1(blocks)
    step = (w.view(16, 3, 32).amax(-1) - w.view(16, 3, 32).amin(-1)) / 15  # each block's grid step
    err = (back - w).abs().view(16, 3, 32)
    assert torch.all(err <= step[..., None] * 0.5 * 1.01 + 1e-3)  # fp16 step and min add a little
    assert torch.equal(quantize_q4_1(back), blocks)  # loading re-encodes stored blocks to the same blocks


def test_q4_1_round_trip_loads_the_codec_values(tiny_teacher, tmp_path):
    student = _perturbed_student(tiny_teacher)
    _save(tmp_path, tiny_teacher, student, "q4_1")
    loaded = own_state(load_spark(tmp_path, tiny_teacher))
    for name, w in own_state(student).items():
        want = dequantize_q4_1(quantize_q4_1(w)) if w.dim() == 2 else w  # norms stay fp32
        assert torch.equal(loaded[name], want), name


def test_q4_1_file_is_what_the_kernels_run(tmp_path):
    """A Q4_1 Spark on a teacher running on fastmode's kernels runs as Q4_1 blocks, byte for byte as stored."""
    from fastmode.distill.export import read_spark
    from fastmode.loader import load_model
    from fastmode.models.quant_linear import GGML_TYPES, QuantLinear

    teacher = load_model(None)  # the embedded model, natively quantized
    if getattr(teacher.model.norm, "kernels", None) is None:
        pytest.skip("fastmode's kernels are not built here")
    student = build_student(load_model(None, dtype="float32", weights="dequantize").model, [0, 29])
    info = {"teacher": teacher_identity(teacher.path), "layer_indices": [0, 29]}
    save_spark(tmp_path, own_state(student), info, "q4_1")
    stored, _ = read_spark(tmp_path)
    loaded = load_spark(tmp_path, teacher)
    down = loaded.layers[1].mlp.down_proj
    assert isinstance(down, QuantLinear) and down.qtype == GGML_TYPES["Q4_1"]
    assert torch.equal(down.qweight, stored["layers.1.mlp.down_proj.weight"])


def test_size_limit_picks_int8_for_ten_smollm2_layers():
    shapes = {k: tuple(v.shape) for k, v in _meta_student_state(SMOLLM2, 10).items()}
    assert encoded_bytes(shapes, "bf16") > MAX_BYTES  # 10 layers in bf16 are ~71 MB
    assert choose_format(shapes) == "int8" and encoded_bytes(shapes, "int8") < MAX_BYTES  # ~36 MB
    small = {k: tuple(v.shape) for k, v in _meta_student_state(SMOLLM2, 6).items()}
    assert choose_format(small) == "bf16"
    sixteen = {k: tuple(v.shape) for k, v in _meta_student_state(SMOLLM2, 16).items()}
    assert choose_format(sixteen) == "q4_1" and encoded_bytes(sixteen, "q4_1") < 40e6  # int8 would be ~57 MB
    with pytest.raises(ValueError, match="fewer layers"):
        choose_format({k: tuple(v.shape) for k, v in _meta_student_state(SMOLLM2, 30).items()})


def test_save_refuses_a_file_over_the_limit(tiny_teacher, tmp_path):
    student = _perturbed_student(tiny_teacher)
    info = {"teacher": teacher_identity(tiny_teacher.path), "layer_indices": [0, 2]}
    shapes = {k: tuple(v.shape) for k, v in own_state(student).items()}
    int8_bytes = encoded_bytes(shapes, "int8")
    with pytest.raises(ValueError, match="does not fit"):
        save_spark(tmp_path, own_state(student), info, "auto", max_bytes=int8_bytes // 2)
    limit = int8_bytes + 8192  # room for the header, still far below bf16
    assert limit < encoded_bytes(shapes, "bf16")
    path = save_spark(tmp_path, own_state(student), info, "auto", max_bytes=limit)
    assert read_info(path)["format"] == "int8" and path.stat().st_size <= limit


def test_load_refuses_another_teacher(tiny_teacher, tmp_path):
    student = _perturbed_student(tiny_teacher)
    info = {"teacher": {"name": "other.gguf", "sha256": "0" * 64}, "layer_indices": [0, 2]}
    save_spark(tmp_path, own_state(student), info)
    with pytest.raises(ValueError, match="distilled from other.gguf"):
        load_spark(tmp_path, tiny_teacher)
    assert load_spark(tmp_path, tiny_teacher, check_teacher=False).cfg.num_layers == 2


def test_spark_as_loaded_serves_under_the_spark_name(tiny_teacher, tmp_path):
    _save(tmp_path, tiny_teacher, _perturbed_student(tiny_teacher), "fp32")
    loaded = spark_as_loaded(tmp_path, tiny_teacher)
    assert loaded.name == tiny_teacher.name + "-spark" and loaded.config.num_layers == 2
    assert loaded.tokenizer is tiny_teacher.tokenizer and loaded.dtype == tiny_teacher.dtype


def _meta_student_state(cfg: ModelConfig, num_layers: int) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = LlamaModel(replace(cfg, num_layers=num_layers), max_positions=16)
    return {k: v for k, v in model.state_dict().items() if k.startswith(("layers.", "norm."))}
