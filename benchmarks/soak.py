"""Soak: a long run of mixed traffic against one `fastmode serve`, checking nothing leaks or is lost.

Workers loop over a mix of scenarios for --duration-s (30 minutes by default):
chat streams and non-streaming chats on every tier (fast, standard, flex, auto),
Anthropic messages (fast and standard, streamed or not), clients that disconnect
mid-stream, WebSocket sessions of two chained Responses turns, bad requests
(lone surrogates, out-of-range seeds, broken JSON, too many stop strings), and
slow-loris connections that dribble a request head, which the server must close
within its header timeout (`--header-timeout-s`, passed to the server).

Every request must end with a response or a clean error: a 2xx, or a 4xx/429/503/529
in the dialect's format, or (for a stream) an in-band error event. Anything else (a 500,
a dropped connection, a timeout) counts as lost. Every 10 s the server's RSS and KV
usage are sampled. Pass criteria, printed at the end:
- no request lost;
- KV usage back to its starting value once the load stops;
- RSS at the end within --rss-growth of the RSS after the first tenth of the run (warm-up).

    .venv/bin/python benchmarks/soak.py                      # 30 min, the embedded model
    .venv/bin/python benchmarks/soak.py --duration-s 120     # a quick look

Writes runs/soak.json: counts by scenario and outcome, p50/p99 latency per minute, the samples.
Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import pct, write_json  # noqa: E402
from benchmarks.peers_http import Server, fastmode_bin  # noqa: E402

PROMPTS = ["tell me a long story", "count slowly to twenty", "write a haiku about rain", "what is 2+2?"]
CLEAN_ERRORS = {400, 404, 413, 429, 503, 529}


class Soak:
    def __init__(self, url: str, model: str, max_tokens: int, header_timeout_s: float, client_timeout_s: float):
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.header_timeout_s, self.client_timeout_s = header_timeout_s, client_timeout_s
        self.outcomes: Counter = Counter()  # (scenario, outcome)
        self.latency: dict[int, list[float]] = defaultdict(list)  # minute -> seconds
        self.t0 = time.monotonic()

    def record(self, scenario: str, outcome: str, seconds: float) -> None:
        self.outcomes[(scenario, outcome)] += 1
        if outcome == "ok" and scenario != "slowloris":  # a slow-loris lasts as long as the server lets it
            self.latency[int((time.monotonic() - self.t0) // 60)].append(seconds)

    def chat(self, stream: bool, tier: str) -> dict:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": random.choice(PROMPTS)}],
            "max_tokens": random.randint(4, self.max_tokens),
            "stream": stream,
            "service_tier": tier,
        }

    async def stream_outcome(self, client: httpx.AsyncClient, path: str, body: dict, cut_after: int | None) -> str:
        async with client.stream("POST", self.url + path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code) if r.status_code in CLEAN_ERRORS else f"lost {r.status_code}"
            n, last = 0, ""
            async for line in r.aiter_lines():
                if line.startswith(("data:", "event:")):
                    n += 1
                    last = line
                    if '"error"' in line or line == "event: error":
                        return "error event"
                    if cut_after is not None and n >= cut_after:
                        return "ok"  # the client leaves: the server must free the request
            done = last == "data: [DONE]" or "message_stop" in last
            return "ok" if done else "lost (stream cut)"

    async def one(self, client: httpx.AsyncClient) -> None:
        scenario = random.choices(
            ["chat_stream", "chat", "messages", "disconnect", "websocket", "bad", "slowloris"],
            weights=[4, 3, 3, 1, 1, 2, 1],
        )[0]
        tier = random.choice(["priority", "default", "flex", "auto"])
        t = time.monotonic()
        try:
            if scenario == "chat_stream":
                outcome = await self.stream_outcome(client, "/v1/chat/completions", self.chat(True, tier), None)
            elif scenario == "disconnect":
                outcome = await self.stream_outcome(client, "/v1/chat/completions", self.chat(True, tier), 3)
            elif scenario == "chat":
                r = await client.post(self.url + "/v1/chat/completions", json=self.chat(False, tier))
                outcome = "ok" if r.status_code == 200 else self.status(r)
            elif scenario == "messages":
                body = {
                    "model": self.model,
                    "max_tokens": random.randint(4, self.max_tokens),
                    "messages": [{"role": "user", "content": random.choice(PROMPTS)}],
                    **({"speed": "fast"} if random.random() < 0.5 else {}),
                }
                if random.random() < 0.5:
                    outcome = await self.stream_outcome(client, "/v1/messages", {**body, "stream": True}, None)
                else:
                    r = await client.post(self.url + "/v1/messages", json=body)
                    outcome = "ok" if r.status_code == 200 else self.status(r)
            elif scenario == "websocket":
                outcome = await self.websocket()
            elif scenario == "slowloris":
                outcome = await self.slowloris()
            else:
                outcome = await self.bad(client)
        except (httpx.HTTPError, websockets.WebSocketException, OSError, asyncio.TimeoutError) as e:
            outcome = f"lost ({type(e).__name__})"
        self.record(scenario, outcome, time.monotonic() - t)

    @staticmethod
    def status(r: httpx.Response) -> str:
        return str(r.status_code) if r.status_code in CLEAN_ERRORS else f"lost {r.status_code}"

    async def bad(self, client: httpx.AsyncClient) -> str:
        base = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        body = random.choice(
            [
                json.dumps({**base, "messages": [{"role": "user", "content": "\ud800"}]}).encode(),
                json.dumps({**base, "seed": 2**64}).encode(),
                json.dumps({**base, "stop": ["x"] * 1000}).encode(),
                b'{"model": ',
                b"[" * 100_000,
            ]
        )
        r = await client.post(
            self.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        return "ok" if 400 <= r.status_code < 500 else f"lost {r.status_code}"

    async def slowloris(self) -> str:
        """Send a request head a line at a time, never finishing it: the server must close the
        connection within its header timeout (plus a few seconds of slack for a busy machine)."""
        host, port = self.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        t0 = time.monotonic()
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: " + host.encode() + b"\r\n")
            i = 0
            while time.monotonic() - t0 < self.header_timeout_s + 5:
                try:
                    if await asyncio.wait_for(reader.read(4096), 0.5) == b"":
                        return "ok"  # closed by the server
                except asyncio.TimeoutError:
                    pass
                writer.write(b"x-pad-%d: y\r\n" % i)
                i += 1
            return "lost (slow-loris connection held open)"
        except (ConnectionResetError, BrokenPipeError):
            return "ok"  # closed by the server while we wrote
        finally:
            writer.close()

    async def websocket(self) -> str:
        ws_url = self.url.replace("http://", "ws://") + "/v1/responses"
        async with websockets.connect(ws_url, open_timeout=self.client_timeout_s) as ws:
            previous = None
            for _ in range(2):
                event = {
                    "type": "response.create",
                    "model": self.model,
                    "input": random.choice(PROMPTS),
                    "max_output_tokens": random.randint(4, self.max_tokens),
                    "store": False,
                    **({"previous_response_id": previous} if previous else {}),
                }
                await ws.send(json.dumps(event))
                while True:
                    e = json.loads(await asyncio.wait_for(ws.recv(), self.client_timeout_s))
                    if e["type"] == "error":
                        return str(e["status"]) if e["status"] in CLEAN_ERRORS else f"lost {e['status']}"
                    if e["type"] in ("response.completed", "response.incomplete"):
                        previous = e["response"]["id"]
                        break
                    if e["type"] == "response.failed":
                        return "error event"
        return "ok"


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def sample(url: str, pid: int, t0: float) -> dict:
    async with httpx.AsyncClient(timeout=30) as c:
        text = (await c.get(url + "/metrics")).text
    return {
        "t_s": round(time.monotonic() - t0, 1),
        "rss_mib": round(rss_mib(pid), 1),
        "kv_usage": metric(text, "fastmode:kv_cache_usage_perc"),
        "running": metric(text, "fastmode:num_requests_running"),
    }


async def run(args: argparse.Namespace, server: Server) -> dict:
    soak = Soak(server.base_url, args.model_name, args.max_tokens, args.header_timeout_s, args.client_timeout_s)
    pid = server.proc.pid
    samples = [await sample(server.base_url, pid, soak.t0)]
    stop_at = soak.t0 + args.duration_s

    async def worker() -> None:
        async with httpx.AsyncClient(timeout=args.client_timeout_s) as client:
            while time.monotonic() < stop_at:
                await soak.one(client)

    async def sampler() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(10)
            samples.append(await sample(server.base_url, pid, soak.t0))
            print(f"  {samples[-1]}  served {sum(soak.outcomes.values())}", flush=True)

    await asyncio.gather(sampler(), *(worker() for _ in range(args.concurrency)))
    await asyncio.sleep(5)  # aborted requests are freed at the next step boundary
    samples.append(await sample(server.base_url, pid, soak.t0))
    warm = next((s for s in samples if s["t_s"] >= args.duration_s / 10), samples[0])
    end = samples[-1]
    lost = {f"{s} {o}": n for (s, o), n in soak.outcomes.items() if o.startswith("lost")}
    report = {
        "duration_s": args.duration_s,
        "concurrency": args.concurrency,
        "served": sum(soak.outcomes.values()),
        "outcomes": {f"{s} {o}": n for (s, o), n in sorted(soak.outcomes.items())},
        "latency_by_minute": {
            m: {"n": len(v), "p50_s": pct(v, 50), "p99_s": pct(v, 99)} for m, v in sorted(soak.latency.items())
        },
        "samples": samples,
        "checks": {
            "no_request_lost": not lost,
            "kv_back_to_start": end["kv_usage"] <= samples[0]["kv_usage"] + 1e-9,
            "rss_flat": end["rss_mib"] <= warm["rss_mib"] * (1 + args.rss_growth),
        },
        "lost": lost,
    }
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=1800)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--model", default=None, help="a model path (default: the embedded model)")
    p.add_argument("--port", type=int, default=8471)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--client-timeout-s",
        type=float,
        default=120.0,
        help="how long a client waits for a response (or the next event) before counting the request lost",
    )
    p.add_argument("--header-timeout-s", type=float, default=3.0, help="the server's --http-header-timeout-s")
    p.add_argument("--rss-growth", type=float, default=0.10, help="allowed RSS growth after warm-up (fraction)")
    p.add_argument("--out", default="runs/soak.json")
    args = p.parse_args(argv)
    cmd = fastmode_bin() + [
        "serve",
        "--port",
        str(args.port),
        "--num-threads",
        str(args.threads),
        "--max-waiting-requests",
        "16",
        "--http-header-timeout-s",
        str(args.header_timeout_s),
        "--log-level",
        "warning",
    ]
    if args.model:
        cmd += ["--model", args.model]
    with Server("fastmode", cmd, args.port, Path("runs/soak-server.log")) as server:
        server.start(timeout_s=600)
        models = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]
        args.model_name = models[0]["id"]
        report = asyncio.run(run(args, server))
    write_json(args.out, report)
    summary = {k: report[k] for k in ("served", "outcomes", "checks", "lost")}
    summary["p99_s_by_minute"] = {m: v["p99_s"] for m, v in report["latency_by_minute"].items()}
    summary["start"], summary["end"] = report["samples"][0], report["samples"][-1]
    print(json.dumps(summary, indent=1))
    print("PASS" if all(report["checks"].values()) else "FAIL")
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
