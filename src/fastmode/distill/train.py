"""One distillation step, and the state a checkpoint needs to resume it bit for bit.

A step: take the next (B, T+1) window batch, run the frozen teacher and the
student over the first T tokens with the plain causal forward, back-propagate
the distillation loss (see `loss.py`) into the student's layers and final
norm, clip, AdamW. Everything is deterministic on one machine with a fixed
thread count, so a checkpoint of (student, optimizer, RNG, stream position,
step) continues exactly where an uninterrupted run would be.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fastmode.distill.forward import causal_hidden
from fastmode.distill.loss import LossParts, distill_loss
from fastmode.distill.qat import quant_aware_hidden
from fastmode.distill.stream import WindowStream
from fastmode.distill.student import build_student, choose_layers, own_parameters, own_state
from fastmode.models.llama import LlamaModel


@dataclass(frozen=True)
class TrainConfig:
    """What decides the maths of a run; a checkpoint resumes only under an equal config."""

    num_layers: int = 10
    layer_selection: str = "importance"  # "even" spacing, or greedy removal by measured "importance"
    seq_len: int = 256  # tokens per window
    batch_size: int = 4  # windows per step
    lr: float = 5e-4  # peak AdamW learning rate (measured: 1e-3 beat 2e-4 over the first 12 steps)
    warmup_steps: int = 20
    decay_steps: int | None = None  # None: constant lr after warm-up; else cosine to 10% at this step
    temperature: float = 1.0
    ce_weight: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm
    seed: int = 0
    # From this step on the student trains through Q4_1 rounding (see qat.py); None: never.
    quantize_aware_from: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "seq_len", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.temperature <= 0 or self.ce_weight < 0 or self.grad_clip <= 0:
            raise ValueError("lr, temperature and grad_clip must be > 0, ce_weight >= 0")
        if self.layer_selection not in ("even", "importance"):
            raise ValueError(f"layer_selection must be 'even' or 'importance', got {self.layer_selection!r}")
        if self.quantize_aware_from is not None and self.quantize_aware_from < 0:
            raise ValueError(f"quantize_aware_from must be >= 0, got {self.quantize_aware_from}")
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"decay_steps ({self.decay_steps}) must exceed warmup_steps ({self.warmup_steps})")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch_size

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then constant; with decay_steps, cosine decay to 10% of peak at that step."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps is None:
            return self.lr
        progress = (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    def quantize_aware_at(self, step: int) -> bool:
        """Whether step `step` (0-based) trains through Q4_1 rounding."""
        return self.quantize_aware_from is not None and step >= self.quantize_aware_from


def resume_mismatch(saved: dict[str, Any], cfg: TrainConfig, step: int) -> dict[str, tuple[Any, Any]]:
    """The settings under which a checkpoint saved at `step` with config `saved` does not continue
    as `cfg` would have run: {field: (saved, now)}; empty when it resumes exactly.

    A field added after the checkpoint was written counts as its default. The
    quantization-aware start may differ if both values lie at or after `step`,
    since the steps already taken were computed the same way under either.
    """
    now = asdict(cfg)
    defaults = asdict(TrainConfig())
    diff = {}
    for name, value in now.items():
        old = saved.get(name, defaults[name])
        if name == "quantize_aware_from":
            starts = [step if v is None else v for v in (old, value)]  # None: not before `step` either
            if min(starts) >= step:
                continue
        if old != value:
            diff[name] = (old, value)
    return diff


class Trainer:
    """The student, its optimizer and the data stream; `train_step` advances all three."""

    def __init__(
        self, teacher: LlamaModel, stream: WindowStream, cfg: TrainConfig, layer_indices: Sequence[int] | None = None
    ):
        if stream.seq_len != cfg.seq_len or stream.batch_size != cfg.batch_size:
            raise ValueError("the stream's seq_len/batch_size differ from the config's")
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.teacher, self.stream, self.cfg = teacher, stream, cfg
        self.layer_indices = list(layer_indices or choose_layers(teacher.cfg.num_layers, cfg.num_layers))
        if len(self.layer_indices) != cfg.num_layers:
            raise ValueError(f"{len(self.layer_indices)} layer indices for num_layers={cfg.num_layers}")
        self.student = build_student(teacher, self.layer_indices)
        self.params = own_parameters(self.student)
        # betas (0.9, 0.95): the usual LM setting; no weight decay, the target is the teacher, not small weights.
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step = 0
        self.tokens_seen = 0

    def _loss(self, batch: torch.Tensor, backward: bool) -> LossParts:
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, T) each
        with torch.no_grad():
            teacher_h = causal_hidden(self.teacher, inputs)
        student_forward = quant_aware_hidden if self.cfg.quantize_aware_at(self.step) else causal_hidden
        with torch.set_grad_enabled(backward):
            student_h = student_forward(self.student, inputs)
        return distill_loss(
            self.student.lm_head,
            student_h.flatten(0, 1),
            teacher_h.flatten(0, 1),
            targets.flatten(),
            self.cfg.temperature,
            self.cfg.ce_weight,
            backward=backward,
        )

    def train_step(self) -> LossParts:
        """One optimizer step on the stream's next batch; returns the batch's loss before the update."""
        lr = self.cfg.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        parts = self._loss(self.stream.next_batch(), backward=True)
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += parts.num_tokens
        return parts

    @torch.no_grad()
    def evaluate(self, batch: torch.Tensor) -> LossParts:
        """The loss on a fixed (B, T+1) batch, without touching weights or stream; once training is
        quantization-aware, of the weights as they will be stored."""
        return self._loss(batch, backward=False)

    def load_student(self, weights: dict[str, torch.Tensor], source: str) -> None:
        """Set the student's own tensors (layers + final norm); ValueError naming `source` if they do not fit."""
        missing, unexpected = self.student.load_state_dict(weights, strict=False)
        if unexpected or any(k.startswith(("layers.", "norm.")) for k in missing):
            raise ValueError(f"{source} student does not match: missing {missing}, unexpected {unexpected}")

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "config": asdict(self.cfg),
            "layer_indices": self.layer_indices,
            "student": {k: v.clone() for k, v in own_state(self.student).items()},
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "stream": self.stream.state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`; ValueError if it was made under another config or layer choice."""
        diff = resume_mismatch(state["config"], self.cfg, state["step"])
        if diff or state["layer_indices"] != self.layer_indices:
            raise ValueError(
                f"checkpoint was made with other settings (checkpoint, now): {diff or state['layer_indices']}"
            )
        self.load_student(state["student"], "checkpoint")
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.stream.load_state(state["stream"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a crash while saving leaves the previous checkpoint intact."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)
