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
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    return build_hf_model(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory) -> Path:
    return build_hf_model(tmp_path_factory.mktemp("tiny-gemma3"), "gemma3")


@pytest.fixture(scope="session")
def tiny_gemma3_gguf_dir(tmp_path_factory) -> Path:
    """Gemma 3 with query_pre_attn_scalar = head_dim: the scale llama.cpp's GGUF readers
    assume for every Gemma 3 but the 27B, so this one converts to a faithful GGUF."""
    return build_hf_model(tmp_path_factory.mktemp("tiny-gemma3-gguf"), "gemma3", query_pre_attn_scalar=16)


@pytest.fixture(scope="session")
def default_llm():
    """The embedded SmolLM2-135M-Instruct in fp32, loaded once per session."""
    from fastmode import LLM

    return LLM(dtype="float32")


@pytest.fixture
def drafting_always(monkeypatch):
    """Make an LLM's n-gram speculation draft wherever a lookup matches, whatever the step
    curve says (min_gain 0): tests that check speculation is exact need it to run, and on a
    loaded machine the measured step times can make drafts look unprofitable."""
    import dataclasses

    def apply(llm):
        lookup = llm.engine.spec.lookup
        monkeypatch.setattr(lookup, "config", dataclasses.replace(lookup.config, min_gain=0.0))
        return llm

    return apply
