"""A real uvicorn server on 127.0.0.1 (free port, background thread) over the tiny model.

`serve(...)` is a context manager so that every test stops what it starts;
`server` is a module-wide default instance. `tiny_spark` is a real Spark
export of the tiny model (two of its layers), to serve next to it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn

from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.loader import LoadedModel, load_model
from fastmode.server.app import create_app
from fastmode.server.config import ServerConfig
from fastmode.server.state import ServerState


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:PORT
    engine: LLMEngine  # the main model's
    state: ServerState
    extra_engines: list[LLMEngine] = field(default_factory=list)

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/responses"

    @property
    def model(self) -> str:
        return self.state.main.name

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


def export_spark(teacher_dir: Path, folder: Path, teacher: dict | None = None) -> Path:
    """Export a Spark of the tiny model (its layers 0 and 2, untrained) to `folder`, as `fastmode distill` does.

    The student is copied from a fresh load: engines pack the shared session
    model's linear weights in place, and packed weights cannot be copied.
    `teacher` overrides the recorded teacher identity (to fake another checkpoint).
    """
    from fastmode.distill.export import save_spark, teacher_identity
    from fastmode.distill.student import build_student, own_state

    fresh = load_model(str(teacher_dir), "float32")
    student = build_student(fresh.model, [0, 2])
    info = {"teacher": teacher or teacher_identity(fresh.path), "layer_indices": [0, 2], "summary": {"steps": 0}}
    save_spark(folder, own_state(student), info, "fp32")
    return folder


@pytest.fixture(scope="session")
def tiny_spark(tiny_llama_dir, tiny_loaded, tmp_path_factory) -> LoadedModel:
    """The tiny model's Spark, loaded on the session's tiny model as `fastmode serve` loads Spark."""
    from fastmode.distill.spark import spark_as_loaded

    return spark_as_loaded(export_spark(tiny_llama_dir, tmp_path_factory.mktemp("tiny-spark")), tiny_loaded)


@contextlib.contextmanager
def serve(
    loaded, config: ServerConfig | None = None, extra: Sequence[LoadedModel] = (), **engine_kwargs
) -> Iterator[RunningServer]:
    """Serve `loaded` (and each of `extra` as another model, without speculation, as `serve` runs Spark)."""
    # One torch thread: the tiny model gains nothing from more, and the server and the
    # test client need the other core. Restored afterwards (the setting is process-wide).
    threads = torch.get_num_threads()
    kwargs = {**dict(model=str(loaded.path), dtype="float32", kv_cache_gib=0.01, num_threads=1), **engine_kwargs}
    engine = LLMEngine(EngineConfig(**kwargs), loaded=loaded)
    extra_engines = [
        LLMEngine(EngineConfig(**{**kwargs, "model": str(x.path), "speculative": "off", "draft_model": None}), loaded=x)
        for x in extra
    ]
    app = create_app(engine, config or ServerConfig(), extra_engines)
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
        yield RunningServer(f"http://127.0.0.1:{port}", engine, app.state.fastmode, extra_engines)
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
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    """One client for raw requests: building an httpx.Client (its TLS context) costs ~0.2 s."""
    with httpx.Client(timeout=30) as c:
        yield c
