"""Shapes in the catalog reproduce the published parameter counts and byte sizes."""

from __future__ import annotations

import dataclasses

import pytest

from fastmode.planner.catalog import load_model, model_names
from fastmode.planner.model_spec import ModelSpec


@pytest.mark.parametrize("name", [n for n in model_names() if load_model(n).published_params])
def test_total_params_match_published(name):
    m = load_model(name)
    assert m.total_params == pytest.approx(m.published_params, rel=0.015)


@pytest.mark.parametrize("name", ["glm-4.7", "gpt-oss-120b", "llama-3.1-8b"])
def test_active_params_match_published(name):
    m = load_model(name)
    assert m.matmul_params_per_token == pytest.approx(m.published_active_params, rel=0.07)


def test_smollm2_kv_and_file_size():
    m = load_model("smollm2-135m")
    assert m.kv_bytes_per_token(2) == 23_040  # anchors.md
    assert 94e6 < m.weight_bytes("q4_1") < 99e6  # the 98 MB GGUF (metadata and tokenizer add the rest)
    assert m.weight_bytes("bf16") == pytest.approx(2 * 134.5e6, rel=0.002)


def test_spark_student_is_fastmode_own_and_smaller():
    spark, teacher = load_model("smollm2-135m-spark"), load_model("smollm2-135m")
    assert spark.origin == "fastmode" and spark.num_layers < teacher.num_layers
    assert spark.hidden_size == teacher.hidden_size and spark.vocab_size == teacher.vocab_size


def test_gpt_oss_mxfp4_checkpoint_size():
    assert load_model("gpt-oss-120b").weight_bytes() == pytest.approx(65e9, rel=0.03)


def test_sliding_window_caps_kv():
    m = load_model("gpt-oss-120b")
    full = m.kv_bytes_per_token() * 100_000
    # Half the layers keep at most 128 tokens, so a long context costs about half the full figure.
    assert m.kv_bytes(100_000) == pytest.approx(full / 2, rel=0.01)
    assert m.kv_bytes(64) == pytest.approx(m.kv_bytes_per_token() * 64)


def test_validation_rejects_bad_shapes():
    base = load_model("llama-3.1-8b")
    with pytest.raises(ValueError):
        dataclasses.replace(base, num_kv_heads=5)
    with pytest.raises(ValueError):
        dataclasses.replace(base, num_experts=8, experts_per_token=9, expert_ffn_size=10)
    with pytest.raises(ValueError):
        dataclasses.replace(base, default_format="fp3")


def test_from_config_duck_types_engine_config():
    class Cfg:
        num_layers, hidden_size, intermediate_size = 30, 576, 1536
        num_heads, num_kv_heads, head_dim, vocab_size = 9, 3, 64, 49152
        tie_word_embeddings, max_position_embeddings = True, 8192

    m = ModelSpec.from_config("smol", Cfg())
    assert m.total_params == load_model("smollm2-135m").total_params
