"""What does the fast lane buy, and what does it cost?

Saturates one engine with closed-loop standard streams (default 32), adds a
few closed-loop fast streams, and measures per tier: output tok/s per request
(decode speed after the first token), TTFT p50/p99, aggregate throughput and
the metered price per million output tokens. It sweeps `fast_lane_max_batch`;
"off" is priority scheduling without a lane -- what vLLM and SGLang offer --
measured in the same run as the peer.

    .venv/bin/python benchmarks/tiers.py                 # ~5 min on 2 cores
    .venv/bin/python benchmarks/tiers.py --duration-s 10 --lanes off,4   # quick look

Writes runs/tiers.json and runs/tiers.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine, pct, write_json  # noqa: E402

PROMPTS = [
    "Explain how a CPU cache works.",
    "Write a short story about a lighthouse keeper.",
    "List five uses of Python dictionaries.",
    "What causes the seasons on Earth?",
    "Describe the water cycle for a child.",
    "Give advice for a first job interview.",
    "Summarize the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
]


def run_one(loaded, lane, args) -> dict:
    from fastmode import SamplingParams
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine

    cfg = EngineConfig(
        kv_cache_gib=args.kv_cache_gib,
        max_num_seqs=args.standard_streams + args.fast_streams,
        max_num_batched_tokens=args.max_batched_tokens,
        fast_lane_max_batch=None if lane == "off" else int(lane),
        usd_per_machine_hour=args.usd_per_hour,
        speculative=args.speculative,
    )
    eng = LLMEngine(cfg, loaded=loaded)
    params = SamplingParams(temperature=0, max_tokens=args.output_tokens, ignore_eos=True)
    tok = loaded.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    counter = iter(range(10**9))
    track: dict[str, dict] = {}  # request id -> tier, token times

    def submit(tier: str) -> None:
        k = next(counter)
        # "off": the peer is plain priority scheduling, so fast requests still go first.
        rid = eng.add_request(prompts[k % len(prompts)], params, tier, f"{tier}-{k}")
        track[rid] = {"tier": tier, "arrival": time.perf_counter(), "times": [], "machine_s": 0.0}

    for _ in range(args.standard_streams):
        submit("standard")
    # Let the standard batch reach steady decoding before fast streams arrive.
    while any(s.is_prefilling for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    for r in track.values():  # measure from here on
        r["times"], r["arrival"] = [], time.perf_counter()
    for _ in range(args.fast_streams):
        submit("fast")
    t0 = time.perf_counter()
    tokens = 0
    while time.perf_counter() - t0 < args.duration_s:
        outs = eng.step()
        now = time.perf_counter()
        for o in outs:
            tokens += len(o.delta_token_ids)
            track[o.request_id]["times"] += [now] * len(o.delta_token_ids)
            if o.finished:
                track[o.request_id]["machine_s"] = o.metrics.machine_s
                submit(o.tier)  # closed loop: keep the load constant
    wall = time.perf_counter() - t0
    for rid, r in track.items():  # requests still in flight: their metered share so far
        seq = eng.scheduler.get(rid)
        if seq is not None:
            r["machine_s"] = seq.machine_s
            eng.abort(rid)

    result = {"lane": lane, "wall_s": wall, "aggregate_tok_s": tokens / wall}
    for tier in ("fast", "standard"):
        rs = [r for r in track.values() if r["tier"] == tier]
        # Output tok/s per request: decode speed between its first and last token in the window.
        otps = [(len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]) for r in rs if len(r["times"]) >= 4]
        ttft = [r["times"][0] - r["arrival"] for r in rs if r["times"] and tier == "fast"]
        toks = sum(len(r["times"]) for r in rs)
        cost = sum(r["machine_s"] for r in rs) * args.usd_per_hour / 3600
        result[tier] = {
            "tokens": toks,
            "otps_mean": sum(otps) / len(otps) if otps else None,
            "ttft_p50_s": pct(ttft, 50),
            "ttft_p99_s": pct(ttft, 99),
            "usd_per_mtok": cost / toks * 1e6 if toks else None,
        }
    f, s = result["fast"], result["standard"]
    if f["otps_mean"] and s["otps_mean"]:
        result["speed_ratio"] = f["otps_mean"] / s["otps_mean"]
        result["price_ratio"] = f["usd_per_mtok"] / s["usd_per_mtok"]
    return result


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "speed_ratio" in r]
    labels = [str(r["lane"]) for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(labels, [r["fast"]["otps_mean"] for r in rows], "o-", label="fast")
    a.plot(labels, [r["standard"]["otps_mean"] for r in rows], "s-", label="standard")
    a.plot(labels, [r["aggregate_tok_s"] for r in rows], "^--", label="aggregate")
    a.set_xlabel("fast_lane_max_batch ('off' = priority only)")
    a.set_ylabel("output tok/s")
    a.legend()
    a.set_title("Speed per tier")
    b.plot([r["price_ratio"] for r in rows], [r["speed_ratio"] for r in rows], "o-")
    for r in rows:
        b.annotate(str(r["lane"]), (r["price_ratio"], r["speed_ratio"]))
    b.scatter([6.0], [2.5], marker="*", s=150, color="red", label="Anthropic fast mode: 2.5x for 6x")
    b.set_xlabel("fast / standard price per Mtok")
    b.set_ylabel("fast / standard output tok/s")
    b.set_title("The trade-off curve")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--lanes", default="off,1,2,4,8", help="fast_lane_max_batch values; 'off' = no lane")
    p.add_argument("--standard-streams", type=int, default=32)
    p.add_argument("--fast-streams", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--max-batched-tokens", type=int, default=256)
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--usd-per-hour", type=float, default=1.0)
    p.add_argument(
        "--speculative", default="off", choices=["off", "ngram"], help="fast-tier speculation (off isolates the lane)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="runs/tiers.json")
    args = p.parse_args()

    from fastmode.loader import load_model

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    print(f"machine: {machine()}  model: {loaded.name} ({loaded.dtype})")
    results = []
    print(
        f"{'lane':>5} {'fast tok/s':>10} {'std tok/s':>10} {'speed x':>8} {'price x':>8} "
        f"{'vs off: speed x':>15} {'price x':>8} {'agg tok/s':>10} {'fast TTFT p50/p99 s':>20} {'$/Mtok fast/std':>16}"
    )
    base = None
    for lane in args.lanes.split(","):
        r = run_one(loaded, lane, args)
        results.append(r)
        f, s = r["fast"], r["standard"]
        if lane == "off":
            base = s
        if base and f["otps_mean"] and base["otps_mean"]:
            # Against what a standard user gets with no lane: Anthropic fast mode's "65 -> 170 tok/s" comparison.
            r["speed_vs_off"] = f["otps_mean"] / base["otps_mean"]
            r["price_vs_off"] = f["usd_per_mtok"] / base["usd_per_mtok"]
        fmt = lambda v, d=1: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        print(
            f"{lane:>5} {fmt(f['otps_mean']):>10} {fmt(s['otps_mean']):>10} {fmt(r.get('speed_ratio'), 2):>8} "
            f"{fmt(r.get('price_ratio'), 2):>8} {fmt(r.get('speed_vs_off'), 2):>15} {fmt(r.get('price_vs_off'), 2):>8} "
            f"{fmt(r['aggregate_tok_s']):>10} {fmt(f['ttft_p50_s'], 2) + '/' + fmt(f['ttft_p99_s'], 2):>20} "
            f"{fmt(f['usd_per_mtok'], 2) + '/' + fmt(s['usd_per_mtok'], 2):>16}",
            flush=True,
        )
    out = write_json(args.out, {"machine": machine(), "args": vars(args), "results": results})
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
