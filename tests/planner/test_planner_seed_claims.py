"""scripts/seed_claims.py builds every section and states the chain numbers exactly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "seed_claims.py"


def test_seed_claims_document_builds():
    spec = importlib.util.spec_from_file_location("seed_claims", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.build()
    for header in ("## 1.", "## 2.", "## 3.", "## 4.", "## 5."):
        assert header in text
    assert "| 0.800 | 10.7% |" in text and "| 0.900 | 34.9% |" in text
    assert "| 0.680 | 2.1% |" in text and "| 0.750 | 5.6% |" in text
    assert text.count("**Verdict") == 5
