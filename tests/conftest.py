"""Shared fixtures: tiny checkpoints built here (no network), and the embedded model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import build_hf_model


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return build_hf_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return build_hf_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", tie_word_embeddings=True)


@pytest.fixture(scope="session")
def default_llm():
    """The embedded SmolLM2-135M-Instruct in fp32, loaded once per session."""
    from fastmode import LLM

    return LLM(dtype="float32")
