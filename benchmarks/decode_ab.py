"""Decode speed of two source trees of fastmode, measured in alternating processes.

A kernel change is judged by the engine's decode speed at the batch sizes it serves, not by a
microbenchmark of one matmul. Two builds of the C++ kernels cannot share one process (the second
load returns the first module), so each measurement is its own process with PYTHONPATH set to
one tree's `src/`; the trees take turns, order swapped every pair, and the median of the pairs
is reported with every pair's figure.

    git worktree add /tmp/base HEAD~1
    .venv/bin/python benchmarks/decode_ab.py --trees /tmp/base . --batches 1,16 --pairs 3

Each measurement: the embedded model, `--threads` torch threads, speculation off, B random
128-token prompts, 128 greedy tokens each (EOS ignored); decode tok/s = B * 128 / (t(129 tokens)
- t(1 token)), so prefill is excluded; the median of 3 repeats in the process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, write_json  # noqa: E402

_CHILD = """
import json, statistics, sys, time
import numpy as np
from fastmode import LLM, SamplingParams
batch, threads = int(sys.argv[1]), int(sys.argv[2])
llm = LLM(num_threads=threads, speculative="off", draft_model=None)
rng = np.random.default_rng(0)
def run(n):
    prompts = [rng.integers(32, 49152, size=128).tolist() for _ in range(batch)]
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    t = time.perf_counter()
    llm.generate(prompts, sp)
    return time.perf_counter() - t
run(4)
rates = []
for _ in range(3):
    t1 = run(1)
    rates.append(batch * 128 / (run(129) - t1))
import fastmode
print(json.dumps({"tok_s": statistics.median(rates), "src": fastmode.__file__}))
"""


def measure(tree: Path, batch: int, threads: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(batch), str(threads)], env=env, cwd=tree, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree} at batch {batch} failed:\n{out.stderr[-2000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if not row["src"].startswith(str(tree.resolve())):
        raise RuntimeError(f"{tree}: the child imported fastmode from {row['src']}")
    return row["tok_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs=2, type=Path, required=True, metavar=("A", "B"), help="two fastmode checkouts")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--pairs", type=int, default=3, help="rounds of A then B (order swapped every round)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="runs/decode_ab.json")
    args = p.parse_args()
    trees = [t.resolve() for t in args.trees]
    batches = [int(b) for b in args.batches.split(",")]
    runs: dict[str, dict[int, list[float]]] = {str(t): {b: [] for b in batches} for t in trees}
    for i in range(args.pairs):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            for b in batches:
                rate = measure(tree, b, args.threads)
                runs[str(tree)][b].append(rate)
                print(f"pair {i + 1}: {tree} batch {b}: {rate:.1f} tok/s", flush=True)
    print(f"\nmachine: {machine()}")
    print(f"{'batch':>5}  {'A tok/s':>8}  {'B tok/s':>8}  {'B / A':>6}  each pair (B / A)")
    a, b_ = (runs[str(t)] for t in trees)
    for b in batches:
        pairs = [y / x for x, y in zip(a[b], b_[b])]
        print(
            f"{b:>5}  {statistics.median(a[b]):>8.1f}  {statistics.median(b_[b]):>8.1f}  "
            f"{statistics.median(pairs):>5.2f}x  {' '.join(f'{r:.2f}' for r in pairs)}"
        )
    print(f"A = {trees[0]}\nB = {trees[1]}")
    write_json(args.out, {"machine": machine(), "args": vars(args) | {"trees": [str(t) for t in trees]}, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
