"""Which teachers distillation accepts: the training forward must be the engine's forward."""

from __future__ import annotations

import pytest
import torch

from fastmode.cli import main
from fastmode.distill import command
from fastmode.distill.forward import SUPPORTED, causal_logits, check_supported
from fastmode.distill.pipeline import DistillOptions, run_distill, teacher_config
from fastmode.distill.train import TrainConfig
from fastmode.engine.scoring import full_logits
from fastmode.loader import load_model

TOKENS = [5, 17, 99, 3, 250, 42, 7, 7, 300, 12]


@pytest.mark.parametrize("fixture", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_training_forward_matches_engine_for_qwen(fixture, request):
    loaded = load_model(request.getfixturevalue(fixture), dtype="float32")
    check_supported(loaded.config)
    ours = causal_logits(loaded.model, torch.tensor([TOKENS]))[0]
    torch.testing.assert_close(ours, full_logits(loaded, TOKENS), rtol=1e-5, atol=1e-5)


def test_gemma3_is_refused_naming_what_is_supported(tiny_gemma3_dir, tmp_path):
    cfg = teacher_config(str(tiny_gemma3_dir))  # read from config.json, no weights loaded
    with pytest.raises(ValueError, match="four norms per block") as err:
        check_supported(cfg)
    assert SUPPORTED in str(err.value)
    loaded = load_model(tiny_gemma3_dir, dtype="float32")
    with pytest.raises(ValueError, match="cannot distill"):
        run_distill(loaded, TrainConfig(num_layers=1), DistillOptions(out_dir=tmp_path, progress=False))
    assert not any(tmp_path.iterdir())  # refused before answers, checkpoints or any training


def test_cli_refuses_gemma3_before_loading_the_teacher(tiny_gemma3_dir, tmp_path, monkeypatch, capsys):
    def no_load(*args, **kwargs):
        raise AssertionError("the teacher was loaded")

    monkeypatch.setattr("fastmode.loader.load_model", no_load)
    assert main(["distill", "--model", str(tiny_gemma3_dir), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "cannot distill" in err and "Qwen3" in err and "sliding-window layers" in err
    assert command.DistillCommandOptions().select_layers == "importance"
