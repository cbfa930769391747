"""Peers end to end over HTTP: llama.cpp's llama-server, `fastmode serve` and (where installed) vLLM's
OpenAI server, same model, same load.

Two scenarios, both driven by the project's load generator (`fastmode bench`,
closed loop, streaming, greedy, ignore_eos so every answer runs to
--max-tokens; synthetic prompts of about --input-len tokens; the same seed, so
both servers get the very same requests):

1. peers: each server alone at --concurrency clients for --num-requests
   requests. The servers run one after the other, never together (they would
   share the cores), in --rounds rounds whose order alternates (llama-server
   then fastmode, then fastmode then llama-server, ...): on this VM the speed
   drifts by 10-20% over minutes, and with an even number of rounds both
   servers sit at the same mean time, so a steady drift cancels out of the
   ratio. Each round's ratio is printed too. No service_tier is sent:
   llama-server has no tiers and fastmode serves an absent tier as standard.
   llama-server: `-m MODEL -np C -cb -c C*CTX_PER_SLOT -t T -tb T`;
   fastmode: `fastmode serve --model MODEL --num-threads T`, otherwise default;
   vLLM (when --vllm-python or $FASTMODE_VLLM_PYTHON names a python with vllm, its CPU build on a
   CPU): `python -m vllm.entrypoints.openai.api_server` on an HF export of MODEL
   (fastmode.vllm.export), `--max-num-seqs C`, its best precision here (benchmarks/peers.py
   vllm_dtype), eager on a CPU, its worker bound to T cores.
2. fast-tier (fastmode only): --concurrency standard clients keep the server
   saturated (`--tier-mix standard=1`, for --fast-tier-duration-s) and, after a
   lead-in, --fast-clients fast clients (`--tier-mix fast=1`, service_tier
   "priority") send --fast-requests requests. Per tier: the decode speed each
   request saw (tok/s per request p50 = 1 / TPOT), TTFT and output tok/s,
   next to the standard-only figures of scenario 1.

The load generator runs on the same machine as the server (it costs both
servers alike). Writes runs/peers/peers_http.json (the bench reports included)
and the server logs next to it.

    .venv/bin/python benchmarks/peers_http.py                         # 16 clients, 64 requests each
    .venv/bin/python benchmarks/peers_http.py --concurrency 2 --num-requests 4 --max-tokens 8 \\
        --input-len 16 --fast-tier-duration-s 20 --fast-requests 2      # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers import (  # noqa: E402
    DEFAULT_LLAMA_CPP_DIR,
    default_model,
    find_binary,
    gguf_info,
    resolve_vllm_python,
    vllm_dtype,
)

SCENARIOS = ("llama-server", "fastmode", "vllm", "fast-tier")


# ---------------------------------------------------------------- reading `fastmode bench --json`


def bench_summary(report: dict | None) -> dict:
    """The figures this script needs from one `fastmode bench --json` report (first level).

    Reads levels[0].aggregate.output_tok_s and levels[0].tiers[T] (the bench's
    documented layout, docs/bench.md), else a flat `aggregate_output_tok_s`;
    whatever is absent is None and named in `missing`, never guessed.
    """
    out: dict = {
        "output_tok_s": None,
        "completed": None,
        "num_requests": None,
        "tok_s_per_request_p50": None,
        "ttft_p50_s": None,
        "tpot_p50_s": None,
        "window_s": None,
        "errors": None,
        "tiers": {},
        "missing": [],
    }
    if not report:
        out["missing"].append("report")
        return out
    levels = report.get("levels") or []
    level = levels[0] if levels else {}
    agg = level.get("aggregate") or {}

    def figures(d: dict) -> dict:
        return {
            "output_tok_s": d.get("output_tok_s"),
            "completed": d.get("completed"),
            "num_requests": d.get("num_requests"),
            "tok_s_per_request_p50": (d.get("tok_s_per_request") or {}).get("p50"),
            "ttft_p50_s": (d.get("ttft_s") or {}).get("p50"),
            "tpot_p50_s": (d.get("tpot_s") or {}).get("p50"),
            "output_tokens": d.get("output_tokens"),
            "errors": d.get("errors"),
        }

    out.update(figures(agg))
    if out["output_tok_s"] is None:
        out["output_tok_s"] = report.get("aggregate_output_tok_s")
    out["window_s"] = level.get("window_s")
    out["tiers"] = {t: figures(d) for t, d in (level.get("tiers") or {}).items()}
    out["missing"] = [k for k in ("output_tok_s", "completed", "tok_s_per_request_p50", "ttft_p50_s") if out[k] is None]
    return out


# ---------------------------------------------------------------- servers


class Server:
    """A server subprocess in its own process group, its output in a log file; stopped on exit."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: Path):
        self.name, self.cmd, self.port, self.log_path = name, cmd, port, log_path
        self.env: dict | None = None  # None: this process's environment
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> float:
        """Start and wait until GET /health answers 200; returns the seconds it took."""
        if _port_answers(self.port):
            raise RuntimeError(f"port {self.port} is already in use; pick another with the --*-port flags")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")
        print(f"   $ {' '.join(self.cmd)}", flush=True)
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
        )
        while time.perf_counter() - t < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited {self.proc.returncode} while starting; log: {self.log_path}\n"
                    + _tail(self.log_path)
                )
            if _health(self.base_url):
                return time.perf_counter() - t
            time.sleep(0.5)
        raise RuntimeError(
            f"{self.name} not healthy after {timeout_s:g} s; log: {self.log_path}\n" + _tail(self.log_path)
        )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the server leads its own group
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _health(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def llama_server(args: argparse.Namespace, model: str, logs: Path) -> Server:
    exe = find_binary(args.llama_cpp_dir, "llama-server")
    if exe is None:
        raise FileNotFoundError(
            f"llama-server not found under {args.llama_cpp_dir} (benchmarks/peers/build_llama_cpp.sh)"
        )
    c = args.concurrency
    cmd = [
        str(exe),
        "-m",
        model,
        "-np",
        str(c),
        "-cb",
        "-c",
        str(c * args.ctx_per_slot),
        "-t",
        str(args.threads),
        "-tb",
        str(args.threads),
        "--host",
        "127.0.0.1",
        "--port",
        str(args.llama_port),
    ]
    return Server("llama-server", cmd, args.llama_port, logs / "llama-server.log")


def fastmode_bin() -> list[str]:
    exe = Path(sys.executable).parent / "fastmode"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("fastmode")
    return [found] if found else [sys.executable, "-m", "fastmode.cli"]


def fastmode_server(args: argparse.Namespace, model: str, logs: Path) -> Server:
    cmd = fastmode_bin() + [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(args.fastmode_port),
        "--model",
        model,
        "--num-threads",
        str(args.threads),
        "--log-level",
        "warning",
    ]
    return Server("fastmode", cmd, args.fastmode_port, logs / "fastmode.log")


def vllm_export(vllm_python: str, model: str) -> str:
    """The HF export of `model` that vLLM loads, made (or found in the cache) by vLLM's own python."""
    code = "import sys; from fastmode.vllm.export import export_hf_dir; print(export_hf_dir(sys.argv[1]))"
    p = subprocess.run([vllm_python, "-c", code, model], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"exporting {model} for vLLM failed: {p.stderr[-2000:]}")
    return p.stdout.strip().splitlines()[-1]


def vllm_server(args: argparse.Namespace, export_dir: str, dtype: str, logs: Path) -> Server:
    cmd = [
        args.vllm_python_resolved,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        export_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.vllm_port),
        "--dtype",
        dtype,
        "--max-num-seqs",
        str(args.concurrency),
        "--max-model-len",
        str(args.ctx_per_slot),
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--seed",
        "0",
    ]
    if not args.cuda:
        cmd.append("--enforce-eager")
    server = Server("vllm", cmd, args.vllm_port, logs / "vllm.log")
    server.env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}")
    return server


