"""A 20-turn agent tool loop: the Responses API over HTTP and over the WebSocket against full-history chat completions.

Every turn the model must call one of three tools (tool_choice "required",
one call a turn, greedy); the client answers with a fixed, agent-like tool
output and the loop goes on. Three sessions run the same turns against one
`fastmode serve` process (the embedded model unless --model), their turns
interleaved so load changes on the machine hit all three alike:

- chat: a stateless client resends the whole conversation to
  /v1/chat/completions each turn (assistant tool_calls, tool messages);
- responses-http: POST /v1/responses with previous_response_id and only the
  new function_call_output, a new connection per turn;
- responses-ws: the same requests as response.create events on one
  WebSocket to /v1/responses.

With previous_response_id the server extends the previous turn's exact tokens,
so the prefix cache serves all of them; a resent history is re-rendered, and
the cache serves it only up to the first block where the re-rendering differs.
Per mode: time per turn (request sent -> response complete) and prompt tokens
prefilled vs served from the cache (usage cached_tokens). Each session starts
with its own nonce so none warms the cache for another. Rounds alternate the
order of the modes; the figures are the median over --rounds rounds.

    .venv/bin/python benchmarks/tool_loop.py            # 20 turns, 3 rounds
    .venv/bin/python benchmarks/tool_loop.py --quick    # 3 turns, 1 round: checks it runs

Writes runs/tool_loop.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine, write_json
from benchmarks.websocket_turns import start_server, tool_outputs

INSTRUCTIONS = (
    "You are a coding agent fixing a failing test in a Python repository. Work only through the tools: "
    "read files, run tests and grep. Call exactly one tool per turn."
)
TASK = "tests/engine/test_scheduler.py fails after the last change to the scheduler. Find out why."


def _string(description: str) -> dict:
    return {"type": "string", "description": description, "maxLength": 48}


# name -> (description, JSON schema of the arguments); strings bounded so a call always fits --max-tokens.
TOOLS = {
    "read_file": (
        "Read a file of the repository.",
        {
            "type": "object",
            "properties": {"path": _string("path from the repository root")},
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
    "run_tests": (
        "Run the tests whose node ids match a pattern.",
        {
            "type": "object",
            "properties": {"pattern": _string("pytest -k pattern")},
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
    "grep": (
        "Search the repository for a string.",
        {
            "type": "object",
            "properties": {"text": _string("text to find")},
            "required": ["text"],
            "additionalProperties": False,
        },
    ),
}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": s}} for n, (d, s) in TOOLS.items()
]
RESPONSES_TOOLS = [{"type": "function", "name": n, "description": d, "parameters": s} for n, (d, s) in TOOLS.items()]


@dataclass
class Turn:
    latency_s: float  # request sent -> complete response received, client side
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    tool: str  # the tool the model called

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


class ChatSession:
    """A stateless client: a new connection per turn, the whole conversation resent."""

    name = "chat"

    def __init__(self, url: str, model: str, nonce: str, args) -> None:
        import httpx

        self.url, self.model, self.args = url, model, args
        self.messages: list[dict] = [
            {"role": "system", "content": f"[session {nonce}] {INSTRUCTIONS}"},
            {"role": "user", "content": TASK},
        ]
        self.last_call_id: str | None = None
        self.client = httpx.Client(timeout=300, headers={"connection": "close"})

    def turn(self, tool_output: str | None) -> Turn:
        if tool_output is not None:
            self.messages.append({"role": "tool", "tool_call_id": self.last_call_id, "content": tool_output})
        body = {
            "model": self.model,
            "messages": self.messages,
            "tools": CHAT_TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_tokens": self.args.max_tokens,
            "temperature": 0,
            "service_tier": self.args.service_tier,
        }
        t0 = time.perf_counter()
        r = self.client.post(self.url + "/v1/chat/completions", json=body)
        latency = time.perf_counter() - t0
        r.raise_for_status()
        out = r.json()
        message = out["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if len(calls) != 1:
            raise RuntimeError(f"chat turn without exactly one call: {out}")
        self.last_call_id = calls[0]["id"]
        self.messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        u = out["usage"]
        return Turn(
            latency,
            u["prompt_tokens"],
            u["prompt_tokens_details"]["cached_tokens"],
            u["completion_tokens"],
            calls[0]["function"]["name"],
        )

    def close(self) -> None:
        self.client.close()


class ResponsesSession:
    """previous_response_id and only the new input each turn, over HTTP (a new connection per turn) or one WebSocket."""

    def __init__(self, url: str, model: str, nonce: str, args, websocket: bool) -> None:
        self.name = "responses-ws" if websocket else "responses-http"
        self.url, self.model, self.args = url, model, args
        self.instructions = f"[session {nonce}] {INSTRUCTIONS}"
        self.previous: str | None = None
        self.last_call_id: str | None = None
        if websocket:
            from websockets.sync.client import connect

            self._conn = connect(url.replace("http://", "ws://") + "/v1/responses", max_size=None)
            self.ws = self._conn.__enter__()  # websockets wants the context-manager protocol
        else:
            import httpx

            self.ws = None
            self.client = httpx.Client(timeout=300, headers={"connection": "close"})

    def turn(self, tool_output: str | None) -> Turn:
        new = (
            [{"type": "message", "role": "user", "content": TASK}]
            if tool_output is None
            else [{"type": "function_call_output", "call_id": self.last_call_id, "output": tool_output}]
        )
        body = {
            "model": self.model,
            "instructions": self.instructions,
            "input": new,
            "tools": RESPONSES_TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "max_output_tokens": self.args.max_tokens,
            "temperature": 0,
            "service_tier": self.args.service_tier,
            "previous_response_id": self.previous,
        }
        t0 = time.perf_counter()
        if self.ws is not None:
            self.ws.send(json.dumps({"type": "response.create", **body}))
            while True:
                e = json.loads(self.ws.recv(timeout=300))
                if e["type"] in ("response.completed", "response.incomplete"):
                    break
                if e["type"] in ("error", "response.failed"):
                    raise RuntimeError(f"{self.name} turn failed: {e}")
            response = e["response"]
            latency = time.perf_counter() - t0
        else:
            r = self.client.post(self.url + "/v1/responses", json=body)
            latency = time.perf_counter() - t0
            r.raise_for_status()
            response = r.json()
        calls = [o for o in response["output"] if o["type"] == "function_call"]
        if len(calls) != 1 or response["status"] != "completed":
            raise RuntimeError(f"{self.name} turn without exactly one completed call: {response}")
        self.previous, self.last_call_id = response["id"], calls[0]["call_id"]
        u = response["usage"]
        return Turn(
            latency, u["input_tokens"], u["input_tokens_details"]["cached_tokens"], u["output_tokens"], calls[0]["name"]
        )

    def close(self) -> None:
        if self.ws is not None:
            self._conn.__exit__(None, None, None)
        else:
            self.client.close()


def make_session(mode: str, url: str, model: str, nonce: str, args):
    if mode == "chat":
        return ChatSession(url, model, nonce, args)
    return ResponsesSession(url, model, nonce, args, websocket=mode == "responses-ws")


MODES = ("chat", "responses-http", "responses-ws")


def run_round(url: str, model: str, args, r: int) -> dict[str, list[Turn]]:
    """One session per mode, turns interleaved; the order of the modes turns round by round."""
    order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
    sessions = {m: make_session(m, url, model, f"{m}-{r}-{time.time_ns()}", args) for m in order}
    turns: dict[str, list[Turn]] = {m: [] for m in order}
    outputs = tool_outputs(args.turns)
    try:
        for i in range(args.turns):
            for m in order:
                turns[m].append(sessions[m].turn(None if i == 0 else outputs[i - 1]))
    finally:
        for s in sessions.values():
            s.close()
    return turns


def summarize(turns: list[Turn]) -> dict:
    return {
        "median_turn_s": statistics.median(t.latency_s for t in turns),
        "total_s": sum(t.latency_s for t in turns),
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
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64, help="cap on a turn's output (one tool call)")
    p.add_argument("--service-tier", default="priority", help="priority = the fast tier")
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--quick", action="store_true", help="3 turns, 1 round: checks it runs")
    p.add_argument("--out", default="runs/tool_loop.json")
    args = p.parse_args()
    if args.quick:
        args.turns, args.rounds = 3, 1

    import httpx

    url, stop = start_server(args)
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        # First-call costs (grammar compilation, allocations) out of the timed rounds.
        warm = make_session("responses-ws", url, model, "warmup", args)
        warm.turn(None)
        warm.close()
        rounds = []
        for r in range(args.rounds):
            rounds.append(run_round(url, model, args, r))
            line = ", ".join(
                f"{m} {statistics.median(t.latency_s for t in rounds[-1][m]) * 1000:.0f} ms/turn" for m in MODES
            )
            print(f"  round {r + 1}: {line}", flush=True)
    finally:
        stop()

    m = machine()
    print(f"\nmachine: {m['cpu']} ({m['isa']}), {m['cores']} cores, torch {m['torch']}")
    print(
        f"model: {model} | {args.turns} turns, each one forced tool call (<= {args.max_tokens} tokens) | greedy | "
        f"service_tier {args.service_tier} | median of {args.rounds} round(s)\n"
    )
    per_mode = {mode: [summarize(rd[mode]) for rd in rounds] for mode in MODES}
    med = {mode: {k: statistics.median(s[k] for s in per_mode[mode]) for k in per_mode[mode][0]} for mode in MODES}
    base = med["chat"]
    print(
        f"{'mode':>15} | {'ms/turn':>8} | {'prompt':>7} {'cached':>7} {'prefill':>7} {'output':>6} | "
        "vs chat: time/turn, prefill"
    )
    for mode in MODES:
        s = med[mode]
        vs = (
            ""
            if mode == "chat"
            else (
                f"{s['median_turn_s'] / base['median_turn_s'] - 1:+.0%}, "
                f"{1 - s['prefilled_tokens'] / max(1, base['prefilled_tokens']):.0%} saved"
            )
        )
        print(
            f"{mode:>15} | {s['median_turn_s'] * 1000:8.0f} | {s['prompt_tokens']:7.0f} {s['cached_tokens']:7.0f} "
            f"{s['prefilled_tokens']:7.0f} {s['output_tokens']:6.0f} | {vs}"
        )
    last = rounds[-1]
    print("\nlast round, per turn (ms / prefilled tokens): " + " | ".join(MODES))
    for i in range(args.turns):
        print(
            f"{i + 1:>4}: "
            + " | ".join(
                f"{last[md][i].latency_s * 1000:6.0f} {last[md][i].prefilled_tokens:5d} {last[md][i].tool:<9}"
                for md in MODES
            )
        )
    path = write_json(
        args.out,
        {
            "machine": m,
            "model": model,
            "args": vars(args),
            "median": med,
            "rounds": [{md: [asdict(t) for t in rd[md]] for md in MODES} for rd in rounds],
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
