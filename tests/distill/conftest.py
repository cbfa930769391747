"""Fixtures: the tiny random Llama as a teacher, and a tiny deterministic window stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastmode.distill.corpus import Document
from fastmode.distill.stream import SourceCursor, WindowStream
from fastmode.distill.train import TrainConfig
from fastmode.loader import LoadedModel, load_model
from tests.builders import CORPUS


@pytest.fixture(scope="session")
def tiny_teacher(tiny_llama_dir: Path) -> LoadedModel:
    """3 layers, hidden 64, vocab 384, fp32; never modified by the tests (students copy its layers)."""
    return load_model(tiny_llama_dir, dtype="float32")


def tiny_sources() -> dict[str, list[Document]]:
    code = [Document("code", f"c{i}", t) for i, t in enumerate(CORPUS[:6]) if "def " in t or "for " in t]
    prose = [Document("prose", f"p{i}", t) for i, t in enumerate(CORPUS[:6]) if t not in {d.text for d in code}]
    return {"code": code, "prose": prose}


def make_tiny_stream(teacher: LoadedModel, cfg: TrainConfig, seed: int | None = None) -> WindowStream:
    """A two-source stream over the builders' corpus."""
    tok = teacher.tokenizer
    sep = tok.backend.token_to_id("<|endoftext|>")
    cursors = [
        SourceCursor(name, docs, lambda t: tok.encode(t, add_special_tokens=False), sep, cfg.seed)
        for name, docs in tiny_sources().items()
    ]
    return WindowStream(
        cursors, {"code": 0.5, "prose": 0.5}, cfg.seed if seed is None else seed, cfg.batch_size, cfg.seq_len
    )
