"""WebSocket mode vs a new HTTP request per turn, over a 20-turn agent-like session.

Both sessions run against one `fastmode serve` process (the embedded model
unless --model) in the same run, with the same instructions, tool outputs
and greedy decoding, their turns interleaved so load changes hit both alike.
The HTTP session does what a stateless client does: a new connection per
turn and the whole conversation resent to /v1/chat/completions (streamed).
The WebSocket session keeps one connection to /v1/responses and sends only
the new tool output plus previous_response_id, so the server extends the
previous turn's tokens and the prefix cache serves all of them. Each session
starts with its own nonce so neither warms the cache for the other.

    .venv/bin/python benchmarks/websocket_turns.py              # ~4 min on 2 busy cores
    .venv/bin/python benchmarks/websocket_turns.py --turns 5    # quick look

Prints per turn: latency, overhead (client-seen TTFT minus the engine's own
TTFT: connection, transfer, parsing, templating -- what the WebSocket mode
can save) and prompt tokens prefilled vs served from the cache; then the
totals. Writes runs/websocket_turns.json.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine, write_json  # noqa: E402

INSTRUCTIONS = (
    "You are a coding agent working in a Python repository. After each tool output, say in one short "
    "sentence what you will do next. Tools: read_file(path), run_tests(pattern), grep(text), "
    "edit(path, old, new). Keep answers brief and concrete."
)


@dataclass
class Turn:
    latency_s: float  # request sent -> last event received, client side
    ttft_s: float  # request sent -> first text delta
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    engine_ttft_s: float  # arrival in the engine -> first token, as the server reports it

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def overhead_s(self) -> float:
        """Client-seen TTFT minus the engine's: connection, transfer, parsing, templating."""
        return self.ttft_s - self.engine_ttft_s


def tool_outputs(turns: int, seed: int = 0) -> list[str]:
    """Deterministic, agent-like tool results (test runs, greps, file reads)."""
    rng = random.Random(seed)
    files = ["engine/scheduler.py", "server/app.py", "loader/gguf_file.py", "models/llama.py", "engine/sampler.py"]
    out = []
    for i in range(turns):
        f = rng.choice(files)
        kind = i % 3
        if kind == 0:
            passed, failed = rng.randint(10, 60), rng.randint(0, 3)
            out.append(
                f"run_tests: {passed} passed, {failed} failed in {rng.uniform(1, 9):.2f}s; failing: test_{rng.randint(1, 99)} in tests/{f}"
            )
        elif kind == 1:
            out.append(
                f"grep: {f}:{rng.randint(10, 250)}: def step(self) -> list[RequestOutput]:\n"
                f"{f}:{rng.randint(10, 250)}:     out = self.scheduler.schedule(self.clock())"
            )
        else:
            out.append(
                f"read_file {f} lines {rng.randint(1, 100)}-{rng.randint(101, 200)}:\n"
                "    for seq in sorted(self.running, key=lambda s: (s.tier.rank, s.arrival_time_s)):\n"
                "        n, drafts = self._tokens_for(seq, budget)"
            )
    return out


