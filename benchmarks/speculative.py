"""Speculation as served against plain decoding, end to end through `fastmode serve`.

The server runs as users run it (a `fastmode serve` subprocess, default flags but the
thread count). Every request asks for the fast tier (`service_tier: "priority"`), greedy,
non-streaming; side A leaves speculation at the tier's default (n-gram drafting, on by
default in the fast tier), side B sends `speculative: "off"`. Both sides run on the same
server, so everything but drafting is the same.

Prompts: benchmarks/data/speculative_prompts.json, by workload (code edits, renames
across files, JSON, tool calls, prose, chat; answers of 30 to 400 tokens). Its "heldout"
prompts are never used to tune the policy and are reported separately.

For each concurrency (`--batches`: the number of clients sending at once) and each
workload, `--repeats` rounds: in a round the workload's prompts go out in groups, one
prompt per client, and each group is sent by both sides back to back, the side going first
alternating (A B, B A, A B, ... from group to group and round to round). A side's figure
in a round is its output tokens over its wall time (end to end: prompt, decoding, HTTP);
the reported figure is the median round, and the ratio is A over B. Every answer must be
the same on both sides (content and tool calls), in every round. Each prompt is sent once
before measuring, so both sides find it in the prefix cache alike.

    .venv/bin/python benchmarks/speculative.py --threads 2                   # batches 1,4,8; 3 rounds
    .venv/bin/python benchmarks/speculative.py --threads 2 --quick           # 2 tune + 1 held-out prompt a workload, batches 1,4

Writes runs/speculative.json (rows per workload, split and concurrency; the machine and
load averages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, write_json  # noqa: E402
from benchmarks.peers_http import Server, fastmode_bin  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "speculative_prompts.json"
SIDES = ("spec", "plain")  # A: the fast tier's default (speculation on); B: speculative "off"


def load_prompts(path: Path, quick: bool) -> list[dict]:
    prompts = json.loads(path.read_text())["prompts"]
    if not quick:
        return prompts
    keep, seen = [], {}
    for p in prompts:  # the first two tune prompts and the first held-out prompt of each workload
        key = (p["workload"], p["split"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= (2 if p["split"] == "tune" else 1):
            keep.append(p)
    return keep


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def send(base_url: str, model: str, prompt: dict, side: str, cap: int | None) -> tuple[int, str, float]:
    """One chat completion: (completion tokens, the answer as compared across sides, seconds)."""
    body = {
        "model": model,
        "messages": prompt["messages"],
        "max_tokens": min(prompt["max_tokens"], cap) if cap else prompt["max_tokens"],
        "temperature": 0,
        "service_tier": "priority",
    }
    for key in ("tools", "tool_choice", "response_format"):
        if key in prompt:
            body[key] = prompt[key]
    if side == "plain":
        body["speculative"] = "off"
    req = urllib.request.Request(
        base_url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            data = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{prompt['id']} ({side}): HTTP {e.code}: {e.read()[:500]!r}") from e
    seconds = time.perf_counter() - t0
    msg = data["choices"][0]["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    return data["usage"]["completion_tokens"], json.dumps([msg.get("content"), calls]), seconds


def run_turn(base_url: str, model: str, prompts: list[dict], clients: int, side: str, cap: int | None) -> dict:
    """`prompts` sent at once, one per client."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(lambda p: send(base_url, model, p, side, cap), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(g[0] for g in got)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "answers": [g[1] for g in got]}


