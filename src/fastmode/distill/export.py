"""Spark on disk: only what differs from the teacher, in one safetensors file.

The file holds the student's transformer layers and final norm under
`LlamaModel` state-dict names (`layers.{j}.self_attn.qkv_proj.weight`, ...,
`norm.weight`) and, in the safetensors header, a JSON record: the teacher's
identity (file name + sha256), the teacher layer each student layer was
initialised from, the storage format and a training summary. Embeddings, LM
head and tokenizer come from the teacher at load time.

Storage formats, chosen to fit `max_bytes` (50 MB by default): `fp32`
(exact), `bf16`, `int8` with one fp32 scale per output row (absmax / 127;
the rounding error of each weight is at most half its row's scale), or
`q4_1`: ggml's Q4_1 blocks (32 weights, 4-bit codes between the block's min
and max, fp16 step and min; 5 bits per weight), the teacher GGUF's own format,
which the kernels then run without re-encoding. `auto` takes the most precise
one that fits. 1-D tensors (norm weights, biases) are always fp32: they are
tiny and sensitive.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

FORMATS = ("fp32", "bf16", "int8", "q4_1")  # most precise first
FILE_NAME = "spark.safetensors"
INFO_FILE = "spark.json"
MAGIC = "fastmode-spark/1"
MAX_BYTES = 50_000_000
_SCALE = ".int8_scale"  # suffix of the per-row scale stored beside an int8 weight
Q4_1_BLOCK = (32, 20)  # (weights, bytes) of one Q4_1 block


def teacher_identity(path: Path) -> dict[str, str]:
    """{"name", "sha256"} of the teacher checkpoint: the GGUF file, or a HF directory's config + weights."""
    path = Path(path)
    files = [path] if path.is_file() else [path / "config.json", *sorted(path.glob("*.safetensors"))]
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return {"name": path.name, "sha256": _sha256_of(stamp)}


