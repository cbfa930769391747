"""fastmode's CPU kernels against PyTorch on the same values, op by op.

    .venv/bin/python benchmarks/kernels.py --threads 2

Rows printed, each beside its PyTorch peer measured in the same run:
- every linear of the default model (q/k/v and gate/up fused, the tied output
  head last) at 1-512 activation rows: `quant_matmul` on the GGUF blocks
  against `F.linear` (oneDNN/MKL) on their exact fp32 dequantization;
- the output head alone at one row (the largest single weight);
- the largest layer linear (gate/up, 3072 x 576, Q4_1) at 1 and 16 rows with
  its blocks in cache, 100 calls in a row: the dequantization's instruction cost
  without DRAM (at one row that cost, not memory, bounds the matmul here), and
  each side's largest error against the float64 product of the same values;
- decode attention for 16 sequences x ~228 tokens over a paged cache:
  `paged_decode_attention` against the PyTorch path fastmode uses without its
  kernels (gather the blocks, matmul, masked softmax, matmul), one layer, its
  cache warm from the repeats;
- the same attention as a decode step meets it: 30 layers' caches in turn, each
  read once (evicted since its last use, as a step's weight stream evicts it),
  fp32 against fp16 K/V (`kv_cache_dtype`).
Times are the minimum over repeats (this VM's noise is one-sided).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SIMD_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_description() -> dict:
    """The CPU (model name, vCPUs), its SIMD flags of interest to the kernels, and the kernel ISA
    path fastmode runs here (fastmode.kernels.select_isa, capped by FASTMODE_KERNELS_ISA)."""
    import os

    from fastmode.kernels import cpu_flags, select_isa

    model = "?"
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), model)
    except OSError:
        pass
    flags = cpu_flags()
    return {
        "cpu": model,
        "vcpus": os.cpu_count(),
        "simd_flags": [f for f in SIMD_FLAGS if f in flags],
        "fastmode_kernels_isa": select_isa(),
    }


def cpu_line(d: dict) -> str:
    return (
        f"{d['cpu']}, {d['vcpus']} vCPUs; flags: {' '.join(d['simd_flags']) or 'none of note'}; "
        f"fastmode kernels: {d['fastmode_kernels_isa']}"
    )


def dram_read_gbs(threads: int, mib: int = 1024, repeats: int = 5) -> float:
    """DRAM read bandwidth in GB/s with `threads` threads: the best of `repeats` sums over a buffer
    of `mib` MiB (far larger than any cache here, so every byte comes from DRAM). An fp32 sum does
    a few vector adds per 32 bytes read, so memory, not the adds, bounds it."""
    torch.set_num_threads(threads)
    buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    buf.sum()  # touch every page first
    best = best_of(lambda: buf.sum(), repeats)
    return buf.numel() * 4 / best / 1e9


def decode_bytes_per_step(gguf_path: str, batch: int, context: float, kv_bytes: int = 2) -> dict:
    """Bytes a decode step of `batch` sequences of `context` tokens each must read from memory at
    the least: every weight once (the token embedding only where the output head is its tied copy;
    otherwise a step gathers `batch` rows of it, counted as nothing) and every sequence's K and V
    (`kv_bytes` per value: 2 for fp16, what fastmode and llama.cpp keep by default)."""
    weights, kv_values_per_token = _model_bytes(gguf_path)
    kv_per_token = kv_values_per_token * kv_bytes
    kv = int(batch * context * kv_per_token)
    return {"weights": weights, "kv": kv, "total": weights + kv, "kv_per_token": kv_per_token}


@functools.lru_cache(maxsize=8)
def _model_bytes(gguf_path: str) -> tuple[int, int]:
    """(bytes of weights a decode step reads, K and V values per token of context) of a GGUF model."""
    import gguf

    r = gguf.GGUFReader(gguf_path)
    tied = "output.weight" not in {t.name for t in r.tensors}
    weights = sum(int(t.n_bytes) for t in r.tensors if t.name != "token_embd.weight" or tied)

    def field(suffix: str) -> int:
        key = next(k for k in r.fields if k.endswith(suffix))
        f = r.fields[key]
        return int(f.parts[f.data[0]][0])

    layers, heads, kv_heads, width = (
        field(s) for s in (".block_count", ".attention.head_count", ".attention.head_count_kv", ".embedding_length")
    )
    return weights, layers * 2 * kv_heads * (width // heads)


def roofline_tok_s(gbs: float, gguf_path: str, batch: int, context: float) -> float:
    """The memory roofline of decode: tok/s if every step only streamed its bytes at `gbs`."""
    return batch * gbs * 1e9 / decode_bytes_per_step(gguf_path, batch, context)["total"]


def best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def linears(model):
    from fastmode.models.quant_linear import QuantLinear

    return [m for m in model.modules() if isinstance(m, QuantLinear)]


def bench_matmuls(k, mods, rows: list[int], repeats: int, int8: bool = False) -> None:
    dense = [_dequantized(k, m) for m in mods]  # the exact values the blocks encode
    print(f"{'rows':>5} {'fastmode ms':>12} {'PyTorch fp32 ms':>16} {'ratio':>6}   (all {len(mods)} linears)")
    for m_rows in rows:
        xs = {K: torch.randn(m_rows, K) for K in {m.in_features for m in mods}}
        ours = best_of(
            lambda xs=xs: [k.quant_matmul(xs[m.in_features], m.qweight, m.qtype, int8) for m in mods], repeats
        )
        peer = best_of(lambda xs=xs: [F.linear(xs[m.in_features], w) for m, w in zip(mods, dense)], repeats)
        print(f"{m_rows:>5} {ours * 1e3:>12.2f} {peer * 1e3:>16.2f} {peer / ours:>5.2f}x", flush=True)
    head, w = mods[-1], dense[-1]
    x = torch.randn(1, head.in_features)
    ours = best_of(lambda: k.quant_matmul(x, head.qweight, head.qtype, int8), repeats * 3)
    peer = best_of(lambda: F.linear(x, w), repeats * 3)
    print(
        f"output head alone ({head.out_features} x {head.in_features}), 1 row: fastmode {ours * 1e3:.2f} ms, "
        f"PyTorch fp32 {peer * 1e3:.2f} ms ({peer / ours:.2f}x)"
    )
    i = max(range(len(mods) - 1), key=lambda j: mods[j].out_features * mods[j].in_features)  # the head excluded
    big, w = mods[i], dense[i]
    for m_rows in (1, 16):  # 16 rows: the many-row path (AMX tiles where the build has them)
        x = torch.randn(m_rows, big.in_features)
        ours = best_of(lambda x=x: [k.quant_matmul(x, big.qweight, big.qtype, int8) for _ in range(100)], repeats) / 100
        peer = best_of(lambda x=x: [F.linear(x, w) for _ in range(100)], repeats) / 100
        exact = x.double() @ w.double().T  # the blocks' exact values times x, in float64
        scale = exact.abs().max().item()
        err = (k.quant_matmul(x, big.qweight, big.qtype, int8).double() - exact).abs().max().item() / scale
        err_peer = (F.linear(x, w).double() - exact).abs().max().item() / scale
        print(
            f"largest layer linear ({big.out_features} x {big.in_features}), {m_rows} row(s), in cache: fastmode "
            f"{ours * 1e6:.0f} us, PyTorch fp32 {peer * 1e6:.0f} us ({peer / ours:.2f}x); max |error| against "
            f"float64, over the largest output: fastmode {err:.1e}, PyTorch fp32 {err_peer:.1e}"
        )


def _dequantized(k, m) -> torch.Tensor:
    return k.quant_dequantize(m.qweight, m.qtype, m.in_features, torch.empty(0, dtype=torch.long))


def bench_attention(k, repeats: int, batch: int = 16, ctx: int = 228) -> None:
    from fastmode.models.attention_batch import decode_mask

    heads, kv_heads, hd, bs = 9, 3, 64, 16  # SmolLM2-135M's attention shape, the engine's block size
    per_seq = (ctx + bs - 1) // bs
    g = torch.Generator().manual_seed(0)
    kc, vc = (
        torch.randn(batch * per_seq + 1, bs, kv_heads, hd, generator=g),
        torch.randn(batch * per_seq + 1, bs, kv_heads, hd, generator=g),
    )
    tables = torch.randperm(batch * per_seq, generator=g).view(batch, per_seq) + 1
    lens = torch.full((batch,), ctx, dtype=torch.long)
    lens[::3] -= 37  # ragged contexts
    q = torch.randn(batch, heads, hd, generator=g)
    mask = decode_mask(lens, per_seq * bs)

    def torch_path():  # what models/llama.py does without the kernels
        kk = kc[tables].flatten(1, 2)
        vv = vc[tables].flatten(1, 2)
        qq = q.view(batch, kv_heads, heads // kv_heads, hd)
        p = torch.softmax(torch.matmul(qq, kk.permute(0, 2, 3, 1)) * hd**-0.5 + mask, dim=-1)
        return torch.matmul(p, vv.transpose(1, 2)).reshape(batch, heads, hd)

    ours_out = k.paged_decode_attention(q, kc, vc, tables, lens, hd**-0.5)
    err = (ours_out - torch_path()).abs().max().item()
    ours = best_of(lambda: k.paged_decode_attention(q, kc, vc, tables, lens, hd**-0.5), repeats * 3)
    peer = best_of(torch_path, repeats * 3)
    print(
        f"decode attention, {batch} seqs x ~{ctx} tokens, one layer: fastmode {ours * 1e3:.3f} ms, "
        f"PyTorch {peer * 1e3:.3f} ms ({peer / ours:.2f}x); max |difference| {err:.1e}"
    )

    # A step's view: every layer's cache once, each cold. 30 layers x 16 x 228 tokens of fp32 K/V
    # is ~130 MB, more than any cache here, so each layer's reads come from DRAM as in a step.
    layers, sweep = 30, {}
    for dtype in (torch.float32, torch.float16):
        caches = [
            (torch.randn(kc.shape, generator=g).to(dtype), torch.randn(vc.shape, generator=g).to(dtype))
            for _ in range(layers)
        ]

        def step(caches=caches):
            for kl, vl in caches:
                k.paged_decode_attention(q, kl, vl, tables, lens, hd**-0.5)

        sweep[dtype] = best_of(step, max(3, repeats // 2)) / layers
        del caches
    f32, f16 = sweep[torch.float32], sweep[torch.float16]
    print(
        f"decode attention per layer over {layers} layers' caches in turn (cold): fp32 K/V {f32 * 1e3:.3f} ms, "
        f"fp16 K/V {f16 * 1e3:.3f} ms ({f32 / f16:.2f}x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,4,8,16,64,512")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument(
        "--int8-activations",
        action="store_true",
        help="fastmode quantizes activations to int8 per block (native-int8) instead of fp32",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from fastmode.kernels import ops, unavailable_reason
    from fastmode.loader import load_model

    k = ops()
    if k is None:
        raise SystemExit(f"kernels unavailable: {unavailable_reason()}")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.common import machine

    loaded = load_model(None)
    amx = k.amx_unavailable_reason()
    print(f"machine: {cpu_line(cpu_description())}; {machine()}")
    print(
        f"model: {loaded.name} ({loaded.weight_format})  kernels: {k.isa()}, fp32 path {k.fp32_lanes()} lanes, "
        f"int8 dot {k.int8_dot()}, AMX {f'from {k.direct_max_rows() + 1} rows' if not amx else 'off: ' + amx}"
    )
    with torch.inference_mode():
        bench_matmuls(
            k, linears(loaded.model), [int(r) for r in args.rows.split(",")], args.repeats, args.int8_activations
        )
        bench_attention(k, args.repeats)


if __name__ == "__main__":
    main()