def run_round(base_url: str, model: str, prompts: list[dict], clients: int, rnd: int, cap: int | None) -> dict:
    """One round of a workload: its prompts (cycled to at least one per client) in groups of
    `clients` sent at once; each group is sent by both sides back to back, the side going first
    alternating from group to group and from round to round (A B, B A, ...), so the machine's
    drift hits both alike. Returns per side the round's tokens, wall time and answers."""
    batch = [prompts[i % len(prompts)] for i in range(max(len(prompts), clients))]
    out = {s: {"tokens": 0, "wall_s": 0.0, "answers": []} for s in SIDES}
    for g, i in enumerate(range(0, len(batch), clients)):
        for side in SIDES if (g + rnd) % 2 == 0 else SIDES[::-1]:
            t = run_turn(base_url, model, batch[i : i + clients], clients, side, cap)
            out[side]["tokens"] += t["tokens"]
            out[side]["wall_s"] += t["wall_s"]
            out[side]["answers"] += t["answers"]
    for side in SIDES:
        out[side]["tok_s"] = out[side]["tokens"] / out[side]["wall_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model to serve (default: the embedded one)")
    p.add_argument("--batches", default="1,4,8", help="concurrent clients, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="rounds per side (A B, B A, A B, ...); the median is kept")
    p.add_argument("--threads", type=int, default=None, help="the server's --num-threads")
    p.add_argument("--max-tokens", type=int, default=None, help="cap every prompt's max_tokens (default: the file's)")
    p.add_argument("--quick", action="store_true", help="2 tune and 1 held-out prompt per workload, batches 1,4")
    p.add_argument("--prompts", default=str(DATA))
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--url", default=None, help="use a server already running here instead of starting one")
    p.add_argument("--no-spark", action="store_true", help="accepted for benchmarks/results.py; no effect here")
    p.add_argument("--out", default="runs/speculative.json")
    p.add_argument("--server-log", default="runs/speculative-server.log")
    args = p.parse_args()
    if args.quick and args.batches == p.get_default("batches"):
        args.batches = "1,4"
    prompts = load_prompts(Path(args.prompts), args.quick)
    batches = [int(x) for x in args.batches.split(",")]
    workloads = list(dict.fromkeys(q["workload"] for q in prompts))

    server = None
    if args.url is None:
        cmd = fastmode_bin() + ["serve", "--host", "127.0.0.1", "--port", str(args.port), "--log-level", "warning"]
        if args.model:
            cmd += ["--model", args.model]
        if args.threads:
            cmd += ["--num-threads", str(args.threads)]
        server = Server("fastmode", cmd, args.port, Path(args.server_log))
        startup = server.start(timeout_s=600)
        print(f"server healthy after {startup:.1f} s", flush=True)
    base_url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        mach = machine()
        print(
            f"machine: {mach['cpu']} ({mach['isa']}, {mach['cores']} cores)  model: {model}  "
            f"server threads: {args.threads or 'default'}  load average: {load_avg()}"
        )
        print(
            f"prompts: {len(prompts)} ({sum(q['split'] == 'heldout' for q in prompts)} held out)"
            f"{'  [--quick]' if args.quick else ''}  batches: {batches}  rounds: {args.repeats}"
            f"{f'  max_tokens cap: {args.max_tokens}' if args.max_tokens else ''}",
            flush=True,
        )
        for side in SIDES:  # warm-up: first-call allocations, the grammar compiler, both paths
            run_turn(base_url, model, prompts[:2], 1, side, 16)
        # Every prompt once, so both sides find it in the prefix cache: whichever side went
        # first would otherwise pay its prefill alone.
        run_turn(base_url, model, prompts, 4, "plain", 1)
        rows: list[dict] = []

        def save(done: bool) -> Path:  # after every row, so an interrupted run leaves what it measured
            return write_json(
                args.out,
                {
                    "machine": mach,
                    "model": model,
                    "args": vars(args),
                    "prompts": [q["id"] for q in prompts],
                    "complete": done,
                    "load_average_end": load_avg(),
                    "rows": rows,
                },
            )

        print(
            f"{'split':>7} {'workload':>9} {'batch':>5} {'tokens':>6} {'spec tok/s':>10} {'plain tok/s':>11} "
            f"{'ratio':>6} {'rounds (ratio)':>22} {'same':>5} {'load avg':>16}"
        )
        for b in batches:
            for split in ("tune", "heldout"):
                for w in workloads:
                    group = [q for q in prompts if q["workload"] == w and q["split"] == split]
                    if not group:
                        continue
                    rows.append(measure(base_url, model, group, b, split, w, args))
                    save(False)
            for split in ("tune", "heldout", "all"):
                sel = [r for r in rows if r["batch"] == b and r["workload"] != "all" and split in ("all", r["split"])]
                if sel:
                    rows.append(total_row(sel, b, split))
        print_summary(rows, batches)
        print(f"wrote {save(True)}")
    finally:
        if server is not None:
            server.stop()


def measure(base_url: str, model: str, group: list[dict], b: int, split: str, w: str, args) -> dict:
    """One workload at one concurrency, `repeats` rounds (`run_round`); the median round per side."""
    turns: dict[str, list[dict]] = {s: [] for s in SIDES}
    load = load_avg()
    for rnd in range(args.repeats):
        got = run_round(base_url, model, group, b, rnd, args.max_tokens)
        for side in SIDES:
            turns[side].append(got[side])
    ref = turns["plain"][0]["answers"]
    same = all(t["answers"] == ref for s in SIDES for t in turns[s])
    spec = statistics.median(t["tok_s"] for t in turns["spec"])
    plain = statistics.median(t["tok_s"] for t in turns["plain"])
    per_round = [a["tok_s"] / p["tok_s"] for a, p in zip(turns["spec"], turns["plain"])]
    row = {
        "split": split,
        "workload": w,
        "batch": b,
        "method": "ngram",
        "prompts": [q["id"] for q in group],
        "tokens": turns["plain"][0]["tokens"],
        "spec_tok_s": spec,
        "plain_tok_s": plain,
        "speedup": spec / plain,
        "round_ratios": per_round,
        "spec_runs": [t["tok_s"] for t in turns["spec"]],
        "plain_runs": [t["tok_s"] for t in turns["plain"]],
        "spec_wall_s": [t["wall_s"] for t in turns["spec"]],
        "plain_wall_s": [t["wall_s"] for t in turns["plain"]],
        "identical": same,
        "load_average": load,
    }
    print_row(row)
    return row


def total_row(rows: list[dict], b: int, split: str) -> dict:
    """A split's workloads together: per round, all their tokens over all their turns' time."""
    n = min(len(r["spec_wall_s"]) for r in rows)

    def rate(side: str, i: int) -> float:
        return sum(r["tokens"] for r in rows) / sum(r[f"{side}_wall_s"][i] for r in rows)

    spec = [rate("spec", i) for i in range(n)]
    plain = [rate("plain", i) for i in range(n)]
    row = {
        "split": split,
        "workload": "all",
        "batch": b,
        "method": "ngram",
        "tokens": sum(r["tokens"] for r in rows),
        "spec_tok_s": statistics.median(spec),
        "plain_tok_s": statistics.median(plain),
        "speedup": statistics.median(spec) / statistics.median(plain),
        "round_ratios": [a / p for a, p in zip(spec, plain)],
        "identical": all(r["identical"] for r in rows),
        "load_average": load_avg(),
    }
    print_row(row)
    return row


def print_row(r: dict) -> None:
    rounds = " ".join(f"{x:.2f}" for x in r["round_ratios"])
    print(
        f"{r['split']:>7} {r['workload']:>9} {r['batch']:>5} {r['tokens']:>6} {r['spec_tok_s']:>10.1f} "
        f"{r['plain_tok_s']:>11.1f} {r['speedup']:>5.2f}x {rounds:>22} {str(r['identical']):>5} {r['load_average']:>16}",
        flush=True,
    )


def print_summary(rows: list[dict], batches: list[int]) -> None:
    print("\nspeculation on / off, end to end (median of rounds); held-out prompts never tuned on:")
    for split in ("tune", "heldout", "all"):
        cells = []
        for b in batches:
            sel = [r for r in rows if r["batch"] == b and split in ("all", r["split"]) and r["workload"] != "all"]
            worst = min(sel, key=lambda r: r["speedup"]) if sel else None
            tot = next((r for r in rows if r["batch"] == b and r["split"] == split and r["workload"] == "all"), None)
            code = [r["speedup"] for r in sel if r["workload"] in ("code-edit", "rename")]
            cells.append(
                f"batch {b}: all {tot['speedup']:.2f}x, lowest {worst['workload']} {worst['speedup']:.2f}x"
                + (f", code edits/renames {' '.join(f'{x:.2f}x' for x in code)}" if code else "")
                if worst
                else f"batch {b}: -"
            )
        print(f"{split:>7}: " + "; ".join(cells))
    print(f"outputs identical: {all(r['identical'] for r in rows)}")


if __name__ == "__main__":
    main()
