"""Training lowers the loss, and a resumed run is bit-for-bit the uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from fastmode.distill.student import own_state
from fastmode.distill.train import TrainConfig, Trainer, load_checkpoint, save_checkpoint
from tests.distill.conftest import make_tiny_stream

CFG = TrainConfig(num_layers=2, seq_len=16, batch_size=4, lr=3e-3, warmup_steps=2, seed=3)


def _trainer(teacher, cfg=CFG) -> Trainer:
    return Trainer(teacher.model, make_tiny_stream(teacher, cfg), cfg)


def test_a_few_steps_reduce_the_kd_loss_on_a_fixed_batch(tiny_teacher):
    trainer = _trainer(tiny_teacher)
    batch = make_tiny_stream(tiny_teacher, CFG, seed=99).next_batch()
    before = trainer.evaluate(batch)
    for _ in range(12):
        trainer.train_step()
    after = trainer.evaluate(batch)
    assert before.kl > 0.01
    assert after.kl < 0.7 * before.kl, (before, after)
    assert trainer.step == 12 and trainer.tokens_seen == 12 * CFG.tokens_per_step


def test_resume_gives_identical_weights_to_an_uninterrupted_run(tiny_teacher, tmp_path):
    straight = _trainer(tiny_teacher)
    for _ in range(6):
        straight.train_step()

    first = _trainer(tiny_teacher)
    for _ in range(3):
        first.train_step()
    save_checkpoint(tmp_path / "ckpt.pt", first.state_dict())
    torch.manual_seed(12345)  # disturb the global RNG: the checkpoint must restore it

    resumed = _trainer(tiny_teacher)
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt")
    resumed.load_state_dict(checkpoint)
    assert torch.equal(torch.get_rng_state(), checkpoint["torch_rng"])
    losses = [resumed.train_step().total for _ in range(3)]
    assert resumed.step == 6 and resumed.stream.state() == straight.stream.state()
    a, b = own_state(straight.student), own_state(resumed.student)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a, opt_b = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(opt_a[i]["exp_avg_sq"], opt_b[i]["exp_avg_sq"]) for i in opt_a)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_resume_refuses_a_checkpoint_of_other_settings(tiny_teacher):
    state = _trainer(tiny_teacher).state_dict()
    other = TrainConfig(**{**CFG.__dict__, "lr": 1e-4})
    with pytest.raises(ValueError, match="lr"):
        Trainer(tiny_teacher.model, make_tiny_stream(tiny_teacher, other), other).load_state_dict(state)


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    cfg = TrainConfig(lr=1.0, warmup_steps=10, decay_steps=110)
    assert cfg.lr_at(0) == pytest.approx(0.1) and cfg.lr_at(9) == pytest.approx(1.0)
    assert cfg.lr_at(10) == pytest.approx(1.0) and cfg.lr_at(110) == pytest.approx(0.1)
    assert TrainConfig(lr=1.0, warmup_steps=10).lr_at(10_000) == 1.0
