"""Per-output-token cost of grammar-constrained decoding, against the same requests unconstrained.

One in-process engine (`fastmode.LLM`'s LLMEngine; the embedded model unless
--model) decodes the same prompts twice per round: free, and under a JSON
schema (a list of file records: keys, enums, bounded strings, numbers and
nested arrays, so every token position has a real mask). The schema asks for
more items than fit in --max-tokens, so the grammar never lets a constrained
request end early, and the free requests ignore EOS: both sides emit exactly
--max-tokens tokens per request (checked). Only the decode steps are timed
(every request's first token, which carries the prefill, is left out), so the
figure is the cost of one output token: the forward pass plus, when
constrained, the mask computation (llguidance, on its own threads), the mask
applied to the logits and the matcher advanced by the chosen token.

Rounds alternate their order (free first, then constrained first, ...) so
drift on the machine hits both alike; each side's figure is the median of the
rounds. Target: constrained at most 10% slower per output token.

    .venv/bin/python benchmarks/structured_decoding.py            # batch 1 and 16, 3 rounds, 128 tokens
    .venv/bin/python benchmarks/structured_decoding.py --quick    # end-to-end check in well under a minute

Writes runs/structured_decoding.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine, write_json

TARGET_RATIO = 1.10  # constrained / free seconds per output token

# Many records, each with several kinds of value: no constrained request can complete (and stop)
# within any --max-tokens this script is run with.
SCHEMA = {
    "type": "object",
    "properties": {
        "files": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "maxLength": 40},
                    "kind": {"enum": ["module", "test", "doc", "config"]},
                    "lines": {"type": "integer", "minimum": 0, "maximum": 100000},
                    "coverage": {"type": "number"},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
                    "generated": {"type": "boolean"},
                },
                "required": ["path", "kind", "lines", "coverage", "tags", "generated"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["files"],
    "additionalProperties": False,
}

TOPICS = [
    "an HTTP server",
    "a tokenizer",
    "a scheduler",
    "a KV cache",
    "a JSON parser",
    "a CLI",
    "a test suite",
    "a web crawler",
    "a compiler",
    "a database driver",
    "a chat client",
    "an image loader",
    "a build tool",
    "a profiler",
    "a linter",
    "a package manager",
]


def prompts(llm, n: int) -> list[list[int]]:
    """n distinct chat prompts asking for the files of a project as JSON."""
    out = []
    for i in range(n):
        text = (
            f"List every file of {TOPICS[i % len(TOPICS)]} project number {i} as JSON: path, kind, line "
            "count, test coverage, tags and whether it is generated."
        )
        out.append(llm.tokenizer.encode_chat([{"role": "user", "content": text}]))
    return out


def decode_seconds_per_token(engine, batch: list[list[int]], params) -> tuple[float, list[int], list[str]]:
    """Run `batch` to the end; (seconds per output token over the decode steps, tokens and text per request)."""
    ids = [engine.add_request(p, params) for p in batch]
    emitted = {rid: 0 for rid in ids}
    texts = dict.fromkeys(ids, "")
    done: set[str] = set()
    # Until every request has its first token: prefill, and the first token's sampling, untimed.
    while any(n == 0 for n in emitted.values()):
        for o in engine.step():
            emitted[o.request_id] = len(o.token_ids)
            if o.finished:
                done.add(o.request_id)
    start_tokens = sum(emitted.values())
    t0 = time.perf_counter()
    while len(done) < len(ids):
        for o in engine.step():
            emitted[o.request_id] = len(o.token_ids)
            if o.finished:
                if o.finish_reason == "error":
                    raise RuntimeError(f"request failed: {engine.last_error!r}")
                done.add(o.request_id)
                texts[o.request_id] = o.text
    elapsed = time.perf_counter() - t0
    timed = sum(emitted.values()) - start_tokens
    return elapsed / max(1, timed), [emitted[r] for r in ids], [texts[r] for r in ids]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request, both sides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="batch 1 and 2, 16 tokens, 1 round: checks it runs")
    p.add_argument("--out", default="runs/structured_decoding.json")
    args = p.parse_args()
    if args.quick:
        args.batch_sizes, args.max_tokens, args.rounds = "1,2", 16, 1
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    from importlib.metadata import version

    from fastmode import LLM
    from fastmode.sampling_params import SamplingParams, StructuredOutput

    llm = LLM(
        args.model,
        dtype=args.dtype,
        num_threads=args.num_threads,
        max_num_seqs=max(batch_sizes),
        kv_cache_gib=0.5,
        speculative="off",
    )
    engine = llm.engine
    all_prompts = prompts(llm, max(batch_sizes))
    common = {"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True, "speculative": "off"}
    sides = {
        "free": SamplingParams(**common),
        "constrained": SamplingParams(**common, structured=StructuredOutput("json_schema", json.dumps(SCHEMA))),
    }

    # Warm-up, untimed: compiles the grammar (cached per schema), allocates at each batch size.
    for b in batch_sizes:
        for params in sides.values():
            decode_seconds_per_token(
                engine, all_prompts[:b], SamplingParams(**{**common, "max_tokens": 4, "structured": params.structured})
            )
    sample = decode_seconds_per_token(engine, all_prompts[:1], sides["constrained"])[2][0]
    print(f"a constrained output begins: {sample[:100]!r}", flush=True)

    samples: dict[tuple[int, str], list[float]] = {(b, s): [] for b in batch_sizes for s in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for b in batch_sizes:
            for side in order:
                s_per_token, lengths, texts = decode_seconds_per_token(engine, all_prompts[:b], sides[side])
                if set(lengths) != {args.max_tokens}:
                    raise RuntimeError(f"{side} batch {b}: requests emitted {lengths} tokens, not {args.max_tokens}")
                if side == "constrained" and not all(t.startswith('{"files": [') for t in texts):
                    raise RuntimeError(f"the schema was not enforced: {texts[0][:80]!r}")
                samples[(b, side)].append(s_per_token)
                print(f"  round {r + 1} batch {b:>2} {side:<11} {s_per_token * 1000:7.2f} ms/token", flush=True)

    m = machine()
    print(
        f"\nmachine: {m['cpu']} ({m['isa']}), {m['cores']} cores, torch {m['torch']} "
        f"({m['torch_threads']} threads), llguidance {version('llguidance')}"
    )
    print(
        f"model: {engine.model_name} | {args.max_tokens} output tokens per request | greedy | median of "
        f"{args.rounds} alternating round(s) | decode steps only\n"
    )
    print(
        f"{'batch':>5} | {'free ms/tok':>11} | {'constrained ms/tok':>18} | {'ratio':>6} | target <= {TARGET_RATIO:.2f}"
    )
    rows = []
    for b in batch_sizes:
        free = statistics.median(samples[(b, "free")])
        con = statistics.median(samples[(b, "constrained")])
        ratio = con / free
        rows.append(
            {
                "batch": b,
                "free_s_per_token": free,
                "constrained_s_per_token": con,
                "ratio": ratio,
                "free_rounds": samples[(b, "free")],
                "constrained_rounds": samples[(b, "constrained")],
            }
        )
        verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
        print(f"{b:>5} | {free * 1000:11.2f} | {con * 1000:18.2f} | {ratio:6.3f} | {verdict}")
    path = write_json(
        args.out,
        {
            "machine": m,
            "model": engine.model_name,
            "args": vars(args),
            "schema": SCHEMA,
            "target_ratio": TARGET_RATIO,
            "results": rows,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
