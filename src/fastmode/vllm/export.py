"""A GGUF file as a Hugging Face directory, for engines that load those (vLLM, SGLang).

vLLM reads HF directories, not the embedded model's GGUF file. This writes the same weights,
dequantized (fp32 by default: Q4_1 and Q8_0 values are exact in fp32), with the GGUF's own
tokenizer and chat template, through transformers' GGUF reader. transformers 5 marks a model
loaded from GGUF as quantized and will not save it, so the weights are moved into a plain model
built from the same config first.

    python -m fastmode.vllm.export [OUT_DIR]     # prints the directory; default: in fastmode's cache

Exports are cached under FASTMODE_CACHE_DIR (fastmode.env), keyed like the GGUF cache by the
file's path, size and modification time: the first export takes about a minute on 2 cores.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fastmode.env import cache_dir

_FORMAT = 1  # bump when the exported layout changes


def default_export_dir(gguf: Path, dtype: str) -> Path:
    root = cache_dir() or Path(tempfile.gettempdir()) / "fastmode"
    st = gguf.stat()
    key = f"{_FORMAT}|{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype}"
    return root / "hf-export" / f"{gguf.stem}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def is_exported(out: Path) -> bool:
    return (out / "config.json").is_file() and any(out.glob("*.safetensors")) and (out / "tokenizer.json").is_file()


def export_hf_dir(gguf: str | Path | None = None, out: str | Path | None = None, dtype: str = "float32") -> Path:
    """Write (or find, when already there) the HF directory for `gguf` (default: the embedded
    model's file) and return it. `dtype` is the stored precision: "float32" or "bfloat16"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fastmode.loader.default_model import default_model_path

    gguf = Path(gguf) if gguf is not None else default_model_path()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    out = Path(out) if out is not None else default_export_dir(gguf, dtype)
    if is_exported(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))  # renamed into place when complete
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        try:
            del config.quantization_config  # the GGUF marker that stops save_pretrained
        except AttributeError:
            pass
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict(), strict=True)
        plain.to(torch_dtype).save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        if out.exists():  # a partial export from an interrupted run
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(export_hf_dir(out=sys.argv[1] if len(sys.argv) > 1 else None))
