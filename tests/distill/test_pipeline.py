"""`fastmode distill` end to end on the tiny model: train, checkpoint, resume, export, load."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from fastmode.cli import build_parser
from fastmode.distill import pipeline
from fastmode.distill.pipeline import DistillOptions, run_distill
from fastmode.distill.spark import load_spark
from fastmode.distill.train import TrainConfig, Trainer, load_checkpoint
from tests.distill.conftest import tiny_sources

MIX = {"code": 0.5, "prose": 0.5}


@pytest.fixture
def tiny_data(monkeypatch):
    # The real sources (the stdlib, Shakespeare, generated answers) are tested in test_corpus.py.
    monkeypatch.setattr(pipeline, "load_sources", lambda mix, answer_docs: tiny_sources())


def _run(teacher, out, max_steps, resume=False):
    cfg = TrainConfig(num_layers=2, seq_len=16, batch_size=2, lr=3e-3, warmup_steps=2, decay_steps=8)
    opts = DistillOptions(out_dir=out, resume=resume, max_steps=max_steps, checkpoint_every=2, mix=MIX, progress=False)
    return run_distill(teacher, cfg, opts)


def test_run_checkpoint_resume_export(tiny_teacher, tmp_path, tiny_data):
    info = _run(tiny_teacher, tmp_path, max_steps=4)
    selection = info["layer_selection"]
    assert info["format"] == "fp32" and selection["method"] == "importance"
    assert info["layer_indices"] == selection["layers"] and len(selection["layers"]) == 2
    assert [r["layer"] for r in selection["removed"]] == sorted(set(range(3)) - set(selection["layers"]))
    assert set(selection["kept_kl"]) == {str(i) for i in selection["layers"]}
    assert info["summary"]["steps"] == 4 and info["file_bytes"] <= 50_000_000
    with pytest.raises(FileExistsError):
        _run(tiny_teacher, tmp_path, max_steps=6)

    with pytest.raises(ValueError, match="other data settings"):
        run_distill(
            tiny_teacher,
            TrainConfig(num_layers=2, seq_len=16, batch_size=2, lr=3e-3, warmup_steps=2, decay_steps=8),
            DistillOptions(out_dir=tmp_path, resume=True, mix={"code": 1.0}, progress=False),
        )
    info = _run(tiny_teacher, tmp_path, max_steps=6, resume=True)
    assert info["summary"]["steps"] == 6 and info["layer_selection"] == selection
    steps = [json.loads(line)["step"] for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))

    straight = _run(tiny_teacher, tmp_path / "straight", max_steps=6)
    assert straight["summary"]["last20_mean_kl"] == info["summary"]["last20_mean_kl"]
    a, b = load_spark(tmp_path, tiny_teacher), load_spark(tmp_path / "straight", tiny_teacher)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_even_selection_and_a_changed_selection_is_not_resumed(tiny_teacher, tmp_path, tiny_data):
    cfg = TrainConfig(num_layers=2, seq_len=16, batch_size=2, lr=3e-3, warmup_steps=2, layer_selection="even")
    opts = DistillOptions(out_dir=tmp_path, max_steps=4, mix=MIX, progress=False)
    info = run_distill(tiny_teacher, cfg, opts)
    assert info["layer_indices"] == [0, 2] and info["layer_selection"] == {"method": "even", "layers": [0, 2]}
    assert info["summary"]["probe_kl_end"] < info["summary"]["probe_kl_start"]
    with pytest.raises(ValueError, match="other training settings"):
        run_distill(
            tiny_teacher,
            TrainConfig(num_layers=2, seq_len=16, batch_size=2, lr=3e-3, warmup_steps=2),
            DistillOptions(out_dir=tmp_path, resume=True, max_steps=6, mix=MIX, progress=False),
        )


def test_time_budget_stops_training(tiny_teacher, tmp_path, tiny_data):
    cfg = TrainConfig(num_layers=2, seq_len=16, batch_size=2)
    opts = DistillOptions(out_dir=tmp_path, max_minutes=0.0, mix=MIX, progress=False)
    assert run_distill(tiny_teacher, cfg, opts)["summary"]["steps"] == 1  # the first step always runs


def test_ctrl_c_stops_after_the_current_step_and_exports(tiny_teacher, tmp_path, tiny_data, monkeypatch):
    real_step = Trainer.train_step

    def step_then_ctrl_c(self):
        parts = real_step(self)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C during step 2
        return parts

    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    info = _run(tiny_teacher, tmp_path, max_steps=10)
    assert info["summary"]["steps"] == 2 and (tmp_path / "spark.safetensors").exists()
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 2


def test_cli_registers_distill():
    args = build_parser().parse_args(["distill", "--num-layers", "8", "--max-minutes", "2", "--mix", "stdlib=1"])
    assert args.num_layers == 8 and args.max_minutes == 2 and args.mix == {"stdlib": 1.0}


def test_distill_flags_default_to_the_training_configs():
    """DistillCommandOptions spells out TrainConfig's and DistillOptions' defaults (the CLI must not import torch)."""
    from fastmode.distill.command import DistillCommandOptions
    from fastmode.distill.export import MAX_BYTES

    flags, train, run = DistillCommandOptions(), TrainConfig(), DistillOptions(out_dir=Path("x"))
    assert flags.select_layers == train.layer_selection and flags.importance_windows == run.importance_windows
    for name in (
        "num_layers",
        "seq_len",
        "batch_size",
        "lr",
        "warmup_steps",
        "decay_steps",
        "temperature",
        "ce_weight",
        "seed",
        "quantize_aware_from",
    ):
        assert getattr(flags, name) == getattr(train, name), name
    for name in (
        "model",
        "resume",
        "init_from",
        "max_steps",
        "max_minutes",
        "checkpoint_every",
        "mix",
        "answer_max_tokens",
    ):
        assert getattr(flags, name) == getattr(run, name), name
    assert flags.format == run.export_format and int(flags.max_mb * 1e6) == run.max_bytes == MAX_BYTES
    args = build_parser().parse_args(["distill", "--out", "runs/s", "--decay-steps", "50", "--resume"])
    assert args.out == Path("runs/s") and args.decay_steps == 50 and args.resume and args.mix == run.mix
    with pytest.raises(SystemExit):
        build_parser().parse_args(["distill", "--mix", "stdlib"])


def test_init_from_an_exported_student(tiny_teacher, tmp_path, tiny_data):
    """A new run from an exported student starts from its stored weights and layers, continues its log."""
    first = _run(tiny_teacher, tmp_path / "first", max_steps=3)
    cfg = TrainConfig(num_layers=2, seq_len=16, batch_size=2, lr=3e-3, warmup_steps=2, decay_steps=8, seed=1)

    def opts(out, **kw):
        return DistillOptions(out_dir=out, mix=MIX, progress=False, checkpoint_every=2, **kw)

    # Zero steps: the exported student comes back unchanged, on the same layers.
    same = run_distill(tiny_teacher, cfg, opts(tmp_path / "same", init_from=tmp_path / "first", max_steps=0))
    assert same["layer_indices"] == first["layer_indices"] and same["layer_selection"] == first["layer_selection"]
    a, b = load_spark(tmp_path / "first", tiny_teacher), load_spark(tmp_path / "same", tiny_teacher)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert same["summary"]["probe_kl_start"] == pytest.approx(same["summary"]["probe_kl_end"])

    more = run_distill(tiny_teacher, cfg, opts(tmp_path / "more", init_from=tmp_path / "first", max_steps=2))
    prior = more["summary"]["init_from"]
    assert (prior["steps"], prior["tokens"], prior["file"]) == (3, first["summary"]["tokens"], "spark.safetensors")
    rows = [json.loads(line) for line in (tmp_path / "more" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[3]["elapsed_s"] >= rows[2]["elapsed_s"]  # the time goes on from the earlier run's
    # Resuming such a run keeps the continued numbering.
    more = run_distill(tiny_teacher, cfg, opts(tmp_path / "more", resume=True, max_steps=3))
    rows = [json.loads(line) for line in (tmp_path / "more" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and more["summary"]["init_from"] == prior

    with pytest.raises(ValueError, match="--num-layers 2"):
        run_distill(tiny_teacher, TrainConfig(num_layers=1), opts(tmp_path / "x", init_from=tmp_path / "first"))
    with pytest.raises(ValueError, match="only one"):
        run_distill(tiny_teacher, cfg, opts(tmp_path / "more", init_from=tmp_path / "first", resume=True))
    with pytest.raises(FileNotFoundError, match="no Spark weights"):
        run_distill(tiny_teacher, cfg, opts(tmp_path / "y", init_from=tmp_path / "nothing"))