@functools.lru_cache(maxsize=16)
def _sha256_of(stamp: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over the files in `stamp`, read once per (path, size, mtime): a server that
    loads Spark both as a draft and as a served model hashes the ~100 MB teacher once."""
    h = hashlib.sha256()
    for name, _, _ in stamp:
        with open(name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) float -> int8 weights and fp32 scales (rows,), symmetric per output row."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # an all-zero row keeps a harmless scale
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_int8`, in fp32 (rows, cols)."""
    return q.float() * scale[:, None]


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """(rows, cols) float, cols a multiple of 32 -> (rows, cols / 32 * 20) uint8 Q4_1 blocks (gguf's quantizer)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return torch.from_numpy(quantize(w.detach().float().contiguous().numpy(), GGMLQuantizationType.Q4_1))


def dequantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_q4_1`, in fp32 (rows, cols)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType.Q4_1).astype("float32"))


def encoded_bytes(shapes: Mapping[str, tuple[int, ...]], fmt: str) -> int:
    """Tensor bytes of a state with these shapes in format `fmt` (the header adds a few KB)."""
    total = 0
    for shape in shapes.values():
        n = 1
        for d in shape:
            n *= d
        if len(shape) != 2 or (fmt == "q4_1" and shape[1] % Q4_1_BLOCK[0]):
            total += 4 * n
        elif fmt == "q4_1":
            total += n // Q4_1_BLOCK[0] * Q4_1_BLOCK[1]
        elif fmt == "int8":
            total += n + 4 * shape[0]
        else:
            total += (4 if fmt == "fp32" else 2) * n
    return total


def choose_format(shapes: Mapping[str, tuple[int, ...]], fmt: str = "auto", max_bytes: int = MAX_BYTES) -> str:
    """`fmt` itself if it fits, or for "auto" the most precise format that fits; ValueError if none does."""
    candidates = FORMATS if fmt == "auto" else (fmt,)
    for f in candidates:
        if f not in FORMATS:
            raise ValueError(f"unknown format {f!r}; choose auto, {', '.join(FORMATS)}")
        if encoded_bytes(shapes, f) <= max_bytes:
            return f
    sizes = ", ".join(f"{f}: {encoded_bytes(shapes, f) / 1e6:.1f} MB" for f in candidates)
    raise ValueError(f"the student does not fit in {max_bytes / 1e6:.1f} MB ({sizes}); use fewer layers")


def encode(state: Mapping[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """The tensors to write for `state` in format `fmt`."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach().float().contiguous()
        if t.dim() != 2 or fmt == "fp32":
            out[name] = t
        elif fmt == "bf16":
            out[name] = t.to(torch.bfloat16)
        elif fmt == "q4_1":
            out[name] = quantize_q4_1(t) if t.shape[1] % Q4_1_BLOCK[0] == 0 else t
        else:
            out[name], out[name + _SCALE] = quantize_int8(t)
    return out


def decode(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Inverse of `encode`: plain `LlamaModel` state-dict tensors in `dtype`."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(_SCALE):
            continue
        if t.dtype == torch.int8:
            t = dequantize_int8(t, tensors[name + _SCALE])
        elif t.dtype == torch.uint8:
            t = dequantize_q4_1(t)
        out[name] = t.to(dtype)
    return out


def save_spark(
    out_dir: Path,
    state: Mapping[str, torch.Tensor],
    info: dict[str, Any],
    fmt: str = "auto",
    max_bytes: int = MAX_BYTES,
) -> Path:
    """Write `state` (the student's own tensors) and `info` to out_dir/spark.safetensors; returns the path.

    `info` must hold "teacher" (see `teacher_identity`) and "layer_indices";
    "format" and "file_bytes" are added here. A readable copy of the record
    goes to out_dir/spark.json; the safetensors header is the one that counts.
    """
    from safetensors.torch import save_file

    for field in ("teacher", "layer_indices"):
        if field not in info:
            raise ValueError(f"spark info lacks {field!r}")
    fmt = choose_format({k: tuple(v.shape) for k, v in state.items()}, fmt, max_bytes)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILE_NAME
    info = {**info, "format": fmt}
    tmp = path.with_suffix(".tmp")
    save_file(encode(state, fmt), str(tmp), metadata={"format": MAGIC, "spark": json.dumps(info)})
    tmp.chmod(0o644)  # safetensors writes 0600; a server running as another user must read it
    size = tmp.stat().st_size
    if size > max_bytes:  # the estimate ignores the header; never ship a file over the limit
        tmp.unlink()
        raise ValueError(f"{path} would be {size} bytes, over the {max_bytes} byte limit")
    tmp.replace(path)
    (out_dir / INFO_FILE).write_text(json.dumps({**info, "file_bytes": size}, indent=2) + "\n")
    return path


def spark_file(path: str | Path) -> Path:
    """`path` itself, or the spark.safetensors inside folder `path`."""
    path = Path(path)
    path = path / FILE_NAME if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"{path}: no Spark weights here (run `fastmode distill` first)")
    return path


def read_spark(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(stored tensors, info) of a Spark file, or of the spark.safetensors inside folder `path`."""
    from safetensors import safe_open

    path = spark_file(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != MAGIC:
            raise ValueError(f"{path} is not a fastmode Spark file (header format {meta.get('format')!r})")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, json.loads(meta["spark"])


def is_spark(path: str | Path) -> bool:
    """Whether `path` is a Spark file, or a folder holding one (cheap: reads the header only)."""
    try:
        read_info(path)
        return True
    except Exception:  # missing file, not safetensors (SafetensorError), not ours
        return False


def read_info(path: str | Path) -> dict[str, Any]:
    """The JSON record of a Spark file (or folder), without reading the weights."""
    from safetensors import safe_open

    path = spark_file(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != MAGIC:
        raise ValueError(f"{path} is not a fastmode Spark file")
    return json.loads(meta["spark"])
