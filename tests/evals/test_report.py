"""Summaries, agreement and the table, built from item results (no model needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastmode.evals.command import register
from fastmode.evals.report import format_table, to_json, write_json
from fastmode.evals.runner import ItemResult, agreement, summarize


def _items(passed: list[bool], category: str = "factual", text: str = "ok") -> list[ItemResult]:
    return [ItemResult(f"{category}-{i}", category, p, text, 3) for i, p in enumerate(passed)]


def test_summarize_counts_per_category_and_chain() -> None:
    items = _items([True] * 8 + [False] * 2) + _items([True, False], category="code")
    report = summarize("teacher", None, items, chain_steps=10)
    assert (report.accuracy.num_correct, report.accuracy.num_total) == (9, 12)
    assert report.per_category["factual"].value == 0.8
    assert report.per_category["code"].value == 0.5
    assert "arithmetic" not in report.per_category
    assert report.chain.value == (9 / 12) ** 10


def test_agreement_compares_text_by_id() -> None:
    base = summarize("t", None, _items([True, True, False]))
    same = summarize("t", "ngram", _items([True, True, False]))
    other = summarize("t", "ngram", _items([True, True, False], text="different"))
    assert agreement(base, same).value == 1.0
    assert agreement(base, other).value == 0.0


def test_table_and_json(tmp_path: Path) -> None:
    teacher = summarize("teacher", None, _items([True] * 9 + [False]))
    spark = summarize("spark", None, _items([True] * 6 + [False] * 4))
    spec = summarize("teacher", "ngram", _items([True] * 9 + [False]))
    spec.decode_tok_s = 123.4
    text = format_table([teacher, spark, spec], baseline=teacher)
    assert "teacher +ngram" in text and "identical to teacher" in text
    assert "90.0% [59.6, 98.2]" in text  # 9/10 with its Wilson interval
    assert "123.4" in text
    path = tmp_path / "out" / "eval.json"
    write_json(path, to_json([teacher, spark], {"num_items": 10}))
    doc = json.loads(path.read_text())
    assert [m["name"] for m in doc["models"]] == ["teacher", "spark"]
    assert doc["models"][1]["accuracy"]["correct"] == 6
    assert len(doc["models"][0]["items"]) == 10


def test_command_registers_eval_options() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "eval",
            "--model",
            "a",
            "--model",
            "b",
            "--speculative",
            "ngram",
            "--limit",
            "3",
            "--categories",
            "code,format",
            "--json",
            "x.json",
            "--dtype",
            "float32",
            "--batch-size",
            "4",
        ]
    )
    assert args.model == ["a", "b"] and args.speculative == "ngram" and args.limit == 3
    assert args.categories == "code,format" and args.dtype == "float32" and args.batch_size == 4
    assert callable(args.func)
