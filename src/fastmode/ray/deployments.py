"""The Ray Serve application: one deployment per pool, and the ingress in front.

    from fastmode.ray import build_app
    app = build_app("standard=2,fast=1,spark=1", engine={"num_threads": 4})
    serve.run(app, name="fastmode")

or, for `serve run` and a KubeRay RayService, the import path
`fastmode.ray:app_builder` with its arguments (docs/scale-out.md):

    serve run fastmode.ray:app_builder pools=standard=2,fast=1 num_threads=4

Each pool is a deployment named `fastmode-<pool>` whose replicas each run one
engine (replica.py) with the pool's engine config. A replica asks Ray for as
many CPUs as its engine's threads (`num_threads`, else 1) and takes up to
`max_num_seqs + max_waiting_requests` requests at once: the ingress's
admission keeps each pool within that sum over its replicas, so Ray's own
queue stays empty and a refusal is the API's 429 or 529, never a hang.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application

from fastmode.engine.config import EngineConfig
from fastmode.ray.ingress import Ingress, built_app
from fastmode.ray.pools import PoolsSpec, deployment_name, parse_pools
from fastmode.ray.replica import PoolReplica
from fastmode.ray.router import router_config
from fastmode.server.config import ServerConfig

INGRESS_NAME = "fastmode-ingress"
# Ray Serve checks a replica this often; a dead replica is replaced once a check fails.
HEALTH_CHECK_PERIOD_S = 2.0
# The ingress forwards every request; admission, not Ray's per-replica cap, bounds them.
INGRESS_MAX_ONGOING_REQUESTS = 100_000


def _engine_kwargs(engine: EngineConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    """Flat EngineConfig keywords (checked now, so a bad setting fails here, not in every replica)."""
    if engine is None:
        return {}
    if isinstance(engine, EngineConfig):
        return {f.name: _flat_value(engine, f) for f in EngineConfig.flat_fields()}
    kwargs = dict(engine)
    EngineConfig(**kwargs)
    return kwargs


def _flat_value(config: EngineConfig, flat) -> Any:
    part = config if flat.part is None else getattr(config, flat.part)
    return getattr(part, flat.field.name)


def build_app(
    pools: str | Mapping[str, Any] | PoolsSpec = "standard=1,fast=1",
    engine: EngineConfig | Mapping[str, Any] | None = None,
    server: ServerConfig | Mapping[str, Any] | None = None,
) -> Application:
    """The fastmode application for `serve.run` / `serve run` / KubeRay.

    `pools`: a pools spec (pools.py); `engine`: the base engine config every pool starts
    from (EngineConfig or its flat keywords); `server`: the ingress's ServerConfig (rate
    limits, queue bounds, API key...); its host and port are the caller's to give Ray's
    HTTP proxy, as `fastmode serve --ray` does.
    """
    spec = parse_pools(pools)
    base = _engine_kwargs(engine)
    if server is None:
        server = ServerConfig()
    server_kwargs = dataclasses.asdict(server) if isinstance(server, ServerConfig) else dict(server)
    config = ServerConfig(**server_kwargs)
    handles = {}
    for p in spec.pools:
        kwargs = p.engine_kwargs(base)
        engine_config = EngineConfig(**kwargs)
        threads = engine_config.num_threads or 1
        per_replica = engine_config.scheduling.max_num_seqs + config.max_waiting_requests
        deployment = serve.deployment(PoolReplica).options(
            name=deployment_name(p.name),
            num_replicas=p.replicas,
            max_ongoing_requests=per_replica,
            ray_actor_options={"num_cpus": threads},
            health_check_period_s=HEALTH_CHECK_PERIOD_S,
            **router_config(engine_config.scheduling.block_size),
        )
        handles[p.name] = deployment.bind(p.name, kwargs)
    ingress = serve.deployment(serve.ingress(built_app)(Ingress)).options(
        name=INGRESS_NAME,
        num_replicas=1,
        max_ongoing_requests=INGRESS_MAX_ONGOING_REQUESTS,
        ray_actor_options={"num_cpus": 0},
    )
    return ingress.bind(server_kwargs, spec.to_dict(), handles)


def app_builder(args: Mapping[str, Any]) -> Application:
    """`serve run fastmode.ray:app_builder pools=... KEY=VALUE...`: besides `pools`, every key is
    a `fastmode serve` flag without its dashes (an engine or a server setting), with the same
    values; booleans as true or false."""
    import argparse

    from fastmode.flags import add_dataclass_args, pick

    args = dict(args)
    pools = str(args.pop("pools", "standard=1,fast=1"))
    parser = argparse.ArgumentParser(prog="fastmode.ray:app_builder", add_help=False, exit_on_error=False)
    add_dataclass_args(parser, ServerConfig, title="server")
    add_dataclass_args(parser, EngineConfig, title="engine")
    argv: list[str] = []
    for key, value in args.items():
        name = str(key).replace("_", "-")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if text in ("true", "false"):
            argv.append(f"--{name}" if text == "true" else f"--no-{name}")
        else:
            argv += [f"--{name}", text]
    try:
        ns = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        raise ValueError(f"fastmode.ray:app_builder: bad arguments {argv}: {e}") from None
    return build_app(pools, pick(EngineConfig, ns), pick(ServerConfig, ns))
