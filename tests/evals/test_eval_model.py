"""End to end on the embedded model through the public API (skipped until it exists)."""

from __future__ import annotations

import pytest

from fastmode.evals.runner import evaluate
from fastmode.evals.tasks import load_tasks


@pytest.mark.slow
def test_evaluate_embedded_model_smoke() -> None:
    fastmode = pytest.importorskip("fastmode")
    try:
        llm_class = fastmode.LLM
    except AttributeError:
        pytest.skip("fastmode.LLM is not available yet")
    llm = llm_class(model=None, dtype="float32")
    # The first item of each category: the easiest, and quick on a CPU.
    tasks = load_tasks(limit_per_category=1)
    report = evaluate(llm, tasks, measure_speed=False, measure_perplexity=False)
    assert report.accuracy.num_total == len(tasks) == 4
    assert set(report.per_category) == {"factual", "arithmetic", "code", "format"}
    by_id = {item.id: item for item in report.items}
    # "What is the capital of France?" and add(a, b): a 135M model gets both.
    assert by_id["fact-001"].passed, by_id["fact-001"].response
    assert by_id["code-001"].passed, by_id["code-001"].response
