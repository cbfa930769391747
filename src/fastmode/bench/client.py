"""One streaming request to an OpenAI-compatible server, timed chunk by chunk.

The client stamps every server-sent event that carries output text (chat
`delta.content` or `delta.reasoning_content`, completions `text`) with
`time.perf_counter()` as it is read off the socket. Chunks that carry no text
do not count: our server, like OpenAI, opens a chat stream with an empty
`{"role": "assistant", "content": ""}` delta before the prompt is even
processed, and counting it would make TTFT look like a network round trip.

Output tokens come from the final `usage` chunk when the server sends one
(we ask with `stream_options: {"include_usage": true}`); otherwise they are
the number of text-bearing chunks, which is exact for servers that send one
token per chunk and an undercount for those that batch tokens. The record
says which it was (`usage_tokens`).

Failures are recorded, never raised: an HTTP status other than 200 (the
`error.message` of the body as text), an error event inside a 200 stream
(`stream_error`: the server gave up after headers were sent), a timeout over
the whole request, or a connection failure.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from fastmode.bench.workload import BenchRequest
from fastmode.engine.tiers import Tier

# How each bench tier is asked for, in OpenAI's `service_tier` vocabulary. "default"
# rather than "auto" for standard: on fastmode (as on OpenAI) "auto" may be served
# fast when the lane has room, and a standard request must stay standard.
TIER_FIELD: dict[Tier, str] = {Tier.FAST: "priority", Tier.STANDARD: "default", Tier.FLEX: "flex"}
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_ERROR_TEXT_MAX = 500


def normalize_base_url(url: str) -> str:
    """'http://h:8000/v1/' -> 'http://h:8000': paths are added here, and users often paste the /v1 form."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to send requests; everything but the request itself."""

    base_url: str
    model: str
    endpoint: str = "chat"  # "chat" or "completions"
    api_key: str | None = None
    tier_field: bool = True  # False: tiers are labels only (peers that refuse unknown fields)
    ignore_eos: bool = False
    temperature: float | None = 0.0  # None: leave it to the server
    include_usage: bool = True  # send stream_options.include_usage
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINTS)}, got {self.endpoint!r}")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINTS[self.endpoint]

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def request_body(cfg: EndpointConfig, req: BenchRequest) -> dict[str, Any]:
    """The JSON body for one request."""
    body: dict[str, Any] = {"model": cfg.model, "stream": True, "max_tokens": req.max_tokens}
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if cfg.include_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    if cfg.tier_field:
        body["service_tier"] = TIER_FIELD[req.tier]
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    body.update(cfg.extra_body)
    return body


@dataclass
class RequestRecord:
    """What happened to one request. Times are `time.perf_counter()` seconds."""

    index: int
    tier: str
    max_tokens: int
    start_s: float
    end_s: float = math.nan
    chunk_s: list[float] = field(default_factory=list)  # arrival of every text-bearing chunk
    status: int | None = None  # HTTP status; None when no response arrived
    error_kind: str | None = None  # "404", "429", ..., "stream_error", "timeout", "connection"
    error: str | None = None
    output_tokens: int = 0
    usage_tokens: bool = False  # output_tokens came from the server's usage, not from counting chunks
    prompt_tokens: int | None = None
    served_tier: str | None = None  # the response's service_tier, when it has one
    finish_reason: str | None = None
    scheduled_s: float | None = None  # open loop: when the arrival process wanted it sent

    @property
    def ok(self) -> bool:
        return self.error_kind is None and self.status == 200

    @property
    def ttft_s(self) -> float | None:
        """Send to first text-bearing chunk."""
        return self.chunk_s[0] - self.start_s if self.chunk_s else None

    @property
    def e2e_s(self) -> float:
        """Send to end of stream."""
        return self.end_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first: (e2e - TTFT) / (output_tokens - 1)."""
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def tok_s(self) -> float | None:
        """Output tokens per second this request saw while decoding: 1 / TPOT."""
        tpot = self.tpot_s
        return 1.0 / tpot if tpot else None

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive text-bearing chunks."""
        c = self.chunk_s
        return [b - a for a, b in zip(c, c[1:])]

    def fail(self, kind: str, message: str) -> None:
        self.error_kind, self.error = kind, message[:_ERROR_TEXT_MAX]

    def to_json(self, t0: float) -> dict[str, Any]:
        """A compact summary (no per-chunk times), times relative to `t0`."""

        def r(x: float | None, nd: int = 6) -> float | None:
            return None if x is None or math.isnan(x) else round(x, nd)

        return {
            "index": self.index,
            "tier": self.tier,
            "served_tier": self.served_tier,
            "ok": self.ok,
            "status": self.status,
            "error_kind": self.error_kind,
            "error": self.error,
            "start_s": r(self.start_s - t0),
            "scheduled_s": r(self.scheduled_s - t0 if self.scheduled_s is not None else None),
            "ttft_s": r(self.ttft_s),
            "tpot_s": r(self.tpot_s),
            "e2e_s": r(self.e2e_s),
            "output_tokens": self.output_tokens,
            "usage_tokens": self.usage_tokens,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "finish_reason": self.finish_reason,
            "num_chunks": len(self.chunk_s),
        }


