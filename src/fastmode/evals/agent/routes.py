"""The routes the agent eval compares, the server it runs them on, and the background load.

A route is what a client can choose per request on one `fastmode serve`: the
model (the main one or its Spark student), the tier (`service_tier`) and the
speculative mode (the `speculative` extension), plus, for the verifier route,
how often a step the sandbox rejects is retried. The fast routes only mean
something next to other traffic, so the eval keeps a few standard-tier
streams decoding on the main model for the whole measurement (every route
sees the same load; the streams never stop between routes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastmode.evals.agent.loop import RouteRequest

DEFAULT_RETRIES = 3


@dataclass(frozen=True)
class Route:
    """One way to run every step of a task."""

    name: str
    model: str  # "main" or "spark": resolved to the served names at run time
    service_tier: str  # OpenAI's service_tier: "default" is standard, "priority" is fast
    speculative: str  # "off" or "ngram"
    verifier: bool = False  # retry a step the sandbox rejects
    description: str = ""

    def request(self, models: dict[str, str], retries: int) -> RouteRequest:
        return RouteRequest(
            model=models[self.model],
            service_tier=self.service_tier,
            speculative=self.speculative,
            retries=retries if self.verifier else 0,
        )


ROUTES: dict[str, Route] = {
    r.name: r
    for r in (
        Route("standard", "main", "default", "off", description="main model, standard tier"),
        Route("fast", "main", "priority", "off", description="main model, fast tier (the low-batch lane)"),
        Route("fast-ngram", "main", "priority", "ngram", description="fast tier with n-gram speculation"),
        Route("spark", "spark", "default", "off", description="the Spark student"),
        Route(
            "spark-retry", "spark", "default", "off", verifier=True, description="Spark, each step verified, retried"
        ),
    )
}


def parse_routes(text: str | None) -> list[Route]:
    """A comma-separated list of route names (None or "all": every route, in the table's order)."""
    if not text or text == "all":
        return list(ROUTES.values())
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROUTES]
    if unknown:
        raise ValueError(f"unknown routes {unknown}; known: {', '.join(ROUTES)}")
    return [ROUTES[n] for n in dict.fromkeys(names)]


def served_models(client: Any) -> dict[str, str]:
    """{"main": name, "spark": name} from GET /v1/models (spark only where the server serves one)."""
    r = client.get("/v1/models")
    r.raise_for_status()
    names = [m["id"] for m in r.json()["data"]]
    out = {}
    spark = [n for n in names if n.endswith("-spark")]
    main = [n for n in names if not n.endswith("-spark")]
    if main:
        out["main"] = main[0]
    if spark:
        out["spark"] = spark[0]
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(serve_args: Sequence[str] = (), startup_timeout_s: float = 600.0) -> Iterator[str]:
    """`fastmode serve` in a child process on a free loopback port; yields its base URL.

    The child is stopped with SIGINT (the server drains, then exits) and killed if it
    lingers. Its log goes to a temporary file, shown when it fails to start.
    """
    import httpx

    port = _free_port()
    argv = [sys.executable, "-m", "fastmode.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--log-level", "warning", "--drain-timeout-s", "2", *serve_args]
    log = tempfile.NamedTemporaryFile(prefix="fastmode-agent-serve-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fastmode serve exited with {proc.returncode}:\n{_tail(log.name)}")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"fastmode serve did not start in {startup_timeout_s:.0f} s:\n{_tail(log.name)}")
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        os.unlink(log.name)


def _tail(path: str, chars: int = 3000) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()[-chars:]


LOAD_PROMPT = "Tell me a long story about a lighthouse keeper and the ships she watches."


class BackgroundLoad:
    """`streams` clients that keep standard-tier requests decoding on `model` until stopped.

    Each request runs to `max_tokens` (ignore_eos), so the main engine always has
    `streams` sequences in its batch besides the agent's; the counts say how much
    load actually ran.
    """

    def __init__(self, url: str, model: str, streams: int, max_tokens: int = 64):
        self.url, self.model, self.streams, self.max_tokens = url, model, streams, max_tokens
        self.completed = 0
        self.errors = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _run(self) -> None:
        import httpx

        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": LOAD_PROMPT}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "service_tier": "default",
            "speculative": "off",
        }
        with httpx.Client(base_url=self.url, timeout=600.0) as client:
            while not self._stop.is_set():
                try:
                    ok = client.post("/v1/chat/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                with self._lock:
                    if ok:
                        self.completed += 1
                    else:
                        self.errors += 1
                if not ok:
                    self._stop.wait(0.5)

    def __enter__(self) -> BackgroundLoad:
        for i in range(self.streams):
            t = threading.Thread(target=self._run, name=f"agent-eval-load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(660)

    def to_dict(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "max_tokens": self.max_tokens,
            "tier": "standard",
            "completed": self.completed,
            "errors": self.errors,
        }