# ---------------------------------------------------------------- the load generator


def bench_cmd(
    args: argparse.Namespace,
    base_url: str,
    out_json: Path,
    *,
    concurrency: int,
    num_requests: int | None = None,
    duration_s: float | None = None,
    tier_mix: str | None = None,
    warmup: int = 0,
    seed: int | None = None,
) -> list[str]:
    cmd = fastmode_bin() + [
        "bench",
        "--base-url",
        base_url,
        "--concurrency",
        str(concurrency),
        "--max-tokens",
        str(args.max_tokens),
        "--ignore-eos",
        "--endpoint",
        args.endpoint,
        "--prompts",
        "synthetic",
        "--input-len",
        str(args.input_len),
        "--seed",
        str(args.seed if seed is None else seed),
        "--warmup-requests",
        str(warmup),
        "--json",
        str(out_json),
        "--no-progress",
    ]
    if num_requests is not None:
        cmd += ["--num-requests", str(num_requests)]
    if duration_s is not None:
        cmd += ["--duration-s", str(duration_s)]
    cmd += ["--tier-mix", tier_mix] if tier_mix else ["--no-tier-field"]
    return cmd


def run_bench(cmd: list[str], out_json: Path, timeout_s: float) -> dict | None:
    """Run `fastmode bench` to the end; its report, or None (its output is shown)."""
    print(f"   $ {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if p.stdout.strip():
        print("     " + p.stdout.strip().replace("\n", "\n     "), flush=True)
    if p.returncode != 0:
        print(f"   fastmode bench exited {p.returncode}: {p.stderr.strip()[-2000:]}", file=sys.stderr, flush=True)
    try:
        return json.loads(out_json.read_text())
    except (OSError, ValueError):
        return None


def scenario_peer(args: argparse.Namespace, server: Server, work: Path, round_no: int = 0) -> dict:
    with server:
        startup = server.start(args.startup_timeout_s)
        print(f"   {server.name} healthy after {startup:.1f} s", flush=True)
        out = work / f"bench-{server.name}-{round_no}.json"
        cmd = bench_cmd(
            args,
            server.base_url,
            out,
            concurrency=args.concurrency,
            num_requests=args.num_requests,
            warmup=args.warmup_requests,
        )
        report = run_bench(cmd, out, args.timeout_s)
    summary = bench_summary(report)
    check_full_length(server.name, summary, args.max_tokens)
    return {
        "server": server.name,
        "command": server.cmd,
        "startup_s": startup,
        "bench_command": cmd,
        "summary": summary,
        "report": report,
    }


def combine_rounds(rounds: list[dict]) -> dict:
    """One server's summary over its rounds: rates and latencies are the mean of the rounds' figures
    (each round weighs the same, as the alternating order assumes), counts are summed."""
    summaries = [r["summary"] for r in rounds]
    out: dict = {"rounds": len(rounds), "missing": sorted({m for s in summaries for m in s["missing"]})}
    for key in ("output_tok_s", "tok_s_per_request_p50", "ttft_p50_s", "tpot_p50_s"):
        vals = [s[key] for s in summaries]
        out[key] = None if any(v is None for v in vals) else sum(vals) / len(vals)
    for key in ("completed", "num_requests", "output_tokens"):
        vals = [s.get(key) for s in summaries]
        out[key] = None if any(v is None for v in vals) else sum(vals)
    out["errors"] = [s.get("errors") for s in summaries]  # each round's, as the bench reported them
    fl = [s.get("full_length") for s in summaries]
    out["full_length"] = None if None in fl else all(fl)
    return out


def check_full_length(name: str, summary: dict, max_tokens: int) -> None:
    """Warn when answers stopped short of max_tokens (a server ignoring ignore_eos): tok/s would not compare."""
    done, tokens = summary.get("completed"), summary.get("output_tokens")
    summary["full_length"] = None if done is None or tokens is None else tokens == done * max_tokens
    if summary["full_length"] is False:
        print(
            f"   warning: {name} produced {tokens} output tokens for {done} requests of max_tokens "
            f"{max_tokens}: ignore_eos was not honoured",
            file=sys.stderr,
            flush=True,
        )


def scenario_fast_tier(args: argparse.Namespace, model: str, logs: Path, work: Path) -> dict:
    server = fastmode_server(args, model, logs)
    server.log_path = logs / "fastmode-fast-tier.log"
    with server:
        startup = server.start(args.startup_timeout_s)
        print(f"   fastmode healthy after {startup:.1f} s", flush=True)
        std_out, fast_out = work / "bench-fast-tier-standard.json", work / "bench-fast-tier-fast.json"
        std_cmd = bench_cmd(
            args,
            server.base_url,
            std_out,
            concurrency=args.concurrency,
            duration_s=args.fast_tier_duration_s,
            tier_mix="standard=1",
            warmup=args.warmup_requests,
        )
        fast_cmd = bench_cmd(
            args,
            server.base_url,
            fast_out,
            concurrency=args.fast_clients,
            num_requests=args.fast_requests,
            tier_mix="fast=1",
            seed=args.seed + 1,
        )
        print(f"   $ {' '.join(std_cmd)} &", flush=True)
        t0 = time.perf_counter()
        std_proc = subprocess.Popen(std_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(args.fast_lead_in_s)
        fast_report = run_bench(fast_cmd, fast_out, args.timeout_s)
        fast_done = time.perf_counter() - t0
        std_stdout, std_stderr = std_proc.communicate(timeout=args.timeout_s)
        if std_stdout.strip():
            print("     " + std_stdout.strip().replace("\n", "\n     "), flush=True)
        if std_proc.returncode != 0:
            print(f"   standard bench exited {std_proc.returncode}: {std_stderr.strip()[-2000:]}", file=sys.stderr)
        try:
            std_report = json.loads(std_out.read_text())
        except (OSError, ValueError):
            std_report = None
    summaries = {"standard": bench_summary(std_report), "fast": bench_summary(fast_report)}
    for tier, summary in summaries.items():
        check_full_length(f"fastmode ({tier})", summary, args.max_tokens)
    # The standard bench starts new requests until duration_s (after its warmup); the fast clients
    # must be done by then for "under saturating load" to hold throughout.
    saturated = fast_done <= args.fast_tier_duration_s
    if not saturated:
        print(
            f"   warning: the fast clients finished {fast_done:.0f} s after start, past the standard load's "
            f"{args.fast_tier_duration_s:g} s: raise --fast-tier-duration-s or lower --fast-requests",
            file=sys.stderr,
        )
    return {
        "server": "fastmode",
        "command": server.cmd,
        "startup_s": startup,
        "standard": {"bench_command": std_cmd, "summary": summaries["standard"], "report": std_report},
        "fast": {"bench_command": fast_cmd, "summary": summaries["fast"], "report": fast_report},
        "fast_clients_done_s": fast_done,
        "saturated_throughout": saturated,
    }


# ---------------------------------------------------------------- report


def fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def print_tables(res: dict, args: argparse.Namespace) -> None:
    from benchmarks.common import machine
    from benchmarks.kernels import cpu_line, roofline_tok_s

    m = res["machine"] if "machine" in res else machine()
    print()
    line = cpu_line(m) if "simd_flags" in m else f"{m['cpu']} ({m['isa']}), {m['cores']} cores"
    print(f"machine: {line}; servers get --threads {args.threads}; the load generator shares the machine")
    bw = res.get("dram_read_gbs")
    context = args.input_len + args.max_tokens / 2
    roof = roofline_tok_s(bw, res["model"]["path"], args.concurrency, context) if bw else None
    print(
        f"DRAM read bandwidth (--threads threads, this run): {fmt(bw)} GB/s; memory roofline at "
        f"{args.concurrency} sequences of ~{context:.0f} tokens: {fmt(roof, 0)} tok/s"
    )
    print(f"model:   {res['model']['path']} ({res['model']['quant']})")
    print(
        f"load:    closed loop, {args.concurrency} clients, prompts ~{args.input_len} tokens (synthetic), "
        f"{args.max_tokens} output tokens (ignore_eos), greedy, /v1/{args.endpoint.replace('chat', 'chat/completions')}"
    )
    peers = res["peers"]
    ref = next((p["summary"]["output_tok_s"] for p in peers if p["server"] == "llama-server"), None)
    header = (
        "server",
        "precision",
        "clients",
        "ok/sent",
        "out tok/s",
        "of roofline",
        "tok/s/req p50",
        "TTFT p50 s",
        "vs llama-server",
    )
    rows = []
    for p in peers:
        s = p["summary"]
        ratio = f"{s['output_tok_s'] / ref:.2f}x" if ref and s["output_tok_s"] else "-"
        of_roof = f"{100 * s['output_tok_s'] / roof:.0f}%" if roof and s["output_tok_s"] else "-"
        rows.append(
            (
                p["server"],
                p["precision"],
                str(args.concurrency),
                f"{s['completed']}/{s['num_requests']}",
                fmt(s["output_tok_s"]),
                of_roof,
                fmt(s["tok_s_per_request_p50"]),
                fmt(s["ttft_p50_s"], 3),
                ratio,
            )
        )
    _print_rows(header, rows)
    per_round = {p["server"]: [r["summary"]["output_tok_s"] for r in p.get("rounds", [])] for p in peers}
    if {"llama-server", "fastmode"} <= per_round.keys() and min(len(v) for v in per_round.values()) > 1:
        ratios = [
            f"{f / ll:.2f}x" if f and ll else "-" for ll, f in zip(per_round["llama-server"], per_round["fastmode"])
        ]
        print(
            "per round (out tok/s, llama-server / fastmode, order alternating): "
            + "; ".join(
                f"{fmt(ll)} / {fmt(f)} ({r})"
                for ll, f, r in zip(per_round["llama-server"], per_round["fastmode"], ratios)
            )
        )
    for p in peers:
        if p["summary"]["missing"]:
            print(f"   {p['server']}: missing from the bench report: {', '.join(p['summary']['missing'])}")
    ft = res.get("fast_tier")
    if ft:
        print()
        print(
            f"fast tier: fastmode, {args.concurrency} standard clients saturating it, {args.fast_clients} fast clients"
        )
        alone = next((p["summary"] for p in peers if p["server"] == "fastmode"), None)
        header = ("tier", "clients", "ok/sent", "tok/s/req p50", "TTFT p50 s", "out tok/s")
        rows = []
        if alone:
            rows.append(
                (
                    "standard alone (scenario 1)",
                    str(args.concurrency),
                    f"{alone['completed']}/{alone['num_requests']}",
                    fmt(alone["tok_s_per_request_p50"]),
                    fmt(alone["ttft_p50_s"], 3),
                    fmt(alone["output_tok_s"]),
                )
            )
        for tier, clients in (("standard", args.concurrency), ("fast", args.fast_clients)):
            s = ft[tier]["summary"]
            rows.append(
                (
                    f"{tier} (mixed)",
                    str(clients),
                    f"{s['completed']}/{s['num_requests']}",
                    fmt(s["tok_s_per_request_p50"]),
                    fmt(s["ttft_p50_s"], 3),
                    fmt(s["output_tok_s"]),
                )
            )
        _print_rows(header, rows, left=1)
        if not ft["saturated_throughout"]:
            print("   (the standard load ended before the fast clients did: not saturated throughout)")


def _print_rows(header: tuple, rows: list[tuple], left: int = 2) -> None:
    """A fixed-width table: the first `left` columns left-aligned, the figures right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="GGUF file (default: the embedded default model's)")
    p.add_argument("--threads", type=int, default=2, help="threads each server gets (default 2)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--num-requests", type=int, default=64, help="measured requests per server and round (default 64)")
    p.add_argument(
        "--rounds", type=int, default=2, help="rounds of the peers scenario, the servers' order alternating (default 2)"
    )
    p.add_argument("--warmup-requests", type=int, help="unmeasured requests first (default: --concurrency)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--input-len", type=int, default=128, help="synthetic prompt length, ~tokens (default 128)")
    p.add_argument(
        "--endpoint",
        choices=["completions", "chat"],
        default="completions",
        help="completions (default: the raw prompt, no chat template on either side) or chat",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ctx-per-slot", type=int, default=512, help="llama-server: -c is clients x this (default 512)")
    p.add_argument("--fast-clients", type=int, default=2, help="fast-tier scenario: fast clients (default 2)")
    p.add_argument("--fast-requests", type=int, default=8, help="fast-tier scenario: fast requests (default 8)")
    p.add_argument(
        "--fast-lead-in-s",
        type=float,
        default=5.0,
        help="fast-tier scenario: standard load runs this long before the fast clients start",
    )
    p.add_argument(
        "--fast-tier-duration-s",
        type=float,
        default=90.0,
        help="fast-tier scenario: how long the standard clients keep starting requests",
    )
    p.add_argument("--skip", default="", help=f"comma-separated: {','.join(SCENARIOS)}")
    p.add_argument(
        "--llama-cpp-dir",
        default=DEFAULT_LLAMA_CPP_DIR,
        help="where llama-server is (build dir or bin dir; default $FASTMODE_LLAMA_CPP_DIR or %(default)s)",
    )
    p.add_argument("--llama-port", type=int, default=8181)
    p.add_argument("--fastmode-port", type=int, default=8182)
    p.add_argument("--vllm-port", type=int, default=8183)
    p.add_argument(
        "--vllm-python",
        default=os.environ.get("FASTMODE_VLLM_PYTHON"),
        help="the python of a venv with vllm (default: $FASTMODE_VLLM_PYTHON, else this one if it has vllm)",
    )
    p.add_argument("--vllm-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="limit on each bench run")
    p.add_argument("--out", default=str(ROOT / "runs" / "peers" / "peers_http.json"))
    args = p.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(SCENARIOS):
        p.error(f"--skip: unknown {sorted(skip - set(SCENARIOS))}; choose from {', '.join(SCENARIOS)}")
    if args.warmup_requests is None:
        args.warmup_requests = args.concurrency
    if args.rounds < 1:
        p.error("--rounds must be >= 1")

    from benchmarks.common import machine, write_json

    model_path = Path(args.model).expanduser().resolve() if args.model else default_model()
    info = gguf_info(model_path)
    model = str(model_path)
    out_path = Path(args.out)
    logs = out_path.parent / "logs"
    work = Path(tempfile.mkdtemp(prefix="peers_http-"))
    from benchmarks.kernels import cpu_description

    res: dict = {
        "benchmark": "peers_http",
        "machine": machine() | cpu_description(),
        "model": info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "peers": [],
        "fast_tier": None,
        "skipped": {},
    }
    try:  # the bandwidth the roofline uses, measured in this run before the servers start
        bw = subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "peers.py"),
                "--worker",
                "bandwidth",
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        line = next(ln for ln in reversed(bw.stdout.splitlines()) if ln.startswith("PEERS_RESULT "))
        res["dram_read_gbs"] = json.loads(line.removeprefix("PEERS_RESULT "))["dram_read_gbs"]
    except (StopIteration, ValueError, subprocess.TimeoutExpired) as e:
        print(f"bandwidth: not measured ({type(e).__name__})", file=sys.stderr)

    fastmode_precision = "see its log"
    try:  # a label: what `fastmode serve` runs by default on this machine
        from fastmode.kernels import ops
        from fastmode.loader.load import resolve_dtype

        dtype = resolve_dtype("auto")
        if dtype == "float32" and ops() is not None and info["quant"] in ("Q4_0", "Q4_1", "Q8_0"):
            fastmode_precision = f"{info['quant']} GGUF (as stored), fp32 activations, f16 KV"
        else:
            fastmode_precision = (
                f"{dtype} (dequantized from {info['quant']}), {'f16' if dtype == 'float32' else dtype} KV"
            )
    except Exception:  # noqa: BLE001 -- a label only
        pass
    plan = [
        (
            "llama-server",
            f"{info['quant']} GGUF (as stored), int8 activations, f16 KV",
            lambda: llama_server(args, model, logs),
        ),
        ("fastmode", fastmode_precision, lambda: fastmode_server(args, model, logs)),
    ]
    args.vllm_python_resolved = None if "vllm" in skip else resolve_vllm_python(args.vllm_python)
    args.cuda = False
    if args.vllm_python_resolved:
        try:
            import torch

            args.cuda = torch.cuda.is_available()
        except ImportError:
            pass
        dtype = vllm_dtype(args.vllm_dtype, args.cuda)
        try:
            export_dir = vllm_export(args.vllm_python_resolved, model)
            precision = f"{dtype} (HF export, dequantized from {info['quant']}){'' if args.cuda else ', eager'}"
            plan.append(("vllm", precision, lambda: vllm_server(args, export_dir, dtype, logs)))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            res["skipped"]["vllm"] = f"failed: {e}"
    elif "vllm" not in skip:
        res["skipped"]["vllm"] = "not installed here (pass --vllm-python VENV/bin/python or set FASTMODE_VLLM_PYTHON)"
    plan = [x for x in plan if x[0] not in skip]
    res["skipped"].update({name: "--skip" for name in ("llama-server", "fastmode", "vllm") if name in skip})
    rounds: dict[str, list[dict]] = {name: [] for name, _, _ in plan}
    for rnd in range(args.rounds):
        for name, _, make in plan if rnd % 2 == 0 else plan[::-1]:
            if name in res["skipped"]:  # failed in an earlier round
                continue
            print(
                f"== {name}: {args.concurrency} clients, {args.num_requests} requests, round {rnd + 1} of "
                f"{args.rounds}",
                flush=True,
            )
            try:
                rounds[name].append(scenario_peer(args, make(), work, rnd))
            except Exception as e:  # noqa: BLE001 -- one server failing must not lose the other
                res["skipped"][name] = f"failed in round {rnd + 1}: {type(e).__name__}: {e}"
                print(f"{name}: FAILED: {e}", file=sys.stderr, flush=True)
    for name, precision, _ in plan:
        if name in res["skipped"] or not rounds[name]:
            continue
        first = rounds[name][0]
        res["peers"].append(
            {
                "server": name,
                "precision": precision,
                "command": first["command"],
                "bench_command": first["bench_command"],
                "summary": combine_rounds(rounds[name]),
                "rounds": rounds[name],
            }
        )
    if "fast-tier" in skip:
        res["skipped"]["fast-tier"] = "--skip"
    else:
        print(f"== fast-tier: fastmode, {args.concurrency} standard + {args.fast_clients} fast clients", flush=True)
        try:
            res["fast_tier"] = scenario_fast_tier(args, model, logs, work)
        except Exception as e:  # noqa: BLE001
            res["skipped"]["fast-tier"] = f"failed: {type(e).__name__}: {e}"
            print(f"fast-tier: FAILED: {e}", file=sys.stderr, flush=True)

    print_tables(res, args)
    for name, why in res["skipped"].items():
        print(f"skipped {name}: {why}")
    print(f"results: {write_json(out_path, res)}  (server logs: {logs})")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if res["peers"] or res["fast_tier"] else 1


if __name__ == "__main__":
    sys.exit(main())
