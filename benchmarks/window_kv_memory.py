"""KV memory of one long sequence on Gemma 3 shapes, with sliding-window layers in a pool of
their own against one pool for every layer (the engine with `--no-local-kv-pool`).

Counted, not timed: the engine's own block manager (`engine/window_blocks.py`) prefills the
sequence in chunks, giving back the local blocks behind the window after each chunk as serving
does; KV bytes are blocks held times the bytes a block holds per layer.

    .venv/bin/python benchmarks/window_kv_memory.py
    .venv/bin/python benchmarks/window_kv_memory.py --context 8192
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from fastmode.engine.sequence import Sequence  # noqa: E402
from fastmode.engine.window_blocks import WindowedBlockManager  # noqa: E402
from fastmode.sampling_params import SamplingParams  # noqa: E402

# name: (layers, local layers, KV heads, head dim, window, block size) from each model's config.json
SHAPES = {
    "Gemma 3 1B": (26, 22, 1, 256, 512, 16),
    "Gemma 3 4B": (34, 29, 4, 256, 1024, 16),
    "the tests' tiny Gemma 3": (6, 5, 2, 16, 8, 4),
}


def kv_held(shape: tuple, context: int, chunk: int, dtype_bytes: int) -> tuple[float, float, int, int]:
    """(MiB with one pool, MiB with the local pool, global blocks, local blocks held at the end)."""
    layers, local_layers, kv_heads, head_dim, window, bs = shape
    bm = WindowedBlockManager(1_000_000, bs, window, 1_000_000, chunk)
    seq = Sequence("s", [1] * (context + 1), SamplingParams(max_tokens=1))
    while seq.num_computed_tokens < context:
        n = min(chunk, context - seq.num_computed_tokens)
        if not bm.allocate(seq, n):
            raise RuntimeError("the pool could not hold the sequence")
        seq.num_computed_tokens += n
        bm.release_behind_window(seq)
    per_block = 2 * kv_heads * head_dim * dtype_bytes * bs  # K and V of one layer
    g, loc = len(seq.block_table), len(seq.local_block_table)
    one_pool = g * layers * per_block
    two_pools = (g * (layers - local_layers) + loc * local_layers) * per_block
    return one_pool / 2**20, two_pools / 2**20, g, loc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk (max_num_batched_tokens)")
    p.add_argument("--dtype-bytes", type=int, default=2, help="KV element size (2: fp16)")
    args = p.parse_args()
    print(f"one sequence of {args.context} tokens, {args.dtype_bytes}-byte KV, prefilled in {args.chunk}-token chunks")
    for name, shape in SHAPES.items():
        one, two, g, loc = kv_held(shape, args.context, args.chunk, args.dtype_bytes)
        print(
            f"{name:24s} one pool {one:8.1f} MiB   local pool {two:8.1f} MiB ({two / one:.2f}x)   "
            f"global blocks {g}, local blocks {loc}"
        )


if __name__ == "__main__":
    main()
