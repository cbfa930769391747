"""Where Spark is found (user build before the packaged copy), loading it by name or path,
and the engine's default draft ("auto")."""

from __future__ import annotations

import pytest
import torch

from fastmode import SamplingParams
from fastmode.distill import spark as spark_mod
from fastmode.distill.export import save_spark, teacher_identity
from fastmode.distill.spark import find_spark, spark_name
from fastmode.distill.student import build_student, own_state
from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.loader import ModelLoadError, load_model
from fastmode.loader.default_model import DEFAULT_MODEL_NAME


def _write_tiny_spark(folder, teacher, seed=0):
    torch.manual_seed(seed)
    student = build_student(teacher.model, [0, 2])
    with torch.no_grad():
        for p in student.layers.parameters():
            p.add_(0.01 * torch.randn_like(p))
    info = {"teacher": teacher_identity(teacher.path), "layer_indices": [0, 2], "summary": {"steps": 0}}
    save_spark(folder, own_state(student), info, "fp32")
    return folder


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """An empty user cache and an empty packaged folder."""
    monkeypatch.setenv("FASTMODE_CACHE_DIR", str(tmp_path / "cache"))
    packaged = tmp_path / "packaged"
    monkeypatch.setattr(spark_mod, "packaged_spark_dir", lambda name=DEFAULT_MODEL_NAME: packaged / spark_name(name))
    return tmp_path


def test_find_spark_prefers_the_users_build_over_the_packaged_copy(isolated, tiny_teacher):
    name = tiny_teacher.name
    assert find_spark(name) is None
    packaged = _write_tiny_spark(isolated / "packaged" / spark_name(name), tiny_teacher)
    assert find_spark(name) == packaged
    built = _write_tiny_spark(isolated / "cache" / "spark" / spark_name(name), tiny_teacher, seed=1)
    assert find_spark(name) == built


def test_load_model_takes_a_spark_path(tiny_teacher, tmp_path):
    _write_tiny_spark(tmp_path, tiny_teacher)
    # A Spark path is rebuilt on the *default* model; the tiny one was distilled from another
    # teacher, so the sha256 check refuses it with a clear error instead of producing noise.
    with pytest.raises(ModelLoadError, match="distilled from"):
        load_model(tmp_path, dtype="float32")


def test_spark_by_name_without_weights_is_a_clear_error(isolated):
    for name in ("spark", spark_name(DEFAULT_MODEL_NAME)):
        with pytest.raises(ModelLoadError, match="fastmode distill"):
            load_model(name)


def test_auto_draft_uses_the_models_spark_and_stays_lossless(isolated, tiny_teacher, tiny_llama_dir):
    cfg = EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, speculative="off")
    plain = LLMEngine(cfg, loaded=load_model(tiny_llama_dir, dtype="float32"))
    assert plain.drafter is None  # no Spark yet: no draft model, and asking for one is refused
    with pytest.raises(ValueError, match="draft model"):
        plain.add_request([1, 2, 3], SamplingParams(speculative="draft"))

    _write_tiny_spark(isolated / "cache" / "spark" / spark_name(tiny_teacher.name), tiny_teacher)
    engine = LLMEngine(cfg, loaded=load_model(tiny_llama_dir, dtype="float32"))
    assert engine.drafter is not None
    prompt = [5, 17, 99, 3, 250, 42, 7, 7, 300, 12]
    want = _run(plain, prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    got = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, speculative="draft"))
    assert got == want
    assert sum(engine.spec.stats.draft_tokens.values()) > 0


def test_auto_draft_skips_a_spark_of_another_checkpoint(isolated, tiny_teacher, tiny_llama_dir):
    folder = isolated / "cache" / "spark" / spark_name(tiny_teacher.name)
    info = {"teacher": {"name": "other", "sha256": "0" * 64}, "layer_indices": [0, 2]}
    save_spark(folder, own_state(build_student(tiny_teacher.model, [0, 2])), info, "fp32")
    cfg = EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01)
    assert LLMEngine(cfg, loaded=load_model(tiny_llama_dir, dtype="float32")).drafter is None


def _run(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[int]:
    rid = engine.add_request(prompt, params)
    out: list[int] = []
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid and o.finished:
                out = o.token_ids
    return out
