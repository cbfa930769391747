"""Held-out eval text never reaches Spark's training data."""

from __future__ import annotations

import pytest

from fastmode.distill.answers import Answer, load_prompts
from fastmode.distill.corpus import (
    Document,
    keep_clean,
    normalize,
    shakespeare_dir,
    shakespeare_documents,
    split_text,
    stdlib_documents,
)
from fastmode.distill.defaults import DEFAULT_MIX
from fastmode.distill.pipeline import load_sources
from fastmode.evals.perplexity import load_heldout
from fastmode.evals.tasks import load_tasks

HELDOUT = [normalize(t.text) for t in load_heldout()]


@pytest.fixture(scope="module")
def training_documents() -> list[Document]:
    """Exactly what the pipeline trains on (answers stand in: prompt + a fixed reply)."""
    answers = [Answer(p, (1, 2), (3,), "Here is my answer.").document(eos_id=2) for p in load_prompts()]
    sources = load_sources(DEFAULT_MIX, answers)
    assert len(sources["stdlib"]) > 1000 and len(sources["answers"]) == len(answers)
    return [d for docs in sources.values() for d in docs]


def test_no_training_document_contains_a_heldout_paragraph(training_documents):
    assert len(HELDOUT) == 25
    for doc in training_documents:
        text = normalize(doc.text)
        leaked = [h[:40] for h in HELDOUT if h in text]
        assert not leaked, f"{doc.source}/{doc.name} contains held-out text {leaked}"


def test_raw_sources_are_clean_before_filtering():
    # The guard should have nothing to drop: a drop would mean the sources changed.
    raw = stdlib_documents() + shakespeare_documents()
    assert len(keep_clean(raw)) == len(raw)


def test_prompts_are_not_eval_task_prompts():
    prompts = [normalize(p) for p in load_prompts()]
    assert 180 <= len(prompts) <= 260 and len(set(prompts)) == len(prompts)
    for task in load_tasks():
        t = normalize(task.prompt)
        assert not any(t in p or p in t for p in prompts), task.id


def test_guard_drops_rewrapped_heldout_and_eval_prompts():
    passage = load_heldout()[3].text.replace(". ", ".\n    ")
    task = next(t for t in load_tasks() if len(t.prompt) > 30)
    docs = [
        Document("x", "leak", "intro\n" + passage.upper()),
        Document("x", "task", f"Q: {task.prompt} A:"),
        Document("x", "fine", "an unrelated sentence"),
    ]
    assert [d.name for d in keep_clean(docs)] == ["fine"]


def test_shakespeare_uses_modern_texts_only():
    if shakespeare_dir() is None:
        pytest.skip("the shakespeare package is not installed")
    names = [d.name for d in shakespeare_documents()]
    assert "hamlet_gut.txt" in names and not any(n.endswith("_gut_f.txt") for n in names)


def test_split_text_keeps_every_line_and_respects_the_size():
    text = "".join(f"line {i}\n" for i in range(500))
    pieces = split_text(text, 200)
    assert "".join(pieces) == text and max(len(p) for p in pieces) <= 200
