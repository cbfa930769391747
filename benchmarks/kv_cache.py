"""The KV cache's width end to end: fp16 K/V (the default) against fp32, same engine, same run.

    .venv/bin/python benchmarks/kv_cache.py --batches 1,16 --threads 2

Two engines on the default model, identical but for `kv_cache_dtype`, decode the
same random 128-token prompts (greedy, every answer full length) in turns for
`--repeats` rounds; each keeps its best round (this VM's noise is one-sided). It
prints decode tok/s per width and batch, the ratio, and how many sequences'
tokens differ between the widths (rounding K/V to fp16 may flip a near-tie).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.common import machine
    from fastmode import LLM, SamplingParams

    widths = ("float16", "float32")
    llms = {w: LLM(num_threads=args.threads, speculative="off", kv_cache_dtype=w) for w in widths}
    print(f"machine: {machine()}  model: {llms['float16'].engine.model_name}")
    rng = random.Random(0)
    vocab = llms["float16"].engine.loaded.config.vocab_size
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_len)] for _ in range(b)]
        sp = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        best, outs = {w: 0.0 for w in widths}, {}
        for llm in llms.values():  # warm-up: first-call allocations
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        for _ in range(args.repeats):
            for w, llm in llms.items():
                t = time.perf_counter()
                res = llm.generate(prompts, sp)
                dt = time.perf_counter() - t
                assert all(len(o.token_ids) == args.tokens for o in res)
                best[w] = max(best[w], b * args.tokens / dt)
                outs[w] = [o.token_ids for o in res]
        differ = sum(a != c for a, c in zip(outs["float16"], outs["float32"]))
        rows.append(
            {
                "batch": b,
                "fp16_tok_s": best["float16"],
                "fp32_tok_s": best["float32"],
                "ratio": best["float16"] / best["float32"],
                "sequences_differing": differ,
            }
        )
    print(f"{'batch':>5}  {'fp16 KV tok/s':>13}  {'fp32 KV tok/s':>13}  {'ratio':>6}  sequences differing")
    for r in rows:
        print(
            f"{r['batch']:>5}  {r['fp16_tok_s']:>13.1f}  {r['fp32_tok_s']:>13.1f}  {r['ratio']:>5.2f}x  "
            f"{r['sequences_differing']}/{r['batch']}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "benchmark": "kv_cache",
                    "machine": machine(),
                    "settings": vars(args) | {"out": str(args.out)},
                    "rows": rows,
                },
                indent=2,
            )
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
