"""fastmode against llama.cpp on a K-quant GGUF (Q4_K_M by default): decode at batch 1 and 16, one run.

The file is made from the embedded model's GGUF by llama.cpp's own quantizer, once, and reused:

    llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf runs/kquant/SmolLM2-135M-Instruct.Q4_K_M.gguf Q4_K_M

(--allow-requantize: the embedded file is already quantized, Q4_1, so the K-quant file encodes
those Q4_1 values again: a file to measure speed on, not quality.) SmolLM2-135M's hidden size, 576,
is not a multiple of 256, so llama-quantize stores the tensors that read it (q/k/v/o, gate/up,
the embedding) in its fallback types, Q5_0 for Q4_K and Q8_0 for Q6_K; ffn_down (1536 wide) gets
Q4_K and Q6_K. The report prints the file's tensor types and the formats fastmode runs.

Then benchmarks/peers.py measures llama.cpp (`llama-batched-bench`) and fastmode (`LLM`, default
config) on that file in the same run: rounds in alternating order (ABBA), medians over rounds, each
round's ratio taken within the round, the 1-minute load average at each round's start, the DRAM
bandwidth and the memory roofline (see peers.py and benchmarks/peers/README.md for the method).

    .venv/bin/python benchmarks/kquant.py                                  # Q4_K_M, batches 1,16, 3 rounds
    .venv/bin/python benchmarks/kquant.py --ntg 16 --batches 1,2 --rounds 1   # smoke run
    .venv/bin/python benchmarks/kquant.py --type Q5_K_M

Any flag this script does not define is passed to peers.py (--threads, --npp, --ntg, --batches,
--rounds, --repeats, --wait-load, ...). Writes runs/peers/kquant.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402


def make_file(llama_cpp_dir: str, source: Path, out: Path, qtype: str) -> Path:
    """`out`, made from `source` by llama-quantize unless it already exists."""
    if out.exists():
        return out
    exe = peers.find_binary(llama_cpp_dir, "llama-quantize")
    if exe is None:
        raise SystemExit(
            f"llama-quantize not found under {llama_cpp_dir}: build it next to llama-batched-bench with\n"
            f"  cmake --build {Path(llama_cpp_dir) / 'build'} --target llama-quantize\n"
            "(benchmarks/peers/README.md, 'A K-quant file')"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    cmd = [str(exe), "--allow-requantize", str(source), str(tmp), qtype]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"llama-quantize exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Other flags go to benchmarks/peers.py.")
    p.add_argument("--type", default="Q4_K_M", help="llama-quantize's file type (default Q4_K_M)")
    p.add_argument("--source", help="GGUF to quantize from (default: the embedded model's)")
    p.add_argument("--file", help="the K-quant file (default runs/kquant/<source name>.<type>.gguf; made if missing)")
    p.add_argument("--llama-cpp-dir", default=peers.DEFAULT_LLAMA_CPP_DIR)
    p.add_argument("--out", default=str(ROOT / "runs" / "peers" / "kquant.json"))
    args, rest = p.parse_known_args(argv)
    source = Path(args.source) if args.source else peers.default_model()
    stem = source.name.split(".")[0]
    path = Path(args.file) if args.file else ROOT / "runs" / "kquant" / f"{stem}.{args.type}.gguf"
    path = make_file(args.llama_cpp_dir, source, path, args.type)
    info = peers.gguf_info(path)
    types = ", ".join(f"{n} {t}" for t, n in sorted(info["tensor_types"].items(), key=lambda kv: -kv[1]))
    print(f"file: {path} ({info['quant']}, {info['size_mib']} MiB): tensors {types}", flush=True)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rc = peers.main(
        [
            "--model",
            str(path),
            "--skip",
            "llama-cpp-python,transformers,vllm",
            "--llama-cpp-dir",
            args.llama_cpp_dir,
            "--out",
            args.out,
            *rest,
        ]
    )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
