"""Speculative decoding speed-up over plain decoding, by batch size and workload.

Workloads: (i) chat answers, (ii) code edits whose answer repeats much of the
input. Methods: n-gram prompt lookup and a draft model. Every configuration
is run with speculation off in the same process, and outputs are checked to
be identical (speculation is lossless). Speculation is forced on regardless
of the batch policy with `--force`; by default the engine's policy decides
(so large batches show the policy switching it off, i.e. ~1.0x).

    .venv/bin/python benchmarks/speculative.py --batches 1,4,16 --draft-model layers:8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine, write_json  # noqa: E402

CHAT = [
    "Explain what a KV cache is and why it speeds up text generation.",
    "Give three tips for writing readable Python code.",
    "What is the difference between a list and a tuple in Python?",
    "Describe how a bus schedule trades waiting time for cost.",
]

CODE_EDIT = '''Rename the variable `total` to `running_sum` in this function and return the whole function:

```python
def summarize(values):
    total = 0
    count = 0
    for v in values:
        total += v
        count += 1
    mean = total / count if count else 0.0
    return {"total": total, "count": count, "mean": mean}
```'''


def run(llm, prompts, method: str, max_tokens: int):
    from fastmode import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, speculative=method, ignore_eos=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    return outs, tokens / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--draft-model", default=None, help="path, or layers:N (the target's first N layers)")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--force", action="store_true", help="speculate at every batch size (ignore the batch threshold)")
    p.add_argument("--out", default="runs/speculative.json")
    args = p.parse_args()

    from fastmode import LLM

    extra = {"speculative_max_batch": 1024} if args.force else {}
    llm = LLM(model=args.model, draft_model=args.draft_model, **extra)
    tok = llm.tokenizer
    workloads = {
        "chat": [tok.encode_chat([{"role": "user", "content": c}]) for c in CHAT],
        "code-edit": [tok.encode_chat([{"role": "user", "content": CODE_EDIT}])],
    }
    methods = ["ngram"] + (["draft"] if args.draft_model else [])
    print(f"machine: {machine()}  model: {llm.engine.model_name} ({llm.engine.loaded.dtype})  draft: {args.draft_model}")
    print(f"{'workload':>10} {'batch':>5} {'method':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'speed-up':>8} {'accept':>7} {'same':>5}")
    rows = []
    for name, base in workloads.items():
        for b in [int(x) for x in args.batches.split(",")]:
            prompts = [base[i % len(base)] for i in range(b)]
            ref, plain = run(llm, prompts, "off", args.max_tokens)
            for m in methods:
                before = dict(llm.engine.spec.stats.draft_tokens), dict(llm.engine.spec.stats.accepted_tokens)
                outs, spec = run(llm, prompts, m, args.max_tokens)
                drafted = sum(llm.engine.spec.stats.draft_tokens.values()) - sum(before[0].values())
                accepted = sum(llm.engine.spec.stats.accepted_tokens.values()) - sum(before[1].values())
                same = [o.token_ids for o in outs] == [o.token_ids for o in ref]
                acc = accepted / drafted if drafted else None
                rows.append({"workload": name, "batch": b, "method": m, "plain_tok_s": plain, "spec_tok_s": spec,
                             "speedup": spec / plain, "acceptance": acc, "drafted": drafted, "identical": same})
                print(f"{name:>10} {b:>5} {m:>6} {plain:>11.1f} {spec:>10.1f} {spec / plain:>7.2f}x "
                      f"{'-' if acc is None else f'{acc:.2f}':>7} {str(same):>5}", flush=True)
    out = write_json(args.out, {"machine": machine(), "args": vars(args), "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