class HttpSession:
    """A stateless client: a new connection per turn, the whole conversation resent."""

    def __init__(self, url: str, model: str, nonce: str, max_tokens: int):
        import httpx

        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.messages = [{"role": "system", "content": f"[session {nonce}] {INSTRUCTIONS}"}]
        # Built once (its TLS setup is client-side cost, not the protocol's); `connection: close`
        # makes every turn open a new TCP connection, as a stateless caller does.
        self.client = httpx.Client(timeout=300, headers={"connection": "close"})

    def turn(self, text: str) -> Turn:
        self.messages.append({"role": "user", "content": text})
        body = {
            "model": self.model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        ttft, reply, usage = None, [], None
        with self.client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for c in chunk.get("choices", []):
                    if c["delta"].get("content"):
                        ttft = ttft or time.perf_counter() - t0
                        reply.append(c["delta"]["content"])
        self.messages.append({"role": "assistant", "content": "".join(reply)})
        return Turn(
            time.perf_counter() - t0,
            ttft or 0.0,
            usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"],
            usage["completion_tokens"],
            usage["time_to_first_token_seconds"] or 0.0,
        )

    def close(self) -> None:
        self.client.close()


class WsSession:
    """One WebSocket; each turn sends only the new input and previous_response_id."""

    def __init__(self, url: str, model: str, nonce: str, max_tokens: int):
        from websockets.sync.client import connect

        self._conn = connect(url.replace("http://", "ws://") + "/v1/responses", max_size=None)
        self.ws = self._conn.__enter__()  # websockets wants the context-manager protocol
        self.model, self.max_tokens, self.previous = model, max_tokens, None
        self.instructions = f"[session {nonce}] {INSTRUCTIONS}"

    def turn(self, text: str) -> Turn:
        event = {
            "type": "response.create",
            "model": self.model,
            "instructions": self.instructions,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
            "max_output_tokens": self.max_tokens,
            "temperature": 0,
            "previous_response_id": self.previous,
        }
        t0 = time.perf_counter()
        self.ws.send(json.dumps(event))
        ttft = None
        while True:
            e = json.loads(self.ws.recv(timeout=300))
            if e["type"] == "response.output_text.delta":
                ttft = ttft or time.perf_counter() - t0
            elif e["type"] in ("response.completed", "response.incomplete"):
                break
            elif e["type"] in ("error", "response.failed"):
                raise RuntimeError(f"turn failed: {e}")
        u = e["response"]["usage"]
        self.previous = e["response"]["id"]
        return Turn(
            time.perf_counter() - t0,
            ttft or 0.0,
            u["input_tokens"],
            u["input_tokens_details"]["cached_tokens"],
            u["output_tokens"],
            u["time_to_first_token_seconds"] or 0.0,
        )

    def close(self) -> None:
        self._conn.__exit__(None, None, None)


def start_server(args):
    """`fastmode serve` in its own process (so this client does not share its GIL); (url, stop())."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "fastmode.cli",
        "serve",
        "--port",
        str(port),
        "--dtype",
        args.dtype,
        "--kv-cache-gib",
        str(args.kv_cache_gib),
        "--log-level",
        "warning",
    ]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start")
        time.sleep(0.2)

    def stop():
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()

    return url, stop


def summarize(name: str, turns: list[Turn]) -> dict:
    med = statistics.median
    return {
        "mode": name,
        "total_s": sum(t.latency_s for t in turns),
        "median_turn_s": med(t.latency_s for t in turns),
        "median_ttft_s": med(t.ttft_s for t in turns),
        "median_overhead_ms": med(t.overhead_s for t in turns) * 1000,
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "cached_tokens": sum(t.cached_tokens for t in turns),
        "prefilled_tokens": sum(t.prefilled_tokens for t in turns),
        "output_tokens": sum(t.output_tokens for t in turns),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=24, help="output tokens per turn")
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--out", default="runs/websocket_turns.json")
    args = p.parse_args()

    import httpx

    url, stop = start_server(args)
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        inputs = tool_outputs(args.turns)
        warm = WsSession(url, model, "warmup", 4)  # first-call costs (allocations) out of both runs
        warm.turn(inputs[0])
        warm.close()
        http, ws = HttpSession(url, model, "http", args.max_tokens), WsSession(url, model, "ws", args.max_tokens)
        hs, ws_turns = [], []
        for text in inputs:  # interleaved, so load changes on the machine hit both modes alike
            hs.append(http.turn(text))
            ws_turns.append(ws.turn(text))
        ws.close()
        http.close()
    finally:
        stop()

    m = machine()
    print(f"machine: {m['cpu']} ({m['isa']}), {m['cores']} cores, torch {m['torch']}")
    print(
        f"model: {model} | {args.turns} turns | {args.max_tokens} output tokens/turn | greedy | "
        f"overhead = client TTFT - engine TTFT\n"
    )
    print(
        f"{'turn':>4} | {'HTTP s':>6} {'ovh ms':>6} {'prompt':>6} {'cached':>6} {'prefill':>7} |"
        f" {'WS s':>6} {'ovh ms':>6} {'prompt':>6} {'cached':>6} {'prefill':>7}"
    )
    for i, (h, w) in enumerate(zip(hs, ws_turns), 1):
        print(
            f"{i:>4} | {h.latency_s:6.2f} {h.overhead_s * 1000:6.1f} {h.prompt_tokens:6d} {h.cached_tokens:6d} "
            f"{h.prefilled_tokens:7d} | {w.latency_s:6.2f} {w.overhead_s * 1000:6.1f} {w.prompt_tokens:6d} "
            f"{w.cached_tokens:6d} {w.prefilled_tokens:7d}"
        )
    sh, sw = summarize("http", hs), summarize("websocket", ws_turns)
    print()
    for s in (sh, sw):
        print(
            f"{s['mode']:>9}: {s['total_s']:.1f} s total, median {s['median_turn_s'] * 1000:.0f} ms/turn, "
            f"TTFT {s['median_ttft_s'] * 1000:.0f} ms, overhead {s['median_overhead_ms']:.1f} ms; prompt "
            f"{s['prompt_tokens']} tokens = {s['cached_tokens']} cached + {s['prefilled_tokens']} prefilled"
        )
    print(
        f"\nWebSocket vs HTTP: total time {1 - sw['total_s'] / sh['total_s']:+.0%}, "
        f"per-turn overhead {sh['median_overhead_ms'] - sw['median_overhead_ms']:+.1f} ms, "
        f"prefilled tokens {1 - sw['prefilled_tokens'] / max(1, sh['prefilled_tokens']):+.0%} "
        f"(positive = WebSocket saves)"
    )
    path = write_json(
        args.out,
        {
            "machine": m,
            "model": model,
            "args": vars(args),
            "summary": [sh, sw],
            "http": [asdict(t) for t in hs],
            "websocket": [asdict(t) for t in ws_turns],
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
