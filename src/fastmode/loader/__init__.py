"""Load checkpoints users actually have: a Hugging Face directory or a GGUF file."""

from fastmode.loader.errors import ModelLoadError
from fastmode.loader.load import LoadedModel, load_model, resolve_model_path

__all__ = ["LoadedModel", "ModelLoadError", "load_model", "resolve_model_path"]
