"""`fastmode serve --ray --pools standard=2,fast=1,spark=1`: the pools on Ray Serve from the command line.

The flags are added to `fastmode serve` (commands/serve.py) by `add_ray_args`,
which imports nothing of Ray; `run_on_ray` runs only when --ray is given. With
no `--ray-address` (and no RAY_ADDRESS in the environment) it starts a local
Ray instance; with one, it joins that cluster. The ingress is served by Ray
Serve's HTTP proxy on --host and --port; the other server and engine flags mean
what they mean without --ray, the engine flags being every pool's base config.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

DEFAULT_POOLS = "standard=1,fast=1"
APP_NAME = "fastmode"


def add_ray_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tier pools on Ray Serve (pip install fastmode[ray]; see docs/scale-out.md)")
    g.add_argument(
        "--ray",
        action="store_true",
        help="serve through Ray Serve, one deployment per pool (fastmode-<pool>) behind one ingress",
    )
    g.add_argument(
        "--pools",
        default=None,
        help=f"with --ray: POOL=REPLICAS,... (pools: standard, fast, flex, spark) or a pools spec JSON file, "
        f"as `fastmode plan --pools-out` writes (default {DEFAULT_POOLS})",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        help="with --ray: the Ray cluster to join (e.g. 10.0.0.5:6379, or auto); default: a local Ray instance",
    )


def _local_cpus(spec, engine_kwargs) -> int:
    """CPUs to declare for a local Ray instance: enough for every replica to be placed. Ray's
    CPU count is a scheduling budget, not a pin; the replicas then share this machine's cores."""
    from fastmode.engine.config import EngineConfig

    wanted = sum(p.replicas * (EngineConfig(**p.engine_kwargs(engine_kwargs)).num_threads or 1) for p in spec.pools)
    return max(os.cpu_count() or 1, wanted)


def run_on_ray(args: argparse.Namespace) -> int:
    from fastmode.engine.config import EngineConfig
    from fastmode.flags import pick
    from fastmode.ray.pools import parse_pools
    from fastmode.server.config import ServerConfig, api_key_from_env

    try:
        import ray
        from ray import serve
    except ImportError:
        print("fastmode: --ray needs Ray Serve: pip install 'fastmode[ray]'", file=sys.stderr)
        return 2
    from fastmode.ray.deployments import build_app

    try:
        spec = parse_pools(args.pools or DEFAULT_POOLS)
        server_kwargs = pick(ServerConfig, args)
        server_kwargs["api_key"] = api_key_from_env(server_kwargs.get("api_key"), server_kwargs.get("api_key_file"))
        server = ServerConfig(**server_kwargs)
        engine_kwargs = pick(EngineConfig, args)
        app = build_app(spec, engine_kwargs, server)
    except ValueError as e:
        print(f"fastmode: {e}", file=sys.stderr)
        return 2
    address = args.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=args.log_level.upper())
    else:
        ray.init(num_cpus=_local_cpus(spec, engine_kwargs), include_dashboard=False, logging_level="WARNING")
    where = f"the Ray cluster at {address}" if address else "a local Ray instance"
    print(f"fastmode: starting pools {spec.short_form()} on {where}", file=sys.stderr)
    serve.start(http_options={"host": server.host, "port": server.port})
    serve.run(app, name=APP_NAME, route_prefix="/")
    auth = "API key required" if server.api_key else "no API key"
    print(f"fastmode: serving on http://{server.host}:{server.port} through Ray Serve ({auth})", file=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("fastmode: shutting down the pools", file=sys.stderr)
    serve.delete(APP_NAME)
    if not address:
        serve.shutdown()
        ray.shutdown()
    return 0
