"""Quantization-aware training: the student trains on exactly the Q4_1 weights it is stored with."""

from __future__ import annotations

import logging

import pytest
import torch

from fastmode.distill import pipeline
from fastmode.distill.export import dequantize_q4_1, quantize_q4_1, save_spark
from fastmode.distill.forward import causal_hidden
from fastmode.distill.pipeline import DistillOptions, run_distill
from fastmode.distill.qat import fake_quantize_q4_1, q4_1_round_trip, quant_aware_hidden, quantized_weight_names
from fastmode.distill.spark import load_spark
from fastmode.distill.student import own_state
from fastmode.distill.train import TrainConfig, Trainer, resume_mismatch
from tests.distill.conftest import make_tiny_stream, tiny_sources

CFG = TrainConfig(num_layers=2, seq_len=16, batch_size=4, lr=3e-3, warmup_steps=2, seed=3)
MIX = {"code": 0.5, "prose": 0.5}


def test_round_trip_equals_gguf_encoding_and_decoding_bit_for_bit():
    torch.manual_seed(0)
    w = torch.randn(48, 128) * 0.05
    w[0, :32] = 0.3  # a constant block: zero step
    w[1, 32:64] = 0.0
    w[2, :32] = torch.linspace(-1, 1, 32)  # codes 0 and 15 both used
    assert torch.equal(q4_1_round_trip(w), dequantize_q4_1(quantize_q4_1(w)))
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_1_round_trip(torch.zeros(4, 40))


def test_fake_quantization_passes_the_gradient_straight_through():
    w = (torch.randn(8, 64) * 0.1).requires_grad_(True)
    coeff = torch.randn(8, 64)
    out = fake_quantize_q4_1(w)
    assert torch.equal(out.detach(), q4_1_round_trip(w))
    (out * coeff).sum().backward()
    assert torch.equal(w.grad, coeff)


def test_the_training_forward_is_the_forward_of_the_stored_student(tiny_teacher, tmp_path):
    cfg = TrainConfig(**{**CFG.__dict__, "quantize_aware_from": 0})
    trainer = Trainer(tiny_teacher.model, make_tiny_stream(tiny_teacher, cfg), cfg)
    for _ in range(3):
        trainer.train_step()
    names = quantized_weight_names(trainer.student)
    assert names and all(".weight" in n and "norm" not in n for n in names)
    save_spark(
        tmp_path, own_state(trainer.student), {"teacher": {"name": "t", "sha256": "x"}, "layer_indices": [0, 2]}, "q4_1"
    )
    stored = load_spark(tmp_path, tiny_teacher, check_teacher=False)
    ids = make_tiny_stream(tiny_teacher, cfg, seed=7).next_batch()[:, :-1]
    with torch.no_grad():
        trained, served = quant_aware_hidden(trainer.student, ids), causal_hidden(stored, ids)
        plain = causal_hidden(trainer.student, ids)
    torch.testing.assert_close(served, trained, rtol=0, atol=1e-5)
    assert (plain - served).abs().max() > 1e-3  # the rounding is real: fp32 weights give other states


def test_quantization_aware_steps_lower_the_loss_of_the_stored_weights(tiny_teacher):
    cfg = TrainConfig(**{**CFG.__dict__, "quantize_aware_from": 0})
    trainer = Trainer(tiny_teacher.model, make_tiny_stream(tiny_teacher, cfg), cfg)
    batch = make_tiny_stream(tiny_teacher, cfg, seed=99).next_batch()
    before = trainer.evaluate(batch).kl
    for _ in range(12):
        trainer.train_step()
    assert trainer.evaluate(batch).kl < 0.8 * before


def test_a_checkpoint_resumes_quantization_aware_only_from_a_later_step():
    plain = {**TrainConfig().__dict__}
    plain.pop("quantize_aware_from")  # a checkpoint written before the field existed
    assert resume_mismatch(plain, TrainConfig(), 50) == {}
    assert resume_mismatch(plain, TrainConfig(quantize_aware_from=50), 50) == {}
    assert resume_mismatch(plain, TrainConfig(quantize_aware_from=80), 50) == {}
    assert resume_mismatch(plain, TrainConfig(quantize_aware_from=20), 50) == {"quantize_aware_from": (None, 20)}
    qat = {**plain, "quantize_aware_from": 10}
    assert resume_mismatch(qat, TrainConfig(), 50) == {"quantize_aware_from": (10, None)}
    assert resume_mismatch(qat, TrainConfig(quantize_aware_from=10, lr=1.0), 50) == {"lr": (5e-4, 1.0)}
    with pytest.raises(ValueError, match=">= 0"):
        TrainConfig(quantize_aware_from=-1)


def test_distill_trains_a_q4_1_student_quantization_aware(tiny_teacher, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(pipeline, "load_sources", lambda mix, answer_docs: tiny_sources())
    cfg = TrainConfig(num_layers=2, seq_len=16, batch_size=2, lr=3e-3, warmup_steps=2)
    fresh = run_distill(
        tiny_teacher,
        cfg,
        DistillOptions(out_dir=tmp_path / "q", max_steps=3, mix=MIX, export_format="q4_1", progress=False),
    )
    assert fresh["format"] == "q4_1" and fresh["summary"]["quantize_aware_from"] == 0

    # A run trained in fp32 and then stored as Q4_1 is warned about, and can turn rounding on from here.
    run_distill(tiny_teacher, cfg, DistillOptions(out_dir=tmp_path / "p", max_steps=3, mix=MIX, progress=False))
    with caplog.at_level(logging.WARNING, logger="fastmode.distill.pipeline"):
        late = run_distill(
            tiny_teacher,
            cfg,
            DistillOptions(
                out_dir=tmp_path / "p", resume=True, max_steps=4, mix=MIX, export_format="q4_1", progress=False
            ),
        )
    assert late["summary"]["quantize_aware_from"] is None and "Q4_1 rounding" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastmode.distill.pipeline"):
        late = run_distill(
            tiny_teacher,
            TrainConfig(**{**cfg.__dict__, "quantize_aware_from": 4}),
            DistillOptions(
                out_dir=tmp_path / "p", resume=True, max_steps=6, mix=MIX, export_format="q4_1", progress=False
            ),
        )
    assert late["summary"]["quantize_aware_from"] == 4 and late["summary"]["steps"] == 6
    assert "Q4_1 rounding" not in caplog.text
    with pytest.raises(ValueError, match="quantize_aware_from"):
        run_distill(
            tiny_teacher,
            TrainConfig(**{**cfg.__dict__, "quantize_aware_from": 2}),
            DistillOptions(out_dir=tmp_path / "p", resume=True, max_steps=8, mix=MIX, progress=False),
        )
