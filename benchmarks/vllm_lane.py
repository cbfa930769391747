"""The fast lane inside vLLM, against vLLM's own priority: one fast streaming request beside
saturating standard ones, on vLLM's OpenAI server, the same model in every configuration.

    (a) fcfs      stock vLLM (`--scheduling-policy fcfs`); the fast request is an ordinary one
    (b) priority  stock vLLM (`--scheduling-policy priority`); the fast request at priority -10
    (c) lane      `--scheduler-cls fastmode.vllm.FastLaneScheduler` with `lane_max_batch` and the
                  service-tier middleware; the fast request sends `service_tier: "priority"`
    (d) alone     stock vLLM, the fast request with nothing else running

Each configuration gets a fresh server (`python -m vllm.entrypoints.openai.api_server`); (a) and
(d) share one. The standard clients (closed loop, streaming, `ignore_eos`) are started and the
fast request is sent once every one of them is decoding, plus a lead-in. Reported per
configuration: the fast request's decode speed (tokens after its first / the time from its first
token to its last, i.e. 1 / TPOT), its TTFT, and the standard clients' aggregate output tok/s
while the fast request decoded. Rounds alternate the servers' order; medians over rounds.

Run it with the vLLM venv's python (docs/vllm.md); the model defaults to the embedded model
exported to an HF directory (fastmode.vllm.export, fp32):

    VENV/bin/python benchmarks/vllm_lane.py                            # CPU, 15 standard clients, 3 rounds
    VENV/bin/python benchmarks/vllm_lane.py --rounds 1 --fast-tokens 16 --standard-clients 3   # smoke run
    VENV/bin/python benchmarks/vllm_lane.py --device cuda --dtype bfloat16   # one GPU (vllm_lane_gpu.sh)

Writes runs/vllm_lane/vllm_lane.json and the server logs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ("fcfs", "priority", "lane", "alone")
SERVED_NAME = "model"
PROMPT_WORDS = "the quick brown fox jumps over the lazy dog while a fast lane keeps every step short".split()


# ---------------------------------------------------------------- machine


def machine(device: str) -> dict:
    """The CPU as lscpu names it (family, model, the SIMD flags vLLM's CPU kernels care about), the
    GPU where one is used, and the versions."""
    info: dict = {"python": platform.python_version(), "vcpus": os.cpu_count()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    interesting = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
    info |= {
        "cpu": fields.get("Model name", platform.processor() or "?"),
        "cpu_family": fields.get("CPU family", "?"),
        "cpu_model": fields.get("Model", "?"),
        "flags": [f for f in interesting if f in fields.get("Flags", "").split()],
    }
    try:
        import torch
        import vllm

        info |= {"torch": torch.__version__, "vllm": vllm.__version__}
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError as e:
        info["import_error"] = str(e)
    return info


def machine_line(m: dict) -> str:
    line = (
        f"{m['cpu']} (family {m['cpu_family']}, model {m['cpu_model']}), {m['vcpus']} vCPUs; "
        f"flags: {' '.join(m['flags']) or 'none of note'}"
    )
    if m.get("gpu"):
        line += f"; GPU: {m['gpu']}"
    return line + f"; vLLM {m.get('vllm', '?')}, torch {m.get('torch', '?')}"


# ---------------------------------------------------------------- servers


def server_cmd(args: argparse.Namespace, config: str, port: int) -> list[str]:
    cmd = [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(args.model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--kv-cache-memory-bytes",
        str(args.kv_cache_mib << 20),
        "--seed",
        "0",
        "--scheduling-policy",
        "priority" if config == "priority" else "fcfs",
    ]
    if args.device == "cpu":
        cmd.append("--enforce-eager")  # as measured on the CPU so far: no torch.compile warm-up
    if config == "lane":
        lane = {"fastmode": {"lane_max_batch": args.lane_max_batch}}
        cmd += [
            "--scheduler-cls",
            "fastmode.vllm.FastLaneScheduler",
            "--additional-config",
            json.dumps(lane),
            "--middleware",
            "fastmode.vllm.ServiceTierMiddleware",
        ]
    return cmd


def server_env(args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if args.device == "cpu":
        # vLLM's CPU worker binds one OpenMP thread per listed core; its "auto" default keeps one core
        # of a small machine for the scheduler process, so the cores are named explicitly.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    return env


@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    log_path: Path
    env: dict
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> float:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        print(f"   $ {' '.join(self.cmd)}", flush=True)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} server exited {self.proc.returncode} while starting:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} server not healthy after {timeout_s:g} s; log: {self.log_path}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass


def idle(url: str) -> bool:
    """No request running or waiting, by vLLM's own gauges."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return False
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return total == 0


# ---------------------------------------------------------------- clients


@dataclass
class Stream:
    sent_s: float
    token_times_s: list[float] = field(default_factory=list)  # one entry per token, when its chunk arrived
    error: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first, over the time from the first to the last: 1 / TPOT."""
        t = self.token_times_s
        if len(t) < 2 or t[-1] <= t[0]:
            return None
        return (len(t) - 1) / (t[-1] - t[0])


def prompt(seed: int, num_words: int) -> str:
    return " ".join(PROMPT_WORDS[(seed * 7 + i * 3) % len(PROMPT_WORDS)] for i in range(num_words))


async def stream_completion(client, url: str, body: dict) -> Stream:
    s = Stream(time.perf_counter())
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                for choice in chunk.get("choices") or []:
                    s.token_times_s.extend([now] * len(choice.get("token_ids") or []))
    except Exception as e:  # noqa: BLE001 -- recorded with the figure, never hidden
        s.error = f"{type(e).__name__}: {e}"
    return s


def request_body(args: argparse.Namespace, seed: int, max_tokens: int, extra: dict | None = None) -> dict:
    body = {
        "model": SERVED_NAME,
        "prompt": prompt(seed, args.prompt_words),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    return body | (extra or {})


async def scenario(args: argparse.Namespace, url: str, config: str, seed: int) -> dict:
    """The fast request, alone or beside `--standard-clients` closed-loop standard clients."""
    import httpx

    fast_extra = {"priority": {"priority": -10}, "lane": {"service_tier": "priority"}}.get(config)
    num_standard = 0 if config == "alone" else args.standard_clients
    standard: list[Stream] = []  # every standard request, in the order sent
    current: list[Stream | None] = [None] * num_standard  # each client's request in flight
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=num_standard + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout_s), limits=limits) as client:

        async def standard_client(i: int) -> None:
            n = 0
            stopping = asyncio.create_task(stop.wait())
            while not stop.is_set():
                body = request_body(args, seed * 1000 + i * 31 + n, args.standard_tokens)
                s = current[i] = Stream(time.perf_counter())
                standard.append(s)
                task = asyncio.create_task(_fill(client, url, body, s))
                await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
                if not task.done():  # stopping: drop the connection; vLLM aborts the request
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                n += 1

        tasks = [asyncio.create_task(standard_client(i)) for i in range(num_standard)]
        if num_standard:
            waited = time.perf_counter()
            while not all(s is not None and s.token_times_s for s in current):
                if time.perf_counter() - waited > args.timeout_s:
                    raise RuntimeError(f"{config}: the standard clients did not all start decoding")
                await asyncio.sleep(0.1)
            await asyncio.sleep(args.lead_in_s)
        fast = await stream_completion(client, url, request_body(args, seed, args.fast_tokens, fast_extra))
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    if fast.error or fast.num_tokens != args.fast_tokens:
        raise RuntimeError(f"{config}: the fast request failed: {fast.error or f'{fast.num_tokens} tokens'}")
    t0, t1 = fast.token_times_s[0], fast.token_times_s[-1]
    in_window = sum(1 for s in standard for t in s.token_times_s if t0 <= t <= t1)
    errors = [s.error for s in standard if s.error and "Cancel" not in s.error]
    return {
        "config": config,
        "fast_decode_tok_s": fast.decode_tok_s,
        "fast_ttft_s": fast.ttft_s,
        "fast_tokens": fast.num_tokens,
        "window_s": t1 - t0,
        "standard_tok_s": in_window / (t1 - t0) if num_standard and t1 > t0 else None,
        "standard_requests": len(standard),
        "standard_errors": errors[:3],
        "standard_decoding_at_fast_start": sum(1 for s in standard if s.token_times_s and s.token_times_s[0] <= t0),
    }


async def _fill(client, url: str, body: dict, s: Stream) -> None:
    got = await stream_completion(client, url, body)
    s.token_times_s, s.error = got.token_times_s, got.error


# ---------------------------------------------------------------- rounds and report


SERVERS = {"stock": ("fcfs", "alone"), "priority": ("priority",), "lane": ("lane",)}


def run_round(args: argparse.Namespace, rnd: int, logs: Path) -> list[dict]:
    order = list(SERVERS) if rnd % 2 == 0 else list(SERVERS)[::-1]
    rows = []
    for name in order:
        configs = SERVERS[name] if rnd % 2 == 0 else SERVERS[name][::-1]
        server = Server(
            name, server_cmd(args, configs[0], args.port), args.port, logs / f"{name}-{rnd}.log", server_env(args)
        )
        try:
            startup_s = server.start(args.startup_timeout_s)
            print(f"== round {rnd + 1}: {name} server healthy after {startup_s:.0f} s", flush=True)
            asyncio.run(warm_up(args, server.url))
            for config in configs:
                t = time.perf_counter()
                while not idle(server.url) and time.perf_counter() - t < 120:
                    time.sleep(0.5)
                row = asyncio.run(scenario(args, server.url, config, seed=rnd + 1))
                row["round"] = rnd + 1
                row["load_1min"] = os.getloadavg()[0]
                rows.append(row)
                std = "-" if row["standard_tok_s"] is None else f"{row['standard_tok_s']:.1f}"
                print(
                    f"   ({'abcd'[CONFIGS.index(config)]}) {config:<8} fast {row['fast_decode_tok_s']:.1f} tok/s, "
                    f"TTFT {row['fast_ttft_s']:.2f} s; standard {std} tok/s in all",
                    flush=True,
                )
        finally:
            server.stop()
    return rows


async def warm_up(args: argparse.Namespace, url: str) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout_s)) as client:
        s = await stream_completion(client, url, request_body(args, 999, 8))
    if s.error:
        raise RuntimeError(f"warm-up request failed: {s.error}")


def summarize(rows: list[dict]) -> dict:
    out = {}
    for config in CONFIGS:
        mine = [r for r in rows if r["config"] == config]
        if not mine:
            continue

        def med(key: str, mine=mine):
            vals = [r[key] for r in mine if r[key] is not None]
            return statistics.median(vals) if vals else None

        out[config] = {
            "fast_decode_tok_s": med("fast_decode_tok_s"),
            "fast_ttft_s": med("fast_ttft_s"),
            "standard_tok_s": med("standard_tok_s"),
            "fast_decode_tok_s_by_round": [r["fast_decode_tok_s"] for r in mine],
            "standard_tok_s_by_round": [r["standard_tok_s"] for r in mine],
        }
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def print_report(args: argparse.Namespace, mach: dict, summary: dict, rows: list[dict]) -> dict:
    print()
    print(f"machine: {machine_line(mach)}")
    print(
        f"model:   {args.model} ({args.dtype}{', eager' if args.device == 'cpu' else ''}); device {args.device}"
        + (f", {args.threads} threads (VLLM_CPU_OMP_THREADS_BIND=0-{args.threads - 1})" if args.device == "cpu" else "")
    )
    print(
        f"load:    {args.standard_clients} standard clients (closed loop, {args.standard_tokens} tokens each, ignore_eos), "
        f"one fast request of {args.fast_tokens} tokens after {args.lead_in_s:g} s; prompts ~{args.prompt_words} words; "
        f"max_num_seqs {args.max_num_seqs}; lane_max_batch {args.lane_max_batch}; {args.rounds} round(s), order alternating"
    )
    print("1-min load average per measurement: " + ", ".join(f"{r['load_1min']:.1f}" for r in rows))
    header = ("config", "fast tok/s (median)", "each round", "fast TTFT s", "standard tok/s in all", "each round")
    lines = []
    for config in CONFIGS:
        s = summary.get(config)
        if not s:
            continue
        lines.append(
            (
                f"({'abcd'[CONFIGS.index(config)]}) {config}",
                _f(s["fast_decode_tok_s"]),
                " ".join(_f(x) for x in s["fast_decode_tok_s_by_round"]),
                _f(s["fast_ttft_s"], 2),
                _f(s["standard_tok_s"]),
                " ".join(_f(x) for x in s["standard_tok_s_by_round"]),
            )
        )
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    for x in [header, *lines]:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths))))
    get = lambda c, k: (summary.get(c) or {}).get(k)  # noqa: E731
    ratios = {
        "lane_vs_priority": ratio(get("lane", "fast_decode_tok_s"), get("priority", "fast_decode_tok_s")),
        "lane_vs_alone": ratio(get("lane", "fast_decode_tok_s"), get("alone", "fast_decode_tok_s")),
        "priority_vs_alone": ratio(get("priority", "fast_decode_tok_s"), get("alone", "fast_decode_tok_s")),
        "standard_lane_vs_fcfs": ratio(get("lane", "standard_tok_s"), get("fcfs", "standard_tok_s")),
    }
    by_round = [
        ratio(lane["fast_decode_tok_s"], prio["fast_decode_tok_s"])
        for lane in rows
        if lane["config"] == "lane"
        for prio in rows
        if prio["config"] == "priority" and prio["round"] == lane["round"]
    ]
    verdict = "met" if (ratios["lane_vs_priority"] or 0) >= 2.0 else "missed"
    print(
        f"(c) lane / (b) priority: {_f(ratios['lane_vs_priority'], 2)}x (target 2.0x: {verdict}); each round "
        + " ".join(_f(x, 2) for x in by_round)
    )
    print(
        f"(c) lane / (d) alone: {_f(ratios['lane_vs_alone'], 2)}x; (b) priority / (d) alone: "
        f"{_f(ratios['priority_vs_alone'], 2)}x"
    )
    print(
        f"standard clients' throughput while the fast request decoded, (c) lane / (a) fcfs: "
        f"{_f(ratios['standard_lane_vs_fcfs'], 2)}x (the lane's cost to them)"
    )
    return ratios | {"lane_vs_priority_by_round": by_round}


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="HF directory (default: the embedded model exported by fastmode.vllm.export)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", default=None, help="vLLM --dtype (default: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--threads", type=int, default=2, help="cpu: OpenMP threads of vLLM's worker (default 2)")
    p.add_argument("--standard-clients", type=int, default=15)
    p.add_argument("--standard-tokens", type=int, default=128, help="tokens per standard request (default 128)")
    p.add_argument("--fast-tokens", type=int, default=64, help="tokens of the fast request (default 64)")
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--lead-in-s", type=float, default=2.0, help="after every standard client decodes (default 2)")
    p.add_argument("--lane-max-batch", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=8191)
    p.add_argument("--vllm-python", default=sys.executable, help="python with vllm (default: this one)")
    p.add_argument("--startup-timeout-s", type=float, default=900)
    p.add_argument("--timeout-s", type=float, default=900, help="limit on one request")
    p.add_argument("--out", default=str(ROOT / "runs" / "vllm_lane" / "vllm_lane.json"))
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    if args.standard_clients + 1 > args.max_num_seqs:
        p.error("--max-num-seqs must hold every standard client and the fast request")
    if min(args.rounds, args.fast_tokens - 1, args.standard_tokens, args.lane_max_batch, args.threads) < 1:
        p.error("--rounds, --standard-tokens, --lane-max-batch and --threads must be >= 1, --fast-tokens >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from fastmode.vllm.export import export_hf_dir

        print("exporting the embedded model to an HF directory (cached)...", flush=True)
        args.model = str(export_hf_dir())
    if shutil.which(args.vllm_python) is None and not Path(args.vllm_python).exists():
        print(f"--vllm-python {args.vllm_python} not found", file=sys.stderr)
        return 2
    mach = machine(args.device)
    print(f"machine: {machine_line(mach)}", flush=True)
    out = Path(args.out)
    rows: list[dict] = []
    for rnd in range(args.rounds):
        rows += run_round(args, rnd, out.parent / "logs")
    summary = summarize(rows)
    ratios = print_report(args, mach, summary, rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "vllm_lane",
                "machine": mach,
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "settings": {k: v for k, v in vars(args).items() if k != "out"},
                "summary": summary,
                "ratios": ratios,
                "rows": rows,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
            indent=2,
        )
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