def _error_message(text: str) -> str:
    """OpenAI's error.message when the body has one, else the body itself."""
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return text.strip()
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err) if err else text.strip()


def _chunk_text(event: dict[str, Any]) -> str:
    """The output text a chunk carries (chat content or reasoning, or completion text)."""
    out = []
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        if isinstance(delta, dict):
            out += [delta.get("content") or "", delta.get("reasoning_content") or "", delta.get("reasoning") or ""]
        else:
            out.append(choice.get("text") or "")
    return "".join(out)


class BenchClient:
    """An httpx.AsyncClient that sends `BenchRequest`s; use as `async with`."""

    def __init__(self, cfg: EndpointConfig, max_connections: int | None = None):
        self.cfg = cfg
        # No keep-alive pool limit below the load: the generator, not the pool, must decide concurrency.
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(cfg.timeout_s), limits=limits, headers=cfg.headers())

    async def __aenter__(self) -> BenchClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def send(self, req: BenchRequest, scheduled_s: float | None = None) -> RequestRecord:
        """Send one request and return its record; never raises for a failed request."""
        rec = RequestRecord(req.index, req.tier.value, req.max_tokens, time.perf_counter(), scheduled_s=scheduled_s)
        try:
            await asyncio.wait_for(self._stream(req, rec), self.cfg.timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            rec.fail("timeout", f"no complete answer within {self.cfg.timeout_s:g} s")
        except httpx.HTTPError as e:
            rec.fail("connection", f"{type(e).__name__}: {e}")
        rec.end_s = time.perf_counter()
        if not rec.usage_tokens:
            rec.output_tokens = len(rec.chunk_s)
        return rec

    async def _stream(self, req: BenchRequest, rec: RequestRecord) -> None:
        async with self._http.stream("POST", self.cfg.url, json=request_body(self.cfg, req)) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec.fail(str(resp.status_code), _error_message(text))
                return
            async for line in resp.aiter_lines():
                now = time.perf_counter()
                if not line.startswith("data:"):
                    continue  # blank separators, `event:` names, `:` keep-alive comments
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    event = json.loads(payload)
                except ValueError:
                    rec.fail("stream_error", f"unparseable event: {payload}")
                    return
                if "error" in event:
                    err = event["error"]
                    rec.fail("stream_error", str(err.get("message", err) if isinstance(err, dict) else err))
                    return
                self._observe(event, now, rec)

    @staticmethod
    def _observe(event: dict[str, Any], now: float, rec: RequestRecord) -> None:
        if _chunk_text(event):
            rec.chunk_s.append(now)
        rec.served_tier = event.get("service_tier") or rec.served_tier
        for choice in event.get("choices") or ():
            rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
        usage = event.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            rec.output_tokens, rec.usage_tokens = int(usage["completion_tokens"]), True
            if usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = int(usage["prompt_tokens"])


async def first_model_id(base_url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The first id GET /v1/models lists: the served model, on single-model servers."""
    url = normalize_base_url(base_url) + "/v1/models"
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
            resp = await http.get(url)
    except httpx.HTTPError as e:
        raise RuntimeError(f"GET {url} failed ({type(e).__name__}: {e}); is the server up? (or pass --model)") from e
    if resp.status_code != 200:
        raise RuntimeError(f"GET {url} answered {resp.status_code}: {_error_message(resp.text)}")
    data = resp.json().get("data") or []
    if not data:
        raise RuntimeError(f"GET {url} lists no models; pass --model")
    return str(data[0]["id"])
