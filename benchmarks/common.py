"""Helpers shared by benchmark scripts: machine description, percentiles, output files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path


def machine() -> dict:
    """What the numbers were measured on."""
    import torch

    cpu = platform.processor() or "cpu"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "?")
    return {
        "cpu": cpu,
        "isa": isa,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "commit": code_commit(),
    }


def code_commit() -> str:
    """The commit the measured code is at: the short hash, with "+changes" when src/ differs from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True)
    except OSError:
        return "?"
    commit = head.stdout.strip() or "?"
    return commit + ("+changes" if dirty.stdout.strip() else "")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(values, q))


def write_json(path: str | Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path
