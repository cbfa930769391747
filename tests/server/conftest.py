"""A real uvicorn server on 127.0.0.1 (free port, background thread) over the tiny model.

`serve(...)` is a context manager so that every test stops what it starts;
`server` is a module-wide default instance.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import torch
import uvicorn

from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.loader import load_model
from fastmode.server.app import create_app
from fastmode.server.config import ServerConfig
from fastmode.server.state import ServerState


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:PORT
    engine: LLMEngine
    state: ServerState

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/responses"

    @property
    def model(self) -> str:
        return self.state.model_name

    def kv_all_free(self) -> bool:
        return self.engine.scheduler.block_manager.num_free_blocks == self.engine.scheduler_config.num_blocks

    def idle(self) -> bool:
        s = self.engine.scheduler
        return not s.running and not len(s.waiting)

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Aborts run on the engine thread; give it a moment to settle."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle() and self.kv_all_free():
                return True
            time.sleep(0.02)
        return False


@pytest.fixture(scope="session")
def tiny_loaded(tiny_llama_dir):
    return load_model(str(tiny_llama_dir), "float32")


@contextlib.contextmanager
def serve(loaded, config: ServerConfig | None = None, **engine_kwargs) -> Iterator[RunningServer]:
    # One torch thread: the tiny model gains nothing from more, and the server and the
    # test client need the other core. Restored afterwards (the setting is process-wide).
    threads = torch.get_num_threads()
    kwargs = dict(model=str(loaded.path), dtype="float32", kv_cache_gib=0.01, num_threads=1, **engine_kwargs)
    engine = LLMEngine(EngineConfig(**kwargs), loaded=loaded)
    app = create_app(engine, config or ServerConfig())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="test-uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield RunningServer(f"http://127.0.0.1:{port}", engine, app.state.fastmode)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        torch.set_num_threads(threads)
        assert not thread.is_alive(), "the test server did not stop"


@pytest.fixture(scope="module")
def server(tiny_loaded) -> Iterator[RunningServer]:
    with serve(tiny_loaded) as s:
        yield s


# Greedy on the tiny model: this prompt runs to max_tokens (no EOS within 400
# tokens), which makes long-lived requests for disconnect and capacity tests;
# SHORT_PROMPT answers EOS at once (stop_reason end_turn).
LONG_PROMPT = "tell me a long story"
SHORT_PROMPT = "count slowly"


def chat_body(model: str, content: str = LONG_PROMPT, max_tokens: int = 300, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    """One client for raw requests: building an httpx.Client (its TLS context) costs ~0.2 s."""
    with httpx.Client(timeout=30) as c:
        yield c
