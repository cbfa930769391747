"""Teacher answers: generated greedily through the LLM API, cached, reused."""

from __future__ import annotations

import fastmode
from fastmode.distill.answers import teacher_answers
from fastmode.distill.export import teacher_identity

PROMPTS = ["Tell me about foxes.", "Write a loop in Python.", "Describe a dog."]


def test_answers_are_generated_once_then_read_from_the_cache(tiny_llama_dir, tmp_path, monkeypatch):
    key = teacher_identity(tiny_llama_dir)
    cache = tmp_path / "answers.jsonl"
    first = teacher_answers(PROMPTS, cache, key, model=str(tiny_llama_dir), max_tokens=6, batch_size=2)
    assert [a.prompt for a in first] == PROMPTS
    assert all(0 < len(a.answer_ids) <= 6 and len(a.prompt_ids) > 3 for a in first)
    doc = first[0].document(eos_id=2)
    assert doc.token_ids[: len(first[0].prompt_ids)] == first[0].prompt_ids and doc.token_ids[-1] == 2

    def no_engine(*args, **kwargs):
        raise AssertionError("a cached answer was generated again")

    monkeypatch.setattr(fastmode, "LLM", no_engine)
    assert teacher_answers(PROMPTS[::-1], cache, key, model=str(tiny_llama_dir), max_tokens=6) == first[::-1]
