"""Spark: a smaller student distilled from the served model (`fastmode distill`).

Module map, in the order a run uses them:

- corpus     offline training text (stdlib source, Shakespeare) and the held-out guard
- answers    the teacher's greedy answers to prompts.txt
- stream     deterministic, resumable (B, T+1) token windows from a source mix
- student    which teacher layers the student keeps; building it on shared embeddings
- forward    a plain causal (B, T) forward for training
- loss       KL(teacher || student) over the full vocabulary (+ CE), chunked
- train      one step, and the state a checkpoint resumes bit for bit
- pipeline   the command's run: data, time budget, checkpoints, export
- export     the on-disk format (fp32 / bf16 / int8 rows), size limit
- spark      load_spark / spark_as_loaded: Spark back on the teacher
- command    the `fastmode distill` flags (defaults: the torch-free source mix)

Public API (imported lazily so that `fastmode --help` does not import torch):
`load_spark`, `spark_as_loaded`, `default_spark_dir`, `packaged_spark_dir`, `find_spark`,
`spark_name`, `is_spark`.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "load_spark": "fastmode.distill.spark",
    "spark_as_loaded": "fastmode.distill.spark",
    "default_spark_dir": "fastmode.distill.spark",
    "spark_name": "fastmode.distill.spark",
    "find_spark": "fastmode.distill.spark",
    "packaged_spark_dir": "fastmode.distill.spark",
    "is_spark": "fastmode.distill.export",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fastmode.distill' has no attribute {name!r}")
