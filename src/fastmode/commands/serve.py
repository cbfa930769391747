"""`fastmode serve`: the server on the command line, on one machine or (`--ray`) as tier pools
on Ray Serve. It lives with the commands, above both `server/` and `ray/`, which it composes.

Every engine flag is generated from a field of one of `EngineConfig`'s parts
(under its flat name, see engine/config.py) and every server flag from a
`ServerConfig` field (fastmode/flags.py), so a new config field is a new flag
without touching this file.

Serving the default model also serves its Spark student under its own name
when Spark's weights are present (`--no-serve-spark` turns that off), so
clients can pick the small fast model per request.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from fastmode.flags import add_dataclass_args
from fastmode.flags import pick as _pick

if TYPE_CHECKING:  # imported lazily at run time: they pull in torch, and `fastmode --help` should not wait
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine


def register(sub: argparse._SubParsersAction) -> None:
    from fastmode.engine.config import EngineConfig
    from fastmode.server.config import ServerConfig

    p = sub.add_parser(
        "serve",
        help="serve the OpenAI and Anthropic APIs (HTTP, SSE, WebSocket)",
        description="Serve a model (and, for the default model, its Spark student) over the OpenAI and Anthropic "
        "APIs. Flags whose default is None accept 'none'.",
    )
    add_dataclass_args(p, ServerConfig, title="server")
    add_dataclass_args(p, EngineConfig, title="engine")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    from fastmode.ray.command import add_ray_args  # the flags only: Ray is imported by --ray alone

    add_ray_args(p)
    p.set_defaults(func=run)


def spark_engine(main: LLMEngine, config: EngineConfig) -> LLMEngine | None:
    """A second engine serving the default model's Spark student, or None when the
    main model is another one or no Spark weights are present.

    Spark shares the main engine's embeddings and LM head (no copies) and runs
    with the same flags, except without speculation: it is itself the small
    fast model, and no draft is smaller. A Spark distilled from another
    checkpoint is skipped with a warning: an optional extra model must never
    stop the main one from being served.
    """
    from fastmode.distill.spark import find_spark, spark_as_loaded
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.loader.default_model import DEFAULT_MODEL_NAME

    if main.loaded.name != DEFAULT_MODEL_NAME:
        return None
    path = find_spark(DEFAULT_MODEL_NAME)
    if path is None:
        return None
    try:
        loaded = spark_as_loaded(path, main.loaded)
    except ValueError as e:
        print(f"fastmode: not serving Spark: {e}", file=sys.stderr)
        return None
    return LLMEngine(
        dataclasses.replace(config, model=str(path), speculative_method="off", draft_model=None), loaded=loaded
    )


def run(args: argparse.Namespace) -> int:
    if getattr(args, "ray", False):  # tier pools on Ray Serve; the single-machine server never imports Ray
        from fastmode.ray.command import run_on_ray

        return run_on_ray(args)
    if getattr(args, "pools", None) or getattr(args, "ray_address", None):
        print("fastmode: --pools and --ray-address take effect with --ray", file=sys.stderr)
        return 2
    from fastmode.engine.config import EngineConfig
    from fastmode.engine.llm_engine import LLMEngine
    from fastmode.loader import ModelLoadError
    from fastmode.server.app import create_app
    from fastmode.server.config import ServerConfig, api_key_from_env

    try:
        server_kwargs = _pick(ServerConfig, args)
        if server_kwargs.get("api_key"):
            print(
                "fastmode: --api-key is visible to every user of this machine (ps); prefer FASTMODE_API_KEY "
                "or --api-key-file",
                file=sys.stderr,
            )
        server_kwargs["api_key"] = api_key_from_env(server_kwargs.get("api_key"), server_kwargs.get("api_key_file"))
        server_config = ServerConfig(**server_kwargs)
        engine_config = EngineConfig(**_pick(EngineConfig, args))
        engine = LLMEngine(engine_config)
        spark = spark_engine(engine, engine_config) if server_config.serve_spark else None
        app = create_app(engine, server_config, [spark] if spark is not None else [])
    except (ModelLoadError, ValueError) as e:
        print(f"fastmode: {e}", file=sys.stderr)
        return 2
    names = list(app.state.fastmode.models)
    auth = "API key required" if server_config.api_key else "no API key"
    print(
        f"fastmode: serving {', '.join(names)} on http://{server_config.host}:{server_config.port} ({auth})",
        file=sys.stderr,
    )
    if spark is not None:
        print(
            f"fastmode: {spark.model_name} (the Spark student) is served as its own model; "
            "--no-serve-spark turns it off",
            file=sys.stderr,
        )
    from fastmode.server.edge.shutdown import DrainingServer
    from fastmode.server.edge.timeouts import uvicorn_config

    # The app drains itself first (server/edge/shutdown.py); uvicorn's own wait comes after, with little left.
    config = uvicorn_config(app, server_config, log_level=args.log_level, timeout_graceful_shutdown=5)
    try:
        DrainingServer(config, app.state.fastmode, server_config.drain_timeout_s).run()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down and re-raised the signal
        return 130
    return 0
